locals {
  create = var.create

  ami_id = var.ami_id != null ? var.ami_id : try(nonsensitive(data.aws_ssm_parameter.ami[0].value), null)

  member_names = [for i in range(var.node_count) : "${var.name}-etcd-${i}"]
  member_ips   = aws_network_interface.this[*].private_ip

  initial_cluster = join(",", [
    for i, ip in local.member_ips : "${local.member_names[i]}=http://${ip}:${var.peer_port}"
  ])

  download_url = replace(replace(var.etcd_download_url, "{version}", var.etcd_version), "{arch}", var.etcd_arch)

  endpoints = local.create ? [for ip in local.member_ips : "${ip}:${var.client_port}"] : var.existing_endpoints
}

data "aws_ssm_parameter" "ami" {
  count = local.create && var.ami_id == null ? 1 : 0

  name = var.ami_ssm_parameter
}

# Each member keeps its address in a network interface of its own, so a replaced instance comes
# back with the same peer URL and rejoins the cluster from its data volume.
resource "aws_network_interface" "this" {
  count = local.create ? var.node_count : 0

  subnet_id       = var.subnet_ids[count.index % length(var.subnet_ids)]
  security_groups = var.security_group_ids
  description     = "${local.member_names[count.index]} (etcd member)"

  tags = merge(var.tags, { Name = local.member_names[count.index] })

  lifecycle {
    precondition {
      condition     = length(var.subnet_ids) > 0
      error_message = "Creating the etcd cluster needs at least one subnet in subnet_ids."
    }
  }
}

resource "aws_instance" "this" {
  count = local.create ? var.node_count : 0

  ami                  = local.ami_id
  instance_type        = var.instance_type
  key_name             = var.key_name
  iam_instance_profile = var.iam_instance_profile

  network_interface {
    network_interface_id = aws_network_interface.this[count.index].id
    device_index         = 0
  }

  metadata_options {
    http_endpoint = "enabled"
    http_tokens   = "required"
  }

  root_block_device {
    volume_type = "gp3"
    volume_size = var.root_volume_size
    encrypted   = true
    kms_key_id  = var.kms_key_arn
  }

  user_data = templatefile("${path.module}/templates/user_data.sh.tftpl", {
    member_name         = local.member_names[count.index]
    member_ip           = local.member_ips[count.index]
    initial_cluster     = local.initial_cluster
    cluster_token       = var.name
    client_port         = var.client_port
    peer_port           = var.peer_port
    download_url        = local.download_url
    sha256              = var.etcd_sha256 == null ? "" : var.etcd_sha256
    quota_backend_bytes = var.quota_backend_bytes
  })

  tags        = merge(var.tags, { Name = local.member_names[count.index] })
  volume_tags = merge(var.tags, { Name = "${local.member_names[count.index]}-root" })
}

resource "aws_ebs_volume" "data" {
  count = local.create ? var.node_count : 0

  availability_zone = aws_instance.this[count.index].availability_zone
  size              = var.data_volume_size
  type              = var.data_volume_type
  iops              = var.data_volume_iops
  encrypted         = true
  kms_key_id        = var.kms_key_arn

  tags = merge(var.tags, { Name = "${local.member_names[count.index]}-data" })

  lifecycle {
    # A replaced instance's zone is unknown until it exists; the subnet pins it, so the data
    # volume must not be replaced along with the instance.
    ignore_changes = [availability_zone]
  }
}

resource "aws_volume_attachment" "data" {
  count = local.create ? var.node_count : 0

  device_name                    = "/dev/sdf"
  volume_id                      = aws_ebs_volume.data[count.index].id
  instance_id                    = aws_instance.this[count.index].id
  stop_instance_before_detaching = true
}
