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
//! - [`app_auth`]: the App's JWT, installations per owner, the token cache.
//! - `transport`: one request through octocrab; classification of failures.
//! - [`budget`]: rate-limit budgets per installation / polling token.
//! - `wire`: the JSON fields read.

pub mod app_auth;
pub mod budget;
mod transport;
mod wire;

pub use transport::RESPONSE_BODY_MAX_BYTES;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use http::{HeaderMap, Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use tracing::{debug, instrument, warn};
use url::Url;

use crate::act::{self, Deregistration, Registrar, RunnerIdentity, RunnerRegistry};
use crate::clients::http::REQUEST_TIMEOUT_DEFAULT;
use crate::config::{CredentialKind, Mode, RepoConfig};
use crate::model::{ErrorClass, RATE_LIMIT_WAIT_MAX_S, RepoName, RunnerName};
use crate::observe::{
    ForgeJob, JobState, PortError, QueueSource, ReadPoints, RepoJobs, RunnerRegistration,
};
use crate::secrets::SecretSource;

use app_auth::{
    AppSigner, InstallationToken, Installations, Permission, REPOS_PER_TOKEN_MAX, TokenCache,
    TokenKey,
};
pub use budget::{
    Budget, BudgetHolder, CONTENT_REQUESTS_PER_HOUR, CONTENT_REQUESTS_PER_MINUTE,
    READ_POINTS_PER_MINUTE_MAX, RateBudgets, SecondaryPoints, URGENT_READ_POINTS_HEADROOM,
};
use budget::{ContentRequests, creates_content};
pub use transport::SECONDARY_LIMIT_WAIT_S;
use transport::{Answer, RateHeaders, Target, Transport, classify, malformed};

pub const GITHUB_API_URL_DEFAULT: &str = "https://api.github.com";

/// GitHub's largest page.
pub const PER_PAGE: usize = 100;
/// Pages followed per listing at most. A status-filtered run listing is a search capped at
/// 1000 results (10 pages); a run has at most 256 matrix jobs per job definition.
pub const PAGES_MAX: usize = 20;
/// The run statuses whose runs can hold a queued job.
pub const RUN_STATUSES_WITH_QUEUED_JOBS: [&str; 5] =
    ["queued", "in_progress", "waiting", "pending", "requested"];
/// GitHub returns at most this many results for a filtered run listing.
pub const RUN_SEARCH_CAP: u64 = 1000;
/// How long a polling token read from Vault is reused, so that a tick does not read Vault
/// once per request; a rotation in Vault is picked up within this time (or at once on 401).
pub const POLLING_TOKEN_TTL: chrono::Duration = chrono::Duration::minutes(5);
/// A repo whose last read found no run that could hold a queued job is read with one request
/// (its newest runs, conditionally) until one of them is not completed, and its `queued` and
/// `in_progress` runs are listed once in this long: a run re-run from further back than the
/// newest [`PER_PAGE`] is found then (or at once by a webhook hint). Each repo's first such
/// listing comes at its own offset within the interval, so a fleet's do not bunch up.
pub const DEEP_READ_INTERVAL: chrono::Duration = chrono::Duration::hours(1);
/// What a deep read of a quiet repo lists: a re-run run is `queued`, or `in_progress` once a
/// job of it started. (Runs held at a gate were there before and were seen busy.)
const DEEP_READ_STATUSES: [&str; 2] = ["queued", "in_progress"];
/// A full read of a repo not read in full before: one listing per status, and at least one
/// run's jobs (it was hinted at, so something moved).
const FULL_READ_REQUESTS_AT_LEAST: u32 = RUN_STATUSES_WITH_QUEUED_JOBS.len() as u32 + 1;
/// The Vault field holding a polling token.
pub const POLLING_TOKEN_FIELD: &str = "token";

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

struct App {
    signer: AppSigner,
    fallback_installation: Option<u64>,
    installations: Installations,
    tokens: TokenCache,
}

/// A token for one call and the budget it spends.
struct Credential {
    token: SecretString,
    holder: BudgetHolder,
}

/// A listing body kept for conditional requests: a `304 Not Modified` answer costs nothing
/// against the primary rate limit, and the body is reused.
#[derive(Clone)]
struct Conditional {
    etag: String,
    body: String,
    /// The page's `Link` header: a `304` need not repeat it (RFC 9110 §15.4.5 lists what it
    /// must), and without it the walk would guess the next page's URL, a different cache key.
    link: Option<http::HeaderValue>,
}

/// What the last read of a repo's queue found, which decides how the next one reads it.
#[derive(Clone)]
enum LastRead {
    /// Runs that can hold a queued job: read in full, which took this many requests.
    Busy { requests: u32 },
    /// None: read quickly until something moves.
    Quiet(Quiet),
}

impl LastRead {
    fn into_quiet(self) -> Option<Quiet> {
        match self {
            LastRead::Busy { .. } => None,
            LastRead::Quiet(quiet) => Some(quiet),
        }
    }
}

#[derive(Clone)]
struct Quiet {
    /// When a full read last found no run that could hold a queued job (or the first quick
    /// read found none among the newest runs).
    deep_read_at: DateTime<Utc>,
    /// The ETag of the newest-runs page at the last quick read, and whether that page showed
    /// a run not completed. The body itself is not kept.
    newest: Option<(String, bool)>,
}

/// How deep a read of a repo's queue goes.
enum Depth {
    /// Every status that can hold a queued job, and each such run's jobs; the requests the
    /// last full read of the repo took, if it had one.
    Full { last_requests: Option<u32> },
    /// The `queued` and `in_progress` runs of a quiet repo, hourly.
    Deep,
    /// The newest runs, conditionally, from what the last quick read saw.
    Quick(Option<Quiet>),
}

/// What a quick read found.
enum QuickRead {
    /// No run among the newest is active: nothing can be queued there.
    Quiet,
    /// A run among the newest is not completed: read in full.
    Active,
}

/// The GitHub client: a [`QueueSource`] and a [`Registrar`] for `app` and `vault` repos.
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

/// One page of a listing.
trait Page: DeserializeOwned {
    type Item;
    fn total_count(&self) -> u64;
    fn into_items(self) -> Vec<Self::Item>;
}

impl Page for wire::RunsPage {
    type Item = wire::Run;
    fn total_count(&self) -> u64 {
        self.total_count
    }
    fn into_items(self) -> Vec<wire::Run> {
        self.workflow_runs
    }
}

impl Page for wire::RunnersPage {
    type Item = wire::Runner;
    fn total_count(&self) -> u64 {
        self.total_count
    }
    fn into_items(self) -> Vec<wire::Runner> {
        self.runners
    }
}

impl Page for wire::JobsPage {
    type Item = wire::Job;
    fn total_count(&self) -> u64 {
        self.total_count
    }
    fn into_items(self) -> Vec<wire::Job> {
        self.jobs
    }
}

struct Listing<T> {
    items: Vec<T>,
    /// The largest `total_count` any page reported.
    total_count: u64,
    /// Stopped at [`PAGES_MAX`] with pages left.
    capped: bool,
    /// Pages requested.
    pages: u32,
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

    fn app(&self, repo: &RepoName) -> Result<&App, PortError> {
        self.app.as_ref().ok_or_else(|| {
            PortError::new(
                ErrorClass::Configuration,
                format!(
                    "{repo} is in app mode but no GitHub App is configured \
                     (GITHUB_APP_ID, GITHUB_APP_PRIVATE_KEY_FILE)"
                ),
            )
        })
    }

    fn record(&self, holder: &BudgetHolder, answer: &Answer) {
        if let Some(rate) = RateHeaders::read(&answer.headers) {
            if let Some(remaining) = rate.remaining {
                crate::metrics::set_rate_limit_remaining(&holder.metric_label(), remaining);
            }
            self.budgets.record(holder, rate, self.now());
        }
    }

    /// The classified error for a failed answer; a rate limit also pauses the budget.
    fn refusal(&self, holder: &BudgetHolder, answer: &Answer, doing: &str) -> PortError {
        let now = self.now();
        let error = classify(answer.status, &answer.headers, &answer.body, now).context(doing);
        if let (ErrorClass::RateLimited, Some(wait_s)) = (error.class, error.retry_after_s) {
            self.budgets
                .pause(holder, budget::wait_until(now, wait_s), now);
        }
        error
    }

    fn refuse_while_paused(&self, holder: &BudgetHolder, doing: &str) -> Result<(), PortError> {
        let now = self.now();
        match self.budgets.paused_until(holder, now) {
            Some(until) => Err(rate_limited_until(
                format!(
                    "{doing}: the rate-limit budget of {holder} is spent until {}",
                    until.to_rfc3339()
                ),
                until,
                now,
            )),
            None => Ok(()),
        }
    }

    /// Counts a request about to be sent against its holder's secondary limit.
    /// A content-creating one is counted for GitHub's content limits too, and the crossing of
    /// either limit is said once: it is not held back (see [`CONTENT_REQUESTS_PER_HOUR`]).
    fn spend_points(&self, holder: &BudgetHolder, method: &Method) {
        let now = self.now();
        let points = self.secondary.spend(holder, method, now);
        let owner = holder.metric_label();
        crate::metrics::set_secondary_points(&owner, points);
        if !creates_content(method) {
            return;
        }
        let count = self.content.record(holder, now);
        crate::metrics::set_content_requests(&owner, count.last_minute, count.last_hour);
        if count.last_minute == CONTENT_REQUESTS_PER_MINUTE
            || count.last_hour == CONTENT_REQUESTS_PER_HOUR
        {
            warn!(
                owner = %owner,
                last_minute = count.last_minute,
                last_hour = count.last_hour,
                "{holder} reached GitHub's content-creation limit ({CONTENT_REQUESTS_PER_MINUTE} a minute, {CONTENT_REQUESTS_PER_HOUR} an hour): its mints may be refused for a while; spread its repos over more installations if this recurs"
            );
        }
    }

    /// GitHub's secondary limit (900 points a minute) answers 403 or 429 and may block an
    /// integration that keeps going; reads stop short of it, leaving room for the writes that
    /// serve jobs. A read held back is a rate limit like any other: its repo waits until the
    /// oldest points leave the minute.
    fn refuse_reads_over_points(
        &self,
        holder: &BudgetHolder,
        doing: &str,
    ) -> Result<(), PortError> {
        let now = self.now();
        let Some(until) =
            self.secondary
                .read_refused_until(holder, self.read_points_refused_at, now)
        else {
            return Ok(());
        };
        Err(rate_limited_until(
            format!(
                "{doing}: {holder} spent {} points of GitHub's secondary limit in the last minute; reads wait until {}",
                self.read_points_refused_at,
                until.to_rfc3339()
            ),
            until,
            now,
        ))
    }

    /// A call authenticated as the App itself (JWT).
    async fn app_call(
        &self,
        app: &App,
        method: Method,
        path: String,
        body: Option<&serde_json::Value>,
        doing: &str,
    ) -> Result<Answer, PortError> {
        let holder = BudgetHolder::App;
        self.refuse_while_paused(&holder, doing)?;
        let jwt = app.signer.jwt(self.now())?;
        self.spend_points(&holder, &method);
        let answer = self
            .transport
            .send(method, &Target::Path(path), &jwt, body, None, doing)
            .await?;
        self.record(&holder, &answer);
        if answer.is_success() {
            return Ok(answer);
        }
        let mut error = self.refusal(&holder, &answer, doing);
        if error.class == ErrorClass::Unauthorized {
            error.message.push_str(&format!(
                " (GitHub refused the JWT of App {}: check GITHUB_APP_ID, the private key and \
                 this host's clock)",
                app.signer.app_id()
            ));
        }
        Err(error)
    }

    async fn installation_of(&self, app: &App, repo: &RepoName) -> Result<u64, PortError> {
        let now = self.now();
        if let Some(id) = app.installations.get(repo.owner(), now) {
            return Ok(id);
        }
        let id = match self.lookup_installation(app, repo).await {
            Ok(id) => id,
            Err(e) if e.class == ErrorClass::NotFound => match app.fallback_installation {
                Some(id) => id,
                None => {
                    return Err(e.context(format!(
                        "the App is not installed for {} and GITHUB_APP_INSTALLATION_ID is not set",
                        repo.owner()
                    )));
                }
            },
            Err(e) => return Err(e),
        };
        app.installations.put(repo.owner(), id, now);
        Ok(id)
    }

    /// `GET /repos/{owner}/{repo}/installation` with the App's JWT: the installation that
    /// covers `repo`; a `NotFound` error when the App is not installed on it.
    async fn lookup_installation(&self, app: &App, repo: &RepoName) -> Result<u64, PortError> {
        let doing = format!("look up the GitHub App installation for {repo}");
        let path = format!("/repos/{}/{}/installation", repo.owner(), repo.name());
        let answer = self.app_call(app, Method::GET, path, None, &doing).await?;
        Ok(serde_json::from_str::<wire::Installation>(&answer.body)
            .map_err(|e| malformed(&doing, &e))?
            .id)
    }

    /// `config check --live`: the installation of the App that covers `repo` itself, asked
    /// afresh (no per-owner cache, no `GITHUB_APP_INSTALLATION_ID` fallback); `None` when
    /// the App is not installed on it.
    pub async fn app_installation_on(&self, repo: &RepoName) -> Result<Option<u64>, PortError> {
        let app = self.app(repo)?;
        match self.lookup_installation(app, repo).await {
            Ok(id) => Ok(Some(id)),
            Err(e) if e.class == ErrorClass::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn mint_installation_token(
        &self,
        app: &App,
        installation: u64,
        repo: &RepoName,
        repos: &[String],
        permission: Permission,
    ) -> Result<InstallationToken, PortError> {
        let doing = if repos.len() > 1 {
            format!(
                "mint an installation token ({permission}) for {repo} and {} other repos of {} (installation {installation})",
                repos.len() - 1,
                repo.owner()
            )
        } else {
            format!(
                "mint an installation token ({permission}) for {repo} (installation {installation})"
            )
        };
        let path = format!("/app/installations/{installation}/access_tokens");
        let body = permission.token_request(repos);
        let answer = match self
            .app_call(app, Method::POST, path, Some(&body), &doing)
            .await
        {
            Ok(answer) => answer,
            Err(e) => {
                if e.class == ErrorClass::NotFound {
                    // The installation is gone: look it up again.
                    app.installations.forget(repo.owner());
                }
                return Err(e);
            }
        };
        let token: wire::Token =
            serde_json::from_str(&answer.body).map_err(|e| malformed(&doing, &e))?;
        let expires_at = DateTime::parse_from_rfc3339(&token.expires_at)
            .map_err(|_| {
                PortError::new(
                    ErrorClass::Malformed,
                    format!(
                        "{doing}: expires_at {:?} is not a timestamp",
                        token.expires_at
                    ),
                )
            })?
            .with_timezone(&Utc);
        debug!(%repo, repos = repos.len(), %permission, installation, %expires_at, "minted installation token");
        let mut covered: Vec<String> = repos.iter().map(|r| r.to_ascii_lowercase()).collect();
        covered.sort_unstable();
        covered.dedup();
        Ok(InstallationToken {
            token: token.token,
            installation,
            expires_at,
            repos: covered,
        })
    }

    /// The repos a shared read token for `repo` names: the configured `app` repos of its
    /// owner (as last told through [`QueueSource::serving`], plus `repo` itself), in groups
    /// of [`REPOS_PER_TOKEN_MAX`] by name; and which group. Just `repo` once GitHub refused
    /// exactly that group (a repo the App is not installed on would otherwise stop every
    /// read of the owner).
    fn read_scope(&self, repo: &RepoName) -> (TokenKey, Vec<String>) {
        let owner = repo.owner().to_ascii_lowercase();
        let name = repo.name().to_string();
        let mut names: Vec<String> = self
            .read_sets
            .lock()
            .expect("read sets lock")
            .get(&owner)
            .map(|names| names.iter().cloned().collect())
            .unwrap_or_default();
        if !names.iter().any(|n| n.eq_ignore_ascii_case(&name)) {
            names.push(name.clone());
        }
        names.sort_unstable_by_key(|n| n.to_ascii_lowercase());
        let at = names
            .iter()
            .position(|n| n.eq_ignore_ascii_case(&name))
            .expect("pushed above");
        let chunk = at / REPOS_PER_TOKEN_MAX;
        let group: Vec<String> = names
            .into_iter()
            .skip(chunk * REPOS_PER_TOKEN_MAX)
            .take(REPOS_PER_TOKEN_MAX)
            .collect();
        let refused = self
            .shared_refused
            .lock()
            .expect("refused sets lock")
            .get(&(owner.clone(), chunk))
            .is_some_and(|refused| *refused == group);
        if group.len() == 1 || refused {
            return (TokenKey::Repo(repo.clone()), vec![name]);
        }
        (TokenKey::Installation { owner, chunk }, group)
    }

    /// Which cached token serves `repo` for `permission`, and the repos it names: reads share
    /// the installation's ([`Self::read_scope`]), a write token is the repo's own.
    fn token_scope(&self, repo: &RepoName, permission: Permission) -> (TokenKey, Vec<String>) {
        match permission {
            Permission::Read => self.read_scope(repo),
            Permission::AdministrationWrite => {
                (TokenKey::Repo(repo.clone()), vec![repo.name().to_string()])
            }
        }
    }

    async fn app_token(
        &self,
        repo: &RepoName,
        permission: Permission,
    ) -> Result<Credential, PortError> {
        let app = self.app(repo)?;
        let (key, repos) = self.token_scope(repo, permission);
        let slot = app.tokens.slot(key.clone(), permission);
        let mut held = slot.lock().await;
        let token = match held.as_ref().filter(|t| t.serves(repo, self.now())) {
            Some(token) => token.clone(),
            None => {
                let installation = self.installation_of(app, repo).await?;
                let minted = self
                    .mint_installation_token(app, installation, repo, &repos, permission)
                    .await;
                let token = match (minted, &key) {
                    (Ok(token), _) => token,
                    // 422: a repo of the group is not one the installation covers. Read this
                    // one with a token of its own; the group is tried again once it changes.
                    (Err(e), TokenKey::Installation { owner, chunk })
                        if e.class == ErrorClass::Configuration =>
                    {
                        warn!(
                            repo = %repo,
                            "{}; reading each repo of {owner} with a token of its own until the document changes",
                            e.message
                        );
                        self.shared_refused
                            .lock()
                            .expect("refused sets lock")
                            .insert((owner.clone(), *chunk), repos.clone());
                        drop(held);
                        return Box::pin(self.app_token(repo, permission)).await;
                    }
                    (Err(e), _) => return Err(e),
                };
                *held = Some(token.clone());
                token
            }
        };
        Ok(Credential {
            token: token.token,
            holder: BudgetHolder::Installation(token.installation),
        })
    }

    async fn polling_token(&self, vault_path: &str) -> Result<Credential, PortError> {
        let holder = BudgetHolder::PollingToken {
            vault_path: vault_path.to_string(),
        };
        let now = self.now();
        {
            let cached = self.polling_tokens.lock().expect("polling token lock");
            if let Some((token, read_at)) = cached.get(vault_path)
                && now - *read_at < POLLING_TOKEN_TTL
            {
                return Ok(Credential {
                    token: token.clone(),
                    holder,
                });
            }
        }
        let token = self
            .secrets
            .read_field(vault_path, POLLING_TOKEN_FIELD)
            .await
            .map_err(|e| e.context(format!("read the GitHub polling token at {vault_path}")))?;
        debug!(vault_path, "read GitHub polling token");
        self.polling_tokens
            .lock()
            .expect("polling token lock")
            .insert(vault_path.to_string(), (token.clone(), now));
        Ok(Credential { token, holder })
    }

    async fn credential(
        &self,
        repo: &RepoConfig,
        permission: Permission,
    ) -> Result<Credential, PortError> {
        match &repo.mode {
            Mode::App => self.app_token(&repo.repo, permission).await,
            Mode::Vault { vault_path, .. } => self.polling_token(vault_path).await,
            Mode::Forgejo { .. } => Err(not_github(repo)),
        }
    }

    /// Drops a credential GitHub refused with 401, unless another call already replaced it.
    async fn forget(&self, repo: &RepoConfig, permission: Permission, refused: &Credential) {
        let same = |token: &SecretString| token.expose_secret() == refused.token.expose_secret();
        match &repo.mode {
            Mode::App => {
                if let Some(app) = &self.app {
                    let (key, _) = self.token_scope(&repo.repo, permission);
                    let slot = app.tokens.slot(key, permission);
                    let mut held = slot.lock().await;
                    if held.as_ref().is_some_and(|t| same(&t.token)) {
                        *held = None;
                    }
                }
            }
            Mode::Vault { vault_path, .. } => {
                let mut cached = self.polling_tokens.lock().expect("polling token lock");
                if cached.get(vault_path).is_some_and(|(t, _)| same(t)) {
                    cached.remove(vault_path);
                }
            }
            Mode::Forgejo { .. } => {}
        }
    }

    /// One call on a repo with a credential for `permission`. A 401 drops the credential and
    /// the call is made once more with a fresh one (a token can be revoked or expire early).
    #[allow(clippy::too_many_arguments)]
    async fn repo_call(
        &self,
        repo: &RepoConfig,
        permission: Permission,
        method: Method,
        target: &Target,
        payload: Payload<'_>,
        doing: &str,
    ) -> Result<Answer, PortError> {
        self.repo_call_answering(repo, permission, method, target, payload, &[], doing)
            .await
    }

    /// [`GitHub::repo_call`], returning the answer for the `answered` statuses too instead of
    /// classifying them as a failure (a 422 that vetoes a deletion is an outcome).
    #[allow(clippy::too_many_arguments)]
    async fn repo_call_answering(
        &self,
        repo: &RepoConfig,
        permission: Permission,
        method: Method,
        target: &Target,
        payload: Payload<'_>,
        answered: &[StatusCode],
        doing: &str,
    ) -> Result<Answer, PortError> {
        let (body, if_none_match) = match payload {
            Payload::Nothing => (None, None),
            Payload::IfNoneMatch(etag) => (None, Some(etag)),
            Payload::Json(body) => (Some(body), None),
        };
        let mut retried = false;
        loop {
            let credential = self.credential(repo, permission).await?;
            self.refuse_while_paused(&credential.holder, doing)?;
            if method == Method::GET {
                self.refuse_reads_over_points(&credential.holder, doing)?;
            }
            self.spend_points(&credential.holder, &method);
            let answer = self
                .transport
                .send(
                    method.clone(),
                    target,
                    &credential.token,
                    body,
                    if_none_match,
                    doing,
                )
                .await?;
            self.record(&credential.holder, &answer);
            if answer.status == StatusCode::UNAUTHORIZED && !retried {
                debug!(repo = %repo.repo, "GitHub answered 401; dropping the cached credential");
                self.forget(repo, permission, &credential).await;
                retried = true;
                continue;
            }
            if answer.is_success()
                || answer.status == StatusCode::NOT_MODIFIED
                || answered.contains(&answer.status)
            {
                return Ok(answer);
            }
            return Err(self.refusal(&credential.holder, &answer, doing));
        }
    }

    /// GETs one listing page, conditionally when its body is cached and `seen` is given.
    async fn get_page(
        &self,
        repo: &RepoConfig,
        permission: Permission,
        target: &Target,
        doing: &str,
        seen: Option<&mut HashMap<String, Conditional>>,
    ) -> Result<(HeaderMap, String), PortError> {
        let key = target.as_key();
        let Some(seen) = seen.filter(|_| self.conditional_requests) else {
            let answer = self
                .repo_call(
                    repo,
                    permission,
                    Method::GET,
                    target,
                    Payload::Nothing,
                    doing,
                )
                .await?;
            if answer.status == StatusCode::NOT_MODIFIED {
                return Err(PortError::new(
                    ErrorClass::Malformed,
                    format!("{doing}: 304 Not Modified to an unconditional request"),
                ));
            }
            return Ok((answer.headers, answer.body));
        };
        let cached = {
            let conditional = self.conditional.lock().expect("conditional cache lock");
            conditional
                .get(&repo.repo)
                .and_then(|pages| pages.get(&key))
                .cloned()
        };
        let answer = self
            .repo_call(
                repo,
                permission,
                Method::GET,
                target,
                cached
                    .as_ref()
                    .map_or(Payload::Nothing, |c| Payload::IfNoneMatch(&c.etag)),
                doing,
            )
            .await?;
        let mut headers = answer.headers;
        let body = if answer.status == StatusCode::NOT_MODIFIED {
            match cached {
                Some(cached) => {
                    crate::metrics::count_conditional_hit();
                    let body = cached.body.clone();
                    if let Some(link) = &cached.link
                        && !headers.contains_key(http::header::LINK)
                    {
                        headers.insert(http::header::LINK, link.clone());
                    }
                    seen.insert(key, cached);
                    body
                }
                None => {
                    return Err(PortError::new(
                        ErrorClass::Malformed,
                        format!("{doing}: 304 Not Modified to an unconditional request"),
                    ));
                }
            }
        } else {
            if let Some(etag) = headers
                .get(http::header::ETAG)
                .and_then(|v| v.to_str().ok())
            {
                seen.insert(
                    key,
                    Conditional {
                        etag: etag.to_string(),
                        body: answer.body.clone(),
                        link: headers.get(http::header::LINK).cloned(),
                    },
                );
            }
            answer.body
        };
        Ok((headers, body))
    }

    /// Follows every page of a listing that starts at `first` (a path with `per_page=100`),
    /// with a credential for `permission`; conditionally when `seen` collects the bodies.
    async fn walk<P: Page>(
        &self,
        repo: &RepoConfig,
        permission: Permission,
        first: &str,
        doing: &str,
        mut seen: Option<&mut HashMap<String, Conditional>>,
    ) -> Result<Listing<P::Item>, PortError> {
        let mut listing = Listing {
            items: Vec::new(),
            total_count: 0,
            capped: false,
            pages: 0,
        };
        let mut target = Target::Path(first.to_string());
        for page_number in 1..=PAGES_MAX {
            let (headers, body) = self
                .get_page(repo, permission, &target, doing, seen.as_deref_mut())
                .await?;
            listing.pages += 1;
            let page: P = serde_json::from_str(&body).map_err(|e| malformed(doing, &e))?;
            listing.total_count = listing.total_count.max(page.total_count());
            let page_total = page.total_count();
            let items = page.into_items();
            let full = items.len() >= PER_PAGE;
            listing.items.extend(items);
            let link = headers
                .get(http::header::LINK)
                .map(|v| v.to_str().unwrap_or_default());
            target = match link {
                Some(link) => match next_link(link) {
                    Some(next) => Target::Absolute(self.same_origin(&next, doing)?),
                    None => return Ok(listing),
                },
                // No `Link` header: GitHub omits it when everything fit on one page. A full
                // page short of `total_count` still means there is more.
                None if full && (listing.items.len() as u64) < page_total => {
                    Target::Path(format!("{first}&page={}", page_number + 1))
                }
                None => return Ok(listing),
            };
        }
        listing.capped = true;
        Ok(listing)
    }

    /// A `Link` URL is followed only on the API's own origin and path: the request carries a
    /// token, and a body or proxy must not be able to send it elsewhere.
    fn same_origin(&self, next: &str, doing: &str) -> Result<Url, PortError> {
        let api = self.transport.api_url();
        let refuse = || {
            PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: the next-page link leaves the API at {api}"),
            )
        };
        let url = Url::parse(next).map_err(|_| refuse())?;
        let base_path = api.path().trim_end_matches('/');
        // `/api/v3x` is not under `/api/v3`: the base must end at a segment boundary.
        let under_base = url.path() == base_path
            || url
                .path()
                .strip_prefix(base_path)
                .is_some_and(|rest| rest.starts_with('/'));
        if url.scheme() != api.scheme()
            || url.host_str() != api.host_str()
            || url.port_or_known_default() != api.port_or_known_default()
            || !under_base
            || url.username() != ""
            || url.password().is_some()
        {
            return Err(refuse());
        }
        Ok(url)
    }
}

/// A request the client refuses to send before `until`, as a rate limit with the wait.
fn rate_limited_until(message: String, until: DateTime<Utc>, now: DateTime<Utc>) -> PortError {
    let wait_s = u64::try_from((until - now).num_seconds())
        .unwrap_or(0)
        .clamp(1, RATE_LIMIT_WAIT_MAX_S);
    PortError::new(ErrorClass::RateLimited, message).with_retry_after(Some(wait_s))
}

/// The `rel="next"` URL of a `Link` header.
fn next_link(link: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (url, params) = part.trim().split_once(';')?;
        let is_next = params
            .split(';')
            .any(|p| p.trim().replace(' ', "") == "rel=\"next\"");
        let url = url.trim().strip_prefix('<')?.strip_suffix('>')?;
        is_next.then(|| url.to_string())
    })
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

/// Where in [`DEEP_READ_INTERVAL`] `repo`'s deep reads fall: fixed per repo (std's
/// `DefaultHasher::new` has fixed keys), spread over the interval across a fleet.
fn deep_read_offset(repo: &RepoName) -> chrono::Duration {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    repo.to_string().to_ascii_lowercase().hash(&mut hasher);
    let span = DEEP_READ_INTERVAL.num_seconds().max(1) as u64;
    chrono::Duration::seconds((hasher.finish() % span) as i64)
}

fn parse_time(raw: Option<&str>) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(raw?)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// A GitHub job as demand: self-hosted jobs that are queued or in progress, nothing else.
fn forge_job(job: wire::Job) -> Option<ForgeJob> {
    if !job
        .labels
        .iter()
        .any(|l| l.trim().eq_ignore_ascii_case("self-hosted"))
    {
        return None;
    }
    let state = match job.status.as_str() {
        "queued" => JobState::Queued,
        "in_progress" => JobState::InProgress {
            runner: job
                .runner_name
                .filter(|name| !name.is_empty())
                .map(RunnerName),
        },
        _ => return None,
    };
    let queued_at =
        parse_time(job.created_at.as_deref()).or_else(|| parse_time(job.started_at.as_deref()));
    Some(ForgeJob {
        id: job.id,
        labels: job.labels,
        state,
        queued_at,
    })
}

#[async_trait]
impl QueueSource for GitHub {
    fn budget(&self, repo: &RepoConfig) -> Option<crate::observe::BudgetReading> {
        let holder = self.holder_of(repo)?;
        let budget = self
            .budgets
            .snapshot()
            .into_iter()
            .find(|(h, _)| *h == holder)?
            .1;
        Some(crate::observe::BudgetReading {
            owner: holder.metric_label(),
            limit: budget.limit?,
            remaining: budget.remaining?,
            reset_at: budget.reset_at?,
        })
    }

    fn read_points(&self, repo: &RepoConfig) -> Option<ReadPoints> {
        let holder = self.holder_of(repo)?;
        let now = self.now();
        let spent = self.secondary.spent(&holder, now);
        Some(ReadPoints {
            owner: holder.metric_label(),
            left: self.read_points_per_minute_max.saturating_sub(spent),
            next_read: self.next_read_requests(&repo.repo, now),
        })
    }

    fn serving(&self, repos: &[&RepoConfig]) {
        let mut sets: HashMap<String, BTreeSet<String>> = HashMap::new();
        for repo in repos.iter().filter(|r| matches!(r.mode, Mode::App)) {
            sets.entry(repo.repo.owner().to_ascii_lowercase())
                .or_default()
                .insert(repo.repo.name().to_string());
        }
        *self.read_sets.lock().expect("read sets lock") = sets;
        let served: HashSet<&RepoName> = repos.iter().map(|r| &r.repo).collect();
        self.last_reads
            .lock()
            .expect("last reads lock")
            .retain(|repo, _| served.contains(repo));
    }

    fn hinted(&self, repo: &RepoName) {
        self.hinted
            .lock()
            .expect("hinted repos lock")
            .insert(repo.clone());
    }

    /// BRIEF step 2: GitHub has no "list queued jobs" call, so walk the runs that can hold a
    /// queued job, list each run's latest jobs, keep the self-hosted ones, de-duplicate by job
    /// id. A run is `in_progress` while one of its jobs still waits, and `waiting`,
    /// `pending` or `requested` while it sits at a gate (an environment's approval, a
    /// concurrency group) with other jobs already queued. An unchanged listing answers 304,
    /// which costs no rate limit.
    ///
    /// A repo where that walk found no such run is read with one request instead of five
    /// (`quick_read`) until one of its newest runs is active, a webhook hints at it, or
    /// its hourly deep read is due ([`DEEP_READ_INTERVAL`]): most repos of a fleet are idle most of the time, and
    /// GitHub's secondary limit counts every request, `304`s included.
    #[instrument(level = "debug", skip_all, fields(repo = %repo.repo))]
    async fn list_jobs(&self, repo: &RepoConfig) -> Result<RepoJobs, PortError> {
        if !repo.mode.is_github() {
            return Err(not_github(repo));
        }
        let now = self.now();
        let hinted = self
            .hinted
            .lock()
            .expect("hinted repos lock")
            .remove(&repo.repo);
        let last = self
            .last_reads
            .lock()
            .expect("last reads lock")
            .get(&repo.repo)
            .cloned();
        let statuses: &[&str] = match self.depth(last, hinted, now) {
            Depth::Full { .. } => &RUN_STATUSES_WITH_QUEUED_JOBS,
            Depth::Deep => &DEEP_READ_STATUSES,
            Depth::Quick(quiet) => match self.quick_read(repo, quiet, now).await? {
                QuickRead::Quiet => return Ok(RepoJobs::default()),
                QuickRead::Active => &RUN_STATUSES_WITH_QUEUED_JOBS,
            },
        };
        let (jobs, no_runs, requests) = self.full_read(repo, statuses).await?;
        let mut last_reads = self.last_reads.lock().expect("last reads lock");
        let found = if no_runs {
            // Runs active on the newest page but in no status that can hold a queued job
            // (`action_required`, say) leave the page unchanged until they move.
            let newest = last_reads
                .remove(&repo.repo)
                .and_then(LastRead::into_quiet)
                .and_then(|quiet| quiet.newest)
                .map(|(etag, _)| (etag, false));
            LastRead::Quiet(Quiet {
                deep_read_at: now,
                newest,
            })
        } else {
            LastRead::Busy { requests }
        };
        last_reads.insert(repo.repo.clone(), found);
        Ok(jobs)
    }
}

impl GitHub {
    /// How deep the next read of a repo goes, from its last read and whether a webhook hinted
    /// at it: the one decision both [`QueueSource::list_jobs`] and its cost estimate follow.
    fn depth(&self, last: Option<LastRead>, hinted: bool, now: DateTime<Utc>) -> Depth {
        match last {
            Some(LastRead::Busy { requests }) => Depth::Full {
                last_requests: Some(requests),
            },
            _ if hinted || !self.conditional_requests => Depth::Full {
                last_requests: None,
            },
            Some(LastRead::Quiet(quiet)) if now - quiet.deep_read_at >= DEEP_READ_INTERVAL => {
                Depth::Deep
            }
            // The first read of a repo is quick too: at a restart, hundreds of repos are read
            // within minutes, at one request each instead of five.
            quiet_or_unread => Depth::Quick(quiet_or_unread.and_then(LastRead::into_quiet)),
        }
    }

    /// The requests `repo`'s next [`QueueSource::list_jobs`] will likely take: a full read
    /// as many as the last one, a deep read one per status, a quick read one.
    fn next_read_requests(&self, repo: &RepoName, now: DateTime<Utc>) -> u32 {
        let hinted = self
            .hinted
            .lock()
            .expect("hinted repos lock")
            .contains(repo);
        let last = self
            .last_reads
            .lock()
            .expect("last reads lock")
            .get(repo)
            .cloned();
        match self.depth(last, hinted, now) {
            Depth::Full { last_requests } => last_requests.unwrap_or(FULL_READ_REQUESTS_AT_LEAST),
            Depth::Deep => DEEP_READ_STATUSES.len() as u32,
            Depth::Quick(_) => 1,
        }
    }

    /// `GET …/actions/runs?per_page=100`, conditionally: one request (a `304` when nothing
    /// changed) that says whether any of the newest runs is still active.
    async fn quick_read(
        &self,
        repo: &RepoConfig,
        quiet: Option<Quiet>,
        now: DateTime<Utc>,
    ) -> Result<QuickRead, PortError> {
        let doing = format!("list the newest runs of {}", repo.repo);
        let path = format!(
            "/repos/{}/{}/actions/runs?per_page={PER_PAGE}",
            repo.repo.owner(),
            repo.repo.name()
        );
        let known = quiet.as_ref().and_then(|q| q.newest.clone());
        let answer = self
            .repo_call(
                repo,
                Permission::Read,
                Method::GET,
                &Target::Path(path),
                known
                    .as_ref()
                    .map_or(Payload::Nothing, |(etag, _)| Payload::IfNoneMatch(etag)),
                &doing,
            )
            .await?;
        let (etag, active) = if answer.status == StatusCode::NOT_MODIFIED {
            crate::metrics::count_conditional_hit();
            known.ok_or_else(|| {
                PortError::new(
                    ErrorClass::Malformed,
                    format!("{doing}: 304 Not Modified to an unconditional request"),
                )
            })?
        } else {
            let page: wire::RunsPage =
                serde_json::from_str(&answer.body).map_err(|e| malformed(&doing, &e))?;
            let active = page
                .workflow_runs
                .iter()
                .any(|run| run.status.as_deref() != Some("completed"));
            let etag = answer
                .headers
                .get(http::header::ETAG)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            (etag, active)
        };
        let deep_read_at =
            quiet.map_or_else(|| now - deep_read_offset(&repo.repo), |q| q.deep_read_at);
        let newest = (!etag.is_empty()).then_some((etag, active));
        self.last_reads.lock().expect("last reads lock").insert(
            repo.repo.clone(),
            LastRead::Quiet(Quiet {
                deep_read_at,
                newest,
            }),
        );
        Ok(if active {
            QuickRead::Active
        } else {
            QuickRead::Quiet
        })
    }

    /// BRIEF step 2 in full; also says whether no run could hold a queued job, and how many
    /// requests the read took.
    async fn full_read(
        &self,
        repo: &RepoConfig,
        statuses: &[&str],
    ) -> Result<(RepoJobs, bool, u32), PortError> {
        let (owner, name) = (repo.repo.owner(), repo.repo.name());
        let mut seen = HashMap::new();
        let mut truncated = false;
        let mut runs = Vec::new();
        let mut run_ids = HashSet::new();
        let mut requests = 0;
        for status in statuses {
            let doing = format!("list {status} runs of {}", repo.repo);
            let first =
                format!("/repos/{owner}/{name}/actions/runs?status={status}&per_page={PER_PAGE}");
            let listing = self
                .walk::<wire::RunsPage>(repo, Permission::Read, &first, &doing, Some(&mut seen))
                .await?;
            requests += listing.pages;
            truncated |= listing.capped || listing.total_count >= RUN_SEARCH_CAP;
            for run in listing.items {
                if run_ids.insert(run.id) {
                    runs.push(run.id);
                }
            }
        }
        let no_runs = runs.is_empty();
        let mut jobs = Vec::new();
        let mut job_ids = HashSet::new();
        for run in runs {
            let doing = format!("list jobs for run {run} in {}", repo.repo);
            let first = format!(
                "/repos/{owner}/{name}/actions/runs/{run}/jobs?filter=latest&per_page={PER_PAGE}"
            );
            let listing = match self
                .walk::<wire::JobsPage>(repo, Permission::Read, &first, &doing, Some(&mut seen))
                .await
            {
                Ok(listing) => listing,
                // The run was deleted between the two listings: it has no jobs left to run.
                Err(e) if e.class == ErrorClass::NotFound => {
                    requests += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            requests += listing.pages;
            truncated |= listing.capped;
            for job in listing.items {
                if job_ids.insert(job.id)
                    && let Some(job) = forge_job(job)
                {
                    jobs.push(job);
                }
            }
        }
        // Keep only the bodies of pages this walk touched, so the cache follows the set of
        // active runs instead of growing with every run ever seen.
        self.conditional
            .lock()
            .expect("conditional cache lock")
            .insert(repo.repo.clone(), seen);
        Ok((RepoJobs { jobs, truncated }, no_runs, requests))
    }
}

#[async_trait]
impl Registrar for GitHub {
    #[instrument(level = "debug", skip_all, fields(repo = %repo.repo))]
    async fn mint(
        &self,
        repo: &RepoConfig,
        runner: RunnerIdentity<'_>,
    ) -> Result<Option<act::Credential>, PortError> {
        match &repo.mode {
            // The runner job reads its admin token from Vault itself; the daemon cannot.
            Mode::Vault { .. } => Ok(None),
            Mode::Forgejo { .. } => Err(not_github(repo)),
            Mode::App => match repo.credential {
                CredentialKind::Jit { runner_group_id } => self
                    .generate_jit_config(repo, runner, runner_group_id)
                    .await
                    .map(Some),
                CredentialKind::Registration => {
                    let doing = format!("mint a registration token for {}", repo.repo);
                    let path = format!(
                        "/repos/{}/{}/actions/runners/registration-token",
                        repo.repo.owner(),
                        repo.repo.name()
                    );
                    let answer = self
                        .repo_call(
                            repo,
                            Permission::AdministrationWrite,
                            Method::POST,
                            &Target::Path(path),
                            Payload::Nothing,
                            &doing,
                        )
                        .await?;
                    let token: wire::Token =
                        serde_json::from_str(&answer.body).map_err(|e| malformed(&doing, &e))?;
                    Ok(Some(act::Credential::RegistrationToken(token.token)))
                }
            },
        }
    }

    fn repo_url(&self, repo: &RepoConfig) -> String {
        format!("{}/{}", self.web_url, repo.repo)
    }
}

/// The runner registrations of `app` repos: read to decide whether a runner is busy before its
/// child is stopped, and deleted first (GitHub refuses with 422 while a job runs).
#[async_trait]
impl RunnerRegistry for GitHub {
    #[instrument(level = "debug", skip_all, fields(repo = %repo.repo))]
    async fn list_runners(&self, repo: &RepoConfig) -> Result<Vec<RunnerRegistration>, PortError> {
        let doing = format!("list runners of {}", repo.repo);
        let first = format!("{}?per_page={PER_PAGE}", runners_path(repo)?);
        // Read when a runner is about to be taken back (and in a slow sweep for stale
        // registrations): no conditional cache, so the answer is always today's. Listing needs
        // only `administration: read`, which the installation's shared read token carries.
        let listing = self
            .walk::<wire::RunnersPage>(repo, Permission::Read, &first, &doing, None)
            .await?;
        if listing.capped {
            return Err(PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: more than {PAGES_MAX} pages of runners"),
            ));
        }
        Ok(listing
            .items
            .into_iter()
            .map(|r| RunnerRegistration {
                id: r.id,
                name: RunnerName(r.name),
                online: r.status.eq_ignore_ascii_case("online"),
                busy: r.busy,
            })
            .collect())
    }

    #[instrument(level = "debug", skip_all, fields(repo = %repo.repo, runner_id))]
    async fn delete_runner(
        &self,
        repo: &RepoConfig,
        runner_id: u64,
    ) -> Result<Deregistration, PortError> {
        let doing = format!("delete runner {runner_id} of {}", repo.repo);
        let path = format!("{}/{runner_id}", runners_path(repo)?);
        let answer = self
            .repo_call_answering(
                repo,
                Permission::AdministrationWrite,
                Method::DELETE,
                &Target::Path(path),
                Payload::Nothing,
                &[StatusCode::NOT_FOUND, StatusCode::UNPROCESSABLE_ENTITY],
                &doing,
            )
            .await?;
        Ok(match answer.status {
            StatusCode::NOT_FOUND => Deregistration::NotFound,
            // The documented refusal: the runner is still running a job.
            StatusCode::UNPROCESSABLE_ENTITY => Deregistration::StillBusy,
            _ => Deregistration::Deleted,
        })
    }
}

impl GitHub {
    /// `POST …/actions/runners/generate-jitconfig`: registers `runner` (offline until it
    /// boots) with exactly the bucket's labels and returns its single-use configuration.
    async fn generate_jit_config(
        &self,
        repo: &RepoConfig,
        runner: RunnerIdentity<'_>,
        runner_group_id: u64,
    ) -> Result<act::Credential, PortError> {
        let doing = format!(
            "generate a JIT config for runner {} of {}",
            runner.name, repo.repo
        );
        let body = serde_json::json!({
            "name": runner.name.0,
            "runner_group_id": runner_group_id,
            "labels": runner.labels.iter().collect::<Vec<_>>(),
            // Relative to the runner's own directory, inside its allocation.
            "work_folder": "_work",
        });
        let answer = self
            .repo_call(
                repo,
                Permission::AdministrationWrite,
                Method::POST,
                &Target::Path(format!("{}/generate-jitconfig", runners_path(repo)?)),
                Payload::Json(&body),
                &doing,
            )
            .await?;
        let jit: wire::JitConfig =
            serde_json::from_str(&answer.body).map_err(|e| malformed(&doing, &e))?;
        if jit.runner.name != runner.name.0 {
            return Err(PortError::new(
                ErrorClass::Malformed,
                format!(
                    "{doing}: GitHub registered a runner named {:?}",
                    crate::model::clip_chars(&jit.runner.name, 100)
                ),
            ));
        }
        Ok(act::Credential::JitConfig {
            encoded: jit.encoded_jit_config,
            runner_id: jit.runner.id,
        })
    }
}

/// What a call carries besides its method and target: a GET may be conditional, a POST may
/// have a body, never both.
#[derive(Clone, Copy)]
enum Payload<'a> {
    Nothing,
    IfNoneMatch(&'a str),
    Json(&'a serde_json::Value),
}

/// `/repos/{owner}/{repo}/actions/runners` of an `app` repo: only there does the daemon hold
/// a credential that may manage the repo's runners.
fn runners_path(repo: &RepoConfig) -> Result<String, PortError> {
    if !matches!(repo.mode, Mode::App) {
        return Err(PortError::new(
            ErrorClass::Configuration,
            format!(
                "{} is a {} repo: the daemon manages runner registrations in app mode only",
                repo.repo,
                repo.mode.as_str()
            ),
        ));
    }
    Ok(format!(
        "/repos/{}/{}/actions/runners",
        repo.repo.owner(),
        repo.repo.name()
    ))
}

#[cfg(test)]
mod tests {
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
    fn next_links_are_read_from_any_position() {
        let link = r#"<https://api.github.com/repositories/1/actions/runs?page=1&per_page=100>; rel="prev", <https://api.github.com/repositories/1/actions/runs?page=3&per_page=100>; rel="next", <https://api.github.com/repositories/1/actions/runs?page=5&per_page=100>; rel="last""#;
        assert_eq!(
            next_link(link).as_deref(),
            Some("https://api.github.com/repositories/1/actions/runs?page=3&per_page=100")
        );
        assert_eq!(next_link(r#"<https://x/a?page=1>; rel="first""#), None);
    }

    fn job(status: &str, labels: &[&str]) -> wire::Job {
        wire::Job {
            id: 1,
            status: status.to_string(),
            labels: labels.iter().map(|l| l.to_string()).collect(),
            runner_name: Some("ci-runner-3f9c2a1b7d04".into()),
            created_at: Some("2020-01-22T11:33:08-08:00".into()),
            started_at: None,
        }
    }

    #[test]
    fn only_self_hosted_queued_or_running_jobs_are_demand() {
        assert!(forge_job(job("queued", &["ubuntu-latest"])).is_none());
        assert!(forge_job(job("completed", &["self-hosted"])).is_none());
        assert!(forge_job(job("waiting", &["self-hosted"])).is_none());
        let queued = forge_job(job("queued", &["Self-Hosted", "linux"])).unwrap();
        assert_eq!(queued.state, JobState::Queued);
        assert_eq!(
            queued.queued_at,
            DateTime::parse_from_rfc3339("2020-01-22T19:33:08Z")
                .ok()
                .map(|t| t.with_timezone(&Utc))
        );
        let running = forge_job(job("in_progress", &["self-hosted"])).unwrap();
        assert_eq!(
            running.state,
            JobState::InProgress {
                runner: Some(RunnerName("ci-runner-3f9c2a1b7d04".into()))
            }
        );
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
