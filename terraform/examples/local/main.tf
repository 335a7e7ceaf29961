locals {
  enforce_tls = var.enforce_tls != null ? var.enforce_tls : startswith(var.s3_endpoint, "https://")
}

provider "aws" {
  region     = var.region
  access_key = var.access_key
  secret_key = var.secret_key

  s3_use_path_style           = true
  skip_credentials_validation = true
  skip_metadata_api_check     = true
  skip_requesting_account_id  = true
  skip_region_validation      = true

  endpoints {
    s3  = var.s3_endpoint
    iam = var.iam_endpoint
    sts = var.sts_endpoint
  }
}

module "bucket" {
  source = "../../modules/bucket"

  bucket_name    = var.bucket_name
  cluster_prefix = var.cluster_prefix
  enforce_tls    = local.enforce_tls
  # A local bucket is scratch space: let destroy remove what the gateway wrote.
  force_destroy = true

  segment_transition_days = 30

  tags = {
    Example = "local"
  }
}

module "iam" {
  source = "../../modules/iam"

  create         = var.create_roles
  name           = var.name
  bucket_arn     = module.bucket.s3_bucket_arn
  cluster_prefix = var.cluster_prefix

  tags = {
    Example = "local"
  }
}
