output "s3_bucket_id" {
  description = "Name of the data bucket"
  value       = module.bucket.s3_bucket_id
}

output "s3_bucket_arn" {
  description = "ARN of the data bucket"
  value       = module.bucket.s3_bucket_arn
}

output "object_store_url" {
  description = "Value for `stratalog serve --object-store`"
  value       = module.bucket.s3_bucket_object_store_url
}

output "s3_endpoint_url" {
  description = "S3 endpoint the gateway must be pointed at, with path-style addressing"
  value       = var.s3_endpoint
}

output "region" {
  description = "Region name to sign requests with"
  value       = var.region
}

output "iam_gateway_role_arn" {
  description = "ARN of the gateway role"
  value       = module.iam.iam_gateway_role_arn
}

output "iam_reader_role_arn" {
  description = "ARN of the read-only role"
  value       = module.iam.iam_reader_role_arn
}
