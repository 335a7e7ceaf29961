variable "create" {
  description = "Whether to create the bucket and everything attached to it"
  type        = bool
  default     = true
}

variable "bucket_name" {
  description = "Name of the data bucket. When null, AWS derives a unique name from `bucket_name_prefix`"
  type        = string
  default     = null
}

variable "bucket_name_prefix" {
  description = "Prefix of the generated bucket name, used only when `bucket_name` is null"
  type        = string
  default     = "stratalog-"
}

variable "cluster_prefix" {
  description = "Key prefix of the Stratalog cluster inside the bucket (no leading or trailing slash); the object store URL is s3://<bucket>/<cluster_prefix>"
  type        = string
  default     = "stratalog"

  validation {
    condition     = can(regex("^[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*$", var.cluster_prefix))
    error_message = "The cluster_prefix must be one or more path segments of S3-safe characters, without leading, trailing or doubled slashes."
  }
}

variable "force_destroy" {
  description = "Whether `terraform destroy` may delete the bucket while it still holds objects"
  type        = bool
  default     = false
}

variable "enforce_tls" {
  description = "Whether the bucket policy denies every request not made over TLS. Turn it off only for a local S3-compatible endpoint that speaks plain HTTP"
  type        = bool
  default     = true
}

variable "kms_key_arn" {
  description = "ARN of a KMS key for SSE-KMS. When null, objects are encrypted with S3-managed keys (SSE-S3)"
  type        = string
  default     = null
}

variable "bucket_key_enabled" {
  description = "Whether to use an S3 Bucket Key with SSE-KMS, which cuts KMS request costs"
  type        = bool
  default     = true
}

variable "abort_incomplete_multipart_upload_days" {
  description = "Days after which incomplete multipart uploads (left by a gateway that died mid-upload) are aborted"
  type        = number
  default     = 1

  validation {
    condition     = var.abort_incomplete_multipart_upload_days >= 1 && floor(var.abort_incomplete_multipart_upload_days) == var.abort_incomplete_multipart_upload_days
    error_message = "The abort_incomplete_multipart_upload_days must be a whole number of at least 1."
  }
}

variable "segment_transition_days" {
  description = "Days after which sealed segment objects under <cluster_prefix>/topics/ move to `segment_transition_storage_class`. Null disables the transition"
  type        = number
  default     = null

  validation {
    condition     = var.segment_transition_days == null || try(var.segment_transition_days >= 1 && floor(var.segment_transition_days) == var.segment_transition_days, false)
    error_message = "The segment_transition_days must be null or a whole number of at least 1."
  }
}

variable "segment_transition_storage_class" {
  description = "Storage class that old segment objects move to. It must serve reads immediately, so archive classes are not accepted"
  type        = string
  default     = "STANDARD_IA"

  validation {
    condition     = contains(["STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "GLACIER_IR"], var.segment_transition_storage_class)
    error_message = "The segment_transition_storage_class must be one of STANDARD_IA, ONEZONE_IA, INTELLIGENT_TIERING or GLACIER_IR."
  }
}

variable "tags" {
  description = "Tags added to every resource"
  type        = map(string)
  default     = {}
}
