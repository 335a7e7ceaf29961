output "s3_bucket_id" {
  description = "Name of the data bucket"
  value       = local.bucket_id
}

output "s3_bucket_arn" {
  description = "ARN of the data bucket"
  value       = local.bucket_arn
}

output "s3_bucket_region" {
  description = "AWS region of the data bucket"
  value       = try(aws_s3_bucket.this[0].region, null)
}

output "s3_bucket_cluster_prefix" {
  description = "Key prefix of the Stratalog cluster inside the bucket"
  value       = var.cluster_prefix
}

output "s3_bucket_segment_prefix" {
  description = "Key prefix under which sealed segment objects live"
  value       = local.segment_prefix
}

output "s3_bucket_object_store_url" {
  description = "Object store URL for `stratalog serve --object-store`"
  value       = var.create ? "s3://${local.bucket_id}/${var.cluster_prefix}" : null
}
