# The document runner-scaler reads, and the permissions it needs in Consul.

resource "consul_keys" "runner_config" {
  key {
    path  = var.config_key
    value = file("${path.module}/${var.config_file}")
  }

  # The document is edited in Consul (adding a repo is one line there); Terraform seeds it
  # and must not put an old copy back on the next apply.
  lifecycle {
    ignore_changes = [key]
  }
}

# Read on exactly the document's key and the operator's pause key: not a prefix, not the rest
# of KV. Write on exactly the leader lock's key (`?acquire=` and `?release=` are writes), and
# sessions: the daemon creates its lock session on the local agent's node, whose name is not
# known here. https://developer.hashicorp.com/consul/docs/security/acl/acl-rules
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

# Nomad's Consul workload identity logs in through this auth method; the binding rule gives
# the runner-scaler task, and only it, the role carrying the policy above.
resource "consul_acl_auth_method" "nomad_workloads" {
  name        = "nomad-workloads"
  type        = "jwt"
  description = "Nomad workload identities"
  config_json = jsonencode({
    JWKSURL          = var.nomad_jwks_url
    JWTSupportedAlgs = ["RS256"]
    BoundAudiences   = ["consul.io"]
    ClaimMappings = {
      nomad_namespace = "nomad_namespace"
      nomad_job_id    = "nomad_job_id"
      nomad_task      = "nomad_task"
    }
  })
}

resource "consul_acl_role" "runner_scaler" {
  name     = "runner-scaler"
  policies = [consul_acl_policy.runner_scaler_config.id]
}

resource "consul_acl_binding_rule" "runner_scaler" {
  auth_method = consul_acl_auth_method.nomad_workloads.name
  description = "runner-scaler's task gets the runner-scaler role"
  selector    = "value.nomad_namespace==\"${var.daemon_namespace}\" and value.nomad_job_id==\"${var.daemon_job_id}\""
  bind_type   = "role"
  bind_name   = consul_acl_role.runner_scaler.name
}
