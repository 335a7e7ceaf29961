output "security_group_lb_id" {
  description = "ID of the load balancer's security group"
  value       = try(aws_security_group.lb[0].id, null)
}

output "security_group_gateway_id" {
  description = "ID of the gateways' security group"
  value       = try(aws_security_group.gateway[0].id, null)
}

output "security_group_etcd_id" {
  description = "ID of the etcd members' security group, if created"
  value       = try(aws_security_group.etcd[0].id, null)
}
