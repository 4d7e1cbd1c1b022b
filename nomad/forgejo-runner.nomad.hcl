# forgejo-build-runner: the parameterized batch job runner-scaler dispatches once per missing
# Forgejo Actions runner (`forgejo` mode; the example document's alex/s3-orchestrator
# profile). The daemon passes in `runner_token` either "<uuid>:<token>" of an ephemeral runner
# it registered itself (Forgejo 15, POST …/actions/runners) or a registration token, plain or
# wrapped by Vault. The task runs the runner contract, nomad/runner/entrypoint.sh (README,
# "The runner contract"), read with file() relative to this file: `nomad job run
# nomad/forgejo-runner.nomad.hcl` works as shipped.
#
# Needs Nomad >= 1.8 (the `disconnect` block below; node pools need >= 1.6; README, "Minimum
# versions and cluster settings").

variable "image" {
  description = "The runner's image. The default, Forgejo's own, has no Node: jobs run in it directly (`<label>:host`), so `run:` steps work and `uses:` actions written in JavaScript (actions/checkout and most others) fail. For those, build nomad/runner/forgejo-runner.Dockerfile (this image plus nodejs, curl and the CA bundle) and pass its tag here (README, \"Runner images\")."
  type        = string
  default     = "code.forgejo.org/forgejo/runner:11.3.1"
}

variable "namespace" {
  description = "Namespace of this parent and its children (terraform var.runner_namespace)."
  type        = string
  default     = "ci-runners"
}

variable "node_pool" {
  description = "Node pool of the runner nodes (terraform var.runner_node_pool)."
  type        = string
  default     = "ci-runners"
}

variable "vault_addr" {
  description = "Vault's API, where a runner unwraps its credential: the same variable and default as the daemon's job, so pass both the same -var vault_addr. Resolved inside the container: see dns_servers and nomad/ci-runner.nomad.hcl."
  type        = string
  default     = "https://vault.service.consul:8200"
}

variable "dns_servers" {
  description = "DNS servers (IP addresses) for the runner's container, the Docker driver's dns_servers. Empty: Docker's default (the host's resolv.conf without loopback entries). Set it to a resolver reachable from the container that answers vault_addr's name (see nomad/ci-runner.nomad.hcl)."
  type        = list(string)
  default     = []
}

job "forgejo-build-runner" {
  # Dispatch meta (runner_token included) is readable with read-job in this namespace.
  namespace   = var.namespace
  type        = "batch"
  datacenters = ["*"]

  # Runners execute whatever a workflow says: only on nodes set aside for them.
  node_pool = var.node_pool

  parameterized {
    payload       = "forbidden"
    meta_required = ["repo_url", "runner_token", "runner_name"]
    meta_optional = ["labels", "managed_by"]
  }

  meta {
    labels = "build"
  }

  group "runner" {
    count = 1

    # No retries and no rescheduling: runner-scaler replaces runners from the queue and
    # backs off per bucket when they die before taking a job (BRIEF lesson 7).
    restart {
      attempts = 0
      mode     = "fail"
    }

    reschedule {
      attempts  = 0
      unlimited = false
    }

    # Not booted twice with one credential when its node misses its heartbeats: "unknown" for
    # lost_after, never replaced meanwhile, and kept over any replacement when the node
    # returns; the values and why are in ci-runner.nomad.hcl (6h30m also covers a Forgejo
    # runner's default job timeout, 3h). The daemon never stops a forgejo-mode runner whose
    # allocation may run, `unknown` included: on a dead node it holds its slot until Nomad or
    # an operator ends it (README, "Runner nodes and drains").
    disconnect {
      lost_after = "6h30m"
      replace    = false
      reconcile  = "keep_original"
    }

    task "runner" {
      driver = "docker"
      # The image's own user (USER 1000:1000 in forgejo/runner's Dockerfile); the template
      # below is owned by it.
      user = "1000"

      config {
        # Pinned to a release (code.forgejo.org/forgejo/runner/releases); `one-job` exists
        # since 6.1.0. The image is Alpine with bash and git and no curl and no Node.
        #
        # Jobs run in this container: the entrypoint registers each label as `<label>:host`
        # (Forgejo's label types: docker://IMAGE, lxc://…, host), so the runner execs the steps
        # here instead of asking a Docker daemon for a container. `run:` steps work as they are.
        # A JavaScript action (`uses: actions/checkout@v4`) is started with the `node` found on
        # the PATH of the job's environment (act, which forgejo-runner embeds:
        # pkg/runner/run_context.go GetNodeToolFullPath), and this image has none: run
        # nomad/runner/forgejo-runner.Dockerfile's image (var.image) for those. The other way,
        # `<label>:docker://node:20-bookworm`, needs a Docker daemon: the host's socket would
        # hand every workflow the node (see ci-runner.nomad.hcl), and a daemon of the task's
        # own (DinD) must run privileged; neither is shipped.
        #
        # Unwrapping: without curl the entrypoint uses BusyBox wget (the wrapping token is then
        # briefly on wget's command line, before any job exists). BusyBox wget takes no CA file,
        # so VAULT_CACERT below does not reach it: with a Vault whose certificate a private CA
        # signed, run an image with curl (the Dockerfile above adds it; the entrypoint then
        # prefers curl and gives it VAULT_CACERT) or with the CA in the system bundle (README,
        # "Vault with a private CA").
        image   = var.image
        command = "/bin/bash"
        args    = ["${NOMAD_TASK_DIR}/entrypoint.sh"]
        # Never the host's Docker socket: see README, "The runner contract".
        # Where VAULT_ADDR's name is resolved: see the dns_servers variable.
        dns_servers = var.dns_servers
      }

      env {
        RUNNER_FORGE              = "forgejo"
        REPO_URL                  = "${NOMAD_META_repo_url}"
        RUNNER_NAME               = "${NOMAD_META_runner_name}"
        RUNNER_LABELS             = "${NOMAD_META_labels}"
        RUNNER_TOKEN              = "${NOMAD_META_runner_token}"
        RUNNER_CREDENTIAL_WRAPPED = "auto"
        VAULT_ADDR                = var.vault_addr
        # Rendered below; empty (and then unused) unless the Nomad Variable holds a CA. Used
        # by curl only: see the image above.
        VAULT_CACERT        = "${NOMAD_TASK_DIR}/ca/vault.pem"
        RUNNER_IDLE_TIMEOUT = "15m"
      }

      # Vault's CA, for a Vault whose certificate a private CA signed: rendered from the Nomad
      # Variable nomad/jobs/<this parent job's id> in this job's namespace, if the operator put
      # one (README, "Vault with a private CA"):
      #   nomad var put -namespace ci-runners nomad/jobs/<parent job> vault_ca=@vault-ca.pem
      # A task's workload identity may read nomad/jobs/<its job id> without any policy
      # (hashicorp/nomad acl/acl.go, matchingVariablesCapabilitySet), and a dispatched child's
      # identity carries its parent's job id (nomad/structs NewIdentityClaims: "If this is a
      # child job, use the parent's ID"; Job.GetIDforWorkloadIdentity in later releases). The
      # path comes from NOMAD_JOB_PARENT_ID, so a copy of this file under another job id reads
      # that id's Variable with no edit here. nomadVarExists does not block: without the
      # Variable (a public CA) the file is empty and the entrypoint leaves VAULT_CACERT out.
      template {
        destination = "local/ca/vault.pem"
        perms       = "0444"
        uid         = 1000
        gid         = 1000
        change_mode = "noop"
        data        = <<-EOT
          {{- $path := printf "nomad/jobs/%s" (env "NOMAD_JOB_PARENT_ID") -}}
          {{- if nomadVarExists $path }}{{ with nomadVar $path }}{{ .vault_ca }}{{ end }}{{ end -}}
        EOT
      }

      template {
        data            = file("runner/entrypoint.sh")
        destination     = "local/entrypoint.sh"
        perms           = "0500"
        uid             = 1000
        gid             = 1000
        change_mode     = "noop"
        left_delimiter  = "[[runner-scaler-template:"
        right_delimiter = ":runner-scaler-template]]"
      }

      resources {
        cpu    = 2000
        memory = 2048
      }

      # forgejo-runner ends on SIGINT or SIGTERM alike, cancelling a running task
      # (main.go: signal.NotifyContext); the entrypoint passes the signal on.
      kill_signal  = "SIGTERM"
      kill_timeout = "2m"
    }
  }
}
