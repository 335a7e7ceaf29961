variable "create" {
  description = "Whether to create the security groups"
  type        = bool
  default     = true
}

variable "name" {
  description = "Name prefix of the security groups"
  type        = string
  default     = "stratalog"
}

variable "vpc_id" {
  description = "ID of the VPC the security groups belong to"
  type        = string
  default     = null
}

variable "kafka_port" {
  description = "Port the gateways listen on for Kafka clients inside their tasks"
  type        = number
  default     = 9092
}

variable "listener_ports" {
  description = "Ports the load balancer exposes to Kafka clients, one per gateway"
  type        = list(number)
  default     = [9092, 9093, 9094]
}

variable "metrics_port" {
  description = "Port of the gateways' metrics and health endpoints"
  type        = number
  default     = 9644
}

variable "etcd_client_port" {
  description = "Port etcd serves clients on"
  type        = number
  default     = 2379
}

variable "etcd_peer_port" {
  description = "Port etcd members talk to each other on"
  type        = number
  default     = 2380
}

variable "allowed_cidr_blocks" {
  description = "IPv4 CIDR blocks of the Kafka clients allowed to reach the listener ports"
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for cidr in var.allowed_cidr_blocks : can(cidrhost(cidr, 0))])
    error_message = "Every entry of allowed_cidr_blocks must be an IPv4 CIDR block such as 10.0.0.0/16."
  }
}

variable "metrics_allowed_cidr_blocks" {
  description = "IPv4 CIDR blocks allowed to scrape the gateways' metrics port directly (for example the Prometheus subnet). Empty: only the load balancer's health checks reach it"
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for cidr in var.metrics_allowed_cidr_blocks : can(cidrhost(cidr, 0))])
    error_message = "Every entry of metrics_allowed_cidr_blocks must be an IPv4 CIDR block such as 10.0.0.0/16."
  }
}

variable "create_etcd_security_group" {
  description = "Whether to create the etcd security group (false when an existing etcd cluster is used)"
  type        = bool
  default     = true
}

variable "etcd_admin_cidr_blocks" {
  description = "IPv4 CIDR blocks allowed to reach etcd's client port for administration (etcdctl); the gateways always are"
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for cidr in var.etcd_admin_cidr_blocks : can(cidrhost(cidr, 0))])
    error_message = "Every entry of etcd_admin_cidr_blocks must be an IPv4 CIDR block such as 10.0.0.0/16."
  }
}

variable "tags" {
  description = "Tags added to every resource"
  type        = map(string)
  default     = {}
}
