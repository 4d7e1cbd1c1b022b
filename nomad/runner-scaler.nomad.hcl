# runner-scaler: the daemon itself, as a service job.
#
# Run it once the namespaces, policies and roles (terraform/), its CA Variable and the secrets
# in Vault exist (README, "Deploying on a real cluster"), with the image you built and the
# nodes Terraform's Consul policy lets it hold its lock from:
#   nomad job run -var image=registry.example.com/runner-scaler:0.1.0 \
#     -var "daemon_nodes=$(terraform -chdir=terraform output -json daemon_nodes)" \
#     -var vault_addr=https://vault.example.com:8200 nomad/runner-scaler.nomad.hcl
# Every address below has an HTTPS default; every name Terraform also knows (namespaces, job
# id, Vault role, KV mount and paths, Consul keys) is a variable with terraform/variables.tf's
# default (tests/deploy_files.rs checks that they agree), so a changed name is one -var away.
#
# The CA bundles are not secrets and come from the Nomad Variable nomad/jobs/<job id> in the
# daemon's namespace, which the task's workload identity reads without any policy (Nomad's
# implicit access to nomad/jobs/<job id>):
#   nomad var put -namespace runner-scaler nomad/jobs/runner-scaler \
#     consul_ca=@consul-ca.pem vault_ca=@vault-ca.pem
# (no host volume, so the Docker driver's `volumes` can stay disabled on the node). Put it
# before the first `nomad job run`: until it exists the CA templates below wait for it (`nomad
# alloc status` shows "Missing: nomad.var.block(nomad/jobs/runner-scaler@runner-scaler.global)")
# and the task stays pending, never started. A Variable without one of the keys fails that
# template ("map has no entry for key"). A service whose certificate a public CA signed needs
# no entry: turn its template off (render_consul_ca, render_vault_ca) and point its *_cacert
# at the image's system bundle.
#
# Needs Nomad >= 1.8 (the `disconnect` block); workload identities for Vault and Consul need
# >= 1.7 with the servers' vault.default_identity and consul.task_identity (README,
# "Minimum versions and cluster settings").

variable "image" {
  description = "The daemon's image, built from the repository's Dockerfile and pushed where the Nomad clients pull from (README, \"The image\"), pinned to a version tag or a digest, never latest. No default: no published image is built from this checkout."
  type        = string

  validation {
    # A tag that starts with a digit (0.1.0, 2026-05-01) or a sha256 digest. Nomad's HCL has
    # regex_replace but no regex(): the whole name matches exactly when nothing is left.
    condition     = regex_replace(var.image, "^[^@]+(:[0-9][0-9A-Za-z._-]*|@sha256:[0-9a-f]{64})$", "") == ""
    error_message = "image must be pinned to a version tag (REGISTRY/runner-scaler:0.1.0) or a digest (…@sha256:…), not latest or untagged."
  }
}

variable "daemon_nodes" {
  description = "Node names (node.unique.name) the daemon may run on: Terraform's daemon_nodes, whose sessions its Consul policy may write (`terraform -chdir=terraform output -json daemon_nodes`). On each, the Consul agent's node_name must equal the Nomad client's name: the lock session is created against the agent's."
  type        = list(string)
}

variable "job_id" {
  description = "The daemon's job id (terraform var.daemon_job_id), which its identities are bound to; also the path of its CA Variable, nomad/jobs/<job id>."
  type        = string
  default     = "runner-scaler"
}

variable "namespace" {
  description = "The daemon's own namespace (terraform var.daemon_namespace). Only operators may submit jobs there."
  type        = string
  default     = "runner-scaler"
}

variable "runner_namespace" {
  description = "Default namespace of the runner parents (terraform var.runner_namespace); a repo may name another with nomadNamespace."
  type        = string
  default     = "ci-runners"
}

variable "nomad_addr" {
  description = "Nomad's API. Default: the task API socket (Nomad >= 1.5), authenticated by the task's workload identity, reached without TLS or network."
  type        = string
  # `$${` keeps the runtime variable for the client to fill in when the task starts.
  default = "unix://$${NOMAD_SECRETS_DIR}/api.sock"
}

variable "consul_addr" {
  description = "The local Consul agent's HTTPS listener. The group uses the host's network, so 127.0.0.1 is the node's own loopback, where Consul's default client_addr listens."
  type        = string
  default     = "https://127.0.0.1:8501"
}

variable "consul_cacert" {
  description = "CA bundle that signed Consul's HTTPS certificate, as a path in the task (every certificate in it is trusted). Default: rendered from the Nomad Variable's consul_ca. With render_consul_ca = false, name a file the task has, e.g. the image's system bundle /etc/ssl/certs/ca-certificates.crt."
  type        = string
  default     = "$${NOMAD_TASK_DIR}/ca/consul.pem"
}

variable "render_consul_ca" {
  description = "Render consul_cacert's default file from the Nomad Variable's consul_ca (the task waits until the Variable exists). false: no template; consul_cacert must name another file."
  type        = bool
  default     = true
}

variable "vault_addr" {
  description = "Vault's API. The runner parents (nomad/ci-runner.nomad.hcl, nomad/forgejo-runner.nomad.hcl) have a vault_addr of the same name and default, for their unwrap: pass both the same value."
  type        = string
  default     = "https://vault.service.consul:8200"
}

variable "vault_cacert" {
  description = "CA bundle that signed Vault's certificate, as a path in the task. Default: rendered from the Nomad Variable's vault_ca. With render_vault_ca = false, name a file the task has, e.g. the image's system bundle /etc/ssl/certs/ca-certificates.crt."
  type        = string
  default     = "$${NOMAD_TASK_DIR}/ca/vault.pem"
}

variable "render_vault_ca" {
  description = "Render vault_cacert's default file from the Nomad Variable's vault_ca (the task waits until the Variable exists). false: no template; vault_cacert must name another file."
  type        = bool
  default     = true
}

variable "vault_role" {
  description = "The Vault JWT role the task logs in with (terraform var.daemon_vault_role)."
  type        = string
  default     = "runner-scaler"
}

variable "vault_mount" {
  description = "The KV v2 mount (terraform var.vault_kv_mount)."
  type        = string
  default     = "secret"
}

variable "github_app_vault_path" {
  description = "The App's secret under vault_mount (terraform var.github_app_vault_path): fields app_id and private_key."
  type        = string
  default     = "runner-scaler/github-app"
}

variable "config_key" {
  description = "Consul KV key of the document (terraform var.config_key)."
  type        = string
  default     = "runners/config"
}

variable "pause_key" {
  description = "Consul KV key that pauses every dispatch while it holds a value (terraform var.pause_key, which the Consul policy lets the daemon read)."
  type        = string
  default     = "runners/paused"
}

variable "vault_children_cleanup" {
  description = "Purge dead vault-mode children and stop unplaced surplus ones (--vault-children-cleanup). Set it with terraform var.nomad_vault_children_cleanup, which grants purge-job in the vault-mode namespace (Nomad >= 1.11.2)."
  type        = bool
  default     = false
}

variable "leader_key" {
  description = "Consul KV key of the leader lock (terraform var.leader_key, which the Consul policy lets the daemon write)."
  type        = string
  default     = "runners/leader"
}

variable "state_key" {
  description = "Consul KV key the lock holder keeps its state in (terraform var.state_key, which the Consul policy lets the daemon write)."
  type        = string
  default     = "runners/state"
}

job "runner-scaler" {
  # The label is only a default: `id` is what Nomad stores and what the identities'
  # nomad_job_id claim carries (jobspec2: id and name override the label).
  id   = var.job_id
  name = var.job_id
  # Its own namespace, where only operators submit jobs: the Vault role, the Consul binding
  # rule and the Nomad policy (terraform/) are bound to this namespace, job id and task, so
  # nobody who can merely submit to `default` or to the runners' namespaces gets them.
  namespace   = var.namespace
  type        = "service"
  datacenters = ["*"]

  # Only the nodes whose Consul sessions the daemon's policy may write (terraform/consul.tf):
  # elsewhere its session create would be refused. set_contains_any splits the value on commas
  # and matches the node's name against each (hashicorp/nomad scheduler/feasible.go).
  constraint {
    attribute = "${node.unique.name}"
    operator  = "set_contains_any"
    value     = join(",", var.daemon_nodes)
  }

  group "scaler" {
    # One copy is enough: more may run, and only the holder of the Consul leader lock acts.
    count = 1

    restart {
      attempts = 10
      interval = "30m"
      delay    = "15s"
      mode     = "delay"
    }

    # A copy on a node cut off from the servers stops itself after this long (Nomad >= 1.8;
    # older releases call it stop_after_client_disconnect). Its leader lock fence has stopped
    # its writes long before (15s TTL); this also ends the process, so a partition that heals
    # never finds two copies believing they lead, and the replacement elsewhere takes the lock.
    disconnect {
      stop_on_client_after = "1m"
    }

    # The host's network: the daemon reaches the local Consul agent on 127.0.0.1 (Consul's
    # default client_addr; a bridge network's 127.0.0.1 is the container's own). The
    # alternative, keeping a bridge network, is a Consul agent that also listens on the node's
    # address (client_addr or addresses.https) with consul_addr set to
    # https://${attr.unique.network.ip-address}:8501.
    network {
      mode = "host"
      port "http" {}
    }

    # Registered in Nomad's own service catalogue (Nomad >= 1.4 runs http checks itself), so
    # the daemon's Consul token needs no service:write. /livez fails only when the control
    # loop stopped turning; check_restart turns three failures in a row into a restart.
    # /healthz (a stuck queue, unreadable services) is for alerts, not restarts: a restart
    # cures neither.
    service {
      name     = "runner-scaler"
      provider = "nomad"
      port     = "http"

      check {
        type     = "http"
        path     = "/livez"
        interval = "10s"
        timeout  = "2s"

        check_restart {
          limit = 3
          # The first tick may wait on every service's timeout; /livez allows three polls.
          grace = "90s"
        }
      }
    }

    # Nomad's Consul task identity: with consul.task_identity set on the servers, Nomad logs
    # in to Consul's auth method (terraform/consul.tf) with this task's identity and gets a
    # Consul token bound to the policy that reads the document. Nomad's Consul hook
    # (hashicorp/nomad client/allocrunner/taskrunner/consul_hook.go, Nomad >= 1.8) puts it in
    # the task's environment as CONSUL_HTTP_TOKEN (and CONSUL_TOKEN), which is what the daemon
    # reads. The env block below therefore sets neither CONSUL_HTTP_TOKEN nor
    # CONSUL_HTTP_TOKEN_FILE: the daemon refuses to start when a secret and its _FILE are both
    # set, and the copy the hook also writes to secrets/consul_token is root-owned (0640), so
    # uid 65532 could not read it anyway.
    consul {}

    task "runner-scaler" {
      driver = "docker"
      # The image's USER (Dockerfile: 65532, distroless nonroot). The templates below are
      # owned by it, so the process can read its secrets and nobody else in the container can.
      user = "65532"

      config {
        image        = var.image
        args         = ["run"]
        network_mode = "host"
      }

      # Vault workload identity: the `runner-scaler` JWT role (terraform/vault.tf) grants read
      # on the App key and on each repo's vaultPath, each by its exact path. The daemon reads
      # the polling and Forgejo tokens itself through VAULT_TOKEN at run time.
      vault {
        role = var.vault_role
      }

      # Nomad's own workload identity as the Nomad API token (NOMAD_TOKEN): terraform/nomad.tf
      # attaches the runner-scaler ACL policy to this job, group and task, so no long-lived
      # Nomad token exists.
      identity {
        env = true
      }

      env {
        NOMAD_ADDR = var.nomad_addr
        # Not NOMAD_NAMESPACE: Nomad sets that in every task's environment to the task's own
        # namespace ("Namespace in which the allocation is running",
        # https://developer.hashicorp.com/nomad/docs/runtime/environment), which here is the
        # daemon's, not the runners'.
        RUNNER_SCALER_RUNNER_NAMESPACE = var.runner_namespace
        CONSUL_HTTP_ADDR               = var.consul_addr
        CONSUL_CACERT                  = var.consul_cacert
        # No CONSUL_HTTP_TOKEN here: Nomad's Consul hook sets it (the group's consul block).
        VAULT_ADDR                  = var.vault_addr
        VAULT_CACERT                = var.vault_cacert
        VAULT_MOUNT                 = var.vault_mount
        RUNNER_SCALER_CONFIG_KEY    = var.config_key
        RUNNER_SCALER_PAUSE_KEY     = var.pause_key
        RUNNER_SCALER_LEADER_KEY    = var.leader_key
        RUNNER_SCALER_STATE_KEY     = var.state_key
        RUNNER_SCALER_VAULT_CHILDREN_CLEANUP = var.vault_children_cleanup
        GITHUB_APP_PRIVATE_KEY_FILE = "${NOMAD_SECRETS_DIR}/github-app.pem"
        # The host's network: bind the address Nomad gave the port, not every interface.
        RUNNER_SCALER_LISTEN = "${NOMAD_IP_http}:${NOMAD_PORT_http}"
        # Required off loopback: the daemon refuses to start (exit 64) without it.
        RUNNER_SCALER_LISTEN_TOKEN_FILE = "${NOMAD_SECRETS_DIR}/listen-token"
      }

      # Secrets come from files or the environment, never from flags (they would show in
      # `ps` and in the job spec). The App's private key is a file only this task's user
      # (template uid/gid: Nomad >= 1.3.3) can read.
      template {
        destination = "secrets/github-app.pem"
        perms       = "0400"
        uid         = 65532
        gid         = 65532
        change_mode = "restart"
        data        = <<-EOT
          {{- with secret "${var.vault_mount}/data/${var.github_app_vault_path}" -}}
          {{ .Data.data.private_key }}
          {{- end }}
        EOT
      }

      # The App id is not a secret but lives with the key, so one edit in Vault moves both.
      template {
        destination = "secrets/runner-scaler.env"
        env         = true
        perms       = "0400"
        uid         = 65532
        gid         = 65532
        change_mode = "restart"
        data        = <<-EOT
          {{- with secret "${var.vault_mount}/data/${var.github_app_vault_path}" }}
          GITHUB_APP_ID={{ .Data.data.app_id }}
          {{- end }}
        EOT
      }

      # The CA bundles, from the Nomad Variable named at the top of this file (its path follows
      # the job id). Public certificates: readable by the task's user, written by nobody but
      # Nomad. Each is optional (render_consul_ca, render_vault_ca). A Variable without the key
      # fails the template with 'map has no entry for key "consul_ca"' (error_on_missing_key,
      # Nomad >= 1.5): by default consul-template renders a missing key as its zero value
      # (missingkey=zero), an empty file the daemon would only refuse later, at start ("no PEM
      # certificate in it"), far from the Variable at fault.
      # The bearer token /status and /metrics require: the job listens on the node's address,
      # where runner job steps or anything else on the network could read private repo names
      # and child ids. /livez (the service check) and /healthz stay open. Prometheus presents
      # the same token (README: Metrics and health).
      template {
        destination          = "secrets/listen-token"
        perms                = "0400"
        uid                  = 65532
        gid                  = 65532
        change_mode          = "restart"
        error_on_missing_key = true
        data                 = <<-EOT
          {{- with nomadVar (printf "nomad/jobs/%s" (env "NOMAD_JOB_ID")) }}{{ .listen_token }}{{ end -}}
        EOT
      }
      dynamic "template" {
        for_each = var.render_consul_ca ? ["consul_ca"] : []
        content {
          destination          = "local/ca/consul.pem"
          perms                = "0444"
          uid                  = 65532
          gid                  = 65532
          change_mode          = "restart"
          error_on_missing_key = true
          data                 = <<-EOT
            {{- with nomadVar (printf "nomad/jobs/%s" (env "NOMAD_JOB_ID")) }}{{ .consul_ca }}{{ end -}}
          EOT
        }
      }

      dynamic "template" {
        for_each = var.render_vault_ca ? ["vault_ca"] : []
        content {
          destination          = "local/ca/vault.pem"
          perms                = "0444"
          uid                  = 65532
          gid                  = 65532
          change_mode          = "restart"
          error_on_missing_key = true
          data                 = <<-EOT
            {{- with nomadVar (printf "nomad/jobs/%s" (env "NOMAD_JOB_ID")) }}{{ .vault_ca }}{{ end -}}
          EOT
        }
      }

      resources {
        cpu    = 200
        memory = 128
      }
    }
  }
}
