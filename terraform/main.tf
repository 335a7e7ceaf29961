locals {
  cluster_prefix = var.cluster_prefix != null ? var.cluster_prefix : var.name
  listener_ports = [for i in range(var.gateway_count) : var.listener_port_start + i]
}

module "bucket" {
  source = "./modules/bucket"

  bucket_name                            = var.bucket_name
  bucket_name_prefix                     = "${var.name}-"
  cluster_prefix                         = local.cluster_prefix
  force_destroy                          = var.bucket_force_destroy
  kms_key_arn                            = var.kms_key_arn
  abort_incomplete_multipart_upload_days = var.abort_incomplete_multipart_upload_days
  segment_transition_days                = var.segment_transition_days
  segment_transition_storage_class       = var.segment_transition_storage_class

  tags = var.tags
}

module "iam" {
  source = "./modules/iam"

  name                          = var.name
  bucket_arn                    = module.bucket.s3_bucket_arn
  cluster_prefix                = local.cluster_prefix
  kms_key_arn                   = var.kms_key_arn
  create_reader_role            = var.create_reader_role
  role_permissions_boundary_arn = var.role_permissions_boundary_arn

  tags = var.tags
}

module "security" {
  source = "./modules/security"

  name                        = var.name
  vpc_id                      = var.vpc_id
  listener_ports              = local.listener_ports
  allowed_cidr_blocks         = var.allowed_cidr_blocks
  metrics_allowed_cidr_blocks = var.metrics_allowed_cidr_blocks
  create_etcd_security_group  = var.create_etcd

  tags = var.tags
}

module "etcd" {
  source = "./modules/etcd"

  create             = var.create_etcd
  existing_endpoints = var.etcd_existing_endpoints
  name               = var.name
  node_count         = var.etcd_node_count
  subnet_ids         = var.subnet_ids
  security_group_ids = compact([module.security.security_group_etcd_id])
  ami_id             = var.etcd_ami_id
  instance_type      = var.etcd_instance_type
  key_name           = var.etcd_key_name
  data_volume_size   = var.etcd_data_volume_size
  etcd_version       = var.etcd_version

  tags = var.tags
}

module "gateways" {
  source = "./modules/gateways"

  name                   = var.name
  gateway_count          = var.gateway_count
  container_image        = var.container_image
  cpu                    = var.gateway_cpu
  memory                 = var.gateway_memory
  ephemeral_storage_size = var.gateway_ephemeral_storage_size
  coordinator_url        = module.etcd.etcd_coordinator_url
  object_store_url       = module.bucket.s3_bucket_object_store_url
  extra_args             = var.gateway_extra_args
  environment            = var.gateway_environment
  listener_port_start    = var.listener_port_start
  advertised_host        = var.advertised_host
  security_protocol      = var.security_protocol
  tls_certificate_arn    = var.tls_certificate_arn
  acls_enabled           = var.acls_enabled

  vpc_id                = var.vpc_id
  subnet_ids            = var.subnet_ids
  security_group_ids    = [module.security.security_group_gateway_id]
  lb_internal           = var.lb_internal
  lb_subnet_ids         = var.lb_subnet_ids
  lb_security_group_ids = [module.security.security_group_lb_id]

  task_role_arn         = module.iam.iam_gateway_role_arn
  log_retention_in_days = var.log_retention_in_days

  tags = var.tags
}
