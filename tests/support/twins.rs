//! Twins of all five services on loopback, provisioned the way an operator would (parents
//! registered, secrets stored, the App installed), and the real daemon's clients pointed at
//! them: shared by `cli.rs` and the `loop_over_twins*.rs` tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rand::SeedableRng;
use runner_scaler::config::{Config, ConfigDefaults, parse_document};
use runner_scaler::control_loop::{Controller, LoopSettings};
use runner_scaler::model::RepoName;
use runner_scaler::sim::daemon_clients::{TwinAddresses, TwinCredentials};
use runner_scaler::sim::twins::TwinServer;
use runner_scaler::sim::twins::consul::ConsulTwin;
use runner_scaler::sim::twins::forgejo::ForgejoTwin;
use runner_scaler::sim::twins::github::{
    GitHubTwin, TEST_APP_ID, TEST_APP_PRIVATE_KEY_PEM, accepted_permissions,
};
use runner_scaler::sim::twins::nomad::{NomadTwin, PayloadRule, TwinJob};
use runner_scaler::sim::twins::vault::{VaultPolicy, VaultTwin};
use serde_json::json;

pub const CONFIG_KEY: &str = "runners/config";
pub const NOMAD_TOKEN: &str = "twin-nomad-token-7f3a";
pub const VAULT_TOKEN: &str = "twin-vault-token-91c2";
pub const CONSUL_TOKEN: &str = "twin-consul-token-5d8e";
pub const POLL_TOKEN: &str = "twin-github-poll-token-2b6f";
pub const FORGEJO_TOKEN: &str = "twin-forgejo-api-token-c4e1";

/// What the daemon under test presents; [`Twins::start`] makes the twins accept it.
pub const CREDENTIALS: TwinCredentials = TwinCredentials {
    nomad_token: NOMAD_TOKEN,
    consul_token: CONSUL_TOKEN,
    vault_token: VAULT_TOKEN,
    github_app_id: TEST_APP_ID,
    github_app_private_key_pem: TEST_APP_PRIVATE_KEY_PEM,
    config_key: CONFIG_KEY,
};

pub use runner_scaler::sim::world::{
    BRIEF_DOCUMENT_TEMPLATE, PARENT_META_OPTIONAL, TOKEN_PARENT_META_REQUIRED,
};

pub fn repo(name: &str) -> RepoName {
    RepoName::parse(name).expect("a valid repo name")
}

/// Parses a document with the default process settings; panics on a problem.
pub fn config(document: &str) -> Config {
    parse_document(document.as_bytes(), &ConfigDefaults::default())
        .unwrap_or_else(|problems| panic!("the test document is invalid: {problems:?}"))
}

/// Answers chosen GitHub repos' routes with an error status instead of the twin, as a GitHub
/// outage or a revoked grant that touches one repo only would.
#[derive(Clone, Default)]
pub struct GitHubFaults(Arc<Mutex<FaultState>>);

#[derive(Default)]
struct FaultState {
    /// Path prefix → the status answered.
    failing: BTreeMap<String, StatusCode>,
    /// Requests answered with a fault, per path prefix.
    hits: BTreeMap<String, usize>,
}

fn actions_prefix(repo: &RepoName) -> String {
    format!("/repos/{repo}/actions/")
}

impl GitHubFaults {
    /// Every `/repos/<repo>/actions/…` request (the token-authenticated routes: runs, jobs,
    /// runners, registration tokens) answers `status` until [`GitHubFaults::heal`].
    pub fn fail_repo(&self, repo: &RepoName, status: StatusCode) {
        self.0
            .lock()
            .unwrap()
            .failing
            .insert(actions_prefix(repo), status);
    }

    pub fn heal(&self, repo: &RepoName) {
        self.0.lock().unwrap().failing.remove(&actions_prefix(repo));
    }

    /// Requests to `repo` answered with a fault so far.
    pub fn hits(&self, repo: &RepoName) -> usize {
        self.0
            .lock()
            .unwrap()
            .hits
            .get(&actions_prefix(repo))
            .copied()
            .unwrap_or(0)
    }

    fn status_for(&self, path: &str) -> Option<StatusCode> {
        let path = path.to_ascii_lowercase();
        let mut state = self.0.lock().unwrap();
        let (prefix, status) = state
            .failing
            .iter()
            .find(|(prefix, _)| path.starts_with(prefix.as_str()))
            .map(|(prefix, status)| (prefix.clone(), *status))?;
        *state.hits.entry(prefix).or_default() += 1;
        Some(status)
    }
}

/// GitHub's `message` for an error status: what its REST API says in the JSON body.
fn github_message(status: StatusCode, token_is_a_pat: bool) -> &'static str {
    match status {
        StatusCode::UNAUTHORIZED => "Bad credentials",
        // A token without the route's permission (rate-limit 403s carry their own message
        // and `x-ratelimit-remaining: 0`, which an injected fault does not imitate).
        StatusCode::FORBIDDEN if token_is_a_pat => {
            "Resource not accessible by personal access token"
        }
        StatusCode::FORBIDDEN => "Resource not accessible by integration",
        StatusCode::NOT_FOUND => "Not Found",
        StatusCode::CONFLICT => "Conflict",
        StatusCode::UNPROCESSABLE_ENTITY => "Validation Failed",
        StatusCode::SERVICE_UNAVAILABLE => "Service Unavailable",
        _ if status.is_server_error() => "Server Error",
        _ => status.canonical_reason().unwrap_or("Error"),
    }
}

/// Answers a faulted request as GitHub would answer with that status: GitHub's message, the
/// `x-ratelimit-*` headers GitHub sends on every response (API-CONTRACTS §1.8) and, on a 403,
/// the permission the route needs in `X-Accepted-GitHub-Permissions` (§1.0).
async fn github_fault_layer(
    faults: GitHubFaults,
    github: GitHubTwin,
    request: Request,
    next: Next,
) -> Response {
    let Some(status) = faults.status_for(request.uri().path()) else {
        return next.run(request).await;
    };
    // Installation tokens start `ghs_`; anything else the twins accept is a PAT.
    let token_is_a_pat = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .is_some_and(|(_, token)| !token.trim().starts_with("ghs_"));
    // The holder's budget as the twin keeps it, nothing charged. A 401 is GitHub ignoring the
    // credential: the answer then shows the unauthenticated budget of 60 an hour.
    let rate = github
        .rate_limit_headers(request.headers())
        .filter(|_| status != StatusCode::UNAUTHORIZED)
        .unwrap_or_else(|| {
            let reset = github.now().timestamp() + 3600;
            vec![
                ("x-ratelimit-limit", "60".to_string()),
                ("x-ratelimit-remaining", "59".to_string()),
                ("x-ratelimit-used", "1".to_string()),
                ("x-ratelimit-reset", reset.to_string()),
                ("x-ratelimit-resource", "core".to_string()),
            ]
        });
    let mut response = (
        status,
        [("content-type", "application/json; charset=utf-8")],
        json!({
            "message": github_message(status, token_is_a_pat),
            "documentation_url": "https://docs.github.com/rest"
        })
        .to_string(),
    )
        .into_response();
    let headers = response.headers_mut();
    for (name, value) in rate {
        headers.insert(name, HeaderValue::from_str(&value).expect("a header value"));
    }
    if status == StatusCode::FORBIDDEN
        && let Some(accepted) = accepted_permissions(request.method(), request.uri().path())
    {
        headers.insert(
            "x-accepted-github-permissions",
            HeaderValue::from_str(&accepted).expect("a header value"),
        );
    }
    headers.insert(
        "x-github-api-version-selected",
        HeaderValue::from_static("2022-11-28"),
    );
    response
}

/// The five twins and their servers.
pub struct Twins {
    pub github: GitHubTwin,
    pub github_faults: GitHubFaults,
    pub forgejo: ForgejoTwin,
    pub nomad: NomadTwin,
    pub consul: ConsulTwin,
    pub vault: VaultTwin,
    pub github_server: TwinServer,
    pub forgejo_server: TwinServer,
    pub nomad_server: TwinServer,
    pub consul_server: TwinServer,
    pub vault_server: TwinServer,
}

impl Twins {
    /// Starts every twin on loopback, ACLs on (Nomad, Consul, Vault demand their tokens), and
    /// accepts the daemon's credentials. Nothing else is provisioned.
    pub async fn start() -> Twins {
        let github = GitHubTwin::new();
        let github_faults = GitHubFaults::default();
        let forgejo = ForgejoTwin::new();
        let nomad = NomadTwin::with_seed(1);
        let consul = ConsulTwin::with_token(CONSUL_TOKEN);
        let vault = VaultTwin::new();
        let github_router = github.router().layer(middleware::from_fn({
            let faults = github_faults.clone();
            let github = github.clone();
            move |request: Request, next: Next| {
                github_fault_layer(faults.clone(), github.clone(), request, next)
            }
        }));
        let start = |router| async { TwinServer::start(router).await.expect("serve a twin") };
        let twins = Twins {
            github_server: start(github_router).await,
            forgejo_server: forgejo.serve().await.expect("serve the Forgejo twin"),
            nomad_server: nomad.serve().await.expect("serve the Nomad twin"),
            consul_server: start(consul.router()).await,
            vault_server: vault.serve().await.expect("serve the Vault twin"),
            github,
            github_faults,
            forgejo,
            nomad,
            consul,
            vault,
        };
        twins.nomad.set_acl_token(Some(NOMAD_TOKEN));
        twins.vault.add_token(
            VAULT_TOKEN,
            VaultPolicy::read_only(["secret/data/github/moat-poll", "secret/data/forgejo/scaler"]),
        );
        twins
    }

    /// Registers a runner parent that receives a registration token in its meta.
    pub fn register_token_parent(&self, parent: &str) {
        self.nomad.register_parent(
            parent,
            TOKEN_PARENT_META_REQUIRED,
            PARENT_META_OPTIONAL,
            PayloadRule::Forbidden,
        );
    }

    /// An app-mode repo whose owner has the App installed.
    pub fn add_app_repo(&self, name: &str) -> RepoName {
        let repo = repo(name);
        self.github.install_app(repo.owner());
        self.github.add_repo(&repo);
        repo
    }

    /// The world of BRIEF.md, as `sim::world` provisions it: the three repos, their secrets
    /// in Vault, their parents in Nomad, and the document in Consul. Returns the document.
    pub fn provision_brief_world(&self) -> String {
        self.add_app_repo("afreidah/munchbox");
        self.github.add_repo(&repo("ev-the-dev/moat"));
        self.github.add_pat(
            POLL_TOKEN,
            "moat-poller",
            Some(&[repo("ev-the-dev/moat")]),
            &[("actions", "read")],
        );
        self.forgejo.add_token(FORGEJO_TOKEN);
        self.forgejo.add_repo("alex/s3-orchestrator");
        self.vault
            .put_secret("secret", "github/moat-poll", json!({ "token": POLL_TOKEN }));
        self.vault.put_secret(
            "secret",
            "forgejo/scaler",
            // The token goes only to the Forgejo its secret names.
            json!({ "token": FORGEJO_TOKEN, "url": self.forgejo_server.base_url() }),
        );
        self.vault.put_secret(
            "secret",
            "github/moat-runner",
            json!({ "token": "admin-only" }),
        );
        for parent in ["ci-runner", "forgejo-build-runner"] {
            self.register_token_parent(parent);
        }
        // Vault-mode parents read their admin token themselves: no runner_token in meta.
        for parent in ["github-runner-moat-vm", "go-ci-runner"] {
            self.nomad.register_parent(
                parent,
                &["repo_url", "runner_name"],
                PARENT_META_OPTIONAL,
                PayloadRule::Forbidden,
            );
        }
        let document =
            BRIEF_DOCUMENT_TEMPLATE.replace("FORGEJO_URL", &self.forgejo_server.base_url());
        self.consul.set(CONFIG_KEY, document.clone());
        document
    }

    /// The children of `parent` that carry our marker.
    pub fn our_children(&self, parent: &str) -> Vec<TwinJob> {
        self.nomad
            .children(parent)
            .into_iter()
            .filter(|c| c.meta.get("managed_by").map(String::as_str) == Some("runner-scaler"))
            .collect()
    }

    /// Dispatch requests Nomad received for `parent` so far.
    /// One `app` repo (cap 3) routed to `parent`, its document in Consul, and one queued
    /// `self-hosted` job: what a daemon started against the twins dispatches for.
    pub fn provision_one_queued_job(&self, name: &str, parent: &str) -> (RepoName, u64) {
        let repo = self.add_app_repo(name);
        self.register_token_parent(parent);
        self.consul.set(
            CONFIG_KEY,
            format!(r#"{{ "{name}": {{ "mode": "app", "maxConcurrent": 3 }} }}"#),
        );
        let run = self.github.add_run(&repo, vec![vec!["self-hosted"]]);
        (repo, run.job_ids[0])
    }

    /// Ticks a daemon has started so far, counted by its listings of `parent`'s children.
    pub fn listings_of_children(&self, parent: &str) -> usize {
        let prefix = format!("{parent}/dispatch-");
        self.nomad
            .requests()
            .iter()
            .filter(|r| r.path == "/v1/jobs" && r.query_param("prefix").as_deref() == Some(&prefix))
            .count()
    }

    pub fn dispatch_requests(&self, parent: &str) -> usize {
        let path = format!("/v1/job/{parent}/dispatch");
        self.nomad
            .requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path == path)
            .count()
    }

    /// Unwraps `token` at the Vault twin as a runner's entrypoint does: the wrapping token is
    /// the only credential, and there is no body. The status and the JSON answered.
    pub async fn unwrap_as_runner(&self, token: &str) -> (u16, serde_json::Value) {
        runner_scaler::clients::http::install_crypto_provider();
        let response = reqwest::Client::new()
            .post(format!(
                "{}/v1/sys/wrapping/unwrap",
                self.vault_server.base_url()
            ))
            .header("X-Vault-Token", token)
            .send()
            .await
            .expect("the Vault twin answers");
        let status = response.status().as_u16();
        (status, response.json().await.expect("Vault answers JSON"))
    }

    /// Where the twins listen.
    pub fn addresses(&self) -> TwinAddresses {
        TwinAddresses {
            github: self.github_server.base_url(),
            forgejo: self.forgejo_server.base_url(),
            nomad: self.nomad_server.base_url(),
            consul: self.consul_server.base_url(),
            vault: self.vault_server.base_url(),
        }
    }

    /// The environment `runner-scaler run|once|status` needs to reach every twin.
    pub fn daemon_env(&self, app_key_file: &Path) -> Vec<(&'static str, String)> {
        self.addresses().daemon_env(&CREDENTIALS, app_key_file)
    }

    /// A controller with the real clients pointed at the twins, as `wiring::build` makes it.
    pub fn controller(&self) -> Controller {
        let clients = self
            .addresses()
            .clients(&CREDENTIALS, Duration::from_secs(5))
            .expect("the daemon's clients");
        Controller::new(
            clients.services,
            LoopSettings::default(),
            Box::new(rand::rngs::StdRng::seed_from_u64(7)),
        )
    }
}

/// A file under the system temp directory, unique to this process and call, removed on drop.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn with_contents(tag: &str, contents: &str) -> TempFile {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "runner-scaler-test-{}-{}-{tag}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, contents).expect("write a temp file");
        TempFile(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
