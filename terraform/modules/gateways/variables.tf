variable "create" {
  description = "Whether to create the gateways and their load balancer"
  type        = bool
  default     = true
}

variable "name" {
  description = "Name prefix of the gateway resources"
  type        = string
  default     = "stratalog"
}

variable "gateway_count" {
  description = "Number of gateways; each runs as its own ECS service with its own broker id and listener port"
  type        = number
  default     = 3

  validation {
    condition     = var.gateway_count >= 1 && floor(var.gateway_count) == var.gateway_count
    error_message = "The gateway_count must be a whole number of at least 1."
  }
}

variable "broker_id_start" {
  description = "Broker id of the first gateway; gateway i gets broker_id_start + i"
  type        = number
  default     = 0
}

variable "container_image" {
  description = "Gateway image: the image built from infra/Dockerfile (`docker build -f infra/Dockerfile -t stratalog:latest .`), pushed to a registry the tasks can pull from, such as ECR"
  type        = string
  default     = "stratalog:latest"
}

variable "cpu_architecture" {
  description = "CPU architecture of the tasks (X86_64 or ARM64), matching the image"
  type        = string
  default     = "X86_64"

  validation {
    condition     = contains(["X86_64", "ARM64"], var.cpu_architecture)
    error_message = "The cpu_architecture must be X86_64 or ARM64."
  }
}

variable "cpu" {
  description = "Fargate CPU units of each gateway task"
  type        = number
  default     = 1024
}

variable "memory" {
  description = "Memory of each gateway task, in MiB"
  type        = number
  default     = 2048
}

variable "ephemeral_storage_size" {
  description = "Task storage for active segments and the read cache, in GiB (21 to 200); null keeps Fargate's 20 GiB"
  type        = number
  default     = null

  validation {
    condition     = var.ephemeral_storage_size == null || try(var.ephemeral_storage_size >= 21 && var.ephemeral_storage_size <= 200, false)
    error_message = "The ephemeral_storage_size must be null or between 21 and 200."
  }
}

variable "coordinator_url" {
  description = "Value of `--coordinator`, for example etcd://10.0.1.10:2379,10.0.2.10:2379"
  type        = string
  default     = null
}

variable "object_store_url" {
  description = "Value of `--object-store`, s3://<bucket>/<prefix>"
  type        = string
  default     = null
}

variable "extra_args" {
  description = "Arguments appended to every gateway's `stratalog serve` command"
  type        = list(string)
  default     = []
}

variable "environment" {
  description = "Extra environment variables of the gateway containers (for example STRATALOG_* settings)"
  type        = map(string)
  default     = {}
}

variable "kafka_port" {
  description = "Port the gateways listen on for Kafka clients inside their tasks"
  type        = number
  default     = 9092
}

variable "metrics_port" {
  description = "Port of the gateways' metrics and health endpoints (/metrics, /readyz)"
  type        = number
  default     = 9644
}

variable "listener_port_start" {
  description = "Load balancer port of the first gateway; gateway i is advertised on listener_port_start + i"
  type        = number
  default     = 9092
}

variable "advertised_host" {
  description = "Host name clients use to reach the load balancer (for example a Route 53 alias); null advertises the load balancer's own DNS name"
  type        = string
  default     = null
}

variable "vpc_id" {
  description = "ID of the VPC of the target groups"
  type        = string
  default     = null
}

variable "subnet_ids" {
  description = "Subnets of the gateway tasks"
  type        = list(string)
  default     = []
}

variable "security_group_ids" {
  description = "Security groups of the gateway tasks"
  type        = list(string)
  default     = []
}

variable "assign_public_ip" {
  description = "Whether tasks get a public IP (only for public subnets without a NAT gateway)"
  type        = bool
  default     = false
}

variable "lb_internal" {
  description = "Whether the network load balancer is internal (reachable from the VPC and peered networks only)"
  type        = bool
  default     = true
}

variable "lb_subnet_ids" {
  description = "Subnets of the network load balancer (public ones for an internet-facing load balancer); null uses `subnet_ids`"
  type        = list(string)
  default     = null
}

variable "lb_security_group_ids" {
  description = "Security groups of the network load balancer"
  type        = list(string)
  default     = []
}

variable "deregistration_delay" {
  description = "Seconds a stopping gateway keeps its connections before the target group drops it"
  type        = number
  default     = 30
}

variable "health_check_interval" {
  description = "Seconds between load balancer health checks of /readyz"
  type        = number
  default     = 10
}

variable "health_check_grace_period" {
  description = "Seconds after a task starts during which failed health checks do not replace it"
  type        = number
  default     = 60
}

variable "create_cluster" {
  description = "Whether to create an ECS cluster; when false, `cluster_arn` names an existing one"
  type        = bool
  default     = true
}

variable "cluster_arn" {
  description = "ARN of an existing ECS cluster, used when `create_cluster` is false"
  type        = string
  default     = null
}

variable "container_insights" {
  description = "Whether to enable CloudWatch Container Insights on the created cluster"
  type        = bool
  default     = false
}

variable "task_role_arn" {
  description = "ARN of the role the gateways run as (the iam module's gateway role)"
  type        = string
  default     = null
}

variable "create_execution_role" {
  description = "Whether to create the task execution role that pulls the image and writes logs"
  type        = bool
  default     = true
}

variable "execution_role_arn" {
  description = "ARN of an existing task execution role, used when `create_execution_role` is false"
  type        = string
  default     = null
}

variable "log_retention_in_days" {
  description = "Days CloudWatch keeps the gateways' logs"
  type        = number
  default     = 30
}

variable "log_kms_key_arn" {
  description = "KMS key encrypting the log group; null uses CloudWatch's own encryption"
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags added to every resource"
  type        = map(string)
  default     = {}
}

variable "security_protocol" {
  description = "How clients reach the gateways: SASL_SSL (TLS at the load balancer with tls_certificate_arn, SCRAM or PLAIN users), SASL_PLAINTEXT (SASL without TLS, for private networks) or PLAINTEXT (no authentication at all)"
  type        = string
  default     = "SASL_SSL"

  validation {
    condition     = contains(["SASL_SSL", "SASL_PLAINTEXT", "PLAINTEXT"], var.security_protocol)
    error_message = "The security_protocol must be SASL_SSL, SASL_PLAINTEXT or PLAINTEXT."
  }
}

variable "tls_certificate_arn" {
  description = "ACM certificate of the load balancer's TLS listeners (needed for SASL_SSL); its name should match advertised_host"
  type        = string
  default     = null
}

variable "tls_policy" {
  description = "TLS security policy of the load balancer's TLS listeners"
  type        = string
  default     = "ELBSecurityPolicy-TLS13-1-2-2021-06"
}

variable "acls_enabled" {
  description = "Enforce Kafka ACLs (with SASL): only admin_user, a super user, may do anything until ACLs grant more"
  type        = bool
  default     = true
}

variable "admin_user" {
  description = "SCRAM user each gateway creates at start, with the password the module keeps in Secrets Manager; a super user when ACLs are on"
  type        = string
  default     = "admin"
}
