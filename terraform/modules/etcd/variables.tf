variable "create" {
  description = "Whether to create the etcd cluster. When false, `existing_endpoints` names the cluster to use"
  type        = bool
  default     = true
}

variable "existing_endpoints" {
  description = "Client endpoints (host:port) of an existing etcd cluster, used when `create` is false"
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for e in var.existing_endpoints : can(regex("^[A-Za-z0-9.-]+:[0-9]+$", e))])
    error_message = "Every existing_endpoints entry must be host:port, without a scheme."
  }
}

variable "name" {
  description = "Name prefix of the etcd resources"
  type        = string
  default     = "stratalog"
}

variable "node_count" {
  description = "Number of etcd members; odd, so that a majority survives the loss of a minority"
  type        = number
  default     = 3

  validation {
    condition     = var.node_count >= 1 && var.node_count % 2 == 1
    error_message = "The node_count must be an odd number of at least 1."
  }
}

variable "subnet_ids" {
  description = "Private subnets for the members, used round-robin (give one per availability zone)"
  type        = list(string)
  default     = []
}

variable "security_group_ids" {
  description = "Security groups of the members' network interfaces"
  type        = list(string)
  default     = []
}

variable "ami_id" {
  description = "AMI of the members. When null, the latest Amazon Linux 2023 AMI named by `ami_ssm_parameter` is used"
  type        = string
  default     = null
}

variable "ami_ssm_parameter" {
  description = "Public SSM parameter holding the default AMI id; its architecture must match `instance_type` and `etcd_arch`"
  type        = string
  default     = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
}

variable "instance_type" {
  description = "EC2 instance type of the members"
  type        = string
  default     = "t3.small"
}

variable "key_name" {
  description = "EC2 key pair for SSH access; null disables key-based SSH"
  type        = string
  default     = null
}

variable "iam_instance_profile" {
  description = "Instance profile of the members (for example one allowing SSM Session Manager)"
  type        = string
  default     = null
}

variable "root_volume_size" {
  description = "Size of each member's root volume, in GiB"
  type        = number
  default     = 8
}

variable "data_volume_size" {
  description = "Size of each member's persistent data volume, in GiB; keep it well above `quota_backend_bytes`"
  type        = number
  default     = 20
}

variable "data_volume_type" {
  description = "EBS type of the data volumes; etcd is sensitive to fsync latency, so SSD types only"
  type        = string
  default     = "gp3"

  validation {
    condition     = contains(["gp3", "gp2", "io1", "io2"], var.data_volume_type)
    error_message = "The data_volume_type must be one of gp3, gp2, io1 or io2."
  }
}

variable "data_volume_iops" {
  description = "Provisioned IOPS of the data volumes (gp3, io1, io2); null keeps the type's default"
  type        = number
  default     = null
}

variable "kms_key_arn" {
  description = "KMS key for the EBS volumes; null uses the account's default EBS key"
  type        = string
  default     = null
}

variable "etcd_version" {
  description = "etcd release installed on the members"
  type        = string
  default     = "3.5.17"
}

variable "etcd_arch" {
  description = "Architecture of the etcd release (amd64 or arm64), matching the instance type"
  type        = string
  default     = "amd64"

  validation {
    condition     = contains(["amd64", "arm64"], var.etcd_arch)
    error_message = "The etcd_arch must be amd64 or arm64."
  }
}

variable "etcd_download_url" {
  description = "URL of the etcd release tarball; `{version}` and `{arch}` are substituted. Point it at a mirror when the subnets have no internet route"
  type        = string
  default     = "https://github.com/etcd-io/etcd/releases/download/v{version}/etcd-v{version}-linux-{arch}.tar.gz"
}

variable "etcd_sha256" {
  description = "Expected SHA-256 of the release tarball; null skips the check"
  type        = string
  default     = null
}

variable "client_port" {
  description = "Port etcd serves clients on"
  type        = number
  default     = 2379
}

variable "peer_port" {
  description = "Port etcd members talk to each other on"
  type        = number
  default     = 2380
}

variable "quota_backend_bytes" {
  description = "etcd's backend size quota, in bytes (etcd recommends at most 8 GiB)"
  type        = number
  default     = 8589934592
}

variable "tags" {
  description = "Tags added to every resource"
  type        = map(string)
  default     = {}
}
