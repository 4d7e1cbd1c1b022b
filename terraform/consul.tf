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
# of KV. Write on exactly the leader lock's key (`?acquire=` and `?release=` are writes), and
# sessions: the daemon creates its lock session on the local agent's node, whose name is not
# known here. Rule syntax: https://developer.hashicorp.com/consul/docs/security/acl/acl-rules
resource "consul_acl_policy" "runner_scaler_config" {
  name        = "runner-scaler-config"
  description = "runner-scaler reads its document and its pause key, and holds its leader lock"
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
    session_prefix "" {
      policy = "write"
    }
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
