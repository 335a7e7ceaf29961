provider "aws" {
  region = var.region

  skip_credentials_validation = var.skip_aws_checks
  skip_metadata_api_check     = var.skip_aws_checks
  skip_requesting_account_id  = var.skip_aws_checks
  skip_region_validation      = var.skip_aws_checks
  s3_use_path_style           = var.aws_endpoint_url != null

  dynamic "endpoints" {
    for_each = var.aws_endpoint_url == null ? [] : [var.aws_endpoint_url]

    content {
      cloudwatchlogs = endpoints.value
      ec2            = endpoints.value
      ecs            = endpoints.value
      elbv2          = endpoints.value
      iam            = endpoints.value
      kms            = endpoints.value
      s3             = endpoints.value
      secretsmanager = endpoints.value
      ssm            = endpoints.value
      sts            = endpoints.value
    }
  }

  default_tags {
    tags = {
      Project = "stratalog"
      Example = "complete"
    }
  }
}

module "stratalog" {
  source = "../../"

  name           = var.name
  bucket_name    = var.bucket_name
  cluster_prefix = "prod"

  vpc_id              = var.vpc_id
  subnet_ids          = var.private_subnet_ids
  lb_internal         = length(var.public_subnet_ids) == 0
  lb_subnet_ids       = length(var.public_subnet_ids) == 0 ? null : var.public_subnet_ids
  allowed_cidr_blocks = var.allowed_cidr_blocks

  segment_transition_days = 30

  gateway_count   = 3
  container_image = var.container_image
  advertised_host = var.advertised_host

  # Clients authenticate with SASL over TLS that the load balancer terminates with this
  # certificate; the admin user's password is in the secret named by gateways_admin_secret_arn.
  security_protocol   = var.security_protocol
  tls_certificate_arn = var.tls_certificate_arn

  create_etcd             = length(var.etcd_existing_endpoints) == 0
  etcd_existing_endpoints = var.etcd_existing_endpoints
  etcd_ami_id             = var.etcd_ami_id

  tags = {
    Environment = "demo"
  }
}
