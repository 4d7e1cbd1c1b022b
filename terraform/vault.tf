# Vault: what the daemon may read, what a vault-mode runner job may read, and the JWT roles
# that let Nomad workload identities log in as either.
#
# The daemon's policy names each path exactly. It never uses a glob: a glob over
# secret/data/github/* would also cover the register paths (`registerVaultPath`), whose
# admin tokens must never pass through the daemon (BRIEF "vault" mode).

data "vault_policy_document" "runner_scaler" {
  # The polling token of ev-the-dev/moat (its `vaultPath`).
  rule {
    path         = "secret/data/github/moat-poll"
    capabilities = ["read"]
    description  = "vault-mode polling token"
  }

  # The Forgejo API token of alex/s3-orchestrator (its `vaultPath`).
  rule {
    path         = "secret/data/forgejo/scaler"
    capabilities = ["read"]
    description  = "Forgejo API token"
  }

  # The GitHub App's id and private key.
  rule {
    path         = "secret/data/runner-scaler/github-app"
    capabilities = ["read"]
    description  = "GitHub App key"
  }
}

resource "vault_policy" "runner_scaler" {
  name   = "runner-scaler"
  policy = data.vault_policy_document.runner_scaler.hcl
}

# Read by the prestart task of nomad/github-runner-vault.nomad.hcl, never by the daemon.
data "vault_policy_document" "runner_moat" {
  rule {
    path         = "secret/data/github/moat-runner"
    capabilities = ["read"]
    description  = "admin token that mints moat's registration tokens"
  }
}

resource "vault_policy" "runner_moat" {
  name   = "runner-moat"
  policy = data.vault_policy_document.runner_moat.hcl
}

# Nomad workload identities log in here (Nomad's `vault` block uses this mount by default
# when the agent's vault.jwt_auth_backend_path is "jwt-nomad").
resource "vault_jwt_auth_backend" "nomad" {
  path               = "jwt-nomad"
  type               = "jwt"
  description        = "Nomad workload identities"
  jwks_url           = var.nomad_jwks_url
  jwt_supported_algs = ["RS256", "EdDSA"]
}

# The daemon's role: bound to its namespace and job id.
resource "vault_jwt_auth_backend_role" "runner_scaler" {
  backend         = vault_jwt_auth_backend.nomad.path
  role_name       = "runner-scaler"
  role_type       = "jwt"
  bound_audiences = ["vault.io"]
  user_claim      = "/nomad_job_id"

  user_claim_json_pointer = true
  bound_claims = {
    nomad_namespace = var.daemon_namespace
    nomad_job_id    = var.daemon_job_id
  }
  claim_mappings = {
    nomad_namespace = "nomad_namespace"
    nomad_job_id    = "nomad_job_id"
    nomad_task      = "nomad_task"
  }
  token_type     = "service"
  token_policies = [vault_policy.runner_scaler.name]
  token_period   = 1800
}

# The vault-mode runner job's role. Nomad puts the parent's id in a dispatched child's
# `nomad_job_id` claim (Job.GetIDforWorkloadIdentity), so the parent id binds every child,
# and only the `mint` task (the one with a vault block) gets a token.
resource "vault_jwt_auth_backend_role" "runner_moat" {
  backend         = vault_jwt_auth_backend.nomad.path
  role_name       = "runner-moat"
  role_type       = "jwt"
  bound_audiences = ["vault.io"]
  user_claim      = "/nomad_job_id"

  user_claim_json_pointer = true
  bound_claims = {
    nomad_namespace = var.runner_namespace
    nomad_job_id    = "github-runner-moat-vm"
    nomad_task      = "mint"
  }
  claim_mappings = {
    nomad_namespace = "nomad_namespace"
    nomad_job_id    = "nomad_job_id"
    nomad_task      = "nomad_task"
  }
  token_type     = "service"
  token_policies = [vault_policy.runner_moat.name]
  # One registration token is minted per child; the Vault token need not outlive that.
  token_ttl     = 300
  token_max_ttl = 600
}
