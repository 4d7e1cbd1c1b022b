# ---- Consul: the document and the daemon's keys ----

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

variable "state_key" {
  description = "Consul KV key the lock holder keeps its crash-loop backoff and deleted registrations in, so a restart or a new leader carries them on (the daemon's RUNNER_SCALER_STATE_KEY)."
  type        = string
  default     = "runners/state"
}

variable "config_file" {
  description = "The example document seed_config writes to config_key when that key does not exist yet."
  type        = string
  default     = "runners-config.json"
}

variable "seed_config" {
  description = "Write config_file to config_key. Only for the first apply on a cluster without a document: the plan fails if the key already holds one. Set it back to false afterwards; the key stays (consul.tf)."
  type        = bool
  default     = false
}

# ---- Nomad: namespaces and the daemon's job ----

variable "daemon_namespace" {
  description = "Nomad namespace of the runner-scaler service job. Only operators may submit jobs here: whoever can register a job with the daemon's id and task name in it receives the daemon's identities."
  type        = string
  default     = "runner-scaler"
}

variable "create_daemon_namespace" {
  description = "Create daemon_namespace (false: it exists already)."
  type        = bool
  default     = true
}

variable "daemon_job_id" {
  description = "Nomad job id of the runner-scaler service job (nomad/runner-scaler.nomad.hcl)."
  type        = string
  default     = "runner-scaler"
}

variable "daemon_group" {
  description = "Group name of the daemon's task in its job (nomad/runner-scaler.nomad.hcl); the Nomad ACL policy is attached to this group's task only."
  type        = string
  default     = "scaler"
}

variable "daemon_task" {
  description = "Task name of the daemon in its job (nomad/runner-scaler.nomad.hcl)."
  type        = string
  default     = "runner-scaler"
}

variable "daemon_nodes" {
  description = "Node names the daemon's job may run on (at least one; two or more let a standby run, or let Nomad replace a lost copy elsewhere). The Consul policy lets the daemon create and destroy sessions on exactly these nodes (consul.tf) and the job is pinned to them: pass the same list to the daemon's job as its daemon_nodes variable (`terraform output -json daemon_nodes`). Consul creates the lock session against its local agent's node name (`node_name`), the job is placed by the Nomad client's node name (`name`): both default to the hostname, so on each of these hosts the two must be configured alike."
  type        = list(string)

  validation {
    # The daemon's job matches ${node.unique.name} with set_contains_any, which splits its value
    # on commas (hashicorp/nomad scheduler/feasible.go, checkSetContainsAny).
    condition     = length(var.daemon_nodes) > 0 && alltrue([for node in var.daemon_nodes : trimspace(node) == node && node != "" && !strcontains(node, ",")])
    error_message = "daemon_nodes must name at least one node, each without commas or surrounding spaces."
  }
}

variable "daemon_vault_role" {
  description = "Vault JWT role the daemon's task logs in with (the daemon's job variable vault_role, the role of its vault block)."
  type        = string
  default     = "runner-scaler"
}

variable "runner_namespace" {
  description = "Nomad namespace of the app-mode and Forgejo runner parents and their children (the daemon's RUNNER_SCALER_RUNNER_NAMESPACE). No job here holds a Vault role."
  type        = string
  default     = "ci-runners"
}

variable "vault_runner_namespace" {
  description = "Nomad namespace of the vault-mode runner parents, whose prestart task holds a Vault role for an admin token. The daemon may list, read and dispatch here, never submit (nomad.tf). Repos whose parents live here carry \"nomadNamespace\" with this value in the document."
  type        = string
  default     = "ci-runners-vault"
}

variable "create_runner_namespaces" {
  description = "Create runner_namespace and vault_runner_namespace (false: they exist already)."
  type        = bool
  default     = true
}

variable "runner_node_pool" {
  description = "Nomad node pool of the runner nodes: every runner parent job names it (node_pool), and the runner nodes' client configuration sets it. Nomad refuses to register a job in a node pool that does not exist."
  type        = string
  default     = "ci-runners"
}

variable "create_runner_node_pool" {
  description = "Create runner_node_pool (false: it exists already, e.g. made by `nomad node pool apply` or by a runner node registering in it)."
  type        = bool
  default     = true
}

# ---- Workload identity: how Vault and Consul trust Nomad's JWTs ----

variable "nomad_jwks_url" {
  description = "Nomad's JWKS endpoint, where Vault and Consul fetch the keys that sign workload identities; used only when this configuration creates the JWT backend or the Consul auth method. HTTPS: a plain-HTTP URL lets anyone on the path substitute keys and mint any identity. Its host must be a name in the Nomad agents' certificate that Vault's and Consul's servers resolve, and the agents must not require client certificates on HTTPS (tls.verify_https_client = false): neither Vault nor Consul presents one."
  type        = string
  # server.global.nomad is a name `nomad tls cert create -server` puts in every server
  # certificate (with localhost and 127.0.0.1; hashicorp/nomad command/tls_cert_create.go,
  # recordPreparation), so the certificate check passes without -additional-dnsname. It is not
  # in any DNS: Vault's and Consul's servers must resolve it to Nomad agents (a hosts entry or
  # a DNS record), or set a name of your own that the certificate carries.
  default = "https://server.global.nomad:4646/.well-known/jwks.json"

  validation {
    condition     = startswith(var.nomad_jwks_url, "https://")
    error_message = "nomad_jwks_url must be an https:// URL."
  }
}

variable "jwks_ca_pem" {
  description = "PEM bundle of the CA that signed the certificate served at nomad_jwks_url (Nomad's own TLS CA, usually). Empty: the system roots of Vault and Consul."
  type        = string
  default     = ""
}

variable "vault_jwt_backend_path" {
  description = "Vault auth mount Nomad workload identities log in through (`nomad setup vault` creates jwt-nomad; the Nomad client's vault.jwt_auth_backend_path names it)."
  type        = string
  default     = "jwt-nomad"
}

variable "create_vault_jwt_backend" {
  description = "Create the JWT auth mount at vault_jwt_backend_path (false: `nomad setup vault` or an earlier setup made it)."
  type        = bool
  default     = false
}

variable "consul_auth_method" {
  description = "Consul auth method Nomad task identities log in through: the Nomad agents' consul.task_auth_method (default nomad-workloads, the method `nomad setup consul` creates: hashicorp/nomad command/setup_consul.go)."
  type        = string
  default     = "nomad-workloads"
}

variable "create_consul_auth_method" {
  description = "Create the JWT auth method named consul_auth_method (false: it exists already)."
  type        = bool
  default     = false
}

# ---- Vault: the KV v2 mount and the secrets' paths ----

variable "vault_kv_mount" {
  description = "KV v2 mount holding the secrets (the daemon's VAULT_MOUNT)."
  type        = string
  default     = "secret"
}

variable "create_vault_kv_mount" {
  description = "Create a KV v2 mount at vault_kv_mount (false: it exists already)."
  type        = bool
  default     = false
}

variable "github_app_vault_path" {
  description = "Path under vault_kv_mount of the GitHub App's secret: fields app_id and private_key (PEM), optional installation_id."
  type        = string
  default     = "runner-scaler/github-app"
}

variable "daemon_secret_paths" {
  description = "Paths under vault_kv_mount the daemon reads, field `token` at each: every vault-mode repo's `vaultPath` (its polling token) and every Forgejo repo's `vaultPath` (its API token and the `url` it is for). Exact paths: never a registerVaultPath, never a prefix or glob."
  type        = list(string)
  default     = ["github/moat-poll", "forgejo/scaler"]

  # Vault reads `*` at the end of a policy path and `+` in a segment as globs: one such entry
  # could cover an admin token's path, which the daemon must never read.
  validation {
    condition = alltrue([
      for path in var.daemon_secret_paths :
      can(regex("^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$", path)) && !contains(split("/", path), "..") && !contains(split("/", path), ".")
    ])
    error_message = "Each daemon_secret_paths entry is one exact secret path, e.g. \"github/moat-poll\": no *, +, leading or trailing /, empty, . or .. segment."
  }
}

variable "nomad_vault_children_cleanup" {
  description = "Grant the daemon purge-job in vault_runner_namespace, so that it purges dead vault-mode children and stops unplaced surplus ones (start it with --vault-children-cleanup, the job variable vault_children_cleanup). Only where every Nomad server runs 1.11.2 or later: older servers refuse a policy naming purge-job, and submit-job, the older way, would let the daemon register a job under the admin token's Vault role."
  type        = bool
  default     = false
}

variable "vault_mode_runners" {
  description = "One entry per vault-mode runner parent job, keyed by the Vault role its prestart task logs in with: the parent's job id, the name of the task holding the vault block, and the repo's `registerVaultPath` (under vault_kv_mount, field `token`: the admin token). The role is bound to vault_runner_namespace, that job id and that task."
  type = map(object({
    job_id        = string
    task          = string
    register_path = string
  }))
  default = {
    "runner-moat" = {
      job_id        = "github-runner-moat-vm"
      task          = "mint"
      register_path = "github/moat-runner"
    }
  }
}
