# Nomad: the namespaces, the runner nodes' node pool and the daemon's ACL policy.
#
# Three namespaces, because who may submit jobs where decides who can take which identity:
# - daemon_namespace (runner-scaler): the daemon's service job. Only operators submit here;
#   the daemon's Vault role, Consul binding rule and this policy are bound to it.
# - runner_namespace (ci-runners): app-mode and Forgejo runner parents and their children. No
#   job here holds a Vault role, so the daemon may stop and purge children (submit-job).
# - vault_runner_namespace (ci-runners-vault): vault-mode runner parents, whose prestart task
#   holds a Vault role that reads a repo's admin token. The daemon gets no submit-job here:
#   with it, it could register a job with that id and task name and read the admin token.

resource "nomad_namespace" "daemon" {
  count       = var.create_daemon_namespace ? 1 : 0
  name        = var.daemon_namespace
  description = "The runner-scaler daemon. Only operators submit jobs here: a job registered here with the daemon's id and task gets its identities."
}

resource "nomad_namespace" "runners" {
  count       = var.create_runner_namespaces ? 1 : 0
  name        = var.runner_namespace
  description = "Runner parent jobs (app and forgejo modes) and their dispatched children. Dispatch meta (runner credentials, wrapped when the daemon has Vault) is readable with read-job here: grant it sparingly."
}

# The runner nodes' pool. Nomad refuses to register a job in a node pool that does not exist
# ("job … is in nonexistent node pool", hashicorp/nomad nomad/job_endpoint_hook_node_pool.go);
# a client registering in a new pool creates it, so without this resource the runner parents
# could be registered only after the first runner node joined. Node pools: Nomad >= 1.6,
# provider >= 2.0.
resource "nomad_node_pool" "runners" {
  count       = var.create_runner_node_pool ? 1 : 0
  name        = var.runner_node_pool
  description = "Nodes set aside for CI runners: they run whatever a workflow says, so nothing else (the daemon, Vault, other services) is scheduled beside them."
}

resource "nomad_namespace" "vault_runners" {
  count       = var.create_runner_namespaces ? 1 : 0
  name        = var.vault_runner_namespace
  description = "Vault-mode runner parent jobs, whose prestart task reads an admin token from Vault, and their children. Nobody but operators may submit jobs here."
}

# What runner-scaler does in Nomad and nothing more. Capabilities, from Nomad's ACL policy
# specification (https://developer.hashicorp.com/nomad/docs/other-specifications/acl-policy):
# - list-jobs: list a parent's children (GET /v1/jobs?prefix=…&meta=true). A listing with
#   `namespace=*` returns jobs of every namespace the token may list and needs nothing more
#   (https://developer.hashicorp.com/nomad/api-docs/jobs, "List Jobs").
# - read-job: read a child and its allocations (GET /v1/job/<id>, …/allocations).
# - dispatch-job: dispatch a parent (POST /v1/job/<id>/dispatch).
# - submit-job: "Allows jobs to be submitted, updated, or stopped"; stopping and purging a
#   child (DELETE /v1/job/<id>[?purge=true]) needs it before Nomad 1.11.2 (`nomad job stop`
#   requires submit-job and read-job, https://developer.hashicorp.com/nomad/commands/job/stop).
#   Nomad 1.11.2 split it (hashicorp/nomad#27287, backported to 1.11.x as #27390): Job.Deregister
#   accepts submit-job, purge-job, or deregister-job for a stop without purge. Older servers
#   refuse those names, so runner_namespace keeps submit-job.
#
# vault_runner_namespace never gets submit-job: with it, the daemon could register a job with a
# vault-mode parent's id and task name and read the admin token. Without anything more the
# daemon cannot stop or purge vault-mode children there. It never stops one whose allocation
# runs anyway (it has no runner API in vault mode; a surplus runner ends itself through its
# idle timeout), and dead children are removed by Nomad's batch job garbage collection (server
# `job_gc_threshold`, 4h by default) instead of being purged at once. Nothing usable is left in
# them: the dispatch meta carries no credential in vault mode (the parent refuses
# runner_token), and the JIT config the prestart task minted was single-use and bound to that
# one runner. On Nomad >= 1.11.2, nomad_vault_children_cleanup adds purge-job there (which
# stops and purges, and registers nothing) for the daemon's --vault-children-cleanup.
#
# The policy is attached to the daemon's task (job_acl: namespace, job id, group and task;
# group and task since provider 2.0 and Nomad 1.4, matched against the workload identity's
# claims in hashicorp/nomad nomad/auth/auth.go), so the task's workload identity
# (`identity { env = true }` in nomad/runner-scaler.nomad.hcl) is its Nomad token and no other
# task a later edit adds to the job gets it: no long-lived Nomad token exists for the daemon.
locals {
  # purge-job (Nomad >= 1.11.2) stops and purges a job and registers none: the daemon's
  # --vault-children-cleanup. Never submit-job, register-job or deregister-job alone here.
  vault_runner_capabilities = var.nomad_vault_children_cleanup ? "\"list-jobs\", \"read-job\", \"dispatch-job\", \"purge-job\"" : "\"list-jobs\", \"read-job\", \"dispatch-job\""
}

resource "nomad_acl_policy" "runner_scaler" {
  name        = "runner-scaler"
  description = "runner-scaler: list, read and dispatch runner children; stop and purge them where no job holds a Vault role"
  rules_hcl   = <<-EOT
    namespace "${var.runner_namespace}" {
      capabilities = ["list-jobs", "read-job", "dispatch-job", "submit-job"]
    }
    namespace "${var.vault_runner_namespace}" {
      capabilities = [${local.vault_runner_capabilities}]
    }
  EOT

  job_acl {
    namespace = var.daemon_namespace
    job_id    = var.daemon_job_id
    group     = var.daemon_group
    task      = var.daemon_task
  }
}
