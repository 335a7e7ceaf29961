variable "region" {
  description = "AWS region to deploy into"
  type        = string
  default     = "eu-west-1"
}

variable "name" {
  description = "Name of the cluster"
  type        = string
  default     = "stratalog-demo"
}

variable "vpc_id" {
  description = "ID of an existing VPC"
  type        = string
}

variable "private_subnet_ids" {
  description = "Private subnets (one per availability zone) with a route to S3 and the image registry"
  type        = list(string)
}

variable "public_subnet_ids" {
  description = "Public subnets for an internet-facing load balancer; empty keeps the load balancer internal"
  type        = list(string)
  default     = []
}

variable "allowed_cidr_blocks" {
  description = "IPv4 CIDR blocks of the Kafka clients"
  type        = list(string)
  default     = ["10.0.0.0/8"]
}

variable "container_image" {
  description = "Gateway image (for example <account>.dkr.ecr.<region>.amazonaws.com/stratalog:<tag>)"
  type        = string
  default     = "stratalog:latest"
}

variable "bucket_name" {
  description = "Name of the data bucket; null lets AWS derive a unique one"
  type        = string
  default     = null
}

variable "advertised_host" {
  description = "DNS name clients use for the load balancer (for example a Route 53 alias); null advertises the load balancer's own name"
  type        = string
  default     = null
}

variable "etcd_existing_endpoints" {
  description = "Endpoints (host:port) of an existing etcd cluster; empty creates a 3-node cluster"
  type        = list(string)
  default     = []
}

variable "etcd_ami_id" {
  description = "AMI of the etcd members; null looks up the latest Amazon Linux 2023 through SSM"
  type        = string
  default     = null
}

variable "aws_endpoint_url" {
  description = "Test hook: one endpoint URL for every AWS service the stack uses (an AWS emulator); null talks to AWS"
  type        = string
  default     = null
}

variable "skip_aws_checks" {
  description = "Test hook: skip the provider's credential, region and account checks, which an emulator cannot answer"
  type        = bool
  default     = false
}

variable "security_protocol" {
  description = "SASL_SSL (TLS at the load balancer), SASL_PLAINTEXT or PLAINTEXT"
  type        = string
  default     = "SASL_SSL"
}

variable "tls_certificate_arn" {
  description = "ACM certificate for advertised_host, needed for SASL_SSL"
  type        = string
  default     = null
}
