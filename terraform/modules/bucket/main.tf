locals {
  # `bucket` rather than `id`: it is known at plan time whenever the name is given.
  bucket_id      = try(aws_s3_bucket.this[0].bucket, null)
  bucket_arn     = try(aws_s3_bucket.this[0].arn, null)
  segment_prefix = "${var.cluster_prefix}/topics/"

  # Infrequent-access classes bill a 30-day minimum and S3 rejects earlier transitions to them.
  transition_minimum_days = contains(["STANDARD_IA", "ONEZONE_IA"], var.segment_transition_storage_class) ? 30 : 1
}

resource "aws_s3_bucket" "this" {
  count = var.create ? 1 : 0

  bucket        = var.bucket_name
  bucket_prefix = var.bucket_name == null ? var.bucket_name_prefix : null
  force_destroy = var.force_destroy

  tags = var.tags
}

resource "aws_s3_bucket_ownership_controls" "this" {
  count = var.create ? 1 : 0

  bucket = local.bucket_id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "this" {
  count = var.create ? 1 : 0

  bucket = local.bucket_id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  count = var.create ? 1 : 0

  bucket = local.bucket_id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = var.kms_key_arn == null ? "AES256" : "aws:kms"
      kms_master_key_id = var.kms_key_arn
    }
    bucket_key_enabled = var.kms_key_arn == null ? null : var.bucket_key_enabled
  }
}

data "aws_iam_policy_document" "tls_only" {
  count = var.create && var.enforce_tls ? 1 : 0

  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      local.bucket_arn,
      "${local.bucket_arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "this" {
  count = var.create && var.enforce_tls ? 1 : 0

  bucket = local.bucket_id
  policy = data.aws_iam_policy_document.tls_only[0].json

  # S3 answers OperationAborted to concurrent changes of one bucket's policy and access block.
  depends_on = [aws_s3_bucket_public_access_block.this]
}

resource "aws_s3_bucket_lifecycle_configuration" "this" {
  count = var.create ? 1 : 0

  bucket = local.bucket_id

  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"

    filter {
      prefix = ""
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = var.abort_incomplete_multipart_upload_days
    }
  }

  dynamic "rule" {
    for_each = var.segment_transition_days == null ? [] : [var.segment_transition_days]

    content {
      id     = "transition-old-segments"
      status = "Enabled"

      filter {
        prefix = local.segment_prefix
      }

      transition {
        days          = rule.value
        storage_class = var.segment_transition_storage_class
      }
    }
  }

  lifecycle {
    precondition {
      condition     = var.segment_transition_days == null || try(var.segment_transition_days >= local.transition_minimum_days, false)
      error_message = "Transitions to ${var.segment_transition_storage_class} need segment_transition_days of at least ${local.transition_minimum_days}."
    }
  }
}
