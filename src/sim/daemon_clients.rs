//! The daemon's real clients pointed at a set of twins, as `wiring::build` builds them from
//! process settings: one builder for the demo world, the process bench and the tests, so a
//! change to how the daemon is wired is made once.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;
use url::Url;

use crate::clients::consul::{ConsulKv, ConsulSettings};
use crate::clients::forgejo::Forgejo;
use crate::clients::github::{AppCredentials, GitHub, GitHubSettings};
use crate::clients::http::TlsFiles;
use crate::clients::nomad::{NomadClient, NomadSettings};
use crate::clients::vault::{VaultKv, VaultSettings};
use crate::control_loop::Services;

/// Where each twin listens: `http://127.0.0.1:<port>`, as [`crate::sim::twins::TwinServer::base_url`]
/// gives it.
#[derive(Clone, Debug)]
pub struct TwinAddresses {
    pub github: String,
    /// Not a process setting: the document names each Forgejo repo's instance.
    pub forgejo: String,
    pub nomad: String,
    pub consul: String,
    pub vault: String,
}

/// What the daemon presents to the twins; the twins are provisioned to accept exactly these.
/// Plain strings: they are made-up values a twin checks, never real credentials.
#[derive(Clone, Copy, Debug)]
pub struct TwinCredentials {
    pub nomad_token: &'static str,
    pub consul_token: &'static str,
    pub vault_token: &'static str,
    pub github_app_id: &'static str,
    pub github_app_private_key_pem: &'static str,
    /// The Consul KV key of the document.
    pub config_key: &'static str,
}

/// The daemon's clients: the loop's services and the Consul client the config watcher reads.
pub struct DaemonClients {
    pub services: Services,
    pub consul: ConsulKv,
}

/// Vault's KV v2 mount the twins serve the secrets under.
const VAULT_MOUNT: &str = "secret";

impl TwinAddresses {
    /// Builds the real clients against the twins, each request bounded by `request_timeout`.
    pub fn clients(
        &self,
        credentials: &TwinCredentials,
        request_timeout: Duration,
    ) -> Result<DaemonClients, String> {
        let url = |what: &str, address: &str| {
            Url::parse(address).map_err(|e| format!("the {what} twin's address {address:?}: {e}"))
        };
        let vault = Arc::new(VaultKv::new(VaultSettings {
            addr: url("Vault", &self.vault)?,
            token: SecretString::from(credentials.vault_token),
            namespace: None,
            ca_cert: None,
            mount: VAULT_MOUNT.into(),
        })?);
        let github = Arc::new(GitHub::new(
            GitHubSettings {
                api_url: url("GitHub", &self.github)?,
                app: Some(AppCredentials {
                    app_id: credentials.github_app_id.into(),
                    private_key: SecretString::from(credentials.github_app_private_key_pem),
                    installation_id: None,
                }),
                request_timeout,
            },
            vault.clone(),
        )?);
        let forgejo = Arc::new(Forgejo::new(
            vault.clone(),
            &TlsFiles::default(),
            request_timeout,
        )?);
        let mut nomad_settings = NomadSettings::new(url("Nomad", &self.nomad)?);
        nomad_settings.token = Some(SecretString::from(credentials.nomad_token));
        let nomad = Arc::new(NomadClient::new(nomad_settings, request_timeout)?);
        let consul = ConsulKv::new(
            &ConsulSettings {
                address: self.consul.clone(),
                token: Some(SecretString::from(credentials.consul_token)),
                ca_cert: None,
                client_cert: None,
                client_key: None,
            },
            credentials.config_key,
        )?;
        Ok(DaemonClients {
            // Credentials go into dispatch meta wrapped, as the daemon wraps them with Vault.
            services: Services::of(github, forgejo, nomad).with_wrapper(vault),
            consul,
        })
    }

    /// The environment `runner-scaler run|once|status` needs to reach every twin, as a
    /// deployment sets it: addresses and tokens in variables, the App key in a file
    /// (`app_key_file`, holding `credentials.github_app_private_key_pem`).
    pub fn daemon_env(
        &self,
        credentials: &TwinCredentials,
        app_key_file: &Path,
    ) -> Vec<(&'static str, String)> {
        vec![
            ("NOMAD_ADDR", self.nomad.clone()),
            ("NOMAD_TOKEN", credentials.nomad_token.into()),
            // The twins' parents live in Nomad's `default` namespace.
            ("RUNNER_SCALER_RUNNER_NAMESPACE", "default".into()),
            ("CONSUL_HTTP_ADDR", self.consul.clone()),
            ("CONSUL_HTTP_TOKEN", credentials.consul_token.into()),
            ("RUNNER_SCALER_CONFIG_KEY", credentials.config_key.into()),
            ("VAULT_ADDR", self.vault.clone()),
            ("VAULT_TOKEN", credentials.vault_token.into()),
            ("VAULT_MOUNT", VAULT_MOUNT.into()),
            ("GITHUB_API_URL", self.github.clone()),
            ("GITHUB_APP_ID", credentials.github_app_id.into()),
            (
                "GITHUB_APP_PRIVATE_KEY_FILE",
                app_key_file.display().to_string(),
            ),
            // Any free port: a daemon run against twins must not take (or fail on) the
            // default port a real daemon on this machine may hold.
            ("RUNNER_SCALER_LISTEN", "127.0.0.1:0".into()),
        ]
    }
}
