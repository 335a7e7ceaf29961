output "gateways_bootstrap_servers" {
  description = "Comma-separated advertised addresses of the gateways, for a Kafka client's bootstrap.servers"
  value       = join(",", local.advertised_addresses)
}

output "gateways_advertised_addresses" {
  description = "Advertised address (host:port) of each gateway, in broker id order"
  value       = local.advertised_addresses
}

output "gateways_broker_ids" {
  description = "Broker id of each gateway"
  value       = local.create ? local.broker_ids : []
}

output "gateways_listener_ports" {
  description = "Load balancer port of each gateway"
  value       = local.create ? local.listener_ports : []
}

output "gateways_lb_arn" {
  description = "ARN of the network load balancer"
  value       = try(aws_lb.this[0].arn, null)
}

output "gateways_lb_dns_name" {
  description = "DNS name of the network load balancer"
  value       = local.lb_dns_name
}

output "gateways_lb_zone_id" {
  description = "Route 53 zone id of the network load balancer, for alias records"
  value       = try(aws_lb.this[0].zone_id, null)
}

output "gateways_target_group_arns" {
  description = "ARN of each gateway's target group"
  value       = aws_lb_target_group.this[*].arn
}

output "gateways_ecs_cluster_arn" {
  description = "ARN of the ECS cluster running the gateways"
  value       = local.create ? local.cluster_arn : null
}

output "gateways_ecs_service_names" {
  description = "Name of each gateway's ECS service"
  value       = aws_ecs_service.this[*].name
}

output "gateways_task_definition_arns" {
  description = "ARN of each gateway's task definition"
  value       = aws_ecs_task_definition.this[*].arn
}

output "gateways_cloudwatch_log_group_name" {
  description = "Name of the CloudWatch log group of the gateways"
  value       = try(aws_cloudwatch_log_group.this[0].name, null)
}

output "gateways_execution_role_arn" {
  description = "ARN of the task execution role"
  value       = local.create ? local.execution_role_arn : null
}

output "gateways_admin_secret_arn" {
  description = "ARN of the Secrets Manager secret holding admin_user's password (null without SASL)"
  value       = try(aws_secretsmanager_secret.admin[0].arn, null)
}

output "gateways_security_protocol" {
  description = "The security.protocol Kafka clients set to reach the gateways"
  value       = var.security_protocol
}

output "gateways_container_commands" {
  description = "Entry point and arguments of each gateway's container, in broker id order"
  value = [
    for i in range(length(local.serve_args)) : local.sasl ? ["sh", "-c", local.sasl_commands[i]] : concat(["stratalog"], local.serve_args[i])
  ]
}
