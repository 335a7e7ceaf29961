output "gateways_bootstrap_servers" {
  description = "bootstrap.servers for Kafka clients: every gateway's advertised address"
  value       = module.gateways.gateways_bootstrap_servers
}

output "gateways_advertised_addresses" {
  description = "Advertised address of each gateway, in broker id order"
  value       = module.gateways.gateways_advertised_addresses
}

output "gateways_lb_dns_name" {
  description = "DNS name of the load balancer in front of the gateways"
  value       = module.gateways.gateways_lb_dns_name
}

output "gateways_ecs_cluster_arn" {
  description = "ARN of the ECS cluster running the gateways"
  value       = module.gateways.gateways_ecs_cluster_arn
}

output "gateways_cloudwatch_log_group_name" {
  description = "CloudWatch log group of the gateways"
  value       = module.gateways.gateways_cloudwatch_log_group_name
}

output "s3_bucket_id" {
  description = "Name of the data bucket"
  value       = module.bucket.s3_bucket_id
}

output "s3_bucket_arn" {
  description = "ARN of the data bucket"
  value       = module.bucket.s3_bucket_arn
}

output "s3_bucket_object_store_url" {
  description = "Object store URL of the cluster (s3://<bucket>/<prefix>), also what Spark reads"
  value       = module.bucket.s3_bucket_object_store_url
}

output "iam_gateway_role_arn" {
  description = "ARN of the gateway role"
  value       = module.iam.iam_gateway_role_arn
}

output "iam_reader_role_arn" {
  description = "ARN of the read-only role for Spark"
  value       = module.iam.iam_reader_role_arn
}

output "etcd_endpoints" {
  description = "Client endpoints (host:port) of the etcd cluster"
  value       = module.etcd.etcd_endpoints
}

output "etcd_coordinator_url" {
  description = "The gateways' --coordinator value"
  value       = module.etcd.etcd_coordinator_url
}

output "security_group_gateway_id" {
  description = "Security group of the gateways (add rules to it for other sources)"
  value       = module.security.security_group_gateway_id
}

output "gateways_admin_secret_arn" {
  description = "ARN of the Secrets Manager secret holding the admin user's password (null without SASL)"
  value       = module.gateways.gateways_admin_secret_arn
}

output "gateways_security_protocol" {
  description = "The security.protocol Kafka clients set to reach the gateways"
  value       = module.gateways.gateways_security_protocol
}

output "gateways_container_commands" {
  description = "Entry point and arguments of each gateway's container"
  value       = module.gateways.gateways_container_commands
}
