# ci-runner: the parameterized batch job runner-scaler dispatches once per missing GitHub
# Actions runner (`app` mode, and the default parent job of the document).
#
# One child = one runner = one job: the runner registers with a credential minted for this
# child alone, takes one job (`--ephemeral`), deregisters and exits. Nothing here restarts
# or reschedules it: a replacement is runner-scaler's decision, made from the queue.

job "ci-runner" {
  # Nomad stores dispatch meta, runner_token included, and shows it to anyone with read-job
  # in the job's namespace (BRIEF lesson 9). Runner children therefore live in a namespace of
  # their own, which only runner-scaler and the operators can read.
  namespace   = "ci-runners"
  type        = "batch"
  datacenters = ["*"]

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

    # Same for a lost node: the child ends dead, runner-scaler purges it and dispatches a
    # fresh one with a fresh credential if the job is still queued.
    reschedule {
      attempts  = 0
      unlimited = false
    }

    ephemeral_disk {
      size = 10240
    }

    task "runner" {
      driver = "docker"

      config {
        # The official runner image, pinned: with self-update off the image decides the runner
        # version, so a moving tag would change every runner at the next pull. GitHub stops
        # accepting runners that fall too far behind its releases: move the pin along with
        # them (tags are the runner version, github.com/actions/runner/releases), or pin a
        # digest (`…@sha256:…`) you have tested.
        image   = "ghcr.io/actions/actions-runner:2.336.0"
        command = "/bin/bash"
        args    = ["${NOMAD_TASK_DIR}/entrypoint.sh"]
      }

      env {
        REPO_URL      = "${NOMAD_META_repo_url}"
        RUNNER_TOKEN  = "${NOMAD_META_runner_token}"
        RUNNER_NAME   = "${NOMAD_META_runner_name}"
        RUNNER_LABELS = "${NOMAD_META_labels}"
      }

      # The credential is read, used to register, and removed from the environment before
      # run.sh starts, so no workflow step can read it (BRIEF lesson 9). `exec` replaces the
      # shell, so not even /proc/<pid>/environ of the runner process holds it. It is briefly
      # on config.sh's command line, before any workflow step exists.
      #
      # --ephemeral: one job, then GitHub removes the registration.
      # --disableupdate: an update would restart the listener mid-life (BRIEF lesson 8).
      # --work: a work directory of its own inside this allocation, never shared.
      # --no-default-labels: the runner carries exactly its bucket's labels (self-hosted is
      #   among them), so it takes only the jobs runner-scaler counted it for.
      template {
        destination = "local/entrypoint.sh"
        perms       = "0755"
        data        = <<-EOT
          #!/usr/bin/env bash
          set -euo pipefail
          token="$RUNNER_TOKEN"
          unset RUNNER_TOKEN NOMAD_META_runner_token NOMAD_META_RUNNER_TOKEN

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

      # Workflow steps that use containers need a Docker daemon the runner can reach; give
      # the task one deliberately (a DinD sidecar or a socket) if your workflows need it.

      resources {
        cpu    = 2000
        memory = 4096
      }

      # A runner is only ever stopped by runner-scaler before it has an allocation, or after
      # its job; give an interrupted job's cleanup a moment anyway.
      kill_timeout = "30s"
    }
  }
}
