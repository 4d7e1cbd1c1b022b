# ci-runner: the parameterized batch job runner-scaler dispatches once per missing GitHub
# Actions runner (`app` mode, and the default parent job of the document).
#
# One child = one runner = one job: the runner reads the credential minted for this child
# alone, takes one job, and exits; nothing here restarts or reschedules it: a replacement is
# runner-scaler's decision, made from the queue. What the task does is the runner contract in
# nomad/runner/entrypoint.sh (README, "The runner contract").
#
# Run it from anywhere: `nomad job run nomad/ci-runner.nomad.hcl`. The entrypoint is read by
# the Nomad CLI with file(), relative to this file's directory (the CLI parses HCL2 with the
# job file's path, and jobspec2 takes the directory of that path as the base of file();
# hashicorp/nomad command/helpers.go and jobspec2/parse.go), and submitted inside the job as
# a template: nothing to host, no artifact to fetch, and the job holds exactly the script of
# the checkout it was run from.
#
# Needs Nomad >= 1.8 (the `disconnect` block below; node pools need >= 1.6; README, "Minimum
# versions and cluster settings").

variable "namespace" {
  description = "Namespace of this parent and its children (terraform var.runner_namespace; the daemon's RUNNER_SCALER_RUNNER_NAMESPACE)."
  type        = string
  default     = "ci-runners"
}

variable "node_pool" {
  description = "Node pool of the runner nodes (terraform var.runner_node_pool, which Terraform creates)."
  type        = string
  default     = "ci-runners"
}

variable "vault_addr" {
  description = "Vault's API, where a runner unwraps its credential: the same variable and default as the daemon's job (nomad/runner-scaler.nomad.hcl), so pass both the same -var vault_addr. It is resolved inside the runner's container (Docker's bridge network): a name only the host's loopback resolver knows (*.service.consul behind systemd-resolved or dnsmasq on 127.0.0.1) does not resolve there; see dns_servers."
  type        = string
  default     = "https://vault.service.consul:8200"
}

variable "dns_servers" {
  description = "DNS servers (IP addresses, port 53) for the runner's container, the Docker driver's dns_servers. Empty: Docker's default, the host's resolv.conf without loopback entries (Docker then falls back to public resolvers, which do not know .consul). Set it to a resolver the container can reach that answers vault_addr's name, e.g. a dnsmasq forwarding .consul to Consul's DNS, listening on the Docker bridge's address (172.17.0.1)."
  type        = list(string)
  default     = []
}

variable "no_new_privileges" {
  description = "Start the runner with Docker's no-new-privileges security option: sudo (which the actions-runner image gives its runner user without a password) and every other setuid program stop working, so a workflow step stays uid 1001 and cannot read files or processes of other uids in the task. Off by default: workflows that `sudo apt-get install` fail with it on (README, \"Runner images\")."
  type        = bool
  default     = false
}

job "ci-runner" {
  # Nomad stores dispatch meta, runner_token included, and shows it to anyone with read-job
  # in the job's namespace (BRIEF lesson 9). Runner children therefore live in a namespace of
  # their own, which only runner-scaler and the operators can read.
  namespace   = var.namespace
  type        = "batch"
  datacenters = ["*"]

  # Runners execute whatever a workflow says: only on nodes set aside for them, never beside
  # the daemon, Vault or other services whose secrets or sockets a job could reach.
  node_pool = var.node_pool

  parameterized {
    # runner-scaler never sends a payload.
    payload = "forbidden"
    # Exactly what runner-scaler sends. Nomad refuses a dispatch with any other key, which
    # keeps a hand-typed `nomad job dispatch` from smuggling in something unexpected.
    meta_required = ["repo_url", "runner_token", "runner_name"]
    meta_optional = ["labels", "managed_by"]
  }

  # Defaults for the optional keys; a child's meta is this overlaid with its dispatch meta.
  meta {
    labels = "self-hosted"
  }

  group "runner" {
    count = 1

    # A runner that fails (bad image, rejected token) must not be retried in place: the
    # registration token may already be spent, and runner-scaler backs off per bucket when
    # its runners die before taking a job (BRIEF lesson 7).
    restart {
      attempts = 0
      mode     = "fail"
    }

    # Nor on another node after it failed: a failed child ends dead, runner-scaler purges it
    # and dispatches a fresh one with a fresh credential if the job is still queued.
    reschedule {
      attempts  = 0
      unlimited = false
    }

    # A lost node is no reschedule: Nomad replaces the allocations of a lost node whatever
    # `reschedule` says, and a replacement reads the same dispatch meta, so it would boot with
    # the credential the first allocation spent (exit 4, a false "possible credential theft",
    # for a wrapped one; a failed start that backs the bucket off for a plain one). Nomad >= 1.8
    # (hashicorp/nomad docs, job-specification/disconnect). Nomad ignores this block for a
    # drain: see README, "Runner nodes and drains".
    disconnect {
      # A node that misses its heartbeats is "disconnected", not down, for this long, and its
      # allocations "unknown", not lost: a runner on a partitioned node keeps running (often
      # still in touch with GitHub, keeping its job), and the daemon still counts it. 6h30m
      # outlasts the runner's idle wait (RUNNER_IDLE_TIMEOUT, 15m) plus a job of GitHub's
      # default timeout-minutes (6h; a Forgejo runner's default timeout is 3h): a runner still
      # running when its node returns is one Nomad has not given up on. Workflows with a longer
      # timeout-minutes: raise it to match, as for hardBoundMinutes. After it the node is down
      # and, on Nomad 1.8, 1.9 and >= 1.11.2, the allocation lost and replaced after all
      # (1.10.0 to 1.11.1 leave it unknown): what ends a runner left on a dead node, and how to
      # tell that replacement's exit 4 from a theft, is in the README, "Runner nodes and
      # drains".
      lost_after = "6h30m"
      # No second allocation while the first is unknown (the default, true, places one at
      # once). It holds only with lost_after: without it Nomad >= 1.11.2 replaces at once
      # (hashicorp/nomad#27053).
      replace = false
      # When the node comes back and a replacement exists anyway, keep the original: it holds
      # the credential and may be running a job, while the replacement found the credential
      # spent. "keep_original: Always keep the original allocation"; best_score (the default)
      # keeps the one on the better-scoring node and keep_replacement the replacement, both
      # stopping the original mid-job; longest_running compares task start times. An original
      # that ended while its node was away stays ended: only a running one reconnects.
      reconcile = "keep_original"
    }

    ephemeral_disk {
      size = 10240
    }

    task "runner" {
      driver = "docker"
      # The image's own user (runner, uid 1001, actions/runner images/Dockerfile); the
      # template below is owned by it.
      user = "1001"

      config {
        # The official runner image, pinned: with self-update off the image decides the runner
        # version, so a moving tag would change every runner at the next pull. GitHub stops
        # accepting runners that fall too far behind its releases: move the pin along with
        # them (tags are the runner version, github.com/actions/runner/releases), or pin a
        # digest (`…@sha256:…`) you have tested.
        image   = "ghcr.io/actions/actions-runner:2.336.0"
        command = "/bin/bash"
        args    = ["${NOMAD_TASK_DIR}/entrypoint.sh"]
        # Never mount the host's Docker socket (/var/run/docker.sock) here: any workflow step
        # could then start a privileged container and own the node. Give the task a Docker
        # daemon of its own (a DinD sidecar) if workflows need containers.

        # The image gives uid 1001 passwordless sudo (actions/runner images/Dockerfile), so a
        # step can become root in the container and read what the entrypoint keeps from other
        # uids. no-new-privileges (Docker's --security-opt, which the Nomad driver passes on as
        # written: drivers/docker/driver.go parseSecurityOpts) makes sudo refuse to run.
        security_opt = var.no_new_privileges ? ["no-new-privileges"] : []
        # Where VAULT_ADDR's name is resolved: see the dns_servers variable.
        dns_servers = var.dns_servers
      }

      env {
        RUNNER_FORGE  = "github"
        REPO_URL      = "${NOMAD_META_repo_url}"
        RUNNER_NAME   = "${NOMAD_META_runner_name}"
        RUNNER_LABELS = "${NOMAD_META_labels}"
        # A JIT config or a registration token, plain or wrapped by Vault (a wrapped one is
        # unwrapped here, at VAULT_ADDR, with nothing but the wrapping token).
        RUNNER_TOKEN              = "${NOMAD_META_runner_token}"
        RUNNER_CREDENTIAL_WRAPPED = "auto"
        VAULT_ADDR                = var.vault_addr
        # Rendered below; empty (and then unused) unless the Nomad Variable holds a CA.
        VAULT_CACERT = "${NOMAD_TASK_DIR}/ca/vault.pem"
        # A runner no job came to within this time stops itself and exits 3.
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
        uid         = 1001
        gid         = 1001
        change_mode = "noop"
        data        = <<-EOT
          {{- $path := printf "nomad/jobs/%s" (env "NOMAD_JOB_PARENT_ID") -}}
          {{- if nomadVarExists $path }}{{ with nomadVar $path }}{{ .vault_ca }}{{ end }}{{ end -}}
        EOT
      }

      # The runner contract, verbatim: the delimiters are set to something the script never
      # contains, so the template engine passes it through untouched.
      template {
        data            = file("runner/entrypoint.sh")
        destination     = "local/entrypoint.sh"
        perms           = "0500"
        uid             = 1001
        gid             = 1001
        change_mode     = "noop"
        left_delimiter  = "[[runner-scaler-template:"
        right_delimiter = ":runner-scaler-template]]"
      }

      resources {
        cpu    = 2000
        memory = 4096
      }

      # SIGTERM reaches the entrypoint, which passes it to run.sh; the listener then cancels a
      # running job and lets it report (actions/runner Runner.Listener: shutdown cancels the
      # job it runs). runner-scaler stops a runner only when it is idle or wedged; a node
      # drain gets the job this long to wind down. The client's max_kill_timeout (30s by
      # default) caps it.
      kill_signal  = "SIGTERM"
      kill_timeout = "2m"
    }
  }
}
