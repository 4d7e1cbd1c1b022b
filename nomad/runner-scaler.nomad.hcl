# runner-scaler: the daemon itself, as a service job.

job "runner-scaler" {
  # The daemon's own namespace; the runner children it dispatches live in `ci-runners`.
  namespace   = "default"
  type        = "service"
  datacenters = ["*"]

  group "scaler" {
    # Exactly one copy until the daemon takes a Consul leader lock: two copies would both
    # see the same queue and both dispatch.
    count = 1

    restart {
      attempts = 10
      interval = "30m"
      delay    = "15s"
      mode     = "delay"
    }

    # The port of /metrics, /livez and /healthz. Dynamic: two copies may share a node.
    network {
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

    # Nomad's Consul workload identity: Nomad logs in to Consul's `nomad-workloads` auth
    # method with the task's identity and writes a Consul token, bound (by
    # terraform/consul.tf) to the policy that reads runners/config only, to
    # secrets/consul_token.
    consul {}

    task "runner-scaler" {
      driver = "docker"

      config {
        image = "ghcr.io/afreidah/runner-scaler:0.1.0"
        args  = ["run"]
        ports = ["http"]
      }

      # Vault workload identity: the `runner-scaler` JWT role (terraform/vault.tf) grants read
      # on the polling token, the Forgejo token and the App key, each by its exact path. The
      # daemon reads the polling and Forgejo tokens itself through VAULT_TOKEN at run time.
      vault {
        role = "runner-scaler"
      }

      # Nomad's own workload identity as the Nomad API token: terraform/nomad.tf attaches
      # the runner-scaler ACL policy (list, read, dispatch and purge in ci-runners) to this
      # job, so no long-lived Nomad token is stored anywhere.
      identity {
        env = true
      }

      env {
        NOMAD_ADDR               = "http://${attr.unique.network.ip-address}:4646"
        NOMAD_NAMESPACE          = "ci-runners"
        CONSUL_HTTP_ADDR         = "http://${attr.unique.network.ip-address}:8500"
        VAULT_ADDR               = "https://vault.service.consul:8200"
        RUNNER_SCALER_CONFIG_KEY = "runners/config"
        GITHUB_APP_PRIVATE_KEY_FILE = "${NOMAD_SECRETS_DIR}/github-app.pem"
        # Written by Nomad's Consul workload identity hook (client/allocrunner/taskrunner/
        # consul_hook.go); Consul's standard variable for a token kept in a file.
        CONSUL_HTTP_TOKEN_FILE = "${NOMAD_SECRETS_DIR}/consul_token"
        # All interfaces of the container, on the port Nomad maps: in Docker's bridge
        # network the host address of NOMAD_ADDR_http does not exist inside the container,
        # so binding it would fail. Nothing served there carries a secret or an id.
        RUNNER_SCALER_LISTEN = "0.0.0.0:${NOMAD_PORT_http}"
      }

      # Secrets come from files or the environment, never from flags (they would show in
      # `ps` and in the job spec). The App's private key is a file only this task can read.
      template {
        destination = "secrets/github-app.pem"
        perms       = "0400"
        change_mode = "restart"
        data        = <<-EOT
          {{- with secret "secret/data/runner-scaler/github-app" -}}
          {{ .Data.data.private_key }}
          {{- end }}
        EOT
      }

      # The App id is not a secret but lives with the key, so one edit in Vault moves both.
      template {
        destination = "secrets/runner-scaler.env"
        env         = true
        change_mode = "restart"
        data        = <<-EOT
          {{- with secret "secret/data/runner-scaler/github-app" }}
          GITHUB_APP_ID={{ .Data.data.app_id }}
          {{- end }}
        EOT
      }

      resources {
        cpu    = 200
        memory = 128
      }
    }
  }
}
