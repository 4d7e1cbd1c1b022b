# The document runner-scaler reads, and the permissions it needs in Consul.

# The live document is edited in Consul (adding a repo is one line there); Terraform must never
# write over it. The Consul provider has no create-only write (no `?cas=0` on consul_keys), so
# seeding is opt-in and guarded:
# - seed_config (default false) creates this resource at all;
# - the precondition reads the key first and refuses the plan when it already holds anything;
# - the key block has no `delete = true`, so the key stays when seed_config goes back to false
#   and Terraform drops the resource (consul_keys deletes only keys marked `delete`).
# The window between that read and the write is one plan/apply: do not seed while someone is
# writing the document by hand.
data "consul_keys" "live_config" {
  key {
    name    = "document"
    path    = var.config_key
    default = ""
  }
}

resource "consul_keys" "seed_config" {
  count = var.seed_config ? 1 : 0

  key {
    path  = var.config_key
    value = file("${path.module}/${var.config_file}")
  }

  lifecycle {
    # Only the first write: later edits in Consul are not reverted.
    ignore_changes = [key]

    precondition {
      condition     = data.consul_keys.live_config.var.document == ""
      error_message = "Consul key ${var.config_key} already holds a document: set seed_config = false (Terraform never writes over a live document)."
    }
  }
}

# Read on exactly the document's key and the operator's pause key: not a prefix, not the rest
# of KV. Write on exactly the leader lock's key (`?acquire=` and `?release=` are writes) and
# the state key (only the lock holder writes it; a standby reads the lock key alone), and
# sessions on exactly the daemon's nodes. Consul checks session:write on a session's node to
# create, renew and destroy it (agent/consul/session_endpoint.go, Session.Apply and Renew), and
# the daemon's `PUT /v1/session/create` names no node, so its local agent fills in its own
# `node_name` (agent/session_endpoint.go). `session_prefix ""` would let the daemon's token
# destroy any session in the cluster, and a session with Behavior=delete deletes the keys it
# holds when it is destroyed: so one exact `session` rule per node of var.daemon_nodes, the
# nodes the daemon's job is pinned to (nomad/runner-scaler.nomad.hcl, constraint on
# ${node.unique.name}). That pin is by the Nomad client's node name; the session is by the
# Consul agent's: both are the hostname unless configured otherwise, and must agree.
# Rule syntax: https://developer.hashicorp.com/consul/docs/security/acl/acl-rules
resource "consul_acl_policy" "runner_scaler_config" {
  name        = "runner-scaler-config"
  description = "runner-scaler reads its document and its pause key, and holds its leader lock from its own nodes"
  rules       = <<-EOT
    key "${var.config_key}" {
      policy = "read"
    }
    key "${var.pause_key}" {
      policy = "read"
    }
    key "${var.leader_key}" {
      policy = "write"
    }
    key "${var.state_key}" {
      policy = "write"
    }
    %{for node in var.daemon_nodes~}
    session "${node}" {
      policy = "write"
    }
    %{endfor~}
  EOT
}

# Nomad's Consul task identities log in through this auth method (the Nomad agents'
# consul.task_auth_method). On a cluster set up with `nomad setup consul` it exists already
# (create_consul_auth_method = false); the JWKS URL is HTTPS, checked against jwks_ca_pem.
resource "consul_acl_auth_method" "nomad_workloads" {
  count       = var.create_consul_auth_method ? 1 : 0
  name        = var.consul_auth_method
  type        = "jwt"
  description = "Nomad workload identities"
  config_json = jsonencode(merge(
    {
      JWKSURL          = var.nomad_jwks_url
      JWTSupportedAlgs = ["RS256"]
      BoundAudiences   = ["consul.io"]
      ClaimMappings = {
        nomad_namespace = "nomad_namespace"
        nomad_job_id    = "nomad_job_id"
        nomad_task      = "nomad_task"
      }
    },
    var.jwks_ca_pem == "" ? {} : { JWKSCACert = var.jwks_ca_pem },
  ))
}

locals {
  consul_auth_method = var.create_consul_auth_method ? consul_acl_auth_method.nomad_workloads[0].name : var.consul_auth_method
}

resource "consul_acl_role" "runner_scaler" {
  name     = "runner-scaler"
  policies = [consul_acl_policy.runner_scaler_config.id]
}

# The daemon's task, and only it, gets the role above: bound by namespace, job id and task.
# The selector reads the claims the auth method maps (ClaimMappings: nomad_namespace,
# nomad_job_id, nomad_task, the mapping `nomad setup consul` configures too).
resource "consul_acl_binding_rule" "runner_scaler" {
  auth_method = local.consul_auth_method
  description = "runner-scaler's task gets the runner-scaler role"
  selector    = "value.nomad_namespace==\"${var.daemon_namespace}\" and value.nomad_job_id==\"${var.daemon_job_id}\" and value.nomad_task==\"${var.daemon_task}\""
  bind_type   = "role"
  bind_name   = consul_acl_role.runner_scaler.name
}

# Runner tasks on Nomad 1.8 and 1.9. There, once the servers set `consul { task_identity }`,
# every task with a template block gets an implicit Consul workload identity at registration
# (hashicorp/nomad nomad/job_endpoint_hook_implicit_identities.go, v1.8.0 and v1.9.0: `if
# len(t.Templates) > 0 { h.handleConsulTasks(t, tg) }`), and the client logs each one in before
# any task starts (client/allocrunner/consul_hook.go). With no binding rule matching, Consul
# answers "Permission denied" (agent/consul/auth/binder.go: no bindings, no token) and the
# allocation fails with "failed to derive Consul token for task …" before the entrypoint runs.
# Every runner task has templates (the entrypoint, the CA), so without this rule no runner ever
# starts on 1.8 or 1.9. Nomad 1.10 no longer adds that identity (hashicorp/nomad#25298).
#
# The role below has no policy, no service or node identity: the token it gives grants nothing
# beyond what Consul's default_policy allows every token (nothing, with `deny`). A role binding
# counts only if the role exists at login (binder.go), so the rule names the resource. Runner
# parents registered on a 1.8 or 1.9 server keep the identity in their stored spec after an
# upgrade to 1.10: register them again (`nomad job run`) and the rule is no longer used. Make
# sure no other binding rule of the auth method (a catch-all of your own, say) gives these
# namespaces a role that grants something: runners run whatever a workflow says.
resource "consul_acl_role" "runner_tasks" {
  name        = "ci-runner-tasks"
  description = "Runner tasks of Nomad 1.8 and 1.9 (implicit Consul identity of a task with templates): grants nothing"
}

resource "consul_acl_binding_rule" "runner_tasks" {
  auth_method = local.consul_auth_method
  description = "runner tasks log in to Consul and get a role that grants nothing (Nomad 1.8 and 1.9)"
  # The auth method's ClaimMappings project nomad_namespace as value.nomad_namespace (Consul's
  # JWT validator: selectable fields `value` and `list`); `nomad setup consul` maps it too.
  selector  = "value.nomad_namespace==\"${var.runner_namespace}\" or value.nomad_namespace==\"${var.vault_runner_namespace}\""
  bind_type = "role"
  bind_name = consul_acl_role.runner_tasks.name
}
