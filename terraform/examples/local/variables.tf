variable "s3_endpoint" {
  description = "URL of the local S3-compatible endpoint"
  type        = string
  default     = "http://127.0.0.1:5000"
}

variable "iam_endpoint" {
  description = "URL of the IAM endpoint; moto serves IAM on the same URL as S3, while MinIO-style stores may not serve IAM at all (set `create_roles = false` then)"
  type        = string
  default     = "http://127.0.0.1:5000"
}

variable "sts_endpoint" {
  description = "URL of the STS endpoint"
  type        = string
  default     = "http://127.0.0.1:5000"
}

variable "region" {
  description = "Region name sent to the endpoint"
  type        = string
  default     = "us-east-1"
}

variable "access_key" {
  description = "Access key accepted by the local endpoint"
  type        = string
  default     = "test"
}

variable "secret_key" {
  description = "Secret key accepted by the local endpoint"
  type        = string
  default     = "test"
  sensitive   = true
}

variable "name" {
  description = "Name prefix of the roles"
  type        = string
  default     = "stratalog-local"
}

variable "bucket_name" {
  description = "Name of the bucket to create"
  type        = string
  default     = "stratalog-local"
}

variable "cluster_prefix" {
  description = "Key prefix of the cluster inside the bucket"
  type        = string
  default     = "dev"
}

variable "enforce_tls" {
  description = "Whether the bucket policy denies requests not made over TLS; null turns it on exactly when `s3_endpoint` is https, since a plain-HTTP endpoint could not be used otherwise"
  type        = bool
  default     = null
}

variable "create_roles" {
  description = "Whether to create the gateway and reader roles"
  type        = bool
  default     = true
}
