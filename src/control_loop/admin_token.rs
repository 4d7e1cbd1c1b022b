//! The daemon's refusal of a `vault` repo whose admin token it could read.
//!
//! Whoever takes the daemon over would hold what it can read, so its own Vault token must
//! never be able to read a `registerVaultPath`; the controller asks Vault every tick it has a
//! `vault` repo, and `config check --live` asks the same question.

use std::collections::{BTreeMap, BTreeSet};

use tracing::{error, info};

use super::Controller;

use crate::config::{Config, Mode};
use crate::model::RepoName;
use crate::secrets::{CapabilityProbe, grants_read};

/// Every `vault` repo's `registerVaultPath`.
pub fn register_paths(config: &Config) -> Vec<(RepoName, String)> {
    config
        .repos
        .values()
        .filter_map(|repo| match &repo.mode {
            Mode::Vault {
                register_vault_path,
                ..
            } => Some((repo.repo.clone(), register_vault_path.clone())),
            _ => None,
        })
        .collect()
}

/// The `vault` repos whose `registerVaultPath` the daemon's token can read, or whose
/// capabilities could not be asked, each with why vault mode is refused for it. The daemon
/// must never be able to read an admin token: whoever takes it over would hold it.
pub async fn admin_token_holds(
    config: &Config,
    probe: &dyn CapabilityProbe,
) -> BTreeMap<RepoName, String> {
    let paths = register_paths(config);
    if paths.is_empty() {
        return BTreeMap::new();
    }
    let asked: Vec<String> = paths
        .iter()
        .map(|(_, p)| p.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let answer = probe.capabilities(&asked).await;
    paths
        .into_iter()
        .filter_map(|(repo, path)| {
            let api_path = probe.api_path(&path);
            let why = match &answer {
                Err(e) => format!(
                    "registerVaultPath {path}: could not ask Vault whether VAULT_TOKEN can read \
                     it ({}); vault mode is refused until it can be asked",
                    e.message
                ),
                Ok(capabilities) => {
                    let granted = capabilities.get(&path).map(Vec::as_slice).unwrap_or(&[]);
                    if !grants_read(granted) {
                        return None;
                    }
                    format!(
                        "VAULT_TOKEN can read registerVaultPath {path} ({api_path}: {}): vault \
                         mode is refused, because the daemon must never be able to read the \
                         admin token; remove read on {api_path} from the daemon's Vault policy",
                        granted.join(", ")
                    )
                }
            };
            Some((repo, why))
        })
        .collect()
}

impl Controller {
    pub(super) async fn check_admin_tokens(&mut self, config: &Config, config_version: u64) {
        let Some(probe) = &self.admin_token_probe else {
            return;
        };
        // Asked again while any repo is refused, so that a fixed policy lifts the hold.
        if self.memory.admin_token_asked_for == Some(config_version)
            && self.memory.admin_token_holds.is_empty()
        {
            return;
        }
        let holds = admin_token_holds(config, probe.as_ref()).await;
        for (repo, why) in &holds {
            if self.memory.admin_token_holds.get(repo) != Some(why) {
                error!(repo = %repo, "{why}");
            }
        }
        for repo in self.memory.admin_token_holds.keys() {
            if !holds.contains_key(repo) && config.repos.contains_key(repo) {
                info!(
                    repo = %repo,
                    "vault mode no longer refused: VAULT_TOKEN cannot read its registerVaultPath"
                );
            }
        }
        self.memory.admin_token_holds = holds;
        self.memory.admin_token_asked_for = Some(config_version);
    }
}
