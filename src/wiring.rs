//! Builds the daemon's parts from process settings: the real clients, the leader lock, the
//! loop's settings. It runs nothing; the commands (`crate::commands`) run what it builds. Bad
//! process settings are returned as one line each, which the commands report with exit 64.

use std::sync::Arc;

use async_trait::async_trait;
use secrecy::SecretString;
use tracing::{info, warn};

use crate::cli::DaemonArgs;
use crate::clients::consul::{ConsulKv, ConsulSettings};
use crate::clients::consul_lock::ConsulLock;
use crate::clients::forgejo::Forgejo;
use crate::clients::github::{AppCredentials, GitHub, GitHubSettings};
use crate::clients::http::TlsFiles;
use crate::clients::nomad::{NomadClient, NomadSettings};
use crate::clients::vault::{VaultKv, VaultSettings};
use crate::config::ConfigDefaults;
use crate::control_loop::{LoopSettings, Services};
use crate::leader::{Holder, LeaderSettings, LockStore};
use crate::model::{ErrorClass, PortError};
use crate::plan::PlanSettings;
use crate::plan::reap::ReapPolicy;
use crate::secrets::{CapabilityProbe, SecretSource, read_secret, read_secret_file};

/// Stands in for Vault when `VAULT_TOKEN` is not set: repos that need a Vault secret report
/// a configuration error, the others go on.
struct NoVault;

#[async_trait]
impl SecretSource for NoVault {
    async fn read_field(&self, path: &str, field: &str) -> Result<SecretString, PortError> {
        Err(PortError::new(
            ErrorClass::Configuration,
            format!("read {field} at {path}: VAULT_TOKEN is not set"),
        ))
    }
}

/// The live services the check asks, as `run` builds them.
#[derive(Clone)]
pub struct LiveClients {
    pub nomad: Arc<NomadClient>,
    pub github: Arc<GitHub>,
    pub forgejo: Arc<Forgejo>,
    /// `None` when `VAULT_TOKEN` is not set.
    pub vault: Option<Arc<VaultKv>>,
}

/// Everything the daemon is built from.
pub struct Built {
    pub services: Services,
    pub consul: ConsulKv,
    /// The operator's pause key (`--pause-key`).
    pub pause_key: ConsulKv,
    /// The lock holder's state key (`--state-key`, see `control_loop::carried`).
    pub state_key: Arc<ConsulKv>,
    /// The leader lock's Consul calls, and its settings.
    pub lock: Arc<dyn LockStore>,
    pub leader: LeaderSettings,
    pub loop_settings: LoopSettings,
    pub defaults: ConfigDefaults,
    /// The webhook secrets; empty unless `--webhook-listen` is set.
    pub webhook_secrets: crate::webhook::WebhookSecrets,
    /// The concrete clients, for `config check --live` and the admin-token guard.
    pub live: LiveClients,
}

/// Builds the clients from settings; an error is a bad process setting.
pub async fn build(args: &DaemonArgs) -> Result<Built, String> {
    args.validate()?;
    let timeout = args.request_timeout;
    let nomad = Arc::new(NomadClient::new(
        NomadSettings {
            addr: args.nomad_addr.clone(),
            token: read_secret("NOMAD_TOKEN")?,
            namespace: Some(args.runner_namespace.clone()),
            region: args.nomad_region.clone(),
            tls: TlsFiles {
                ca_cert: args.nomad_cacert.clone(),
                client_cert: args.nomad_client_cert.clone(),
                client_key: args.nomad_client_key.clone(),
            },
        },
        timeout,
    )?);
    let consul_settings = ConsulSettings {
        address: args.consul_http_addr.clone(),
        token: read_secret("CONSUL_HTTP_TOKEN")?,
        ca_cert: args.consul_cacert.clone(),
        client_cert: args.consul_client_cert.clone(),
        client_key: args.consul_client_key.clone(),
    };
    let consul_token = consul_settings.token.clone();
    let consul = ConsulKv::new(&consul_settings, &args.runner_scaler_config_key)?;
    let pause_key = ConsulKv::new(&consul_settings, &args.pause_key)?;
    let state_key = ConsulKv::new(&consul_settings, &args.state_key)
        .map_err(|e| format!("--state-key (RUNNER_SCALER_STATE_KEY): {e}"))?;
    crate::clients::consul::check_key(&args.leader_key)
        .map_err(|e| format!("--leader-key (RUNNER_SCALER_LEADER_KEY): {e}"))?;
    let lock: Arc<dyn LockStore> = Arc::new(ConsulLock::new(&consul, consul_token));
    if args.github_app_vault_path.is_some() && args.github_app_private_key_file.is_some() {
        return Err("set GITHUB_APP_PRIVATE_KEY_FILE or GITHUB_APP_VAULT_PATH, not both".into());
    }
    let vault = match read_secret("VAULT_TOKEN")? {
        Some(token) => Some(Arc::new(VaultKv::new(VaultSettings {
            addr: args.vault_addr.clone(),
            token,
            namespace: args.vault_namespace.clone(),
            ca_cert: args.vault_cacert.clone(),
            mount: args.vault_mount.clone(),
        })?)),
        None => None,
    };
    let secrets: Arc<dyn SecretSource> = match &vault {
        Some(vault) => vault.clone(),
        None => Arc::new(NoVault),
    };
    let mut vault_webhook_secret = None;
    let app = match (
        &args.github_app_id,
        &args.github_app_private_key_file,
        &args.github_app_vault_path,
    ) {
        (Some(app_id), Some(key_file), None) => Some(AppCredentials {
            app_id: app_id.clone(),
            private_key: read_secret_file(key_file, "GITHUB_APP_PRIVATE_KEY_FILE")?,
            installation_id: args.github_app_installation_id,
        }),
        (_, None, Some(path)) => {
            let Some(vault) = &vault else {
                return Err("GITHUB_APP_VAULT_PATH is set but VAULT_TOKEN is not".into());
            };
            let secret = vault
                .read_app_credentials(path)
                .await
                .map_err(|e| format!("read the GitHub App from Vault at {path}: {e}"))?;
            vault_webhook_secret = secret.webhook_secret;
            Some(AppCredentials {
                app_id: args.github_app_id.clone().unwrap_or(secret.app_id),
                private_key: secret.private_key,
                installation_id: args.github_app_installation_id.or(secret.installation_id),
            })
        }
        (None, None, None) => None,
        (None, Some(_), None) => {
            return Err("GITHUB_APP_PRIVATE_KEY_FILE is set but GITHUB_APP_ID is not".into());
        }
        (Some(_), None, None) => {
            return Err(
                "GITHUB_APP_ID is set but neither GITHUB_APP_PRIVATE_KEY_FILE nor GITHUB_APP_VAULT_PATH is"
                    .into(),
            );
        }
        (_, Some(_), Some(_)) => unreachable!("refused above"),
    };
    if app.is_none() {
        info!("no GitHub App configured: only vault and forgejo repos can be served");
    }
    let github = Arc::new(GitHub::new(
        GitHubSettings {
            api_url: args.github_api_url.clone(),
            app,
            request_timeout: timeout,
        },
        secrets.clone(),
    )?);
    let forgejo_tls = TlsFiles {
        ca_cert: args.forgejo_cacert.clone(),
        ..TlsFiles::default()
    };
    let forgejo = Arc::new(
        Forgejo::new(secrets, &forgejo_tls, timeout)
            .map_err(|e| format!("--forgejo-cacert (FORGEJO_CACERT): {e}"))?,
    );
    let webhook_secrets = if args.webhook_listen_addr()?.is_some() {
        crate::webhook::read_secrets(vault_webhook_secret)?
    } else {
        crate::webhook::WebhookSecrets::default()
    };
    let live = LiveClients {
        nomad: nomad.clone(),
        github: github.clone(),
        forgejo: forgejo.clone(),
        vault: vault.clone(),
    };
    Ok(Built {
        webhook_secrets,
        live,
        services: match &vault {
            Some(vault) => Services::of(github, forgejo, nomad).with_wrapper(vault.clone()),
            None => {
                warn!(
                    "VAULT_TOKEN is not set: runner credentials go into Nomad dispatch meta as \
                     they are, readable by anyone with read-job in the runners' namespace; set \
                     VAULT_TOKEN or VAULT_TOKEN_FILE so that each is wrapped in a single-use \
                     Vault token"
                );
                Services::of(github, forgejo, nomad)
            }
        },
        consul,
        pause_key,
        state_key: Arc::new(state_key),
        lock,
        leader: LeaderSettings {
            key: args.leader_key.clone(),
            ttl: args.lock_ttl,
            holder: Holder::of_this_process(),
        },
        loop_settings: LoopSettings {
            poll_interval: args.poll_interval,
            idle_poll_interval: args.idle_poll_interval.unwrap_or(
                if args.webhook_listen_addr()?.is_some() {
                    crate::control_loop::polls::IDLE_POLL_INTERVAL_WITH_WEBHOOKS
                } else {
                    crate::control_loop::polls::IDLE_POLL_INTERVAL_DEFAULT
                },
            ),
            list_concurrency_max: usize::from(args.max_concurrent_polls),
            plan: PlanSettings {
                max_in_flight: args.max_in_flight,
                vault_children_cleanup: args.vault_children_cleanup,
                reap: ReapPolicy {
                    orphan_grace: args.orphan_grace,
                    idle_confirm: args.idle_confirm,
                    job_listing_lag: args.job_listing_lag,
                    hard_bound: args.hard_bound,
                    placement_timeout: args.placement_timeout,
                },
            },
            metrics: Arc::new(crate::metrics::Metrics::new(
                args.poll_interval,
                args.stuck_after,
                crate::clock::Clock::now(&crate::clock::SystemClock),
            )),
            ..LoopSettings::default()
        },
        defaults: ConfigDefaults {
            default_job: args.default_job.clone(),
            default_repo_max: args.default_repo_max,
        },
    })
}

impl Built {
    /// The daemon asks Vault whether it can read an admin token whenever it has Vault.
    pub fn admin_token_probe(&self) -> Option<Arc<dyn CapabilityProbe>> {
        self.live
            .vault
            .clone()
            .map(|vault| vault as Arc<dyn CapabilityProbe>)
    }
}
