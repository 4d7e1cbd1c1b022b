//! GitHub: the queue of a repo's self-hosted jobs, and registration tokens, for repos in
//! `app` and `vault` mode.
//!
//! Credentials are as narrow as GitHub allows. In `app` mode a write (a registration token, a
//! JIT config, a runner deleted) carries an installation token minted for **that one repo**
//! with `administration: write`; reads (runs, jobs, runner registrations) carry the
//! installation's shared read token (`actions: read`, `administration: read`) naming the
//! document's repos of that owner. Tokens are cached until five minutes before they expire.
//! In `vault` mode the polling token is read from Vault and the daemon mints nothing: the
//! runner job reads its own admin token.
//!
//! # Layout
//!
//! This file holds the client itself: its settings, its state and its construction.
//!
//! - `reads`: the [`QueueSource`](crate::observe::QueueSource) side: how deep each repo's
//!   queue is read (quick, deep, full), runs and jobs, jobs as demand.
//! - `pages`: one paged listing: `Link` following, conditional requests (`ETag`, `304`).
//! - `registrations`: the [`Registrar`](crate::act::Registrar) and
//!   [`RunnerRegistry`](crate::act::RunnerRegistry) side: JIT configs, registration tokens,
//!   runners listed and deleted.
//! - `tokens`: which token a call carries: installation tokens (a shared read token, a
//!   per-repo write token), polling tokens from Vault, their caching.
//! - `calls`: one authenticated call on a repo: budget checks before it, charges after it,
//!   one retry on 401.
//! - [`app_auth`]: the App's JWT, installations per owner, the token cache.
//! - `transport`: one request through octocrab; classification of failures.
//! - [`budget`]: rate-limit budgets per installation / polling token.
//! - `wire`: the JSON fields read.

pub mod app_auth;
pub mod budget;
mod calls;
mod pages;
mod reads;
mod registrations;
mod tokens;
mod transport;
mod wire;

pub use transport::RESPONSE_BODY_MAX_BYTES;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use secrecy::SecretString;
use url::Url;

use crate::clients::http::REQUEST_TIMEOUT_DEFAULT;
use crate::config::{Mode, RepoConfig};
use crate::model::{ErrorClass, RepoName};
use crate::observe::PortError;
use crate::secrets::SecretSource;

use app_auth::{AppSigner, Installations, TokenCache};
use budget::ContentRequests;
pub use budget::{
    Budget, BudgetHolder, CONTENT_REQUESTS_PER_HOUR, CONTENT_REQUESTS_PER_MINUTE,
    READ_POINTS_PER_MINUTE_MAX, RateBudgets, SecondaryPoints, URGENT_READ_POINTS_HEADROOM,
};
use pages::Conditional;
pub use pages::{PAGES_MAX, PER_PAGE};
use reads::LastRead;
pub use reads::{DEEP_READ_INTERVAL, RUN_SEARCH_CAP, RUN_STATUSES_WITH_QUEUED_JOBS};
use tokens::App;
pub use tokens::{POLLING_TOKEN_FIELD, POLLING_TOKEN_TTL};
pub use transport::SECONDARY_LIMIT_WAIT_S;
use transport::Transport;

pub const GITHUB_API_URL_DEFAULT: &str = "https://api.github.com";

/// The clock the client reads: token lifetimes, JWT claims, rate-limit resets.
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// The GitHub App's credentials.
#[derive(Clone, Debug)]
pub struct AppCredentials {
    /// The App id (numeric) or client id (`Iv1.…`); goes into the JWT's `iss`.
    pub app_id: String,
    /// The App's private key, PEM.
    pub private_key: SecretString,
    /// Used for an owner whose installation lookup answers 404.
    pub installation_id: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct GitHubSettings {
    /// `GITHUB_API_URL`: `https://api.github.com`, `https://<host>/api/v3` (GHES) or
    /// `https://api.<tenant>.ghe.com` (GHE.com).
    pub api_url: Url,
    /// `None` when no App is configured: only `vault` repos can then be served.
    pub app: Option<AppCredentials>,
    pub request_timeout: Duration,
}

impl GitHubSettings {
    /// Reads `GITHUB_API_URL`, `GITHUB_APP_ID`, `GITHUB_APP_PRIVATE_KEY_FILE` and
    /// `GITHUB_APP_INSTALLATION_ID` through `var` (the process environment in production).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<GitHubSettings, String> {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let raw_url = var("GITHUB_API_URL").unwrap_or_else(|| GITHUB_API_URL_DEFAULT.to_string());
        let api_url = Url::parse(raw_url.trim())
            .map_err(|e| format!("GITHUB_API_URL {raw_url:?} is not a URL: {e}"))?;
        if !matches!(api_url.scheme(), "https" | "http") {
            return Err(format!("GITHUB_API_URL {raw_url:?} is not an http(s) URL"));
        }
        let installation_id = match var("GITHUB_APP_INSTALLATION_ID") {
            Some(raw) => Some(
                raw.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("GITHUB_APP_INSTALLATION_ID {raw:?} is not a number"))?,
            ),
            None => None,
        };
        let app = match (var("GITHUB_APP_ID"), var("GITHUB_APP_PRIVATE_KEY_FILE")) {
            (Some(app_id), Some(key_file)) => {
                let pem = std::fs::read_to_string(key_file.trim()).map_err(|e| {
                    format!("read GITHUB_APP_PRIVATE_KEY_FILE {}: {e}", key_file.trim())
                })?;
                Some(AppCredentials {
                    app_id: app_id.trim().to_string(),
                    private_key: SecretString::from(pem),
                    installation_id,
                })
            }
            (None, None) => None,
            (Some(_), None) => {
                return Err("GITHUB_APP_ID is set but GITHUB_APP_PRIVATE_KEY_FILE is not".into());
            }
            (None, Some(_)) => {
                return Err("GITHUB_APP_PRIVATE_KEY_FILE is set but GITHUB_APP_ID is not".into());
            }
        };
        Ok(GitHubSettings {
            api_url,
            app,
            request_timeout: REQUEST_TIMEOUT_DEFAULT,
        })
    }
}

/// The web URL runners register against, from the API URL: `api.github.com` →
/// `https://github.com`; GHE.com `api.<tenant>.ghe.com` → `https://<tenant>.ghe.com`; GHES
/// `https://<host>/api/v3` → `https://<host>`.
pub fn web_url_of(api_url: &Url) -> String {
    let host = api_url.host_str().unwrap_or_default();
    if host.eq_ignore_ascii_case("api.github.com") {
        return "https://github.com".to_string();
    }
    let mut web = api_url.clone();
    web.set_query(None);
    web.set_fragment(None);
    if let Some(tenant) = host
        .strip_prefix("api.")
        .filter(|h| h.ends_with(".ghe.com"))
    {
        let tenant = tenant.to_string();
        let _ = web.set_host(Some(&tenant));
    }
    let path = web.path().trim_end_matches('/').to_string();
    let path = path.strip_suffix("/api/v3").unwrap_or(&path).to_string();
    web.set_path(&path);
    web.to_string().trim_end_matches('/').to_string()
}

/// The GitHub client: a [`QueueSource`](crate::observe::QueueSource) and a
/// [`Registrar`](crate::act::Registrar) for `app` and `vault` repos.
pub struct GitHub {
    transport: Transport,
    web_url: String,
    app: Option<App>,
    secrets: Arc<dyn SecretSource>,
    polling_tokens: Mutex<HashMap<String, (SecretString, DateTime<Utc>)>>,
    budgets: RateBudgets,
    /// Secondary-limit points spent per holder in the last minute.
    secondary: SecondaryPoints,
    /// Content-creating requests per holder in the last hour.
    content: ContentRequests,
    /// Idle reads wait for a holder at this many points in a minute (the loop defers them,
    /// through `read_points_left`).
    read_points_per_minute_max: u32,
    /// The client refuses every read of a holder at this many points in a minute.
    read_points_refused_at: u32,
    conditional: Mutex<HashMap<RepoName, HashMap<String, Conditional>>>,
    /// The configured `app` repo names per owner (lowercased), which shared read tokens name.
    read_sets: Mutex<HashMap<String, BTreeSet<String>>>,
    /// Groups of repos GitHub refused a shared read token for, per owner and group.
    shared_refused: Mutex<HashMap<(String, usize), Vec<String>>>,
    /// How each repo's queue was found at its last read.
    last_reads: Mutex<HashMap<RepoName, LastRead>>,
    /// Repos whose next read is a full one (a webhook hinted at them).
    hinted: Mutex<HashSet<RepoName>>,
    /// Listings are sent with `If-None-Match` when a body is cached (the default).
    conditional_requests: bool,
    clock: Clock,
}

impl GitHub {
    /// `secrets` serves the polling tokens of `vault` repos.
    pub fn new(settings: GitHubSettings, secrets: Arc<dyn SecretSource>) -> Result<GitHub, String> {
        let transport = Transport::new(&settings.api_url, settings.request_timeout)?;
        GitHub::with_transport(settings, transport, secrets)
    }

    /// A client whose requests are answered by `service` instead of going over the network
    /// (the seeded simulator's in-memory GitHub): everything above the socket runs as in
    /// production. `settings.api_url` still names the API (the web URL runners register
    /// against, and the only origin `Link` URLs may point to). Must be called inside the
    /// tokio runtime that drives the requests: octocrab spawns its buffer worker on it.
    pub fn over_service<S>(
        settings: GitHubSettings,
        service: S,
        secrets: Arc<dyn SecretSource>,
    ) -> Result<GitHub, String>
    where
        S: tower::Service<http::Request<octocrab::OctoBody>, Response = http::Response<String>>
            + Send
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let transport =
            Transport::over_service(&settings.api_url, settings.request_timeout, service);
        GitHub::with_transport(settings, transport, secrets)
    }

    fn with_transport(
        settings: GitHubSettings,
        transport: Transport,
        secrets: Arc<dyn SecretSource>,
    ) -> Result<GitHub, String> {
        let app = match &settings.app {
            Some(creds) => Some(App {
                signer: AppSigner::new(&creds.app_id, &creds.private_key)?,
                fallback_installation: creds.installation_id,
                installations: Installations::default(),
                tokens: TokenCache::default(),
            }),
            None => None,
        };
        Ok(GitHub {
            web_url: web_url_of(&settings.api_url),
            transport,
            app,
            secrets,
            polling_tokens: Mutex::default(),
            budgets: RateBudgets::default(),
            secondary: SecondaryPoints::default(),
            content: ContentRequests::default(),
            read_points_per_minute_max: READ_POINTS_PER_MINUTE_MAX,
            read_points_refused_at: READ_POINTS_PER_MINUTE_MAX + URGENT_READ_POINTS_HEADROOM,
            conditional: Mutex::default(),
            read_sets: Mutex::default(),
            shared_refused: Mutex::default(),
            last_reads: Mutex::default(),
            hinted: Mutex::default(),
            conditional_requests: true,
            clock: Arc::new(Utc::now),
        })
    }

    /// Polls without `If-None-Match`: every listing is a full, billed request (the baseline
    /// a benchmark compares conditional requests against).
    pub fn without_conditional_requests(mut self) -> GitHub {
        self.conditional_requests = false;
        self
    }

    /// Refuses reads of a holder at `points` of GitHub's secondary limit in a minute, and
    /// has idle reads wait [`URGENT_READ_POINTS_HEADROOM`] short of that, instead of
    /// [`READ_POINTS_PER_MINUTE_MAX`] and that plus the headroom (tests).
    pub fn with_read_points_per_minute(mut self, points: u32) -> GitHub {
        self.read_points_refused_at = points;
        self.read_points_per_minute_max = points.saturating_sub(URGENT_READ_POINTS_HEADROOM);
        self
    }

    /// Replaces the wall clock (tests and the simulated world).
    pub fn with_clock(mut self, clock: Clock) -> GitHub {
        self.clock = clock;
        self
    }

    fn now(&self) -> DateTime<Utc> {
        (self.clock)()
    }

    /// `Some(t)` while the rate-limit budget `repo` spends from is exhausted or paused: the loop
    /// skips the repo until `t` instead of spending requests on refusals. `list_jobs` and
    /// `mint` also refuse on their own, without a request.
    pub fn paused_until(&self, repo: &RepoConfig) -> Option<DateTime<Utc>> {
        let holder = self.holder_of(repo)?;
        self.budgets.paused_until(&holder, self.now())
    }

    /// Whose primary budget `repo`'s reads are charged to, once known.
    fn holder_of(&self, repo: &RepoConfig) -> Option<BudgetHolder> {
        match &repo.mode {
            Mode::App => Some(BudgetHolder::Installation(
                self.app
                    .as_ref()?
                    .installations
                    .last_known(repo.repo.owner())?,
            )),
            Mode::Vault { vault_path, .. } => Some(BudgetHolder::PollingToken {
                vault_path: vault_path.clone(),
            }),
            Mode::Forgejo { .. } => None,
        }
    }

    /// Every rate-limit budget seen so far.
    pub fn budgets(&self) -> Vec<(BudgetHolder, Budget)> {
        self.budgets.snapshot()
    }
}

fn not_github(repo: &RepoConfig) -> PortError {
    PortError::new(
        ErrorClass::Configuration,
        format!(
            "{} is a {} repo, not a GitHub one",
            repo.repo,
            repo.mode.as_str()
        ),
    )
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret;

    use super::*;

    #[test]
    fn web_urls_of_github_ghes_and_ghe_com() {
        let web = |api: &str| web_url_of(&Url::parse(api).unwrap());
        assert_eq!(web("https://api.github.com"), "https://github.com");
        assert_eq!(web("https://api.github.com/"), "https://github.com");
        assert_eq!(
            web("https://ghe.example.com/api/v3"),
            "https://ghe.example.com"
        );
        assert_eq!(
            web("https://ghe.example.com/api/v3/"),
            "https://ghe.example.com"
        );
        assert_eq!(
            web("https://api.octocorp.ghe.com"),
            "https://octocorp.ghe.com"
        );
        assert_eq!(web("http://127.0.0.1:8080"), "http://127.0.0.1:8080");
    }

    #[test]
    fn settings_come_from_the_environment() {
        let dir = std::env::temp_dir().join(format!("rs-gh-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("key.pem");
        std::fs::write(&key, "PEM").unwrap();
        let env: HashMap<&str, String> = [
            (
                "GITHUB_API_URL",
                "https://ghe.example.com/api/v3".to_string(),
            ),
            ("GITHUB_APP_ID", "Iv1.abc".to_string()),
            ("GITHUB_APP_PRIVATE_KEY_FILE", key.display().to_string()),
            ("GITHUB_APP_INSTALLATION_ID", "42".to_string()),
        ]
        .into();
        let settings = GitHubSettings::from_env(|k| env.get(k).cloned()).unwrap();
        assert_eq!(settings.api_url.as_str(), "https://ghe.example.com/api/v3");
        let app = settings.app.unwrap();
        assert_eq!(
            (app.app_id.as_str(), app.installation_id),
            ("Iv1.abc", Some(42))
        );
        assert_eq!(app.private_key.expose_secret(), "PEM");

        let defaults = GitHubSettings::from_env(|_| None).unwrap();
        assert_eq!(defaults.api_url.as_str(), "https://api.github.com/");
        assert!(defaults.app.is_none());
        assert!(GitHubSettings::from_env(|k| (k == "GITHUB_APP_ID").then(|| "1".into())).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
