# Vault: the KV v2 mount, what the daemon may read, what each vault-mode runner's prestart task
# may read, and the JWT roles that let Nomad workload identities log in as either.
#
# Every policy path is exact and built from var.vault_kv_mount: KV v2 reads go to
# <mount>/data/<path>. The daemon's policy never uses a glob: a glob over <mount>/data/github/*
# would also cover the register paths (`registerVaultPath`), whose admin tokens must never pass
# through the daemon (BRIEF "vault" mode). Policy syntax:
# https://developer.hashicorp.com/vault/docs/concepts/policies

resource "vault_mount" "kv" {
  count       = var.create_vault_kv_mount ? 1 : 0
  path        = var.vault_kv_mount
  type        = "kv"
  options     = { version = "2" }
  description = "KV v2 secrets of runner-scaler and its runners"
}

locals {
  # Depends on the mount when this configuration creates it, so policies never name a mount
  # that does not exist yet; the name itself is always the variable's.
  kv_mount = var.create_vault_kv_mount ? vault_mount.kv[0].path : var.vault_kv_mount
}

data "vault_policy_document" "runner_scaler" {
  # The GitHub App's id and private key (fields app_id, private_key, optional installation_id).
  rule {
    path         = "${local.kv_mount}/data/${var.github_app_vault_path}"
    capabilities = ["read"]
    description  = "GitHub App key"
  }

  # Each vault-mode repo's polling token and each Forgejo repo's API token (field `token`).
  dynamic "rule" {
    for_each = var.daemon_secret_paths
    content {
      path         = "${local.kv_mount}/data/${rule.value}"
      capabilities = ["read"]
      description  = "a repo's vaultPath"
    }
  }
}

resource "vault_policy" "runner_scaler" {
  name   = "runner-scaler"
  policy = data.vault_policy_document.runner_scaler.hcl

  lifecycle {
    # A path the daemon reads that is also a vault-mode runner's registerVaultPath would hand
    # the daemon that repo's admin token; the daemon refuses such a repo at run time too.
    precondition {
      condition     = length(setintersection(toset(var.daemon_secret_paths), toset([for runner in var.vault_mode_runners : runner.register_path]))) == 0
      error_message = "daemon_secret_paths names a register_path of vault_mode_runners: the daemon must never be able to read a repo's admin token."
    }
  }
}

# Read by the prestart task of each vault-mode parent (nomad/github-runner-vault.nomad.hcl),
# never by the daemon: the admin token at its registerVaultPath.
data "vault_policy_document" "vault_mode_runner" {
  for_each = var.vault_mode_runners

  rule {
    path         = "${local.kv_mount}/data/${each.value.register_path}"
    capabilities = ["read"]
    description  = "admin token that mints ${each.value.job_id}'s runner credentials"
  }
}

resource "vault_policy" "vault_mode_runner" {
  for_each = var.vault_mode_runners
  name     = each.key
  policy   = data.vault_policy_document.vault_mode_runner[each.key].hcl
}

# Nomad workload identities log in here. `nomad setup vault` creates this mount as jwt-nomad
# (hashicorp/nomad command/setup_vault.go); create it here only on a cluster set up by hand
# (create_vault_jwt_backend). The JWKS URL is HTTPS, checked against jwks_ca_pem.
resource "vault_jwt_auth_backend" "nomad" {
  count              = var.create_vault_jwt_backend ? 1 : 0
  path               = var.vault_jwt_backend_path
  type               = "jwt"
  description        = "Nomad workload identities"
  jwks_url           = var.nomad_jwks_url
  jwks_ca_pem        = var.jwks_ca_pem
  jwt_supported_algs = ["RS256", "EdDSA"]
}

locals {
  jwt_backend = var.create_vault_jwt_backend ? vault_jwt_auth_backend.nomad[0].path : var.vault_jwt_backend_path
}

# The daemon's role: bound to its namespace, job id and task, so that no job elsewhere (the
# `default` namespace above all) and no other task of its job logs in as the daemon.
resource "vault_jwt_auth_backend_role" "runner_scaler" {
  backend         = local.jwt_backend
  role_name       = var.daemon_vault_role
  role_type       = "jwt"
  bound_audiences = ["vault.io"]
  user_claim      = "/nomad_job_id"

  user_claim_json_pointer = true
  bound_claims = {
    nomad_namespace = var.daemon_namespace
    nomad_job_id    = var.daemon_job_id
    nomad_task      = var.daemon_task
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

# Each vault-mode parent's role. Nomad puts the parent's id in a dispatched child's
# `nomad_job_id` claim (Job.GetIDforWorkloadIdentity), so the parent id binds every child, and
# only the named task (the one with a vault block) gets a token. The namespace is the one the
# daemon cannot submit jobs to: nobody but an operator can register a job there with this id
# and task name and so read the admin token.
resource "vault_jwt_auth_backend_role" "vault_mode_runner" {
  for_each        = var.vault_mode_runners
  backend         = local.jwt_backend
  role_name       = each.key
  role_type       = "jwt"
  bound_audiences = ["vault.io"]
  user_claim      = "/nomad_job_id"

  user_claim_json_pointer = true
  bound_claims = {
    nomad_namespace = var.vault_runner_namespace
    nomad_job_id    = each.value.job_id
    nomad_task      = each.value.task
  }
  claim_mappings = {
    nomad_namespace = "nomad_namespace"
    nomad_job_id    = "nomad_job_id"
    nomad_task      = "nomad_task"
  }
  token_type     = "service"
  token_policies = [vault_policy.vault_mode_runner[each.key].name]
  # One credential is minted per child; the Vault token need not outlive that.
  token_ttl     = 300
  token_max_ttl = 600
}
