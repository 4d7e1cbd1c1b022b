# Nomad: the runners' namespace and the daemon's ACL policy.

resource "nomad_namespace" "ci_runners" {
  name        = var.runner_namespace
  description = "Runner parent jobs and their dispatched children. Dispatch meta (runner registration tokens) is readable with read-job here: grant it sparingly."
}

# What runner-scaler does in Nomad and nothing more: list a parent's children, re-read one,
# dispatch, and purge (`DELETE /v1/job/<id>?purge=true` needs submit-job before Nomad 2.0;
# Nomad 2.0 adds `purge-job`, which can replace submit-job here once every server runs it).
#
# The policy is attached to the daemon's job (job_acl), so the task's workload identity
# (`identity { env = true }` in nomad/runner-scaler.nomad.hcl) is its Nomad token: no
# long-lived Nomad token exists for the daemon.
resource "nomad_acl_policy" "runner_scaler" {
  name        = "runner-scaler"
  description = "runner-scaler: list, read, dispatch and purge runner children"
  rules_hcl   = <<-EOT
    namespace "ci-runners" {
      capabilities = ["list-jobs", "read-job", "dispatch-job", "submit-job"]
    }
  EOT

  job_acl {
    namespace = var.daemon_namespace
    job_id    = var.daemon_job_id
  }
}
