variable "config_key" {
  description = "Consul KV key of the runner-scaler document (the daemon's RUNNER_SCALER_CONFIG_KEY)."
  type        = string
  default     = "runners/config"
}

variable "pause_key" {
  description = "Consul KV key an operator writes to pause every dispatch (the daemon's RUNNER_SCALER_PAUSE_KEY)."
  type        = string
  default     = "runners/paused"
}

variable "leader_key" {
  description = "Consul KV key of the leader lock (the daemon's RUNNER_SCALER_LEADER_KEY)."
  type        = string
  default     = "runners/leader"
}

variable "config_file" {
  description = "The document written to config_key on first apply; later edits are made in Consul and not reverted (see consul.tf)."
  type        = string
  default     = "runners-config.json"
}

variable "daemon_namespace" {
  description = "Nomad namespace of the runner-scaler service job."
  type        = string
  default     = "default"
}

variable "daemon_job_id" {
  description = "Nomad job id of the runner-scaler service job (nomad/runner-scaler.nomad.hcl)."
  type        = string
  default     = "runner-scaler"
}

variable "runner_namespace" {
  description = "Nomad namespace the runner parent jobs and their children live in."
  type        = string
  default     = "ci-runners"
}

variable "nomad_jwks_url" {
  description = "Where Vault fetches the keys that sign Nomad workload identities."
  type        = string
  default     = "http://nomad.service.consul:4646/.well-known/jwks.json"
}
