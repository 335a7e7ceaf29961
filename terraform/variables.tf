variable "name" {
  description = "Name of the Stratalog cluster, used as the prefix of every resource name"
  type        = string
  default     = "stratalog"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,30}$", var.name))
    error_message = "The name must start with a lowercase letter and hold at most 31 lowercase letters, digits and hyphens."
  }
}

variable "tags" {
  description = "Tags added to every resource"
  type        = map(string)
  default     = {}
}

################################################################################
# Bucket
################################################################################

variable "bucket_name" {
  description = "Name of the data bucket; null lets AWS derive a unique name from `name`"
  type        = string
  default     = null
}

variable "cluster_prefix" {
  description = "Key prefix of the cluster inside the bucket; null uses `name`"
  type        = string
  default     = null
}

variable "bucket_force_destroy" {
  description = "Whether `terraform destroy` may delete the bucket while it still holds data"
  type        = bool
  default     = false
}

variable "kms_key_arn" {
  description = "KMS key for SSE-KMS on the bucket (the roles get matching key permissions); null uses SSE-S3"
  type        = string
  default     = null
}

variable "abort_incomplete_multipart_upload_days" {
  description = "Days after which incomplete multipart uploads are aborted"
  type        = number
  default     = 1
}

variable "segment_transition_days" {
  description = "Days after which sealed segments move to `segment_transition_storage_class`; null disables the transition"
  type        = number
  default     = null
}

variable "segment_transition_storage_class" {
  description = "Storage class old segments move to"
  type        = string
  default     = "STANDARD_IA"
}

################################################################################
# IAM
################################################################################

variable "create_reader_role" {
  description = "Whether to create the read-only role for Spark"
  type        = bool
  default     = true
}

variable "role_permissions_boundary_arn" {
  description = "ARN of a permissions boundary for the created roles"
  type        = string
  default     = null
}

################################################################################
# Network
################################################################################

variable "vpc_id" {
  description = "ID of the VPC to deploy into"
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets of the gateways and etcd members, ideally one per availability zone; they need a route to S3 (NAT or gateway endpoint) and to the image registry"
  type        = list(string)
}

variable "lb_subnet_ids" {
  description = "Subnets of the network load balancer (public ones when `lb_internal` is false); null uses `subnet_ids`"
  type        = list(string)
  default     = null
}

variable "lb_internal" {
  description = "Whether the load balancer in front of the gateways is internal"
  type        = bool
  default     = true
}

variable "allowed_cidr_blocks" {
  description = "IPv4 CIDR blocks of the Kafka clients allowed to reach the gateways"
  type        = list(string)
  default     = []
}

variable "metrics_allowed_cidr_blocks" {
  description = "IPv4 CIDR blocks allowed to scrape the gateways' metrics port"
  type        = list(string)
  default     = []
}

################################################################################
# etcd
################################################################################

variable "create_etcd" {
  description = "Whether to create a 3-node etcd cluster; when false, `etcd_existing_endpoints` is used"
  type        = bool
  default     = true
}

variable "etcd_existing_endpoints" {
  description = "Client endpoints (host:port) of an existing etcd cluster, used when `create_etcd` is false"
  type        = list(string)
  default     = []
}

variable "etcd_node_count" {
  description = "Number of etcd members (odd)"
  type        = number
  default     = 3
}

variable "etcd_ami_id" {
  description = "AMI of the etcd members; null uses the latest Amazon Linux 2023"
  type        = string
  default     = null
}

variable "etcd_instance_type" {
  description = "Instance type of the etcd members"
  type        = string
  default     = "t3.small"
}

variable "etcd_data_volume_size" {
  description = "Size of each etcd member's data volume, in GiB"
  type        = number
  default     = 20
}

variable "etcd_version" {
  description = "etcd release installed on the members"
  type        = string
  default     = "3.5.17"
}

variable "etcd_key_name" {
  description = "EC2 key pair of the etcd members; null disables key-based SSH"
  type        = string
  default     = null
}

################################################################################
# Gateways
################################################################################

variable "gateway_count" {
  description = "Number of gateways"
  type        = number
  default     = 3
}

variable "container_image" {
  description = "Gateway image built from infra/Dockerfile and pushed where ECS can pull it (for example an ECR repository URI with a tag)"
  type        = string
  default     = "stratalog:latest"
}

variable "gateway_cpu" {
  description = "Fargate CPU units of each gateway"
  type        = number
  default     = 1024
}

variable "gateway_memory" {
  description = "Memory of each gateway, in MiB"
  type        = number
  default     = 2048
}

variable "gateway_ephemeral_storage_size" {
  description = "Task storage of each gateway, in GiB (21 to 200); null keeps Fargate's default"
  type        = number
  default     = null
}

variable "gateway_extra_args" {
  description = "Arguments appended to every `stratalog serve` command"
  type        = list(string)
  default     = []
}

variable "gateway_environment" {
  description = "Extra environment variables of the gateways"
  type        = map(string)
  default     = {}
}

variable "listener_port_start" {
  description = "Load balancer port of the first gateway; gateway i listens on listener_port_start + i"
  type        = number
  default     = 9092
}

variable "advertised_host" {
  description = "Host name that clients resolve to the load balancer; null advertises its DNS name"
  type        = string
  default     = null
}

variable "log_retention_in_days" {
  description = "Days CloudWatch keeps the gateways' logs"
  type        = number
  default     = 30
}

variable "security_protocol" {
  description = "How clients reach the gateways: SASL_SSL (TLS at the load balancer, SCRAM or PLAIN users), SASL_PLAINTEXT or PLAINTEXT (no authentication)"
  type        = string
  default     = "SASL_SSL"
}

variable "tls_certificate_arn" {
  description = "ACM certificate of the load balancer's TLS listeners, for SASL_SSL"
  type        = string
  default     = null
}

variable "acls_enabled" {
  description = "Enforce Kafka ACLs; the admin user (password in Secrets Manager) is a super user"
  type        = bool
  default     = true
}
