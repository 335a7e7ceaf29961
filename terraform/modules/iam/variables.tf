variable "create" {
  description = "Whether to create any IAM resource"
  type        = bool
  default     = true
}

variable "name" {
  description = "Name prefix of the roles and policies"
  type        = string
  default     = "stratalog"
}

variable "bucket_arn" {
  description = "ARN of the data bucket"
  type        = string
}

variable "cluster_prefix" {
  description = "Key prefix of the cluster inside the bucket (no leading or trailing slash); access is limited to keys under it"
  type        = string
  default     = "stratalog"

  validation {
    condition     = length(var.cluster_prefix) > 0 && !startswith(var.cluster_prefix, "/") && !endswith(var.cluster_prefix, "/")
    error_message = "The cluster_prefix must be non-empty and have no leading or trailing slash."
  }
}

variable "kms_key_arn" {
  description = "ARN of the KMS key that encrypts the bucket, if SSE-KMS is used; the roles get the key permissions their S3 access needs"
  type        = string
  default     = null
}

variable "trusted_services" {
  description = "Service principals allowed to assume the roles (ECS tasks run the gateways on Fargate, EC2 covers self-managed hosts and Spark clusters)"
  type        = list(string)
  default     = ["ecs-tasks.amazonaws.com", "ec2.amazonaws.com"]
}

variable "trusted_source_account_ids" {
  description = "When non-empty, a service may assume the roles only on behalf of these accounts (aws:SourceAccount), which guards against the confused-deputy problem. EC2 does not send this key, so leave it empty when EC2 is trusted"
  type        = list(string)
  default     = []
}

variable "create_gateway_role" {
  description = "Whether to create the gateway role (read-write on the cluster prefix)"
  type        = bool
  default     = true
}

variable "create_reader_role" {
  description = "Whether to create the read-only role for Spark and other readers"
  type        = bool
  default     = true
}

variable "create_instance_profiles" {
  description = "Whether to create an EC2 instance profile for each role"
  type        = bool
  default     = false
}

variable "role_path" {
  description = "Path of the roles and policies"
  type        = string
  default     = "/"
}

variable "role_permissions_boundary_arn" {
  description = "ARN of a permissions boundary policy for the roles"
  type        = string
  default     = null
}

variable "max_session_duration" {
  description = "Maximum session duration of the roles, in seconds"
  type        = number
  default     = 3600
}

variable "tags" {
  description = "Tags added to every resource"
  type        = map(string)
  default     = {}
}
