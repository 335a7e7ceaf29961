locals {
  create_etcd = var.create && var.create_etcd_security_group

  # A security group rule holds one port range and one CIDR, so each (port, CIDR) pair gets its own.
  client_rules = {
    for pair in setproduct(var.listener_ports, var.allowed_cidr_blocks) :
    "${pair[0]}-${pair[1]}" => { port = pair[0], cidr = pair[1] }
  }
}

################################################################################
# Load balancer: Kafka listener ports from the allowed client networks only
################################################################################

resource "aws_security_group" "lb" {
  count = var.create ? 1 : 0

  name_prefix = "${var.name}-lb-"
  description = "Stratalog load balancer: Kafka listener ports from allowed clients"
  vpc_id      = var.vpc_id

  tags = merge(var.tags, { Name = "${var.name}-lb" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "lb_kafka" {
  for_each = var.create ? local.client_rules : {}

  security_group_id = aws_security_group.lb[0].id
  description       = "Kafka clients"
  ip_protocol       = "tcp"
  from_port         = each.value.port
  to_port           = each.value.port
  cidr_ipv4         = each.value.cidr

  tags = var.tags
}

resource "aws_vpc_security_group_egress_rule" "lb_to_gateway_kafka" {
  count = var.create ? 1 : 0

  security_group_id            = aws_security_group.lb[0].id
  description                  = "Forward Kafka traffic to the gateways"
  ip_protocol                  = "tcp"
  from_port                    = var.kafka_port
  to_port                      = var.kafka_port
  referenced_security_group_id = aws_security_group.gateway[0].id

  tags = var.tags
}

resource "aws_vpc_security_group_egress_rule" "lb_to_gateway_metrics" {
  count = var.create ? 1 : 0

  security_group_id            = aws_security_group.lb[0].id
  description                  = "Health checks on the gateways' /readyz"
  ip_protocol                  = "tcp"
  from_port                    = var.metrics_port
  to_port                      = var.metrics_port
  referenced_security_group_id = aws_security_group.gateway[0].id

  tags = var.tags
}

################################################################################
# Gateways: Kafka and health checks from the load balancer, metrics optionally
################################################################################

resource "aws_security_group" "gateway" {
  count = var.create ? 1 : 0

  name_prefix = "${var.name}-gateway-"
  description = "Stratalog gateways"
  vpc_id      = var.vpc_id

  tags = merge(var.tags, { Name = "${var.name}-gateway" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "gateway_kafka_from_lb" {
  count = var.create ? 1 : 0

  security_group_id            = aws_security_group.gateway[0].id
  description                  = "Kafka traffic forwarded by the load balancer"
  ip_protocol                  = "tcp"
  from_port                    = var.kafka_port
  to_port                      = var.kafka_port
  referenced_security_group_id = aws_security_group.lb[0].id

  tags = var.tags
}

resource "aws_vpc_security_group_ingress_rule" "gateway_metrics_from_lb" {
  count = var.create ? 1 : 0

  security_group_id            = aws_security_group.gateway[0].id
  description                  = "Load balancer health checks"
  ip_protocol                  = "tcp"
  from_port                    = var.metrics_port
  to_port                      = var.metrics_port
  referenced_security_group_id = aws_security_group.lb[0].id

  tags = var.tags
}

resource "aws_vpc_security_group_ingress_rule" "gateway_metrics" {
  for_each = var.create ? toset(var.metrics_allowed_cidr_blocks) : toset([])

  security_group_id = aws_security_group.gateway[0].id
  description       = "Metrics scrapers"
  ip_protocol       = "tcp"
  from_port         = var.metrics_port
  to_port           = var.metrics_port
  cidr_ipv4         = each.value

  tags = var.tags
}

resource "aws_vpc_security_group_egress_rule" "gateway_all" {
  count = var.create ? 1 : 0

  security_group_id = aws_security_group.gateway[0].id
  description       = "S3, etcd, the image registry and CloudWatch Logs"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"

  tags = var.tags
}

################################################################################
# etcd: clients only from the gateways, peers only from each other
################################################################################

resource "aws_security_group" "etcd" {
  count = local.create_etcd ? 1 : 0

  name_prefix = "${var.name}-etcd-"
  description = "Stratalog etcd: clients from the gateways, peers from each other"
  vpc_id      = var.vpc_id

  tags = merge(var.tags, { Name = "${var.name}-etcd" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "etcd_client_from_gateway" {
  count = local.create_etcd ? 1 : 0

  security_group_id            = aws_security_group.etcd[0].id
  description                  = "etcd clients: the gateways"
  ip_protocol                  = "tcp"
  from_port                    = var.etcd_client_port
  to_port                      = var.etcd_client_port
  referenced_security_group_id = aws_security_group.gateway[0].id

  tags = var.tags
}

resource "aws_vpc_security_group_ingress_rule" "etcd_peer" {
  count = local.create_etcd ? 1 : 0

  security_group_id            = aws_security_group.etcd[0].id
  description                  = "etcd members: client and peer ports"
  ip_protocol                  = "tcp"
  from_port                    = min(var.etcd_client_port, var.etcd_peer_port)
  to_port                      = max(var.etcd_client_port, var.etcd_peer_port)
  referenced_security_group_id = aws_security_group.etcd[0].id

  tags = var.tags
}

resource "aws_vpc_security_group_ingress_rule" "etcd_admin" {
  for_each = local.create_etcd ? toset(var.etcd_admin_cidr_blocks) : toset([])

  security_group_id = aws_security_group.etcd[0].id
  description       = "etcd administration"
  ip_protocol       = "tcp"
  from_port         = var.etcd_client_port
  to_port           = var.etcd_client_port
  cidr_ipv4         = each.value

  tags = var.tags
}

resource "aws_vpc_security_group_egress_rule" "etcd_all" {
  count = local.create_etcd ? 1 : 0

  security_group_id = aws_security_group.etcd[0].id
  description       = "Package downloads and peers"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"

  tags = var.tags
}
