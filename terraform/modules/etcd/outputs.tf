output "etcd_endpoints" {
  description = "Client endpoints (host:port) of the etcd cluster, created or existing"
  value       = local.endpoints

  precondition {
    condition     = length(local.endpoints) > 0
    error_message = "With create = false, existing_endpoints must name at least one etcd endpoint."
  }
}

output "etcd_client_urls" {
  description = "Client URLs (http://host:port) of the etcd cluster, as etcdctl takes them"
  value       = [for e in local.endpoints : "http://${e}"]
}

output "etcd_coordinator_url" {
  description = "Value for `stratalog serve --coordinator`"
  value       = length(local.endpoints) > 0 ? "etcd://${join(",", local.endpoints)}" : null
}

output "etcd_instance_ids" {
  description = "IDs of the member instances"
  value       = aws_instance.this[*].id
}

output "etcd_private_ips" {
  description = "Private IP addresses of the members"
  value       = local.member_ips
}

output "etcd_network_interface_ids" {
  description = "IDs of the members' network interfaces, which keep their addresses across instance replacement"
  value       = aws_network_interface.this[*].id
}

output "etcd_data_volume_ids" {
  description = "IDs of the members' persistent data volumes"
  value       = aws_ebs_volume.data[*].id
}
