# github-runner-moat-vm: a runner parent job for a `vault` mode repo (the example document's
# ev-the-dev/moat). One parent per vault-mode repo: register it once per repo with that repo's
# values, from a copy of this file or with -var job_id=… -var vault_role=… -var
# register_vault_path=… -var repo_url=… (each the repo's entry of Terraform's vault_mode_runners,
# whose role is bound to this job id and the task `mint`).
#
# The repo is the job file's, never the dispatch's. The mint task sends the repo's admin token
# to GitHub; were the host taken from dispatch meta, anyone allowed to dispatch this job (the
# daemon included) could dispatch it with repo_url=https://attacker.example/x/y and receive the
# admin token. So REPO_URL and GITHUB_API_URL are this file's variables, and the dispatched
# repo_url reaches the mint script only as DISPATCHED_REPO_URL, to be compared: a dispatch for
# another repo is refused (exit 2) before any request is sent.
#
# In `vault` mode the daemon mints nothing: it may not even read the admin token at
# `registerVaultPath` (its Vault policy names exact paths and none of the register paths).
# This job reads the admin token itself, in a prestart task of its own, mints this runner's
# own credential (a JIT config) from GitHub, and hands only that to the runner task through a
# file in the shared allocation directory. The admin token and the Vault token never enter
# the runner task's environment or file system, where workflow steps run.
#
# Both tasks run as uid 1001 (the actions-runner image's `runner` user): the prestart task
# writes the credential as that uid with mode 0400, the runner task reads and deletes it.
# Scripts come from nomad/runner/ through file(), relative to this file (see
# ci-runner.nomad.hcl): `nomad job run nomad/github-runner-vault.nomad.hcl` works as shipped.
#
# Needs Nomad >= 1.8 (the `disconnect` block below); the mint task's workload identity for
# Vault needs >= 1.7 with the servers' vault.default_identity (README, "Minimum versions and
# cluster settings").

variable "job_id" {
  description = "This parent's job id: the job_id of its entry in terraform var.vault_mode_runners, which its Vault role is bound to (with vault_runner_namespace and the task mint). The document's profile for the repo names it."
  type        = string
  default     = "github-runner-moat-vm"
}

variable "vault_role" {
  description = "The Vault JWT role the mint task logs in with: the key of this parent's entry in terraform var.vault_mode_runners."
  type        = string
  default     = "runner-moat"
}

variable "vault_mount" {
  description = "The KV v2 mount (terraform var.vault_kv_mount)."
  type        = string
  default     = "secret"
}

variable "register_vault_path" {
  description = "The repo's registerVaultPath under vault_mount, field token: the admin token (register_path of this parent's entry in terraform var.vault_mode_runners, the only path its role reads)."
  type        = string
  default     = "github/moat-runner"
}

variable "namespace" {
  description = "Namespace of this parent and its children (terraform var.vault_runner_namespace): where the daemon may dispatch but not submit jobs."
  type        = string
  default     = "ci-runners-vault"
}

variable "node_pool" {
  description = "Node pool of the runner nodes (terraform var.runner_node_pool)."
  type        = string
  default     = "ci-runners"
}

variable "no_new_privileges" {
  description = "Start the runner task with Docker's no-new-privileges security option, so workflow steps cannot become root through the image's passwordless sudo. Off by default: workflows that `sudo apt-get install` fail with it on (README, \"Runner images\"). The mint task runs with it always."
  type        = bool
  default     = false
}

variable "repo_url" {
  description = "The one repo this parent mints runners for, https://HOST/OWNER/REPO: the host its admin token is sent to. A dispatch whose repo_url meta names another repo is refused."
  type        = string
  default     = "https://github.com/ev-the-dev/moat"
}

variable "github_api_url" {
  description = "GitHub's API for repo_url, when it is not derived from it (github.com: api.github.com; *.ghe.com: api.HOST; else HOST/api/v3). Empty: derived."
  type        = string
  default     = ""
}

job "github-runner-moat-vm" {
  # The label is only the default: `id` is what Nomad stores and what the mint task's
  # nomad_job_id claim carries, and the Vault role is bound to it.
  id          = var.job_id
  name        = var.job_id
  namespace   = var.namespace
  type        = "batch"
  datacenters = ["*"]

  # Runners execute whatever a workflow says: only on nodes set aside for them.
  node_pool = var.node_pool

  parameterized {
    payload = "forbidden"
    # No runner_token: in vault mode the daemon sends none, and Nomad refuses a dispatch
    # that carries one, so an admin token can never be pushed through dispatch meta here.
    meta_required = ["repo_url", "runner_name"]
    meta_optional = ["labels", "managed_by"]
  }

  meta {
    labels = "self-hosted"
  }

  group "runner" {
    count = 1

    # No retries and no rescheduling: see ci-runner.nomad.hcl.
    restart {
      attempts = 0
      mode     = "fail"
    }

    reschedule {
      attempts  = 0
      unlimited = false
    }

    # A runner on a node that misses its heartbeats stays "unknown" for lost_after and is not
    # replaced, and a runner that comes back wins over any replacement: the values and why are
    # in ci-runner.nomad.hcl. Here a replacement allocation would run the mint task again (a
    # fresh JIT config for the same runner name: a second runner of that name, or a failed
    # start if GitHub refuses the name) rather than replay a credential; but the daemon never
    # stops or purges a vault-mode child, so a runner left `unknown` on a dead node holds its
    # slot until Nomad or an operator ends it (README, "Runner nodes and drains").
    disconnect {
      lost_after = "6h30m"
      replace    = false
      reconcile  = "keep_original"
    }

    ephemeral_disk {
      size = 10240
    }

    # Mints this runner's credential with the admin token and exits.
    task "mint" {
      driver = "docker"
      # The same uid as the runner task, so the credential file it writes is the runner's.
      user = "1001"

      lifecycle {
        hook    = "prestart"
        sidecar = false
      }

      config {
        # The runner image itself: it has bash, curl and jq, and runs as uid 1001.
        image   = "ghcr.io/actions/actions-runner:2.336.0"
        command = "/bin/bash"
        args    = ["${NOMAD_TASK_DIR}/mint.sh"]
        # The mint script needs no sudo: this task, which holds the admin token, never gains
        # privileges.
        security_opt = ["no-new-privileges"]
      }

      # Workload identity: Vault's JWT role (var.vault_role, terraform/vault.tf) is bound to
      # this job id and this task and grants read on the admin token's path only. Only this
      # task has a vault block, so only this task ever holds a Vault token.
      vault {
        role = var.vault_role
      }

      # The admin token lands in this task's own secrets directory as a ready-made header
      # line, so it is never on a command line (curl reads headers from the file).
      template {
        destination = "secrets/github-auth-header"
        perms       = "0400"
        uid         = 1001
        gid         = 1001
        change_mode = "noop"
        data        = <<-EOT
          {{- with secret "${var.vault_mount}/data/${var.register_vault_path}" -}}
          Authorization: Bearer {{ .Data.data.token }}
          {{- end }}
        EOT
      }

      env {
        # Where the admin token goes: from this file, never from dispatch meta (see the top).
        REPO_URL       = var.repo_url
        GITHUB_API_URL = var.github_api_url
        # Only compared with REPO_URL: the mint script refuses a dispatch for another repo.
        DISPATCHED_REPO_URL     = "${NOMAD_META_repo_url}"
        RUNNER_NAME             = "${NOMAD_META_runner_name}"
        RUNNER_LABELS           = "${NOMAD_META_labels}"
        GITHUB_AUTH_HEADER_FILE = "${NOMAD_SECRETS_DIR}/github-auth-header"
        RUNNER_CREDENTIAL_FILE  = "${NOMAD_ALLOC_DIR}/runner-credential"
        MINT_CREDENTIAL         = "jit"
      }

      template {
        data            = file("runner/mint-github-credential.sh")
        destination     = "local/mint.sh"
        perms           = "0500"
        uid             = 1001
        gid             = 1001
        change_mode     = "noop"
        left_delimiter  = "[[runner-scaler-template:"
        right_delimiter = ":runner-scaler-template]]"
      }

      resources {
        cpu    = 100
        memory = 128
      }
    }

    task "runner" {
      driver = "docker"
      user   = "1001"

      config {
        # Pinned like nomad/ci-runner.nomad.hcl: move the pin along with GitHub's releases.
        image   = "ghcr.io/actions/actions-runner:2.336.0"
        command = "/bin/bash"
        args    = ["${NOMAD_TASK_DIR}/entrypoint.sh"]
        # Never the host's Docker socket: see README, "The runner contract".
        # The image's passwordless sudo, closed on request: see ci-runner.nomad.hcl.
        security_opt = var.no_new_privileges ? ["no-new-privileges"] : []
      }

      env {
        RUNNER_FORGE = "github"
        # The mint task's repo: a registration token (MINT_CREDENTIAL=registration) is sent to
        # this URL by config.sh, so it never comes from dispatch meta either.
        REPO_URL      = var.repo_url
        RUNNER_NAME   = "${NOMAD_META_runner_name}"
        RUNNER_LABELS = "${NOMAD_META_labels}"
        # Written by the mint task; read and deleted before the listener starts.
        RUNNER_CREDENTIAL_FILE    = "${NOMAD_ALLOC_DIR}/runner-credential"
        RUNNER_CREDENTIAL_WRAPPED = "false"
        RUNNER_IDLE_TIMEOUT       = "15m"
      }

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

      # See ci-runner.nomad.hcl.
      kill_signal  = "SIGTERM"
      kill_timeout = "2m"
    }
  }
}
