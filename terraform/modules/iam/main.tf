locals {
  create_gateway = var.create && var.create_gateway_role
  create_reader  = var.create && var.create_reader_role

  objects_arn = "${var.bucket_arn}/${var.cluster_prefix}/*"

  # ListBucket is granted on the bucket but only for listings inside the cluster prefix.
  listable_prefixes = [var.cluster_prefix, "${var.cluster_prefix}/*"]
}

data "aws_iam_policy_document" "assume" {
  count = var.create ? 1 : 0

  statement {
    sid     = "TrustedServices"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = var.trusted_services
    }

    dynamic "condition" {
      for_each = length(var.trusted_source_account_ids) > 0 ? [var.trusted_source_account_ids] : []

      content {
        test     = "StringEquals"
        variable = "aws:SourceAccount"
        values   = condition.value
      }
    }
  }
}

################################################################################
# Gateway: read-write on the cluster prefix
################################################################################

data "aws_iam_policy_document" "gateway" {
  count = local.create_gateway ? 1 : 0

  statement {
    sid       = "ListClusterPrefix"
    actions   = ["s3:ListBucket"]
    resources = [var.bucket_arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = local.listable_prefixes
    }
  }

  statement {
    sid = "ReadWriteClusterObjects"
    actions = [
      "s3:GetObject",
      "s3:PutObject",
      "s3:DeleteObject",
      "s3:AbortMultipartUpload",
      "s3:ListMultipartUploadParts",
    ]
    resources = [local.objects_arn]
  }

  dynamic "statement" {
    for_each = var.kms_key_arn == null ? [] : [var.kms_key_arn]

    content {
      sid       = "UseBucketKey"
      actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
      resources = [statement.value]
    }
  }
}

resource "aws_iam_role" "gateway" {
  count = local.create_gateway ? 1 : 0

  name                 = "${var.name}-gateway"
  path                 = var.role_path
  description          = "Stratalog gateways: read-write access to s3 prefix ${var.cluster_prefix}"
  assume_role_policy   = data.aws_iam_policy_document.assume[0].json
  max_session_duration = var.max_session_duration
  permissions_boundary = var.role_permissions_boundary_arn

  tags = var.tags
}

resource "aws_iam_policy" "gateway" {
  count = local.create_gateway ? 1 : 0

  name        = "${var.name}-gateway"
  path        = var.role_path
  description = "Read-write access to the Stratalog cluster prefix ${var.cluster_prefix}"
  policy      = data.aws_iam_policy_document.gateway[0].json

  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "gateway" {
  count = local.create_gateway ? 1 : 0

  role       = aws_iam_role.gateway[0].name
  policy_arn = aws_iam_policy.gateway[0].arn
}

resource "aws_iam_instance_profile" "gateway" {
  count = local.create_gateway && var.create_instance_profiles ? 1 : 0

  name = "${var.name}-gateway"
  path = var.role_path
  role = aws_iam_role.gateway[0].name

  tags = var.tags
}

################################################################################
# Reader: read-only on the cluster prefix, for Spark
################################################################################

data "aws_iam_policy_document" "reader" {
  count = local.create_reader ? 1 : 0

  statement {
    sid       = "ListClusterPrefix"
    actions   = ["s3:ListBucket"]
    resources = [var.bucket_arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = local.listable_prefixes
    }
  }

  statement {
    sid       = "ReadClusterObjects"
    actions   = ["s3:GetObject"]
    resources = [local.objects_arn]
  }

  dynamic "statement" {
    for_each = var.kms_key_arn == null ? [] : [var.kms_key_arn]

    content {
      sid       = "DecryptWithBucketKey"
      actions   = ["kms:Decrypt"]
      resources = [statement.value]
    }
  }
}

resource "aws_iam_role" "reader" {
  count = local.create_reader ? 1 : 0

  name                 = "${var.name}-reader"
  path                 = var.role_path
  description          = "Stratalog readers (Spark): read-only access to s3 prefix ${var.cluster_prefix}"
  assume_role_policy   = data.aws_iam_policy_document.assume[0].json
  max_session_duration = var.max_session_duration
  permissions_boundary = var.role_permissions_boundary_arn

  tags = var.tags
}

resource "aws_iam_policy" "reader" {
  count = local.create_reader ? 1 : 0

  name        = "${var.name}-reader"
  path        = var.role_path
  description = "Read-only access to the Stratalog cluster prefix ${var.cluster_prefix}"
  policy      = data.aws_iam_policy_document.reader[0].json

  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "reader" {
  count = local.create_reader ? 1 : 0

  role       = aws_iam_role.reader[0].name
  policy_arn = aws_iam_policy.reader[0].arn
}

resource "aws_iam_instance_profile" "reader" {
  count = local.create_reader && var.create_instance_profiles ? 1 : 0

  name = "${var.name}-reader"
  path = var.role_path
  role = aws_iam_role.reader[0].name

  tags = var.tags
}
