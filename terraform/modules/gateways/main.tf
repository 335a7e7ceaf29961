data "aws_region" "current" {}

data "aws_partition" "current" {}

locals {
  create = var.create

  gateway_names  = [for i in range(var.gateway_count) : "${var.name}-gateway-${i}"]
  listener_ports = [for i in range(var.gateway_count) : var.listener_port_start + i]
  broker_ids     = [for i in range(var.gateway_count) : var.broker_id_start + i]

  lb_dns_name     = try(aws_lb.this[0].dns_name, null)
  advertised_host = var.advertised_host != null ? var.advertised_host : local.lb_dns_name
  advertised_addresses = local.create ? [
    for port in local.listener_ports : "${local.advertised_host}:${port}"
  ] : []

  cluster_arn        = var.create_cluster ? try(aws_ecs_cluster.this[0].arn, null) : var.cluster_arn
  execution_role_arn = var.create_execution_role ? try(aws_iam_role.execution[0].arn, null) : var.execution_role_arn
  log_group_name     = "/ecs/${var.name}/gateways"

  environment = [
    for k, v in merge({ AWS_REGION = data.aws_region.current.name }, var.environment) : { name = k, value = v }
  ]

  # With SASL the gateway listens for SASL_PLAINTEXT; for SASL_SSL the load balancer adds TLS.
  sasl               = var.security_protocol != "PLAINTEXT"
  lb_tls             = var.security_protocol == "SASL_SSL"
  admin_password_env = "STRATALOG_ADMIN_PASSWORD"
  acl_args = local.sasl && var.acls_enabled ? [
    "--set", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "--set", "super.users=User:${var.admin_user}",
  ] : []
  serve_args = [
    for i in range(local.create ? var.gateway_count : 0) : concat(
      [
        "serve",
        "--listen", "0.0.0.0:${var.kafka_port}",
        "--http", "0.0.0.0:${var.metrics_port}",
        "--data-dir", "/var/lib/stratalog",
        "--advertised", local.advertised_addresses[i],
        "--coordinator", coalesce(var.coordinator_url, "unset"),
        "--object-store", coalesce(var.object_store_url, "unset"),
        "--broker-id", tostring(local.broker_ids[i]),
      ],
      local.sasl ? [
        "--set", "listeners=SASL_PLAINTEXT://0.0.0.0:${var.kafka_port}",
        "--set", "advertised.listeners=SASL_PLAINTEXT://${local.advertised_addresses[i]}",
      ] : [],
      local.acl_args,
      var.extra_args,
    )
  ]
  # With SASL the container first (re)sets the admin user's SCRAM credential from the secret,
  # then becomes the gateway: a shell line of single-quoted words.
  sasl_commands = [
    for args in local.serve_args : join(" ", concat(
      ["printf '%s' \"$STRATALOG_ADMIN_PASSWORD\" | stratalog users add", "'${replace(var.admin_user, "'", "'\\''")}'",
      "--password-file - --coordinator", "'${coalesce(var.coordinator_url, "unset")}'", "&& exec stratalog"],
      [for a in args : "'${replace(a, "'", "'\\''")}'"],
    ))
  ]
}

################################################################################
# The admin user's password, generated once and kept in Secrets Manager
################################################################################

data "aws_secretsmanager_random_password" "admin" {
  count = local.create && local.sasl ? 1 : 0

  password_length     = 32
  exclude_punctuation = true
}

resource "aws_secretsmanager_secret" "admin" {
  count = local.create && local.sasl ? 1 : 0

  name_prefix = "${var.name}-admin-"
  description = "Password of the Stratalog SCRAM user ${var.admin_user}"

  tags = var.tags
}

resource "aws_secretsmanager_secret_version" "admin" {
  count = local.create && local.sasl ? 1 : 0

  secret_id     = aws_secretsmanager_secret.admin[0].id
  secret_string = data.aws_secretsmanager_random_password.admin[0].random_password

  # Generated once: a later plan's new random value must not replace the password in use.
  lifecycle {
    ignore_changes = [secret_string]
  }
}

################################################################################
# Logs
################################################################################

resource "aws_cloudwatch_log_group" "this" {
  count = local.create ? 1 : 0

  name              = local.log_group_name
  retention_in_days = var.log_retention_in_days
  kms_key_id        = var.log_kms_key_arn

  tags = var.tags
}

################################################################################
# ECS cluster and task execution role
################################################################################

resource "aws_ecs_cluster" "this" {
  count = local.create && var.create_cluster ? 1 : 0

  name = var.name

  setting {
    name  = "containerInsights"
    value = var.container_insights ? "enabled" : "disabled"
  }

  tags = var.tags
}

data "aws_iam_policy_document" "execution_assume" {
  count = local.create && var.create_execution_role ? 1 : 0

  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "execution" {
  count = local.create && var.create_execution_role ? 1 : 0

  name_prefix        = "${var.name}-exec-"
  description        = "Pulls the Stratalog gateway image and writes its logs"
  assume_role_policy = data.aws_iam_policy_document.execution_assume[0].json

  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "execution" {
  count = local.create && var.create_execution_role ? 1 : 0

  role       = aws_iam_role.execution[0].name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy"
}

data "aws_iam_policy_document" "admin_secret" {
  count = local.create && var.create_execution_role && local.sasl ? 1 : 0

  statement {
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [aws_secretsmanager_secret.admin[0].arn]
  }
}

resource "aws_iam_role_policy" "admin_secret" {
  count = local.create && var.create_execution_role && local.sasl ? 1 : 0

  name_prefix = "admin-secret-"
  role        = aws_iam_role.execution[0].id
  policy      = data.aws_iam_policy_document.admin_secret[0].json
}

################################################################################
# Network load balancer: one listener port and one target group per gateway
################################################################################

resource "aws_lb" "this" {
  count = local.create ? 1 : 0

  name_prefix        = substr(var.name, 0, 6)
  load_balancer_type = "network"
  internal           = var.lb_internal
  subnets            = var.lb_subnet_ids != null ? var.lb_subnet_ids : var.subnet_ids
  security_groups    = var.lb_security_group_ids

  # Each listener has a single target in a single zone, so every load balancer node must be
  # able to forward to it whatever zone the client's DNS answer pointed at.
  enable_cross_zone_load_balancing = true

  tags = merge(var.tags, { Name = "${var.name}-gateways" })
}

resource "aws_lb_target_group" "this" {
  count = local.create ? var.gateway_count : 0

  name_prefix          = "gw${count.index}-"
  port                 = var.kafka_port
  protocol             = "TCP"
  target_type          = "ip"
  vpc_id               = var.vpc_id
  deregistration_delay = var.deregistration_delay

  # Traffic arrives from the load balancer's addresses, which the gateway security group admits
  # by referencing the load balancer's group.
  preserve_client_ip = "false"

  health_check {
    protocol            = "HTTP"
    port                = tostring(var.metrics_port)
    path                = "/readyz"
    matcher             = "200"
    interval            = var.health_check_interval
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  tags = merge(var.tags, { Name = local.gateway_names[count.index] })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_lb_listener" "this" {
  count = local.create ? var.gateway_count : 0

  load_balancer_arn = aws_lb.this[0].arn
  port              = local.listener_ports[count.index]
  protocol          = local.lb_tls ? "TLS" : "TCP"
  certificate_arn   = local.lb_tls ? var.tls_certificate_arn : null
  ssl_policy        = local.lb_tls ? var.tls_policy : null

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.this[count.index].arn
  }

  tags = var.tags

  lifecycle {
    precondition {
      condition     = !local.lb_tls || var.tls_certificate_arn != null
      error_message = "security_protocol SASL_SSL needs tls_certificate_arn (an ACM certificate for advertised_host), or choose SASL_PLAINTEXT or PLAINTEXT."
    }
  }
}

################################################################################
# One task definition and one service per gateway: each has its own broker id and address
################################################################################

resource "aws_ecs_task_definition" "this" {
  count = local.create ? var.gateway_count : 0

  family                   = local.gateway_names[count.index]
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.cpu
  memory                   = var.memory
  execution_role_arn       = local.execution_role_arn
  task_role_arn            = var.task_role_arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = var.cpu_architecture
  }

  dynamic "ephemeral_storage" {
    for_each = var.ephemeral_storage_size == null ? [] : [var.ephemeral_storage_size]

    content {
      size_in_gib = ephemeral_storage.value
    }
  }

  container_definitions = jsonencode([
    {
      name       = "gateway"
      image      = var.container_image
      essential  = true
      entryPoint = local.sasl ? ["sh", "-c"] : ["stratalog"]
      command    = local.sasl ? [local.sasl_commands[count.index]] : local.serve_args[count.index]
      secrets = local.sasl ? [
        { name = local.admin_password_env, valueFrom = aws_secretsmanager_secret.admin[0].arn },
      ] : []
      portMappings = [
        { name = "kafka", containerPort = var.kafka_port, protocol = "tcp" },
        { name = "metrics", containerPort = var.metrics_port, protocol = "tcp" },
      ]
      environment = local.environment
      ulimits = [
        { name = "nofile", softLimit = 65536, hardLimit = 65536 },
      ]
      # Time for a final WAL flush and leadership hand-off after SIGTERM.
      stopTimeout = 30
      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.this[0].name
          awslogs-region        = data.aws_region.current.name
          awslogs-stream-prefix = local.gateway_names[count.index]
        }
      }
    }
  ])

  tags = merge(var.tags, { Name = local.gateway_names[count.index] })

  lifecycle {
    precondition {
      condition     = var.coordinator_url != null && var.object_store_url != null
      error_message = "The gateways need coordinator_url and object_store_url."
    }
  }
}

resource "aws_ecs_service" "this" {
  count = local.create ? var.gateway_count : 0

  name                              = local.gateway_names[count.index]
  cluster                           = local.cluster_arn
  task_definition                   = aws_ecs_task_definition.this[count.index].arn
  launch_type                       = "FARGATE"
  desired_count                     = 1
  health_check_grace_period_seconds = var.health_check_grace_period
  enable_ecs_managed_tags           = true
  propagate_tags                    = "SERVICE"

  # Two tasks with the same broker id must never run at once: stop the old task before the new one.
  deployment_minimum_healthy_percent = 0
  deployment_maximum_percent         = 100

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = var.security_group_ids
    assign_public_ip = var.assign_public_ip
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.this[count.index].arn
    container_name   = "gateway"
    container_port   = var.kafka_port
  }

  tags = merge(var.tags, { Name = local.gateway_names[count.index] })

  depends_on = [aws_lb_listener.this]
}
