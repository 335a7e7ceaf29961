output "iam_gateway_role_arn" {
  description = "ARN of the gateway role (read-write on the cluster prefix)"
  value       = try(aws_iam_role.gateway[0].arn, null)
}

output "iam_gateway_role_name" {
  description = "Name of the gateway role"
  value       = try(aws_iam_role.gateway[0].name, null)
}

output "iam_gateway_policy_arn" {
  description = "ARN of the gateway's managed policy"
  value       = try(aws_iam_policy.gateway[0].arn, null)
}

output "iam_gateway_instance_profile_name" {
  description = "Name of the gateway's EC2 instance profile, if created"
  value       = try(aws_iam_instance_profile.gateway[0].name, null)
}

output "iam_reader_role_arn" {
  description = "ARN of the read-only role for Spark and other readers"
  value       = try(aws_iam_role.reader[0].arn, null)
}

output "iam_reader_role_name" {
  description = "Name of the read-only role"
  value       = try(aws_iam_role.reader[0].name, null)
}

output "iam_reader_policy_arn" {
  description = "ARN of the read-only managed policy"
  value       = try(aws_iam_policy.reader[0].arn, null)
}

output "iam_reader_instance_profile_name" {
  description = "Name of the read-only role's EC2 instance profile, if created"
  value       = try(aws_iam_instance_profile.reader[0].name, null)
}
