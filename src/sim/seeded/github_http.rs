//! GitHub's REST API over the simulated world, in memory: the seeded world's `app` and
//! `vault` repos are served to the real [`GitHub`] client through a `tower` service instead of
//! a socket (sockets under a paused clock misbehave), so the client logic the benchmark
//! measures runs inside the sweep: App JWTs and installation tokens narrowed to one repo and
//! permission, conditional requests with ETags, rate-limit headers read into budgets, the
//! 403-versus-429 classification, pagination by `Link`, timeouts.
//!
//! Every request first meets the seed's faults through [`Sim::fault`] (scoped like the loop's
//! own calls, so the invariant checker knows what a fault excuses), rendered as HTTP: a 502
//! or 503, a connection reset, a request that never answers (the client's timeout fires on
//! the paused clock), a 200 whose JSON is cut off, a 403 with `x-ratelimit-remaining: 0` or a
//! 429 with `retry-after`. Then the holder's primary budget (5,000 requests per virtual hour)
//! is checked and spent; a `304 Not Modified` spends nothing.
//!
//! Bodies follow the documentation examples in `tests/fixtures/github/` (as the twin's do):
//! the fields the world knows are filled in, the others kept from the example, except that a
//! run's `repository` and `head_repository` keep only their identifying fields (see
//! [`minimal_repository`]).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use futures::FutureExt;
use http::request::Parts;
use http::{HeaderValue, Method, Response, StatusCode};
use http_body_util::BodyExt;
use jsonwebtoken::DecodingKey;
use octocrab::OctoBody;
use secrecy::SecretString;
use serde_json::{Value, json};

use super::options::{ForgeKind, Service};
use super::ports::{Call, Fault, Scope, Shared, Sim, Transient, budget_of, lock, repo_url};
use super::world::{EPOCH_UNIX, Visible};
use crate::act::{Credential, Deregistration, Registrar, RunnerIdentity, RunnerRegistry};
use crate::clients::github::{AppCredentials, GitHub, GitHubSettings, POLLING_TOKEN_FIELD};
use crate::config::{Mode, RepoConfig};
use crate::model::{ErrorClass, RepoName, RunnerName};
use crate::observe::{PortError, QueueSource, RepoJobs, RunnerRegistration};
use crate::secrets::SecretSource;
use crate::sim::twins;
use crate::sim::twins::github::{
    DOCS_JIT, JIT_NAME_TAKEN, JWT_UNDECODABLE, JitRequest, Query, RUN_SEARCH_CAP, TEST_APP_ID,
    check_app_jwt, jit_config_json, runner_labels_json,
};

/// The App's key pair. 1024 bits, not the 2048 GitHub requires: the real client signs a
/// JWT per App call, and a sweep of thousands of seeds feels every millisecond of RSA.
const APP_PRIVATE_KEY_PEM: &str =
    include_str!("../../../tests/fixtures/github/seeded-only-app-key-1024.pem");
const APP_PUBLIC_KEY_PEM: &str =
    include_str!("../../../tests/fixtures/github/seeded-only-app-key-1024.pub.pem");

/// The API the client is pointed at; runners register against `https://github.com/…`.
pub const API_URL: &str = "https://api.github.com";
/// Primary requests per holder and window.
pub const BUDGET_LIMIT: u64 = 5000;
/// A primary window lasts an hour from its first request.
pub const BUDGET_WINDOW_S: u64 = 3600;
/// Installation and registration tokens live an hour.
pub const TOKEN_LIFETIME_S: u64 = 3600;
/// The client's request timeout in the simulated world.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The budget of requests signed with the App's JWT (installation lookups, token minting).
pub const APP_BUDGET: &str = "the GitHub App";
/// Ids of repos (`/repositories/{id}` in `Link` URLs) count from here, in document order.
const REPO_ID_BASE: u64 = 70_000;
/// Ids of installations count from here, one per owner with an `app` repo.
const INSTALLATION_ID_BASE: u64 = 40_000;

const DOCS_REST: &str = "https://docs.github.com/rest";
const DOCS_RATE_LIMITS: &str = "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api";
const DOCS_TOKEN: &str =
    "https://docs.github.com/rest/apps/apps#create-an-installation-access-token-for-an-app";
const SECONDARY_MESSAGE: &str = "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you reach out to GitHub Support for help, please include the request ID.";

/// The polling token Vault holds at `vault_path` (a fake; it never leaves the simulation).
pub fn polling_token(vault_path: &str) -> String {
    format!(
        "ghp_simulated_polling_token_{}",
        vault_path.replace('/', "_")
    )
}

/// Unix time of simulated second `t`.
pub fn virtual_now(t: u64) -> DateTime<Utc> {
    DateTime::from_timestamp(EPOCH_UNIX + t as i64, 0).expect("simulated time is in range")
}

fn timestamp(seconds: i64) -> String {
    DateTime::from_timestamp(EPOCH_UNIX + seconds, 0)
        .expect("simulated time is in range")
        .to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The documentation examples, parsed once. A listed run or job is the example with the
/// world's fields spliced in: the rest is serialised once and reused, which keeps a run
/// listing cheap enough to answer hundreds of thousands of times per sweep.
struct Templates {
    /// The example run without the fields filled in per run, as `"k":v,…` (no braces).
    run_rest: String,
    job_rest: String,
    installation: Value,
    access_token: Value,
    token_repository: Value,
}

const RUN_FIELDS: &[&str] = &[
    "id",
    "run_number",
    "run_attempt",
    "status",
    "conclusion",
    "created_at",
    "updated_at",
    "run_started_at",
    "url",
    "html_url",
    "jobs_url",
];

const JOB_FIELDS: &[&str] = &[
    "id",
    "run_id",
    "run_url",
    "url",
    "html_url",
    "status",
    "conclusion",
    "created_at",
    "started_at",
    "completed_at",
    "steps",
    "labels",
    "runner_id",
    "runner_name",
    "runner_group_id",
    "runner_group_name",
];

fn rest_of(mut object: Value, filled: &[&str]) -> String {
    let map = object.as_object_mut().expect("a fixture object");
    for key in filled {
        map.remove(*key);
    }
    let text = object.to_string();
    text[1..text.len() - 1].to_string()
}

/// The twin's documentation examples, with run and job cut to what is not filled per answer.
static TEMPLATES: LazyLock<Templates> = LazyLock::new(|| {
    let fixtures = &*twins::github::TEMPLATES;
    let mut run = fixtures.run.clone();
    for key in ["repository", "head_repository"] {
        run[key] = minimal_repository(&run[key]);
    }
    Templates {
        run_rest: rest_of(run, RUN_FIELDS),
        job_rest: rest_of(fixtures.job.clone(), JOB_FIELDS),
        installation: fixtures.installation.clone(),
        token_repository: fixtures.token_repository.clone(),
        access_token: fixtures.access_token.clone(),
    }
});

/// The identifying fields of a run's `repository`/`head_repository`. The documented object
/// has some eighty fields, mostly URL templates, and makes up two thirds of a listed run;
/// every listing is parsed again by the client on each poll (a 304 reuses the cached body),
/// so the full objects tripled the cost of a sweep for fields nobody reads.
fn minimal_repository(full: &Value) -> Value {
    let mut kept = serde_json::Map::new();
    for key in [
        "id",
        "node_id",
        "name",
        "full_name",
        "private",
        "html_url",
        "description",
        "fork",
        "url",
    ] {
        kept.insert(key.to_string(), full[key].clone());
    }
    let owner = &full["owner"];
    kept.insert(
        "owner".into(),
        json!({ "login": owner["login"], "id": owner["id"], "type": owner["type"] }),
    );
    Value::Object(kept)
}

static APP_KEY: LazyLock<DecodingKey> = LazyLock::new(|| {
    DecodingKey::from_rsa_pem(APP_PUBLIC_KEY_PEM.as_bytes()).expect("test App key is valid")
});

/// One primary-limit window of one holder.
#[derive(Clone, Copy, Debug)]
struct Window {
    start_s: u64,
    used: u64,
}

impl Window {
    fn reset_s(&self) -> u64 {
        self.start_s + BUDGET_WINDOW_S
    }
}

/// What an installation token was minted for.
#[derive(Clone, Debug)]
struct Grant {
    repos: BTreeSet<RepoName>,
    permissions: BTreeMap<String, String>,
    expires_s: u64,
}

impl Grant {
    fn allows(&self, permission: &str, level: &str) -> bool {
        self.permissions
            .get(permission)
            .is_some_and(|held| held == "write" || level == "read")
    }
}

/// What the App's installation may grant, as `installation_json` shows it.
const INSTALLATION_PERMISSIONS: [(&str, &str); 3] = [
    ("actions", "read"),
    ("administration", "write"),
    ("metadata", "read"),
];

#[derive(Default)]
struct HttpState {
    budgets: BTreeMap<String, Window>,
    tokens: BTreeMap<String, Grant>,
    tokens_issued: u64,
    /// Mints in flight (the forge port says): an installation lookup then serves a mint.
    minting: u32,
    /// Runner registration reads or deletions in flight: the token they mint serves them.
    managing_runners: u32,
    /// Every request that reached the service, answered or not.
    requests: u64,
    /// Requests entered and not yet answered (or given up by the client).
    in_flight: u64,
}

impl HttpState {
    fn window(&mut self, holder: &str, t: u64) -> &mut Window {
        let window = self.budgets.entry(holder.to_string()).or_insert(Window {
            start_s: t,
            used: 0,
        });
        if t >= window.reset_s() {
            *window = Window {
                start_s: t,
                used: 0,
            };
        }
        window
    }
}

/// GitHub's REST API over the shared world, as a `tower` service octocrab sends to.
#[derive(Clone)]
pub struct GitHubHttp {
    shared: Shared,
    state: Arc<Mutex<HttpState>>,
}

/// How a request ends.
enum Served {
    Answer(Response<String>),
    /// The connection drops before an answer.
    Reset,
    /// No answer ever comes: the client's own timeout has to end the wait.
    Hang,
}

/// The route of a request the daemon makes.
enum Route {
    RepoInstallation(RepoName),
    AccessToken(u64),
    ListRuns(RepoName),
    ListJobs(RepoName, u64),
    RegistrationToken(RepoName),
    GenerateJitConfig(RepoName),
    ListRunners(RepoName),
    DeleteRunner(RepoName, u64),
}

/// An answer under construction.
struct Reply {
    status: StatusCode,
    headers: Vec<(&'static str, String)>,
    body: String,
}

impl Reply {
    fn json(status: StatusCode, body: String) -> Reply {
        Reply {
            status,
            headers: vec![("content-type", "application/json; charset=utf-8".into())],
            body,
        }
    }

    fn error(status: StatusCode, message: &str, docs: &str) -> Reply {
        Reply::json(
            status,
            json!({ "message": message, "documentation_url": docs }).to_string(),
        )
    }

    fn not_found() -> Reply {
        Reply::error(StatusCode::NOT_FOUND, "Not Found", DOCS_REST)
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }

    fn rate(self, limit: u64, used: u64, reset_s: u64) -> Reply {
        self.header("x-ratelimit-limit", limit.to_string())
            .header(
                "x-ratelimit-remaining",
                limit.saturating_sub(used).to_string(),
            )
            .header("x-ratelimit-used", used.to_string())
            .header(
                "x-ratelimit-reset",
                (EPOCH_UNIX + reset_s as i64).to_string(),
            )
            .header("x-ratelimit-resource", "core")
    }

    fn into_response(self) -> Response<String> {
        let mut response = Response::builder().status(self.status);
        for (name, value) in &self.headers {
            if let Ok(value) = HeaderValue::from_str(value) {
                response = response.header(*name, value);
            }
        }
        response
            .header("x-github-api-version-selected", "2022-11-28")
            .body(self.body)
            .expect("a valid response")
    }
}

fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts
        .headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    matches!(scheme.to_ascii_lowercase().as_str(), "bearer" | "token").then(|| token.trim())
}

/// Checks the App's JWT as GitHub does, against virtual time.
fn verify_jwt(parts: &Parts, t: u64) -> Result<(), Reply> {
    let unauthorized = |message: &str| Reply::error(StatusCode::UNAUTHORIZED, message, DOCS_REST);
    let jwt = bearer(parts).ok_or_else(|| unauthorized(JWT_UNDECODABLE))?;
    check_app_jwt(jwt, &APP_KEY, TEST_APP_ID, EPOCH_UNIX + t as i64).map_err(unauthorized)
}

/// Installation ids by owner: one per owner with an `app` repo in the document.
fn installations(sim: &Sim) -> BTreeMap<String, u64> {
    let mut owners: Vec<&str> = sim
        .config
        .repos
        .values()
        .filter(|r| matches!(r.mode, Mode::App))
        .map(|r| r.repo.owner())
        .collect();
    owners.sort_unstable();
    owners.dedup();
    owners
        .into_iter()
        .zip(INSTALLATION_ID_BASE..)
        .map(|(owner, id)| (owner.to_string(), id))
        .collect()
}

fn repo_id(sim: &Sim, repo: &RepoName) -> u64 {
    let index = sim.config.repos.keys().position(|r| r == repo).unwrap_or(0);
    REPO_ID_BASE + index as u64
}

impl Route {
    /// What the request does, for counting requests by kind.
    fn kind(&self) -> &'static str {
        match self {
            Route::RepoInstallation(_) => "GET installation",
            Route::AccessToken(_) => "POST access_tokens",
            Route::ListRuns(_) => "GET runs",
            Route::ListJobs(..) => "GET jobs",
            Route::RegistrationToken(_) => "POST registration-token",
            Route::GenerateJitConfig(_) => "POST generate-jitconfig",
            Route::ListRunners(_) => "GET runners",
            Route::DeleteRunner(..) => "DELETE runner",
        }
    }
}

fn parse_route(sim: &Sim, method: &Method, path: &str) -> Option<Route> {
    let segments: Vec<&str> = path.strip_prefix('/')?.split('/').collect();
    let id = |s: &str| s.parse::<u64>().ok();
    let (repo, rest) = match segments.as_slice() {
        ["app", "installations", installation, "access_tokens"] if method == Method::POST => {
            return Some(Route::AccessToken(id(installation)?));
        }
        ["repos", owner, name, rest @ ..] => (RepoName::parse(&format!("{owner}/{name}"))?, rest),
        ["repositories", repo_id, rest @ ..] => {
            let index = id(repo_id)?.checked_sub(REPO_ID_BASE)?;
            let repo = sim.config.repos.keys().nth(index as usize)?.clone();
            (repo, rest)
        }
        _ => return None,
    };
    match (method.as_str(), rest) {
        ("GET", ["installation"]) => Some(Route::RepoInstallation(repo)),
        ("GET", ["actions", "runs"]) => Some(Route::ListRuns(repo)),
        ("GET", ["actions", "runs", run, "jobs"]) => Some(Route::ListJobs(repo, id(run)?)),
        ("POST", ["actions", "runners", "registration-token"]) => {
            Some(Route::RegistrationToken(repo))
        }
        ("POST", ["actions", "runners", "generate-jitconfig"]) => {
            Some(Route::GenerateJitConfig(repo))
        }
        ("GET", ["actions", "runners"]) => Some(Route::ListRunners(repo)),
        ("DELETE", ["actions", "runners", runner]) => Some(Route::DeleteRunner(repo, id(runner)?)),
        _ => None,
    }
}

/// One request as it meets faults and budgets: on whose budget, in which scope.
struct Billing {
    holder: String,
    scope: Scope,
    repo: RepoName,
    what: &'static str,
    /// The rate-limit message of this holder.
    exceeded: String,
}

impl GitHubHttp {
    pub fn new(shared: &Shared) -> GitHubHttp {
        GitHubHttp {
            shared: shared.clone(),
            state: Arc::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, HttpState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Requests that reached the service so far, answered or not.
    pub fn requests(&self) -> u64 {
        self.state().requests
    }

    /// Requests spent so far in `holder`'s current window.
    pub fn used(&self, holder: &str) -> u64 {
        self.state().budgets.get(holder).map_or(0, |w| w.used)
    }

    /// Sets how much of `holder`'s current window is spent (tests).
    pub fn spend(&self, holder: &str, used: u64) {
        let t = lock(&self.shared).t;
        self.state().window(holder, t).used = used;
    }

    fn serve(&self, parts: &Parts, body: &[u8]) -> Served {
        let mut sim = lock(&self.shared);
        let sim = &mut *sim;
        let mut state = self.state();
        state.requests += 1;
        let Some(route) = parse_route(sim, &parts.method, parts.uri.path()) else {
            return Served::Answer(Reply::not_found().into_response());
        };
        let query = Query::parse(parts.uri.query());
        let installations = installations(sim);
        // Which repo, whose budget, which scope of the loop the request serves.
        let mut token_request = None;
        let billing = match &route {
            Route::RepoInstallation(repo) => app_billing(
                repo.clone(),
                if state.minting > 0 {
                    Scope::Mint(repo.clone())
                } else if state.managing_runners > 0 {
                    Scope::Runners(repo.clone())
                } else {
                    Scope::Queue(repo.clone())
                },
                "get the repository installation",
            ),
            Route::AccessToken(installation) => {
                let Some(owner) = installations
                    .iter()
                    .find(|(_, id)| *id == installation)
                    .map(|(owner, _)| owner.clone())
                else {
                    return Served::Answer(Reply::not_found().into_response());
                };
                let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
                let refuse = |message: &str| {
                    Served::Answer(
                        Reply::error(StatusCode::UNPROCESSABLE_ENTITY, message, DOCS_TOKEN)
                            .into_response(),
                    )
                };
                let names = request["repositories"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let repos: Option<BTreeSet<RepoName>> = names
                    .iter()
                    .map(|name| {
                        RepoName::parse(&format!("{owner}/{}", name.as_str()?))
                            .filter(|r| sim.config.repos.contains_key(r))
                    })
                    .collect();
                let Some(repos) = repos.filter(|r| !r.is_empty() && r.len() <= 500) else {
                    return refuse(
                        "There is at least one repository that does not exist or is not accessible to the parent installation.",
                    );
                };
                let asked = request["permissions"]
                    .as_object()
                    .cloned()
                    .unwrap_or_default();
                let mut granted = BTreeMap::new();
                for (permission, level) in &asked {
                    let level = level.as_str().unwrap_or_default();
                    let allowed = INSTALLATION_PERMISSIONS
                        .iter()
                        .any(|(p, held)| p == permission && (*held == "write" || level == "read"));
                    if !allowed || !matches!(level, "read" | "write") {
                        return refuse(
                            "The permissions requested are not granted to this installation.",
                        );
                    }
                    granted.insert(permission.clone(), level.to_string());
                }
                if granted.is_empty() {
                    return refuse("The daemon always asks for named permissions.");
                }
                let repo = repos.first().expect("not empty").clone();
                let writes = granted.get("administration").is_some_and(|l| l == "write");
                let scope = if repos.len() > 1 {
                    Scope::ReadToken(owner.clone())
                } else if writes && state.managing_runners > 0 {
                    Scope::Runners(repo.clone())
                } else if writes {
                    Scope::Mint(repo.clone())
                } else {
                    Scope::Queue(repo.clone())
                };
                token_request = Some((repos, granted));
                app_billing(repo, scope, "create an installation access token")
            }
            Route::ListRuns(repo) | Route::ListJobs(repo, _) => {
                let Some(config) = sim.config.repos.get(repo) else {
                    return Served::Answer(Reply::not_found().into_response());
                };
                repo_billing(config, &installations, Scope::Queue(repo.clone()), "list")
            }
            Route::RegistrationToken(repo) | Route::GenerateJitConfig(repo) => {
                let Some(config) = sim.config.repos.get(repo) else {
                    return Served::Answer(Reply::not_found().into_response());
                };
                repo_billing(
                    config,
                    &installations,
                    Scope::Mint(repo.clone()),
                    "create a registration token",
                )
            }
            Route::ListRunners(repo) | Route::DeleteRunner(repo, _) => {
                let Some(config) = sim.config.repos.get(repo) else {
                    return Served::Answer(Reply::not_found().into_response());
                };
                repo_billing(
                    config,
                    &installations,
                    Scope::Runners(repo.clone()),
                    if matches!(route, Route::ListRunners(_)) {
                        "list runners"
                    } else {
                        "delete a runner"
                    },
                )
            }
        };
        let t = sim.t;
        // The secondary limit counts every request that reaches GitHub, refused or not.
        sim.requests
            .secondary
            .spend(&billing.holder, &parts.method, t);
        sim.requests.github_sent += 1;
        sim.requests.github_concurrent_max =
            sim.requests.github_concurrent_max.max(state.in_flight);
        let fault = sim.fault(Call {
            scope: billing.scope.clone(),
            service: Service::GitHub,
            via_vault: false,
            budget: Some(billing.holder.clone()),
            what: billing.what,
        });
        // A shared read token that fails holds back the reads of every repo it names, since
        // any of them may be the one whose read asked for it.
        if let (Some(fault), Some((repos, _))) = (&fault, &token_request)
            && repos.len() > 1
        {
            let e = fault.error(billing.what);
            for repo in repos {
                sim.record_fault(&Scope::Queue(repo.clone()), Service::GitHub, &e);
                sim.record_fault(&Scope::Runners(repo.clone()), Service::GitHub, &e);
            }
        }
        let window = *state.window(&billing.holder, t);
        match fault {
            None | Some(Fault::Malformed) => {}
            Some(Fault::Outage | Fault::VaultOutage) => {
                return Served::Answer(
                    Reply::error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "Service Unavailable",
                        DOCS_REST,
                    )
                    .into_response(),
                );
            }
            Some(Fault::Transient(Transient::BadGateway)) => {
                let mut reply = Reply::json(
                    StatusCode::BAD_GATEWAY,
                    "<html><body><h1>502 Bad Gateway</h1></body></html>".into(),
                );
                reply.headers = vec![("content-type", "text/html".into())];
                return Served::Answer(reply.into_response());
            }
            Some(Fault::Transient(Transient::ConnectionReset)) => return Served::Reset,
            Some(Fault::Transient(Transient::TimedOut)) => return Served::Hang,
            Some(Fault::Exhausted { wait_s })
            | Some(Fault::RateLimited {
                wait_s,
                secondary: false,
            }) => {
                return Served::Answer(exhausted(&billing, t + wait_s).into_response());
            }
            Some(Fault::RateLimited {
                wait_s,
                secondary: true,
            }) => {
                return Served::Answer(
                    Reply::error(
                        StatusCode::TOO_MANY_REQUESTS,
                        SECONDARY_MESSAGE,
                        DOCS_RATE_LIMITS,
                    )
                    .header("retry-after", wait_s.to_string())
                    .rate(BUDGET_LIMIT, window.used, window.reset_s())
                    .into_response(),
                );
            }
        }
        let malformed = fault == Some(Fault::Malformed);
        let authenticated = match &route {
            Route::RepoInstallation(_) | Route::AccessToken(_) => verify_jwt(parts, t),
            Route::ListRuns(repo) | Route::ListJobs(repo, _) => {
                authorize(&state, sim, parts, repo, ("actions", "read"))
            }
            Route::RegistrationToken(repo)
            | Route::GenerateJitConfig(repo)
            | Route::DeleteRunner(repo, _) => {
                authorize(&state, sim, parts, repo, ("administration", "write"))
            }
            Route::ListRunners(repo) => {
                authorize(&state, sim, parts, repo, ("administration", "read"))
            }
        };
        if let Err(reply) = authenticated {
            return Served::Answer(
                reply
                    .rate(BUDGET_LIMIT, window.used, window.reset_s())
                    .into_response(),
            );
        }
        if window.used >= BUDGET_LIMIT {
            // Spent for real (not injected): the world records it like a fault, so the
            // checker excuses what it holds back, until the window resets.
            let reset_s = window.reset_s();
            sim.faults.exhausted.insert(billing.holder.clone(), reset_s);
            let reply = exhausted(&billing, reset_s);
            let e = PortError::new(
                ErrorClass::RateLimited,
                format!("{}: budget of {} spent", billing.what, billing.holder),
            );
            sim.record_fault(&billing.scope, Service::GitHub, &e);
            return Served::Answer(reply.into_response());
        }
        let asked = parts
            .headers
            .get(http::header::IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok());
        // A listing whose ETag the client sent is not sent again (a cut-off body is a 200
        // whatever the client has cached).
        let not_modified = |etag: &str| !malformed && asked == Some(etag);
        let listed = |etag: String, link: Option<String>, render: &dyn Fn() -> String| {
            if not_modified(&etag) {
                return Err(etag);
            }
            let reply = Reply::json(StatusCode::OK, render()).header("etag", etag);
            Ok(match link {
                Some(link) => reply.header("link", link),
                None => reply,
            })
        };
        let answered = match &route {
            Route::RepoInstallation(repo) => Ok(match installations.get(repo.owner()) {
                Some(id) => Reply::json(
                    StatusCode::OK,
                    installation_json(repo.owner(), *id).to_string(),
                ),
                None => Reply::not_found(),
            }),
            Route::AccessToken(installation) => {
                let (repos, permissions) = token_request.expect("set for this route");
                state.tokens_issued += 1;
                let token = crate::sim::twins::github::stateless_installation_token(
                    TEST_APP_ID,
                    *installation,
                    &state.tokens_issued.to_string(),
                );
                let expires_s = t + TOKEN_LIFETIME_S;
                let listed: Vec<(RepoName, u64)> = repos
                    .iter()
                    .map(|repo| (repo.clone(), repo_id(sim, repo)))
                    .collect();
                let body = access_token_json(&token, expires_s, &permissions, &listed);
                state.tokens.insert(
                    token,
                    Grant {
                        repos,
                        permissions,
                        expires_s,
                    },
                );
                sim.requests.github_token_mints += 1;
                Ok(Reply::json(StatusCode::CREATED, body.to_string()))
            }
            Route::ListRuns(repo) => {
                let page = runs_page(sim, repo, &query);
                listed(page.etag.clone(), page.link.clone(), &|| render_runs(&page))
            }
            Route::ListJobs(repo, run) => match jobs_page(sim, repo, *run, &query) {
                Some((run, page)) => listed(page.etag.clone(), page.link.clone(), &|| {
                    render_jobs(run, &page)
                }),
                None => Ok(Reply::not_found()),
            },
            Route::RegistrationToken(_) => {
                sim.requests.github_token_mints += 1;
                let token = sim.mint_canary();
                let body = json!({
                    "token": secrecy::ExposeSecret::expose_secret(&token),
                    "expires_at": DateTime::from_timestamp(EPOCH_UNIX + (t + TOKEN_LIFETIME_S) as i64, 0)
                        .expect("simulated time is in range")
                        .to_rfc3339_opts(SecondsFormat::Millis, true),
                });
                Ok(Reply::json(StatusCode::CREATED, body.to_string()))
            }
            Route::GenerateJitConfig(repo) => Ok(match JitRequest::parse(body) {
                // The twin's checks: without `runner_group_id`, among others, GitHub answers
                // 422 (gotcha 5), and the refusal is billed like any answer.
                Err((status, message)) => Reply::error(status, &message, DOCS_JIT),
                Ok(request) => {
                    let config = sim.mint_canary();
                    let Sim { world, trace, .. } = &mut *sim;
                    match world.register_jit(t, repo, &RunnerName(request.name.clone()), trace) {
                        Some(id) => {
                            sim.requests.github_token_mints += 1;
                            let body = jit_config_json(
                                id,
                                &request.name,
                                &request.labels,
                                secrecy::ExposeSecret::expose_secret(&config),
                            );
                            Reply::json(StatusCode::CREATED, body.to_string())
                        }
                        None => Reply::error(StatusCode::CONFLICT, JIT_NAME_TAKEN, DOCS_JIT),
                    }
                }
            }),
            Route::ListRunners(repo) => {
                // `name` filters (exactly, as the twin does); `per_page`/`page` slice, with
                // the `Link` header when more than one page: a fleet of more than 100 runners
                // takes the client several requests, each billed.
                let wanted = query.get("name");
                let registrations: Vec<(u64, RunnerName, bool, bool)> = sim
                    .world
                    .registrations_of(repo)
                    .into_iter()
                    .filter(|(_, name, ..)| wanted.is_none_or(|w| w == name.0))
                    .collect();
                let total = registrations.len();
                let base = format!(
                    "{API_URL}/repositories/{}/actions/runners",
                    repo_id(sim, repo)
                );
                let (range, link) = query.page(total, &base);
                let runners: Vec<Value> = registrations[range]
                    .iter()
                    .map(|(id, name, online, busy)| {
                        // The world keeps no runner's labels: every one shows `self-hosted`.
                        json!({
                            "id": id, "name": name.0, "os": "linux",
                            "status": if *online { "online" } else { "offline" },
                            "busy": busy, "ephemeral": true,
                            "labels": runner_labels_json(&["self-hosted"]),
                        })
                    })
                    .collect();
                let body = json!({ "total_count": total, "runners": runners });
                let reply = Reply::json(StatusCode::OK, body.to_string());
                Ok(match link {
                    Some(link) => reply.header("link", link),
                    None => reply,
                })
            }
            Route::DeleteRunner(repo, id) => {
                let Sim { world, trace, .. } = &mut *sim;
                Ok(match world.delete_registration(t, repo, *id, trace) {
                    Some(true) => Reply {
                        status: StatusCode::NO_CONTENT,
                        headers: Vec::new(),
                        body: String::new(),
                    },
                    Some(false) => Reply::error(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        &format!("Bad request - Runner {id} is still running a job"),
                        DOCS_REST,
                    ),
                    None => Reply::not_found(),
                })
            }
        };
        let mut reply = match answered {
            Ok(reply) => reply,
            Err(etag) => {
                sim.requests.github_not_modified += 1;
                return Served::Answer(
                    Reply {
                        status: StatusCode::NOT_MODIFIED,
                        headers: Vec::new(),
                        body: String::new(),
                    }
                    .header("etag", etag)
                    .rate(BUDGET_LIMIT, window.used, window.reset_s())
                    .into_response(),
                );
            }
        };
        let window = state.window(&billing.holder, t);
        window.used += 1;
        let window = *window;
        sim.requests.github_primary += 1;
        *sim.requests
            .github_primary_by_repo
            .entry(billing.repo.to_string())
            .or_default() += 1;
        *sim.requests
            .github_primary_by_kind
            .entry(route.kind())
            .or_default() += 1;
        *sim.requests
            .github_primary_by_owner
            .entry(billing.holder.clone())
            .or_default() += 1;
        if window.used * 4 > BUDGET_LIMIT * 3 {
            sim.faults
                .low
                .insert(billing.holder.clone(), window.reset_s());
        }
        if window.used >= BUDGET_LIMIT {
            // The client pauses on `remaining: 0`; the world agrees the budget is out.
            sim.faults
                .exhausted
                .insert(billing.holder.clone(), window.reset_s());
        }
        if malformed {
            let mut cut = reply.body.len() / 2;
            while !reply.body.is_char_boundary(cut) {
                cut -= 1;
            }
            reply.body.truncate(cut);
        }
        Served::Answer(
            reply
                .rate(BUDGET_LIMIT, window.used, window.reset_s())
                .into_response(),
        )
    }
}

fn app_billing(repo: RepoName, scope: Scope, what: &'static str) -> Billing {
    Billing {
        holder: APP_BUDGET.to_string(),
        scope,
        repo,
        what,
        exceeded: format!("API rate limit exceeded for app ID {TEST_APP_ID}."),
    }
}

fn repo_billing(
    config: &RepoConfig,
    installations: &BTreeMap<String, u64>,
    scope: Scope,
    what: &'static str,
) -> Billing {
    let exceeded = match installations.get(config.repo.owner()) {
        Some(id) if matches!(config.mode, Mode::App) => {
            format!("API rate limit exceeded for installation ID {id}.")
        }
        _ => "API rate limit exceeded for user ID 1.".to_string(),
    };
    Billing {
        holder: budget_of(config),
        scope,
        repo: config.repo.clone(),
        what,
        exceeded,
    }
}

/// GitHub's primary-limit refusal: 403 with `x-ratelimit-remaining: 0` until `reset_s`.
fn exhausted(billing: &Billing, reset_s: u64) -> Reply {
    Reply::error(StatusCode::FORBIDDEN, &billing.exceeded, DOCS_RATE_LIMITS).rate(
        BUDGET_LIMIT,
        BUDGET_LIMIT,
        reset_s,
    )
}

/// The token of a repo request: an unexpired installation token minted for this repo and
/// permission (`app`), or the polling token Vault holds for the repo (`vault`).
fn authorize(
    state: &HttpState,
    sim: &Sim,
    parts: &Parts,
    repo: &RepoName,
    (permission, level): (&str, &str),
) -> Result<(), Reply> {
    let bad = || Reply::error(StatusCode::UNAUTHORIZED, "Bad credentials", DOCS_REST);
    let token = bearer(parts).ok_or_else(bad)?;
    let config = sim.config.repos.get(repo).ok_or_else(Reply::not_found)?;
    match &config.mode {
        Mode::Vault { vault_path, .. } => {
            if token != polling_token(vault_path) {
                return Err(bad());
            }
            // A polling token reads; it administers nothing.
            if permission != "actions" {
                return Err(Reply::error(
                    StatusCode::FORBIDDEN,
                    "Resource not accessible by personal access token",
                    DOCS_REST,
                ));
            }
            Ok(())
        }
        Mode::App => {
            let grant = state
                .tokens
                .get(token)
                .filter(|g| g.expires_s > sim.t)
                .ok_or_else(bad)?;
            if !grant.repos.contains(repo) {
                return Err(Reply::not_found());
            }
            if !grant.allows(permission, level) {
                return Err(Reply::error(
                    StatusCode::FORBIDDEN,
                    "Resource not accessible by integration",
                    DOCS_REST,
                )
                .header(
                    "x-accepted-github-permissions",
                    format!("{permission}={level}"),
                ));
            }
            Ok(())
        }
        Mode::Forgejo { .. } => Err(Reply::not_found()),
    }
}

fn installation_json(owner: &str, id: u64) -> Value {
    let mut value = TEMPLATES.installation.clone();
    value["id"] = json!(id);
    value["account"]["login"] = json!(owner);
    value["account"]["url"] = json!(format!("{API_URL}/users/{owner}"));
    value["account"]["html_url"] = json!(format!("https://github.com/{owner}"));
    value["access_tokens_url"] = json!(format!("{API_URL}/app/installations/{id}/access_tokens"));
    value["app_id"] = json!(TEST_APP_ID.parse::<u64>().unwrap_or(1));
    value["target_id"] = json!(id);
    value["permissions"] =
        json!({ "actions": "read", "administration": "write", "metadata": "read" });
    value["repository_selection"] = json!("all");
    value
}

fn access_token_json(
    token: &str,
    expires_s: u64,
    permissions: &BTreeMap<String, String>,
    repos: &[(RepoName, u64)],
) -> Value {
    let repositories: Vec<Value> = repos
        .iter()
        .map(|(repo, id)| {
            let mut repository = TEMPLATES.token_repository.clone();
            repository["id"] = json!(id);
            repository["name"] = json!(repo.name());
            repository["full_name"] = json!(repo.to_string());
            repository["owner"]["login"] = json!(repo.owner());
            repository
        })
        .collect();
    let mut body = TEMPLATES.access_token.clone();
    body["token"] = json!(token);
    body["expires_at"] = json!(timestamp(expires_s as i64));
    body["permissions"] = json!(permissions);
    body["repository_selection"] = json!("selected");
    body["repositories"] = json!(repositories);
    body
}

/// A run as the API shows it: in progress once one of its jobs is, queued while one waits.
struct RunView {
    id: u64,
    status: &'static str,
    created_s: i64,
}

/// A job as the API shows it.
struct JobView {
    id: u64,
    in_progress: bool,
    created_s: i64,
    runner: Option<String>,
    labels: Vec<String>,
}

/// One page of a listing: what it shows, and its ETag. The ETag is a digest of everything
/// the body is made from, so the body is only rendered when it is sent.
struct Page<T> {
    repo: RepoName,
    total: usize,
    items: Vec<T>,
    link: Option<String>,
    etag: String,
}

fn runs_of(sim: &Sim, repo: &RepoName) -> Vec<RunView> {
    let mut runs: BTreeMap<u64, RunView> = BTreeMap::new();
    for job in sim
        .world
        .jobs
        .values()
        .filter(|j| j.repo == *repo && j.forge == ForgeKind::GitHub)
    {
        let status = match job.visible {
            Visible::Hidden => continue,
            Visible::Queued => "queued",
            Visible::Running(_) => "in_progress",
        };
        let run = runs.entry(job.run).or_insert(RunView {
            id: job.run,
            status,
            created_s: job.queued_at_s,
        });
        if status == "in_progress" {
            run.status = status;
        }
        run.created_s = run.created_s.min(job.queued_at_s);
    }
    // Newest first, as GitHub lists them.
    runs.into_values().rev().collect()
}

fn digest(parts: impl IntoIterator<Item = String>) -> String {
    let hash = parts
        .into_iter()
        .fold(0, |hash, part| super::trace::fnv1a(hash, part.as_bytes()));
    format!("W/\"{hash:016x}\"")
}

fn runs_page(sim: &Sim, repo: &RepoName, query: &Query) -> Page<RunView> {
    // `status` takes a status or a conclusion, as the twin's does; the world lists only
    // unfinished runs, whose conclusion is null, so a conclusion matches none of them.
    let mut runs: Vec<RunView> = runs_of(sim, repo)
        .into_iter()
        .filter(|r| query.run_status_matches(r.status, None))
        .collect();
    // A filtered listing is a search, capped at 1,000 runs (newest first) like GitHub's.
    if query.is_run_search() {
        runs.truncate(RUN_SEARCH_CAP);
    }
    let total = runs.len();
    let base = format!("{API_URL}/repositories/{}/actions/runs", repo_id(sim, repo));
    let (range, link) = query.page(total, &base);
    let items: Vec<RunView> = runs.drain(range).collect();
    let etag = digest(
        [format!("runs {repo} {total} {link:?}")].into_iter().chain(
            items
                .iter()
                .map(|r| format!("{} {} {};", r.id, r.status, r.created_s)),
        ),
    );
    Page {
        repo: repo.clone(),
        total,
        items,
        link,
        etag,
    }
}

fn render_runs(page: &Page<RunView>) -> String {
    let repo = &page.repo;
    let mut body = format!("{{\"total_count\":{},\"workflow_runs\":[", page.total);
    for (i, run) in page.items.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        let url = format!("{API_URL}/repos/{repo}/actions/runs/{}", run.id);
        let created = timestamp(run.created_s);
        body.push_str(&format!(
            "{{\"id\":{id},\"run_number\":{id},\"run_attempt\":1,\"status\":\"{status}\",\"conclusion\":null,\
             \"created_at\":\"{created}\",\"updated_at\":\"{created}\",\"run_started_at\":\"{created}\",\
             \"url\":\"{url}\",\"html_url\":\"https://github.com/{repo}/actions/runs/{id}\",\
             \"jobs_url\":\"{url}/jobs\",{rest}}}",
            id = run.id,
            status = run.status,
            rest = TEMPLATES.run_rest,
        ));
    }
    body.push_str("]}");
    body
}

/// The jobs of run `run`, or `None` when the run is gone.
fn jobs_page(sim: &Sim, repo: &RepoName, run: u64, query: &Query) -> Option<(u64, Page<JobView>)> {
    let mut exists = false;
    let mut jobs = Vec::new();
    for (id, job) in sim
        .world
        .jobs
        .iter()
        .filter(|(_, j)| j.repo == *repo && j.forge == ForgeKind::GitHub && j.run == run)
    {
        exists = true;
        // Jobs still waiting on `needs:` (or not shown yet) are not listed.
        let (in_progress, runner) = match &job.visible {
            Visible::Hidden => continue,
            Visible::Queued => (false, None),
            Visible::Running(runner) => (true, Some(runner.0.clone())),
        };
        jobs.push(JobView {
            id: *id,
            in_progress,
            created_s: job.queued_at_s,
            runner,
            labels: job.raw_labels.clone(),
        });
    }
    if !exists {
        return None;
    }
    let total = jobs.len();
    let base = format!(
        "{API_URL}/repositories/{}/actions/runs/{run}/jobs",
        repo_id(sim, repo)
    );
    let (range, link) = query.page(total, &base);
    let items: Vec<JobView> = jobs.drain(range).collect();
    let etag = digest(
        [format!("jobs {repo} {run} {total} {link:?}")]
            .into_iter()
            .chain(items.iter().map(|j| {
                format!(
                    "{} {} {} {:?} {:?};",
                    j.id, j.in_progress, j.created_s, j.runner, j.labels
                )
            })),
    );
    Some((
        run,
        Page {
            repo: repo.clone(),
            total,
            items,
            link,
            etag,
        },
    ))
}

fn render_jobs(run: u64, page: &Page<JobView>) -> String {
    let repo = &page.repo;
    let mut body = format!("{{\"total_count\":{},\"jobs\":[", page.total);
    for (i, job) in page.items.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        let created = timestamp(job.created_s);
        let (status, started, runner) = match &job.runner {
            Some(runner) if job.in_progress => (
                "in_progress",
                format!("\"{created}\""),
                serde_json::to_string(runner).expect("a string serialises"),
            ),
            _ => ("queued", "null".to_string(), "null".to_string()),
        };
        let labels = serde_json::to_string(&job.labels).expect("strings serialise");
        body.push_str(&format!(
            "{{\"id\":{id},\"run_id\":{run},\"run_url\":\"{API_URL}/repos/{repo}/actions/runs/{run}\",\
             \"url\":\"{API_URL}/repos/{repo}/actions/jobs/{id}\",\
             \"html_url\":\"https://github.com/{repo}/actions/runs/{run}/job/{id}\",\
             \"status\":\"{status}\",\"conclusion\":null,\"created_at\":\"{created}\",\
             \"started_at\":{started},\"completed_at\":null,\"steps\":[],\"labels\":{labels},\
             \"runner_id\":null,\"runner_name\":{runner},\"runner_group_id\":null,\
             \"runner_group_name\":null,{rest}}}",
            id = job.id,
            rest = TEMPLATES.job_rest,
        ));
    }
    body.push_str("]}");
    body
}

impl tower::Service<http::Request<OctoBody>> for GitHubHttp {
    type Response = Response<String>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<String>, io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<OctoBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        // octocrab's request bodies are whole strings in memory: complete at the first poll.
        let body = body
            .collect()
            .now_or_never()
            .and_then(Result::ok)
            .map(|collected| collected.to_bytes())
            .unwrap_or_default();
        // In flight from here until the client takes the answer or gives up waiting (a
        // hanging request counts until its timeout drops it).
        let entered = InFlight::enter(&self.state);
        match self.serve(&parts, &body) {
            Served::Answer(response) => Box::pin(async move {
                drop(entered);
                Ok(response)
            }),
            Served::Reset => Box::pin(async move {
                drop(entered);
                Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "connection reset by peer",
                ))
            }),
            Served::Hang => Box::pin(async move {
                let _entered = entered;
                futures::future::pending().await
            }),
        }
    }
}

/// One request counted in flight for as long as it lives.
struct InFlight(Arc<Mutex<HttpState>>);

impl InFlight {
    fn enter(state: &Arc<Mutex<HttpState>>) -> InFlight {
        state.lock().unwrap_or_else(|p| p.into_inner()).in_flight += 1;
        InFlight(state.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).in_flight -= 1;
    }
}

/// Vault as the `vault` repos' polling tokens see it: a fixed fake token, and a transient
/// failure while the seed has Vault out (recorded against the queues of the repos whose
/// token lives at that path).
pub struct SimSecrets(pub Shared);

#[async_trait]
impl SecretSource for SimSecrets {
    async fn read_field(&self, path: &str, field: &str) -> Result<SecretString, PortError> {
        let mut sim = lock(&self.0);
        if sim.options.outage_at(Service::Vault, sim.t).is_some() {
            let e = PortError::new(
                ErrorClass::Transient,
                format!("read secret/data/{path}: 503 Vault is sealed"),
            );
            let scopes: Vec<Scope> = sim
                .config
                .repos
                .values()
                .filter(|r| matches!(&r.mode, Mode::Vault { vault_path, .. } if vault_path == path))
                .map(|r| Scope::Queue(r.repo.clone()))
                .collect();
            for scope in &scopes {
                sim.record_fault(scope, Service::Vault, &e);
            }
            sim.faults.injected_total += 1;
            return Err(e);
        }
        if field != POLLING_TOKEN_FIELD {
            return Err(PortError::new(
                ErrorClass::NotFound,
                format!("read secret/data/{path}: no field {field:?}"),
            ));
        }
        Ok(SecretString::from(polling_token(path)))
    }
}

/// The GitHub forge of the seeded world: the real client over [`GitHubHttp`]. The client is
/// built at its first call, inside the runtime that drives the ticks (octocrab spawns its
/// buffer worker there).
pub struct GitHubForge {
    shared: Shared,
    http: GitHubHttp,
    conditional_requests: bool,
    client: OnceLock<GitHub>,
}

/// Marks a mint in flight for as long as it lives, however the mint ends.
struct Minting<'a>(&'a GitHubHttp);

impl<'a> Minting<'a> {
    fn start(http: &'a GitHubHttp) -> Minting<'a> {
        http.state().minting += 1;
        Minting(http)
    }
}

impl Drop for Minting<'_> {
    fn drop(&mut self) {
        self.0.state().minting -= 1;
    }
}

/// Marks a runner registration read or deletion in flight for as long as it lives.
struct ManagingRunners<'a>(&'a GitHubHttp);

impl<'a> ManagingRunners<'a> {
    fn start(http: &'a GitHubHttp) -> ManagingRunners<'a> {
        http.state().managing_runners += 1;
        ManagingRunners(http)
    }
}

impl Drop for ManagingRunners<'_> {
    fn drop(&mut self) {
        self.0.state().managing_runners -= 1;
    }
}

impl GitHubForge {
    pub fn new(shared: &Shared, conditional_requests: bool) -> GitHubForge {
        GitHubForge {
            shared: shared.clone(),
            http: GitHubHttp::new(shared),
            conditional_requests,
            client: OnceLock::new(),
        }
    }

    /// The service the client talks to.
    pub fn http(&self) -> &GitHubHttp {
        &self.http
    }

    /// The real client, built on first use (inside a tokio runtime).
    pub fn client(&self) -> &GitHub {
        self.client.get_or_init(|| {
            let settings = GitHubSettings {
                api_url: url::Url::parse(API_URL).expect("a valid URL"),
                app: Some(AppCredentials {
                    app_id: TEST_APP_ID.into(),
                    private_key: SecretString::from(APP_PRIVATE_KEY_PEM),
                    installation_id: None,
                }),
                request_timeout: REQUEST_TIMEOUT,
            };
            let clock = self.shared.clone();
            let client = GitHub::over_service(
                settings,
                self.http.clone(),
                Arc::new(SimSecrets(self.shared.clone())),
            )
            .expect("the test App key is valid")
            .with_clock(Arc::new(move || virtual_now(lock(&clock).t)));
            if self.conditional_requests {
                client
            } else {
                // The seed poller of the field report: every listing billed, and no holding
                // back short of GitHub's secondary limit either.
                client
                    .without_conditional_requests()
                    .with_read_points_per_minute(u32::MAX)
            }
        })
    }

    /// The client refuses on its own, without a request, while a budget it was told about is
    /// spent. That holds a scope back as a fault does, when the world agrees the budget is
    /// out; a refusal the world does not justify is left for the invariants to catch.
    fn held_back(&self, scope: Scope, repo: &RepoConfig, result: &Result<impl Sized, PortError>) {
        let Err(e) = result else { return };
        if e.class != ErrorClass::RateLimited {
            return;
        }
        let mut sim = lock(&self.shared);
        let t = sim.t;
        let mut holders = vec![budget_of(repo)];
        if matches!(repo.mode, Mode::App) {
            holders.push(APP_BUDGET.to_string());
        }
        let spent = holders
            .iter()
            .any(|h| sim.faults.exhausted.get(h).is_some_and(|reset| *reset > t));
        if spent && !sim.faults.injected_now.contains(&scope) {
            sim.record_fault(&scope, Service::GitHub, e);
        }
    }
}

#[async_trait]
impl QueueSource for GitHubForge {
    fn budget(&self, repo: &RepoConfig) -> Option<crate::observe::BudgetReading> {
        self.client().budget(repo)
    }

    fn serving(&self, repos: &[&RepoConfig]) {
        self.client().serving(repos);
    }

    fn read_points(&self, repo: &RepoConfig) -> Option<crate::observe::ReadPoints> {
        self.client().read_points(repo)
    }

    fn hinted(&self, repo: &crate::model::RepoName) {
        self.client().hinted(repo);
    }

    async fn list_jobs(&self, repo: &RepoConfig) -> Result<RepoJobs, PortError> {
        let result = self.client().list_jobs(repo).await;
        self.held_back(Scope::Queue(repo.repo.clone()), repo, &result);
        if let Ok(reading) = &result {
            lock(&self.shared).queue_read(&repo.repo, reading.jobs.len());
        }
        result
    }
}

#[async_trait]
impl RunnerRegistry for GitHubForge {
    async fn list_runners(&self, repo: &RepoConfig) -> Result<Vec<RunnerRegistration>, PortError> {
        let _managing = ManagingRunners::start(&self.http);
        self.client().list_runners(repo).await
    }

    async fn delete_runner(
        &self,
        repo: &RepoConfig,
        runner_id: u64,
    ) -> Result<Deregistration, PortError> {
        let _managing = ManagingRunners::start(&self.http);
        self.client().delete_runner(repo, runner_id).await
    }
}

#[async_trait]
impl Registrar for GitHubForge {
    async fn mint(
        &self,
        repo: &RepoConfig,
        runner: RunnerIdentity<'_>,
    ) -> Result<Option<Credential>, PortError> {
        let result = {
            let _minting = Minting::start(&self.http);
            self.client().mint(repo, runner).await
        };
        self.held_back(Scope::Mint(repo.repo.clone()), repo, &result);
        result
    }

    fn repo_url(&self, repo: &RepoConfig) -> String {
        repo_url(repo)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::super::options::Outage;
    use super::super::ports::CANARY;
    use super::super::scenarios::Scenario;
    use super::super::trace::Trace;
    use super::super::world::World;
    use super::*;
    use crate::config::{ConfigDefaults, parse_document};
    use crate::observe::JobState;

    const APP_REPO: &str = "afreidah/munchbox";
    const VAULT_REPO: &str = "ev-the-dev/moat";

    /// A world without random faults, with work queued on every repo and the status lag
    /// caught up.
    fn quiet_world() -> Shared {
        let mut rng = StdRng::seed_from_u64(7);
        let mut options = Scenario::Steady.options(&mut rng);
        options.faults = BTreeMap::new();
        options.outages.clear();
        options.burst_runs = 12;
        options.stale_jobs = 0;
        options.cancel_per_s = 0.0;
        options.runs_per_hour = 0.0;
        let config = parse_document(options.document().as_bytes(), &ConfigDefaults::default())
            .expect("a valid document");
        let repo_urls = config
            .repos
            .values()
            .map(|r| (repo_url(r), r.repo.clone()))
            .collect();
        let world = World::new(&options, repo_urls);
        let sim = Sim::new(
            options,
            config,
            world,
            StdRng::seed_from_u64(8),
            Trace::new(false),
        );
        let shared = Arc::new(Mutex::new(sim));
        for t in 0..=5 {
            lock(&shared).advance(t);
        }
        shared
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime")
    }

    fn repo(shared: &Shared, name: &str) -> RepoConfig {
        let name = RepoName::parse(name).expect("a repo name");
        lock(shared).config.repos[&name].clone()
    }

    /// The jobs the world shows for `repo`: (id, queued?, runner).
    fn shown(shared: &Shared, repo: &RepoName) -> BTreeSet<(u64, bool, Option<String>)> {
        lock(shared)
            .world
            .jobs
            .iter()
            .filter(|(_, j)| j.repo == *repo)
            .filter_map(|(id, j)| match &j.visible {
                Visible::Hidden => None,
                Visible::Queued => Some((*id, true, None)),
                Visible::Running(r) => Some((*id, false, Some(r.0.clone()))),
            })
            .collect()
    }

    fn listed(jobs: &RepoJobs) -> BTreeSet<(u64, bool, Option<String>)> {
        jobs.jobs
            .iter()
            .map(|j| match &j.state {
                JobState::InProgress { runner } => {
                    (j.id, false, runner.as_ref().map(|r| r.0.clone()))
                }
                _ => (j.id, true, None),
            })
            .collect()
    }

    fn billed(shared: &Shared) -> (u64, u64) {
        let sim = lock(shared);
        (
            sim.requests.github_primary,
            sim.requests.github_not_modified,
        )
    }

    #[test]
    fn an_unchanged_listing_is_answered_not_modified_and_spends_nothing() {
        let shared = quiet_world();
        let forge = GitHubForge::new(&shared, true);
        runtime().block_on(async {
            for name in [APP_REPO, VAULT_REPO] {
                let repo = repo(&shared, name);
                let first = forge.list_jobs(&repo).await.expect("listed");
                assert!(!first.jobs.is_empty(), "{name}: the burst queued work here");
                assert_eq!(listed(&first), shown(&shared, &repo.repo), "{name}");
                let (spent, not_modified) = billed(&shared);
                let second = forge.list_jobs(&repo).await.expect("listed again");
                assert_eq!(listed(&second), listed(&first), "{name}");
                let (spent_after, not_modified_after) = billed(&shared);
                assert_eq!(spent_after, spent, "{name}: a 304 is free");
                // Two run listings (queued, in progress) and one job listing per run.
                assert!(not_modified_after >= not_modified + 3, "{name}");
            }
        });
        let sim = lock(&shared);
        assert_eq!(
            sim.requests.github_primary,
            sim.requests.github_primary_by_repo.values().sum::<u64>()
        );
    }

    #[test]
    fn without_conditional_requests_every_listing_is_billed() {
        let shared = quiet_world();
        let forge = GitHubForge::new(&shared, false);
        runtime().block_on(async {
            let repo = repo(&shared, VAULT_REPO);
            forge.list_jobs(&repo).await.expect("listed");
            let (spent, _) = billed(&shared);
            let requests = forge.http().requests();
            forge.list_jobs(&repo).await.expect("listed again");
            let (spent_after, not_modified) = billed(&shared);
            assert_eq!(spent_after - spent, forge.http().requests() - requests);
            assert!(spent_after >= spent + 3);
            assert_eq!(not_modified, 0);
        });
    }

    #[test]
    fn a_spent_budget_answers_403_and_pauses_the_holder_in_the_client() {
        let shared = quiet_world();
        let forge = GitHubForge::new(&shared, true);
        let repo = repo(&shared, APP_REPO);
        let holder = budget_of(&repo);
        runtime().block_on(async {
            forge.list_jobs(&repo).await.expect("listed");
            forge.http().spend(&holder, BUDGET_LIMIT);
            let e = forge
                .list_jobs(&repo)
                .await
                .expect_err("the budget is spent");
            assert_eq!(e.class, ErrorClass::RateLimited, "{}", e.message);
            assert!(e.message.contains("installation ID"), "{}", e.message);
            // The window began at t=5 with the first request; now is t=5.
            assert_eq!(e.retry_after_s, Some(BUDGET_WINDOW_S));
            let reset = virtual_now(5 + BUDGET_WINDOW_S);
            assert_eq!(forge.client().paused_until(&repo), Some(reset));
            // Paused: the client refuses without asking, and the world excuses the hold.
            let requests = forge.http().requests();
            let again = forge.list_jobs(&repo).await.expect_err("still paused");
            assert_eq!(again.class, ErrorClass::RateLimited);
            assert_eq!(forge.http().requests(), requests);
            {
                let sim = lock(&shared);
                assert_eq!(
                    sim.faults.exhausted.get(&holder),
                    Some(&(5 + BUDGET_WINDOW_S))
                );
                assert!(
                    sim.faults
                        .failing
                        .contains(&Scope::Queue(repo.repo.clone()))
                );
            }
            // A new window: listed again, and the failure is over.
            lock(&shared).t = 5 + BUDGET_WINDOW_S;
            forge.list_jobs(&repo).await.expect("a new window");
            assert!(
                !lock(&shared)
                    .faults
                    .failing
                    .contains(&Scope::Queue(repo.repo.clone()))
            );
        });
    }

    #[test]
    fn an_injected_exhaustion_reaches_the_client_through_the_headers() {
        let shared = quiet_world();
        let forge = GitHubForge::new(&shared, true);
        let repo = repo(&shared, VAULT_REPO);
        lock(&shared)
            .faults
            .exhausted
            .insert(budget_of(&repo), 5 + 120);
        runtime().block_on(async {
            let e = forge.list_jobs(&repo).await.expect_err("exhausted");
            assert_eq!(
                (e.class, e.retry_after_s),
                (ErrorClass::RateLimited, Some(120)),
                "{}",
                e.message
            );
            assert_eq!(forge.client().paused_until(&repo), Some(virtual_now(125)));
        });
        assert_eq!(lock(&shared).requests.github_primary, 0);
    }

    #[test]
    fn a_vault_outage_fails_the_polling_token_read_and_is_recorded() {
        let shared = quiet_world();
        lock(&shared).options.outages.push(Outage {
            service: Service::Vault,
            start_s: 0,
            end_s: 60,
        });
        let forge = GitHubForge::new(&shared, true);
        let repo = repo(&shared, VAULT_REPO);
        runtime().block_on(async {
            let e = forge.list_jobs(&repo).await.expect_err("Vault is out");
            assert_eq!(e.class, ErrorClass::Transient, "{}", e.message);
            assert_eq!(forge.http().requests(), 0);
            assert!(
                lock(&shared)
                    .faults
                    .failing
                    .contains(&Scope::Queue(repo.repo.clone()))
            );
            lock(&shared).t = 60;
            forge.list_jobs(&repo).await.expect("Vault is back");
        });
    }

    #[test]
    fn transient_faults_fail_each_call_as_transient_timeouts_included() {
        let shared = quiet_world();
        lock(&shared).options.faults.insert(
            Service::GitHub,
            super::super::options::FaultRates {
                transient: 1.0,
                ..Default::default()
            },
        );
        let forge = GitHubForge::new(&shared, true);
        let repo = repo(&shared, VAULT_REPO);
        runtime().block_on(async {
            let mut messages = Vec::new();
            for _ in 0..12 {
                let e = forge.list_jobs(&repo).await.expect_err("faulted");
                assert_eq!(e.class, ErrorClass::Transient, "{}", e.message);
                messages.push(e.message);
            }
            // Each kind came up: a 502, a reset connection, no answer at all (the client's
            // timeout ends the wait on the paused clock).
            for kind in ["502 Bad Gateway", "connection reset", "timed out after 10s"] {
                assert!(
                    messages.iter().any(|m| m.contains(kind)),
                    "{kind}: {messages:#?}"
                );
            }
        });
        let sim = lock(&shared);
        assert!(
            sim.faults
                .failing
                .contains(&Scope::Queue(repo.repo.clone()))
        );
        assert_eq!(sim.faults.injected_total, 12);
        assert_eq!(sim.requests.github_primary, 0);
    }

    #[test]
    fn app_repos_mint_canary_jit_configs_and_vault_repos_mint_nothing() {
        let shared = quiet_world();
        let forge = GitHubForge::new(&shared, true);
        let app = repo(&shared, APP_REPO);
        let vault = repo(&shared, VAULT_REPO);
        let name = RunnerName("ci-runner-0123456789ab".into());
        let labels = crate::model::LabelSet::parse(&["self-hosted"]).unwrap();
        let runner = RunnerIdentity {
            name: &name,
            labels: &labels,
        };
        runtime().block_on(async {
            let minted = forge
                .mint(&app, runner)
                .await
                .expect("minted")
                .expect("a config");
            assert!(secrecy::ExposeSecret::expose_secret(&minted.plain()).starts_with(CANARY));
            let id = minted.runner_id().expect("a JIT config names its runner");
            let registered = lock(&shared).world.registrations_of(&app.repo);
            assert_eq!(registered, vec![(id, name.clone(), false, false)]);
            assert!(
                forge
                    .mint(&vault, runner)
                    .await
                    .expect("nothing to mint")
                    .is_none()
            );
            assert_eq!(forge.client().repo_url(&app), forge.repo_url(&app));
        });
    }

    #[test]
    fn listed_runs_and_jobs_have_the_documented_fields() {
        let keys = |value: &Value| -> BTreeSet<String> {
            value
                .as_object()
                .expect("an object")
                .keys()
                .cloned()
                .collect()
        };
        let fixture_runs: Value = serde_json::from_str(include_str!(
            "../../../tests/fixtures/github/list-workflow-runs-for-repo.response.json"
        ))
        .expect("JSON");
        let fixture_jobs: Value = serde_json::from_str(include_str!(
            "../../../tests/fixtures/github/list-jobs-for-workflow-run.response.json"
        ))
        .expect("JSON");
        let repo = RepoName::parse(APP_REPO).expect("a name");
        let runs = Page {
            repo: repo.clone(),
            total: 1,
            items: vec![RunView {
                id: 5,
                status: "queued",
                created_s: -30,
            }],
            link: None,
            etag: String::new(),
        };
        let rendered: Value = serde_json::from_str(&render_runs(&runs)).expect("JSON");
        assert_eq!(keys(&rendered), keys(&fixture_runs));
        assert_eq!(
            keys(&rendered["workflow_runs"][0]),
            keys(&fixture_runs["workflow_runs"][0])
        );
        let jobs = Page {
            repo,
            total: 1,
            items: vec![JobView {
                id: 6,
                in_progress: true,
                created_s: 10,
                runner: Some("ci-runner-1".into()),
                labels: vec!["self-hosted".into()],
            }],
            link: None,
            etag: String::new(),
        };
        let rendered: Value = serde_json::from_str(&render_jobs(5, &jobs)).expect("JSON");
        let mut documented = keys(&fixture_jobs["jobs"][0]);
        // Required by the schema, absent from the documentation's example.
        documented.insert("created_at".into());
        assert_eq!(keys(&rendered["jobs"][0]), documented);
        assert_eq!(rendered["jobs"][0]["runner_name"], "ci-runner-1");
    }

    /// Serves one request to `http` with an installation token for `repo` that may do
    /// everything the daemon does: the status, the `Link` header and the body.
    fn call(
        http: &GitHubHttp,
        method: Method,
        uri: &str,
        repo: &RepoName,
        body: Option<Value>,
    ) -> (StatusCode, Option<String>, Value) {
        let token = "ghs_test_token";
        http.state().tokens.insert(
            token.to_string(),
            Grant {
                repos: BTreeSet::from([repo.clone()]),
                permissions: BTreeMap::from([
                    ("actions".to_string(), "read".to_string()),
                    ("administration".to_string(), "write".to_string()),
                ]),
                expires_s: u64::MAX,
            },
        );
        let (parts, ()) = http::Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", format!("Bearer {token}"))
            .body(())
            .expect("a request")
            .into_parts();
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let Served::Answer(response) = http.serve(&parts, body.as_bytes()) else {
            panic!("no faults in a quiet world");
        };
        let link = response
            .headers()
            .get("link")
            .map(|v| v.to_str().expect("text").to_string());
        let status = response.status();
        let body = serde_json::from_str(response.body()).unwrap_or(Value::Null);
        (status, link, body)
    }

    #[test]
    fn runners_are_listed_by_page_with_a_link_and_filtered_by_name() {
        let shared = quiet_world();
        let forge = GitHubForge::new(&shared, true);
        let app = repo(&shared, APP_REPO);
        {
            let mut sim = lock(&shared);
            let Sim { world, trace, .. } = &mut *sim;
            for i in 0..150 {
                let name = RunnerName(format!("ci-runner-{i:03}"));
                world
                    .register_jit(5, &app.repo, &name, trace)
                    .expect("a new name");
            }
        }
        let listed = runtime()
            .block_on(forge.list_runners(&app))
            .expect("listed");
        assert_eq!(listed.len(), 150, "both pages walked");
        let pages = lock(&shared).requests.github_primary_by_kind["GET runners"];
        assert_eq!(pages, 2, "one billed request per page of 100");

        let path = format!("/repos/{}/actions/runners", app.repo);
        let (status, link, body) = call(
            forge.http(),
            Method::GET,
            &format!("{path}?per_page=100&page=2"),
            &app.repo,
            None,
        );
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["total_count"], 150);
        assert_eq!(body["runners"].as_array().expect("runners").len(), 50);
        let link = link.expect("two pages: a Link header");
        assert!(
            link.contains("per_page=100&page=1>; rel=\"prev\""),
            "{link}"
        );
        assert!(!link.contains("rel=\"next\""), "{link}");

        let (status, link, body) = call(
            forge.http(),
            Method::GET,
            &format!("{path}?name=ci-runner-042"),
            &app.repo,
            None,
        );
        assert_eq!((status, link), (StatusCode::OK, None));
        assert_eq!(body["total_count"], 1);
        assert_eq!(body["runners"][0]["name"], "ci-runner-042");
    }

    #[test]
    fn a_jit_config_follows_its_example_and_needs_a_runner_group() {
        let shared = quiet_world();
        let forge = GitHubForge::new(&shared, true);
        let app = repo(&shared, APP_REPO);
        let path = format!("/repos/{}/actions/runners/generate-jitconfig", app.repo);
        let example: Value = serde_json::from_str(include_str!(
            "../../../tests/fixtures/github/generate-jitconfig.request.json"
        ))
        .expect("JSON");
        let mut without_group = example.clone();
        without_group
            .as_object_mut()
            .expect("an object")
            .remove("runner_group_id");
        let (status, _, body) = call(
            forge.http(),
            Method::POST,
            &path,
            &app.repo,
            Some(without_group),
        );
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(
            body["message"],
            "Invalid request.\n\n\"runner_group_id\" wasn't supplied."
        );
        assert!(lock(&shared).world.registrations_of(&app.repo).is_empty());

        let (status, _, body) = call(forge.http(), Method::POST, &path, &app.repo, Some(example));
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let documented: Value = serde_json::from_str(include_str!(
            "../../../tests/fixtures/github/generate-jitconfig.response.json"
        ))
        .expect("JSON");
        // The example runner but for the ids: no `ephemeral`, `macOS` read-only.
        let without_ids = |runner: &Value| {
            let mut runner = runner.clone();
            runner.as_object_mut().expect("an object").remove("id");
            for label in runner["labels"].as_array_mut().expect("labels") {
                label.as_object_mut().expect("an object").remove("id");
            }
            runner
        };
        assert_eq!(
            without_ids(&body["runner"]),
            without_ids(&documented["runner"])
        );
        assert!(
            body["encoded_jit_config"]
                .as_str()
                .is_some_and(|c| c.starts_with(CANARY))
        );
    }

    #[test]
    fn the_run_status_filter_takes_conclusions_and_a_search_is_capped_at_1000() {
        let shared = quiet_world();
        let forge = GitHubForge::new(&shared, true);
        let app = repo(&shared, APP_REPO);
        {
            let mut sim = lock(&shared);
            let job = sim
                .world
                .jobs
                .values()
                .find(|j| j.repo == app.repo && j.forge == ForgeKind::GitHub)
                .expect("the burst queued work here")
                .clone();
            for i in 0..1200 {
                let mut job = job.clone();
                job.run = 9_000_000 + i;
                job.visible = Visible::Queued;
                sim.world.jobs.insert(8_000_000 + i, job);
            }
        }
        let total = |query: &str| {
            let uri = format!("/repos/{}/actions/runs?{query}", app.repo);
            let (status, _, body) = call(forge.http(), Method::GET, &uri, &app.repo, None);
            assert_eq!(status, StatusCode::OK, "{query}: {body}");
            body["total_count"].as_u64().expect("a count")
        };
        assert_eq!(total("status=queued&per_page=1"), 1000, "a search");
        assert!(total("per_page=1") > 1200, "no filter: no search, no cap");
        // The world lists unfinished runs only: no conclusion to match.
        assert_eq!(total("status=success&per_page=1"), 0);
    }

    #[test]
    fn pages_link_to_the_next_and_last_page() {
        let query = Query::parse(Some("status=queued&per_page=2&page=2"));
        let (range, link) = query.page(5, "https://api.github.com/repositories/1/actions/runs");
        assert_eq!(range, 2..4);
        let link = link.expect("more pages");
        assert!(
            link.contains("<https://api.github.com/repositories/1/actions/runs?status=queued&per_page=2&page=3>; rel=\"next\""),
            "{link}"
        );
        assert!(link.contains("page=3>; rel=\"last\""), "{link}");
        assert_eq!(Query::parse(Some("per_page=100")).page(5, "x").1, None);
    }
}
