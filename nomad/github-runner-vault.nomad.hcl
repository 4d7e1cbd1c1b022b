# github-runner-moat-vm: a runner parent job for a `vault` mode repo (the example document's
# ev-the-dev/moat). Copy it once per vault-mode parent job, changing the job name, the Vault
# role and the secret path.
#
# In `vault` mode the daemon mints nothing: it may not even read the admin token at
# `registerVaultPath` (its Vault policy names exact paths and none of the register paths).
# This job reads the admin token itself, in a prestart task of its own, mints a registration
# token from GitHub, and hands only that short-lived token to the runner task. The admin
# token never enters the runner task's environment or file system, where workflow steps run.

job "github-runner-moat-vm" {
  namespace   = "ci-runners"
  type        = "batch"
  datacenters = ["*"]

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

    ephemeral_disk {
      size = 10240
    }

    # Mints one registration token with the admin token and exits.
    task "mint" {
      driver = "docker"

      lifecycle {
        hook    = "prestart"
        sidecar = false
      }

      config {
        image   = "curlimages/curl:8.11.1"
        command = "/bin/sh"
        args    = ["${NOMAD_TASK_DIR}/mint.sh"]
      }

      # Workload identity: Vault's JWT role `runner-moat` (terraform/vault.tf) is bound to
      # this job and grants read on secret/data/github/moat-runner only.
      vault {
        role = "runner-moat"
      }

      # The admin token lands in this task's own secrets directory as a ready-made header
      # line, so it is never on a command line (curl reads headers from the file).
      template {
        destination = "secrets/github-auth-header"
        perms       = "0400"
        change_mode = "noop"
        data        = <<-EOT
          {{- with secret "secret/data/github/moat-runner" -}}
          Authorization: Bearer {{ .Data.data.token }}
          {{- end }}
        EOT
      }

      env {
        REPO_URL = "${NOMAD_META_repo_url}"
      }

      template {
        destination = "local/mint.sh"
        perms       = "0755"
        data        = <<-EOT
          #!/bin/sh
          set -eu
          # https://github.com/owner/repo → the API of that host and owner/repo.
          host="$${REPO_URL#https://}"
          host="$${host%%/*}"
          repo="$${REPO_URL#https://*/}"
          case "$host" in
            github.com) api="https://api.github.com" ;;
            *.ghe.com) api="https://api.$host" ;;
            *) api="https://$host/api/v3" ;;
          esac
          umask 077
          curl -fsS -X POST \
            -H @"$NOMAD_SECRETS_DIR/github-auth-header" \
            -H "Accept: application/vnd.github+json" \
            -H "X-GitHub-Api-Version: 2022-11-28" \
            "$api/repos/$repo/actions/runners/registration-token" \
            | sed -n 's/.*"token"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' \
            > "$NOMAD_ALLOC_DIR/registration-token"
          test -s "$NOMAD_ALLOC_DIR/registration-token"
        EOT
      }

      resources {
        cpu    = 100
        memory = 64
      }
    }

    task "runner" {
      driver = "docker"

      config {
        # Pinned like nomad/ci-runner.nomad.hcl: move the pin along with GitHub's releases.
        image   = "ghcr.io/actions/actions-runner:2.336.0"
        command = "/bin/bash"
        args    = ["${NOMAD_TASK_DIR}/entrypoint.sh"]
      }

      env {
        REPO_URL      = "${NOMAD_META_repo_url}"
        RUNNER_NAME   = "${NOMAD_META_runner_name}"
        RUNNER_LABELS = "${NOMAD_META_labels}"
      }

      # Reads the registration token the prestart task left in the shared allocation
      # directory and deletes it before registering; run.sh starts without it.
      template {
        destination = "local/entrypoint.sh"
        perms       = "0755"
        data        = <<-EOT
          #!/usr/bin/env bash
          set -euo pipefail
          token="$(cat "$NOMAD_ALLOC_DIR/registration-token")"
          rm -f "$NOMAD_ALLOC_DIR/registration-token"

          work="$NOMAD_TASK_DIR/work"
          mkdir -p "$work"
          cd /home/runner
          ./config.sh \
            --unattended \
            --url "$REPO_URL" \
            --token "$token" \
            --name "$RUNNER_NAME" \
            --labels "$RUNNER_LABELS" \
            --no-default-labels \
            --work "$work" \
            --ephemeral \
            --disableupdate
          unset token
          exec ./run.sh
        EOT
      }

      resources {
        cpu    = 2000
        memory = 4096
      }

      kill_timeout = "30s"
    }
  }
}
