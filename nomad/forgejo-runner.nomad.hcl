# forgejo-build-runner: the parameterized batch job runner-scaler dispatches once per missing
# Forgejo Actions runner (`forgejo` mode; the example document's alex/s3-orchestrator
# profile). The daemon mints a registration token from the Forgejo instance and passes it
# as `runner_token`.

job "forgejo-build-runner" {
  # Dispatch meta (runner_token included) is readable with read-job in this namespace.
  namespace   = "ci-runners"
  type        = "batch"
  datacenters = ["*"]

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

    task "runner" {
      driver = "docker"

      config {
        # Pin the runner release you have tested.
        image   = "code.forgejo.org/forgejo/runner:11"
        command = "/bin/sh"
        args    = ["${NOMAD_TASK_DIR}/entrypoint.sh"]
      }

      env {
        REPO_URL      = "${NOMAD_META_repo_url}"
        RUNNER_TOKEN  = "${NOMAD_META_runner_token}"
        RUNNER_NAME   = "${NOMAD_META_runner_name}"
        RUNNER_LABELS = "${NOMAD_META_labels}"
      }

      # The instance is the repo URL without `/owner/repo`. The registration file (.runner)
      # goes to this task's own directory. Labels are bare names from the queue, so each
      # becomes `<label>:host`: the job runs inside this container, which is the isolation;
      # use `<label>:docker://<image>` instead if the task is given a Docker daemon.
      #
      # `one-job` fetches a single task, runs it and exits (it is in forgejo-runner's v11
      # source, internal/app/cmd/job.go; I could not pin the first release that ships it, so
      # check `forgejo-runner --help` for your image). If no task is waiting when it asks, it
      # exits at once: a surplus runner ends instead of idling, and runner-scaler counts the
      # early exit against the bucket's backoff. The registration stays on the Forgejo side
      # as an offline runner; Forgejo 15's ephemeral runners remove that, and are not used
      # here yet.
      template {
        destination = "local/entrypoint.sh"
        perms       = "0755"
        data        = <<-EOT
          #!/bin/sh
          set -eu
          token="$RUNNER_TOKEN"
          unset RUNNER_TOKEN NOMAD_META_runner_token NOMAD_META_RUNNER_TOKEN

          instance="$${REPO_URL%/*/*}"
          labels="$(printf '%s' "$RUNNER_LABELS" | sed 's/\([^,][^,]*\)/\1:host/g')"
          cd "$NOMAD_TASK_DIR"
          forgejo-runner register \
            --no-interactive \
            --instance "$instance" \
            --token "$token" \
            --name "$RUNNER_NAME" \
            --labels "$labels"
          unset token
          exec forgejo-runner one-job
        EOT
      }

      resources {
        cpu    = 2000
        memory = 2048
      }

      kill_timeout = "30s"
    }
  }
}
