# runner-scaler: the daemon itself, as a service job.
#
# Run it with the addresses of your cluster, e.g.
#   nomad job run -var image=registry.example.com/runner-scaler:0.1.0 \
#     -var vault_addr=https://vault.example.com:8200 nomad/runner-scaler.nomad.hcl
# Every `variable` below has an HTTPS default. The CA bundles are not secrets and come from the
# Nomad Variable nomad/jobs/runner-scaler in the daemon's namespace, which the task's workload
# identity reads without any policy (Nomad's implicit access to nomad/jobs/<job id>):
#   nomad var put -namespace runner-scaler nomad/jobs/runner-scaler \
#     consul_ca=@consul-ca.pem vault_ca=@vault-ca.pem
# (no host volume, so the Docker driver's `volumes` can stay disabled on the node). Put it
# before the first `nomad job run`: until it exists the CA templates below wait for it (`nomad
# alloc status` shows "Missing: nomad.var.block(nomad/jobs/runner-scaler@runner-scaler.global)")
# and the task stays pending, never started.
#
# Needs Nomad >= 1.8 (the `disconnect` block); workload identities for Vault and Consul need
# >= 1.7 with the servers' vault.default_identity and consul.task_identity (README,
# "Minimum versions and cluster settings").

variable "image" {
  description = "The daemon's image, built from the repository's Dockerfile and pinned to a version tag or a digest, never latest."
  type        = string
  default     = "ghcr.io/afreidah/runner-scaler:0.1.0"
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
  description = "CA certificate that signed Consul's HTTPS certificate, as a path in the task. Default: rendered from the Nomad Variable's consul_ca. The Consul client reads only its first certificate."
  type        = string
  default     = "$${NOMAD_TASK_DIR}/ca/consul.pem"
}

variable "vault_addr" {
  description = "Vault's API."
  type        = string
  default     = "https://vault.service.consul:8200"
}

variable "vault_cacert" {
  description = "CA bundle that signed Vault's certificate, as a path in the task. Default: rendered from the Nomad Variable's vault_ca."
  type        = string
  default     = "$${NOMAD_TASK_DIR}/ca/vault.pem"
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

job "runner-scaler" {
  # Its own namespace, where only operators submit jobs: the Vault role, the Consul binding
  # rule and the Nomad policy (terraform/) are bound to this namespace, job id and task, so
  # nobody who can merely submit to `default` or to the runners' namespaces gets them.
  namespace   = var.namespace
  type        = "service"
  datacenters = ["*"]

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
        role = "runner-scaler"
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
        GITHUB_APP_PRIVATE_KEY_FILE = "${NOMAD_SECRETS_DIR}/github-app.pem"
        # The host's network: bind the address Nomad gave the port, not every interface.
        RUNNER_SCALER_LISTEN = "${NOMAD_IP_http}:${NOMAD_PORT_http}"
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

      # The CA bundles, from the Nomad Variable named at the top of this file. Public
      # certificates: readable by the task's user, written by nobody but Nomad.
      template {
        destination = "local/ca/consul.pem"
        perms       = "0444"
        uid         = 65532
        gid         = 65532
        change_mode = "restart"
        data        = <<-EOT
          {{- with nomadVar "nomad/jobs/runner-scaler" }}{{ .consul_ca }}{{ end -}}
        EOT
      }

      template {
        destination = "local/ca/vault.pem"
        perms       = "0444"
        uid         = 65532
        gid         = 65532
        change_mode = "restart"
        data        = <<-EOT
          {{- with nomadVar "nomad/jobs/runner-scaler" }}{{ .vault_ca }}{{ end -}}
        EOT
      }

      resources {
        cpu    = 200
        memory = 128
      }
    }
  }
}
