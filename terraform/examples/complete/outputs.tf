output "gateways_bootstrap_servers" {
  description = "bootstrap.servers for Kafka clients"
  value       = module.stratalog.gateways_bootstrap_servers
}

output "s3_bucket_id" {
  description = "Name of the data bucket"
  value       = module.stratalog.s3_bucket_id
}

output "s3_bucket_arn" {
  description = "ARN of the data bucket"
  value       = module.stratalog.s3_bucket_arn
}

output "s3_bucket_object_store_url" {
  description = "Object store URL of the cluster"
  value       = module.stratalog.s3_bucket_object_store_url
}

output "iam_gateway_role_arn" {
  description = "ARN of the gateway role"
  value       = module.stratalog.iam_gateway_role_arn
}

output "iam_reader_role_arn" {
  description = "ARN of the read-only role for Spark"
  value       = module.stratalog.iam_reader_role_arn
}

output "etcd_endpoints" {
  description = "Client endpoints of the etcd cluster"
  value       = module.stratalog.etcd_endpoints
}

output "gateways_admin_secret_arn" {
  description = "Secret holding the admin user's password (aws secretsmanager get-secret-value --secret-id ...)"
  value       = module.stratalog.gateways_admin_secret_arn
}

output "gateways_container_commands" {
  description = "What each gateway container runs"
  value       = module.stratalog.gateways_container_commands
}
