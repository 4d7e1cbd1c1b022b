//! Twin of the parts of GitHub's REST API (version 2022-11-28) the daemon uses: App
//! authentication, narrowly scoped installation tokens, the run and job listings with
//! GitHub's pagination, registration tokens, runners, rate limits and conditional requests.
//!
//! Response bodies are built from the documentation examples in `tests/fixtures/github/`:
//! every field of the example object is kept, and ids, statuses, labels, runner names and
//! times are filled in from the twin's state. Errors are `{"message","documentation_url"}`.
//!
//! Deliberate simplifications: an installation covers every repo of its owner; runners are
//! registered by the world, not by the runner binary; secondary limits happen only when
//! switched on.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use chrono::{DateTime, Duration, SecondsFormat, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use rand::Rng;
use serde_json::{Value, json};

use super::TwinServer;
use crate::model::RepoName;

/// The App id of the twin's test App.
pub const TEST_APP_ID: &str = "12345";
/// Private key of the twin's test App. A throw-away key that protects nothing (see
/// `tests/fixtures/README.md`); the daemon signs with it in tests and `simulate`.
pub const TEST_APP_PRIVATE_KEY_PEM: &str =
    include_str!("../../../tests/fixtures/github/test-only-app-key.pem");
pub const TEST_APP_PUBLIC_KEY_PEM: &str =
    include_str!("../../../tests/fixtures/github/test-only-app-key.pub.pem");

/// The only API version the twin serves; GitHub answers 400 to a version it does not know.
pub const API_VERSION: &str = "2022-11-28";
/// Primary limit of a token per hour (installation tokens and PATs both start at 5,000).
pub const BUDGET_LIMIT_DEFAULT: u64 = 5000;
/// Results of a filtered run listing are capped at 1,000 (API-CONTRACTS §1.1).
pub const RUN_SEARCH_CAP: usize = 1000;
const TOKEN_LIFETIME: Duration = Duration::hours(1);
/// GitHub refuses JWTs whose `exp` is more than 10 minutes ahead.
const JWT_LIFETIME_MAX_S: i64 = 600;
const JWT_CLOCK_DRIFT_S: i64 = 60;

const DOCS_REST: &str = "https://docs.github.com/rest";
const DOCS_RATE_LIMITS: &str = "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api";

/// The documentation examples the responses are built from (also the seeded world's
/// in-memory GitHub's).
pub(crate) struct Templates {
    pub(crate) run: Value,
    pub(crate) job: Value,
    pub(crate) installation: Value,
    pub(crate) access_token: Value,
    pub(crate) token_repository: Value,
    registration_token: Value,
    runner: Value,
    jit_config: Value,
}

pub(crate) static TEMPLATES: LazyLock<Templates> = LazyLock::new(|| {
    let parse = |text: &str| -> Value { serde_json::from_str(text).expect("fixture is JSON") };
    let runs = parse(include_str!(
        "../../../tests/fixtures/github/list-workflow-runs-for-repo.response.json"
    ));
    let jobs = parse(include_str!(
        "../../../tests/fixtures/github/list-jobs-for-workflow-run.response.json"
    ));
    let access_token = parse(include_str!(
        "../../../tests/fixtures/github/create-installation-access-token.response.json"
    ));
    Templates {
        run: runs["workflow_runs"][0].clone(),
        job: jobs["jobs"][0].clone(),
        installation: parse(include_str!(
            "../../../tests/fixtures/github/get-installation.response.json"
        )),
        token_repository: access_token["repositories"][0].clone(),
        access_token,
        registration_token: parse(include_str!(
            "../../../tests/fixtures/github/create-registration-token.response.json"
        )),
        runner: parse(include_str!(
            "../../../tests/fixtures/github/get-runner-for-repo.response.json"
        )),
        jit_config: parse(include_str!(
            "../../../tests/fixtures/github/generate-jitconfig.response.json"
        )),
    }
});

/// A job's status as the twin keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwinJobStatus {
    Queued,
    InProgress,
    Completed,
}

impl TwinJobStatus {
    fn as_str(self) -> &'static str {
        match self {
            TwinJobStatus::Queued => "queued",
            TwinJobStatus::InProgress => "in_progress",
            TwinJobStatus::Completed => "completed",
        }
    }
}

/// What `add_run` created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunIds {
    pub run_id: u64,
    pub job_ids: Vec<u64>,
}

/// One job as the world sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobView {
    pub run_id: u64,
    pub status: TwinJobStatus,
    pub conclusion: Option<String>,
    pub runner_name: Option<String>,
    pub labels: Vec<String>,
}

/// One runner registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerView {
    pub id: u64,
    pub name: String,
    pub labels: Vec<String>,
    /// Listed as `status: "online"`: the runner's listener is connected.
    pub online: bool,
    pub busy: bool,
}

/// How a registered runner reads in GitHub's listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunnerPresence {
    pub online: bool,
    pub busy: bool,
}

impl RunnerPresence {
    /// Connected and waiting for a job.
    pub const IDLE: RunnerPresence = RunnerPresence {
        online: true,
        busy: false,
    };
    /// Connected and executing a job: GitHub refuses to delete it (422).
    pub const BUSY: RunnerPresence = RunnerPresence {
        online: true,
        busy: true,
    };
    /// Registered, its listener gone (a runner killed with its allocation).
    pub const OFFLINE: RunnerPresence = RunnerPresence {
        online: false,
        busy: false,
    };
}

/// A registration `DELETE …/actions/runners/{id}` removed (answered 204).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeletedRunner {
    pub repo: RepoName,
    pub id: u64,
    pub name: String,
    /// When the twin served the deletion, to order it against what other twins recorded.
    pub at: std::time::Instant,
}

/// A recorded `POST /app/installations/{id}/access_tokens`.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenRequest {
    pub installation_id: u64,
    pub body: Value,
    pub status: u16,
}

/// What a token used on a request was allowed (never the token itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantView {
    /// `None`: every repo of the installation (or of the PAT's user).
    pub repositories: Option<Vec<String>>,
    pub permissions: BTreeMap<String, String>,
}

/// One request the twin served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedRequest {
    pub method: String,
    /// The documented route, e.g. `GET /repos/{owner}/{repo}/actions/runs`.
    pub endpoint: &'static str,
    /// Path and query as received.
    pub path: String,
    pub status: u16,
    /// Whether it was charged to a primary rate-limit budget (a 304 is not).
    pub counted: bool,
    /// `installation:<id>`, `pat:<name>` or `app`.
    pub holder: Option<String>,
    pub grant: Option<GrantView>,
    pub accept: Option<String>,
    pub api_versions: Vec<String>,
    pub user_agent: Option<String>,
}

/// A rate-limit refusal the twin can be switched to give on every token request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateLimitAnswer {
    /// Primary limit exhausted: `x-ratelimit-remaining: 0`, with this status (403 or 429).
    Primary { status: u16 },
    /// Secondary limit: the documented message, optionally with `retry-after`.
    Secondary {
        status: u16,
        retry_after_s: Option<u64>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Holder {
    Installation(u64),
    Pat(String),
}

impl Holder {
    fn key(&self) -> String {
        match self {
            Holder::Installation(id) => format!("installation:{id}"),
            Holder::Pat(name) => format!("pat:{name}"),
        }
    }
}

#[derive(Clone, Debug)]
struct Grant {
    holder: Holder,
    repos: Option<BTreeSet<RepoName>>,
    owner: Option<String>,
    permissions: BTreeMap<String, String>,
    expires_at: Option<DateTime<Utc>>,
}

impl Grant {
    fn allows(&self, permission: &str, level: &str) -> bool {
        match self.permissions.get(permission).map(String::as_str) {
            Some("write") | Some("admin") => true,
            Some("read") => level == "read",
            _ => false,
        }
    }

    fn covers(&self, repo: &RepoName) -> bool {
        if let Some(owner) = &self.owner
            && owner != repo.owner()
        {
            return false;
        }
        self.repos.as_ref().is_none_or(|repos| repos.contains(repo))
    }

    fn view(&self) -> GrantView {
        GrantView {
            repositories: self
                .repos
                .as_ref()
                .map(|repos| repos.iter().map(|r| r.name().to_string()).collect()),
            permissions: self.permissions.clone(),
        }
    }
}

struct InstallationState {
    id: u64,
    permissions: BTreeMap<String, String>,
}

struct RunState {
    id: u64,
    run_number: u64,
    attempt: u32,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    gate: Option<RunGate>,
}

/// A gate a run can wait at while some of its jobs are already queued. GitHub then shows the
/// gate as the run's status instead of `queued` or `in_progress`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunGate {
    /// A job waits for an environment's approval.
    Waiting,
    /// Behind another run of the same concurrency group.
    Pending,
    Requested,
}

impl RunGate {
    fn as_str(self) -> &'static str {
        match self {
            RunGate::Waiting => "waiting",
            RunGate::Pending => "pending",
            RunGate::Requested => "requested",
        }
    }
}

struct JobState {
    id: u64,
    run_id: u64,
    attempt: u32,
    labels: Vec<String>,
    status: TwinJobStatus,
    conclusion: Option<String>,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    completed_at: Option<DateTime<Utc>>,
    runner_id: Option<u64>,
    runner_name: Option<String>,
}

struct RunnerState {
    id: u64,
    name: String,
    labels: Vec<String>,
    online: bool,
    busy: bool,
}

struct RepoState {
    id: u64,
    runs: BTreeMap<u64, RunState>,
    jobs: BTreeMap<u64, JobState>,
    runners: BTreeMap<u64, RunnerState>,
    runs_created: u64,
}

#[derive(Clone, Copy)]
struct BudgetState {
    limit: u64,
    used: u64,
    reset_at: DateTime<Utc>,
}

struct Twin {
    app_id: String,
    app_key: DecodingKey,
    clock_offset: Duration,
    next_id: u64,
    installations: BTreeMap<String, InstallationState>,
    repos: BTreeMap<RepoName, RepoState>,
    tokens: HashMap<String, Grant>,
    budgets: HashMap<String, BudgetState>,
    budget_limit: u64,
    forced_limit: Option<RateLimitAnswer>,
    token_requests: Vec<TokenRequest>,
    issued: Vec<String>,
    log: Vec<LoggedRequest>,
    deleted_runners: Vec<DeletedRunner>,
}

/// Shared handle on the twin's state: serve it with [`GitHubTwin::router`] and move the world
/// through the methods below.
#[derive(Clone)]
pub struct GitHubTwin {
    state: Arc<Mutex<Twin>>,
    /// Round-trip time added to every answer, in microseconds: loopback answers in well
    /// under a millisecond, GitHub across the internet in a hundred or more.
    latency_us: Arc<AtomicU64>,
}

impl Default for GitHubTwin {
    fn default() -> Self {
        GitHubTwin::new()
    }
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// An installation token as GitHub has minted them since 2026-04 (`ghs_<APPID>_<JWT>`, about
/// 520 characters, length varying with what the JWT holds): the client must carry it whole,
/// with its dots and underscores, wherever a 40-character `ghs_` token went before. `nonce`
/// makes it unique; the same inputs give the same token (the seeded world replays by seed).
pub fn stateless_installation_token(app_id: &str, installation: u64, nonce: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    let encode = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let header = encode(br#"{"alg":"RS256","typ":"JWT","kid":"twin-s2s-1"}"#);
    let claims = encode(
        json!({
            "iss": "https://api.github.com/twin-s2s-issuer",
            "aid": app_id,
            "iid": installation,
            "nonce": nonce,
            "scp": "installation",
        })
        .to_string()
        .as_bytes(),
    );
    // An RS256 signature is 256 bytes: stand one in, derived from the rest.
    let mut signature = Vec::with_capacity(256);
    let mut block = sha2::Sha256::digest(format!("{header}.{claims}").as_bytes()).to_vec();
    while signature.len() < 256 {
        signature.extend_from_slice(&block);
        block = sha2::Sha256::digest(&block).to_vec();
    }
    signature.truncate(256);
    format!("ghs_{app_id}_{header}.{claims}.{}", encode(&signature))
}

fn random_string(len: usize, alphabet: &[u8]) -> String {
    let mut rng = rand::rng();
    (0..len)
        .map(|_| alphabet[rng.random_range(0..alphabet.len())] as char)
        .collect()
}

fn default_installation_permissions() -> BTreeMap<String, String> {
    [
        ("actions", "read"),
        ("administration", "write"),
        ("metadata", "read"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

impl GitHubTwin {
    /// A twin whose App is the test App ([`TEST_APP_ID`], [`TEST_APP_PRIVATE_KEY_PEM`]).
    pub fn new() -> GitHubTwin {
        GitHubTwin::with_app(TEST_APP_ID, TEST_APP_PUBLIC_KEY_PEM).expect("test App key is valid")
    }

    /// A twin that accepts JWTs of App `app_id` signed by the key whose public half is
    /// `public_key_pem`.
    pub fn with_app(app_id: &str, public_key_pem: &str) -> Result<GitHubTwin, String> {
        let app_key = DecodingKey::from_rsa_pem(public_key_pem.as_bytes())
            .map_err(|e| format!("App public key: {e}"))?;
        Ok(GitHubTwin {
            state: Arc::new(Mutex::new(Twin {
                app_id: app_id.to_string(),
                app_key,
                clock_offset: Duration::zero(),
                next_id: 1000,
                installations: BTreeMap::new(),
                repos: BTreeMap::new(),
                tokens: HashMap::new(),
                budgets: HashMap::new(),
                budget_limit: BUDGET_LIMIT_DEFAULT,
                forced_limit: None,
                token_requests: Vec::new(),
                issued: Vec::new(),
                log: Vec::new(),
                deleted_runners: Vec::new(),
            })),
            latency_us: Arc::new(AtomicU64::new(0)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Twin> {
        self.state.lock().expect("github twin lock")
    }

    /// Answers every request `latency` after it arrived (zero, the default, at once), as a
    /// GitHub far away does; requests in flight at once wait side by side.
    pub fn set_latency(&self, latency: std::time::Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.latency_us.store(micros, Ordering::Relaxed);
    }

    pub fn router(&self) -> Router {
        Router::new().fallback(serve).with_state(self.clone())
    }

    /// Serves the twin on loopback.
    pub async fn start(&self) -> std::io::Result<TwinServer> {
        TwinServer::start(self.router()).await
    }

    /// The twin's clock: the wall clock moved by [`GitHubTwin::advance_clock`]. Token expiry,
    /// rate-limit windows and JWT checks follow it, so a daemon under test must read the same
    /// clock (as GitHub and a real host share NTP time).
    pub fn now(&self) -> DateTime<Utc> {
        self.lock().now()
    }

    pub fn advance_clock(&self, by: Duration) {
        self.lock().clock_offset += by;
    }

    /// Installs the App for every repo of `owner`; returns the installation id.
    pub fn install_app(&self, owner: &str) -> u64 {
        let mut twin = self.lock();
        let owner = owner.to_ascii_lowercase();
        if let Some(installation) = twin.installations.get(&owner) {
            return installation.id;
        }
        let id = twin.id();
        twin.installations.insert(
            owner,
            InstallationState {
                id,
                permissions: default_installation_permissions(),
            },
        );
        id
    }

    /// Replaces what the installation on `owner` may be granted.
    pub fn set_installation_permissions(&self, owner: &str, permissions: &[(&str, &str)]) {
        let mut twin = self.lock();
        if let Some(installation) = twin.installations.get_mut(&owner.to_ascii_lowercase()) {
            installation.permissions = permissions
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        }
    }

    /// Creates `repo` if it is new; returns its id.
    pub fn add_repo(&self, repo: &RepoName) -> u64 {
        self.lock().repo_mut(repo).id
    }

    /// A new run on `repo` with one queued job per label list; ids in the order given.
    pub fn add_run<L: AsRef<str>>(&self, repo: &RepoName, jobs: Vec<Vec<L>>) -> RunIds {
        let mut twin = self.lock();
        let now = twin.now();
        let run_id = twin.id();
        let job_ids: Vec<u64> = jobs.iter().map(|_| twin.id()).collect();
        let state = twin.repo_mut(repo);
        state.runs_created += 1;
        state.runs.insert(
            run_id,
            RunState {
                id: run_id,
                run_number: state.runs_created,
                attempt: 1,
                created_at: now,
                updated_at: now,
                gate: None,
            },
        );
        for (id, labels) in job_ids.iter().zip(jobs) {
            state.jobs.insert(
                *id,
                JobState {
                    id: *id,
                    run_id,
                    attempt: 1,
                    labels: labels.iter().map(|l| l.as_ref().to_string()).collect(),
                    status: TwinJobStatus::Queued,
                    conclusion: None,
                    created_at: now,
                    started_at: None,
                    completed_at: None,
                    runner_id: None,
                    runner_name: None,
                },
            );
        }
        RunIds { run_id, job_ids }
    }

    /// Holds a run at `gate` (`None` lifts it): until all its jobs finish, it is listed with
    /// the gate's status, whatever its jobs do.
    pub fn hold_run(&self, repo: &RepoName, run_id: u64, gate: Option<RunGate>) {
        let mut twin = self.lock();
        if let Some(run) = twin.repo_mut(repo).runs.get_mut(&run_id) {
            run.gate = gate;
        }
    }

    pub fn job_status(&self, repo: &RepoName, job_id: u64) -> Option<JobView> {
        let twin = self.lock();
        let job = twin.repos.get(repo)?.jobs.get(&job_id)?;
        Some(JobView {
            run_id: job.run_id,
            status: job.status,
            conclusion: job.conclusion.clone(),
            runner_name: job.runner_name.clone(),
            labels: job.labels.clone(),
        })
    }

    /// Every job of `repo` with its id, oldest first.
    pub fn jobs(&self, repo: &RepoName) -> Vec<(u64, JobView)> {
        let twin = self.lock();
        let Some(state) = twin.repos.get(repo) else {
            return Vec::new();
        };
        state
            .jobs
            .values()
            .map(|job| {
                (
                    job.id,
                    JobView {
                        run_id: job.run_id,
                        status: job.status,
                        conclusion: job.conclusion.clone(),
                        runner_name: job.runner_name.clone(),
                        labels: job.labels.clone(),
                    },
                )
            })
            .collect()
    }

    /// A runner takes a queued job: the job goes `in_progress` naming the runner (and its id
    /// when such a runner is registered, which then reads busy).
    pub fn start_job(&self, repo: &RepoName, job_id: u64, runner_name: &str) -> Result<(), String> {
        let mut twin = self.lock();
        let now = twin.now();
        let state = twin.repos.get_mut(repo).ok_or(format!("no repo {repo}"))?;
        let runner = state.runners.values_mut().find(|r| r.name == runner_name);
        let runner_id = runner.map(|r| {
            r.busy = true;
            r.id
        });
        let job = state
            .jobs
            .get_mut(&job_id)
            .ok_or(format!("no job {job_id}"))?;
        if job.status != TwinJobStatus::Queued {
            return Err(format!("job {job_id} is {}", job.status.as_str()));
        }
        job.status = TwinJobStatus::InProgress;
        job.started_at = Some(now);
        job.runner_name = Some(runner_name.to_string());
        job.runner_id = runner_id;
        let run_id = job.run_id;
        state.touch(run_id, now);
        Ok(())
    }

    /// A job finishes with `conclusion` (`success`, `failure`, …); its runner is idle again.
    pub fn complete_job(
        &self,
        repo: &RepoName,
        job_id: u64,
        conclusion: &str,
    ) -> Result<(), String> {
        let mut twin = self.lock();
        let now = twin.now();
        let state = twin.repos.get_mut(repo).ok_or(format!("no repo {repo}"))?;
        state.finish(job_id, conclusion, now)
    }

    /// Cancels a queued or running job.
    pub fn cancel_job(&self, repo: &RepoName, job_id: u64) -> Result<(), String> {
        self.complete_job(repo, job_id, "cancelled")
    }

    /// Re-runs every job of a run as a new attempt; returns the new job ids.
    pub fn rerun(&self, repo: &RepoName, run_id: u64) -> Result<Vec<u64>, String> {
        let mut twin = self.lock();
        let now = twin.now();
        let (labels, attempt) = {
            let state = twin.repos.get(repo).ok_or(format!("no repo {repo}"))?;
            let run = state.runs.get(&run_id).ok_or(format!("no run {run_id}"))?;
            let labels: Vec<Vec<String>> = state
                .jobs
                .values()
                .filter(|j| j.run_id == run_id && j.attempt == run.attempt)
                .map(|j| j.labels.clone())
                .collect();
            (labels, run.attempt + 1)
        };
        let ids: Vec<u64> = labels.iter().map(|_| twin.id()).collect();
        let state = twin.repo_mut(repo);
        for (id, labels) in ids.iter().zip(labels) {
            state.jobs.insert(
                *id,
                JobState {
                    id: *id,
                    run_id,
                    attempt,
                    labels,
                    status: TwinJobStatus::Queued,
                    conclusion: None,
                    created_at: now,
                    started_at: None,
                    completed_at: None,
                    runner_id: None,
                    runner_name: None,
                },
            );
        }
        if let Some(run) = state.runs.get_mut(&run_id) {
            run.attempt = attempt;
            run.updated_at = now;
        }
        Ok(ids)
    }

    /// Registers a runner (what `config.sh` does) that connects and waits for a job; returns
    /// its id.
    pub fn register_runner<L: AsRef<str>>(&self, repo: &RepoName, name: &str, labels: &[L]) -> u64 {
        self.register_runner_as(repo, name, labels, RunnerPresence::IDLE)
    }

    /// Registers a runner that reads as `presence` says; returns its id.
    pub fn register_runner_as<L: AsRef<str>>(
        &self,
        repo: &RepoName,
        name: &str,
        labels: &[L],
        presence: RunnerPresence,
    ) -> u64 {
        let mut twin = self.lock();
        let id = twin.id();
        twin.repo_mut(repo).runners.insert(
            id,
            RunnerState {
                id,
                name: name.to_string(),
                labels: labels.iter().map(|l| l.as_ref().to_string()).collect(),
                online: presence.online,
                busy: presence.busy,
            },
        );
        id
    }

    /// Sets the `busy` flag of the runner named `name` (GitHub's flag lags the job it runs);
    /// false when no such runner is registered.
    pub fn set_runner_busy(&self, repo: &RepoName, name: &str, busy: bool) -> bool {
        self.with_runner(repo, name, |runner| runner.busy = busy)
    }

    /// Connects or disconnects the runner named `name`; false when no such runner is registered.
    pub fn set_runner_online(&self, repo: &RepoName, name: &str, online: bool) -> bool {
        self.with_runner(repo, name, |runner| runner.online = online)
    }

    fn with_runner(
        &self,
        repo: &RepoName,
        name: &str,
        change: impl FnOnce(&mut RunnerState),
    ) -> bool {
        let mut twin = self.lock();
        let runner = twin
            .repos
            .get_mut(repo)
            .and_then(|state| state.runners.values_mut().find(|r| r.name == name));
        match runner {
            Some(runner) => {
                change(runner);
                true
            }
            None => false,
        }
    }

    /// A run with one job already taken by `runner_name` (GitHub assigned it to the runner
    /// before anyone could list it queued), all under one lock so no listing sees it queued.
    /// The runner, if registered, reads busy. Returns the ids.
    pub fn add_run_in_progress<L: AsRef<str>>(
        &self,
        repo: &RepoName,
        labels: Vec<L>,
        runner_name: &str,
    ) -> RunIds {
        let mut twin = self.lock();
        let now = twin.now();
        let run_id = twin.id();
        let job_id = twin.id();
        let state = twin.repo_mut(repo);
        state.runs_created += 1;
        state.runs.insert(
            run_id,
            RunState {
                id: run_id,
                run_number: state.runs_created,
                attempt: 1,
                created_at: now,
                updated_at: now,
                gate: None,
            },
        );
        let runner_id = state
            .runners
            .values_mut()
            .find(|r| r.name == runner_name)
            .map(|r| {
                r.busy = true;
                r.id
            });
        state.jobs.insert(
            job_id,
            JobState {
                id: job_id,
                run_id,
                attempt: 1,
                labels: labels.iter().map(|l| l.as_ref().to_string()).collect(),
                status: TwinJobStatus::InProgress,
                conclusion: None,
                created_at: now,
                started_at: Some(now),
                completed_at: None,
                runner_id,
                runner_name: Some(runner_name.to_string()),
            },
        );
        RunIds {
            run_id,
            job_ids: vec![job_id],
        }
    }

    /// Every registration the API deleted (204), in order.
    pub fn deleted_runners(&self) -> Vec<DeletedRunner> {
        self.lock().deleted_runners.clone()
    }

    /// Removes a runner registration by name (an ephemeral runner leaving); true if it existed.
    pub fn remove_runner(&self, repo: &RepoName, name: &str) -> bool {
        let mut twin = self.lock();
        let Some(state) = twin.repos.get_mut(repo) else {
            return false;
        };
        let before = state.runners.len();
        state.runners.retain(|_, r| r.name != name);
        state.runners.len() != before
    }

    pub fn runners(&self, repo: &RepoName) -> Vec<RunnerView> {
        let twin = self.lock();
        twin.repos
            .get(repo)
            .map(|state| {
                state
                    .runners
                    .values()
                    .map(|r| RunnerView {
                        id: r.id,
                        name: r.name.clone(),
                        labels: r.labels.clone(),
                        online: r.online,
                        busy: r.busy,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A personal access token (vault mode's polling token) named `name` for its budget,
    /// limited to `repos` (`None`: every repo) and holding `permissions`.
    pub fn add_pat(
        &self,
        token: &str,
        name: &str,
        repos: Option<&[RepoName]>,
        permissions: &[(&str, &str)],
    ) {
        let mut twin = self.lock();
        twin.tokens.insert(
            token.to_string(),
            Grant {
                holder: Holder::Pat(name.to_string()),
                repos: repos.map(|r| r.iter().cloned().collect()),
                owner: None,
                permissions: permissions
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                expires_at: None,
            },
        );
    }

    /// Revokes one token (a rotated PAT): its next use is a 401.
    pub fn revoke_token(&self, token: &str) {
        self.lock().tokens.remove(token);
    }

    /// Revokes every installation token issued so far: their next use is a 401.
    pub fn revoke_installation_tokens(&self) {
        let mut twin = self.lock();
        twin.tokens
            .retain(|_, grant| !matches!(grant.holder, Holder::Installation(_)));
    }

    /// The primary limit per token holder and hour; applies to existing budgets too.
    pub fn set_budget_limit(&self, limit: u64) {
        let mut twin = self.lock();
        twin.budget_limit = limit;
        for budget in twin.budgets.values_mut() {
            budget.limit = limit;
        }
    }

    /// Answers every token-authenticated request with `answer` until switched off (`None`).
    pub fn force_rate_limit(&self, answer: Option<RateLimitAnswer>) {
        self.lock().forced_limit = answer;
    }

    /// The `x-ratelimit-*` headers the twin would send with an answer to a request carrying
    /// `headers`: the budget of the token's holder (or the App's, for a valid JWT) as it
    /// stands, nothing charged. `None` when the credential is unknown, expired or missing.
    /// For an answer made outside the twin (an injected fault), since GitHub sends these
    /// headers on every response (API-CONTRACTS §1.8).
    pub fn rate_limit_headers(&self, headers: &HeaderMap) -> Option<Vec<(&'static str, String)>> {
        let mut twin = self.lock();
        let now = twin.now();
        let holder = match bearer(headers).and_then(|token| twin.tokens.get(&token).cloned()) {
            Some(grant) if grant.expires_at.is_none_or(|t| t > now) => grant.holder.key(),
            Some(_) => return None,
            None if twin.verify_jwt(headers).is_ok() => "app".to_string(),
            None => return None,
        };
        let probe = twin.rate_headers(
            &holder,
            Reply {
                status: StatusCode::OK,
                headers: Vec::new(),
                body: None,
            },
        );
        Some(probe.headers)
    }

    pub fn token_requests(&self) -> Vec<TokenRequest> {
        self.lock().token_requests.clone()
    }

    pub fn request_log(&self) -> Vec<LoggedRequest> {
        self.lock().log.clone()
    }

    /// Requests served per documented route.
    pub fn request_counts(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for entry in self.lock().log.iter() {
            *counts.entry(entry.endpoint).or_default() += 1;
        }
        counts
    }

    pub fn clear_log(&self) {
        let mut twin = self.lock();
        twin.log.clear();
        twin.token_requests.clear();
    }

    /// Every installation and registration token issued so far, for tests that prove none
    /// of them leaks into a log or an error.
    pub fn issued_secrets(&self) -> Vec<String> {
        self.lock().issued.clone()
    }
}

impl RepoState {
    fn touch(&mut self, run_id: u64, now: DateTime<Utc>) {
        if let Some(run) = self.runs.get_mut(&run_id) {
            run.updated_at = now;
        }
    }

    fn finish(&mut self, job_id: u64, conclusion: &str, now: DateTime<Utc>) -> Result<(), String> {
        let job = self
            .jobs
            .get_mut(&job_id)
            .ok_or(format!("no job {job_id}"))?;
        if job.status == TwinJobStatus::Completed {
            return Err(format!("job {job_id} is completed"));
        }
        job.status = TwinJobStatus::Completed;
        job.conclusion = Some(conclusion.to_string());
        job.completed_at = Some(now);
        let (run_id, runner_id) = (job.run_id, job.runner_id);
        if let Some(runner) = runner_id.and_then(|id| self.runners.get_mut(&id)) {
            runner.busy = false;
        }
        self.touch(run_id, now);
        Ok(())
    }

    fn latest_jobs(&self, run: &RunState) -> impl Iterator<Item = &JobState> {
        self.jobs
            .values()
            .filter(move |j| j.run_id == run.id && j.attempt == run.attempt)
    }

    /// A run's status follows its latest attempt's jobs: queued while all are queued,
    /// completed when all are, in progress in between; at its gate while it has one and a
    /// job is unfinished.
    fn run_status(&self, run: &RunState) -> (&'static str, Option<&'static str>) {
        let jobs: Vec<&JobState> = self.latest_jobs(run).collect();
        if let Some(gate) = run.gate
            && !jobs.iter().all(|j| j.status == TwinJobStatus::Completed)
        {
            return (gate.as_str(), None);
        }
        if jobs.iter().all(|j| j.status == TwinJobStatus::Queued) {
            return ("queued", None);
        }
        if !jobs.iter().all(|j| j.status == TwinJobStatus::Completed) {
            return ("in_progress", None);
        }
        let any = |c: &str| jobs.iter().any(|j| j.conclusion.as_deref() == Some(c));
        let conclusion = if any("failure") {
            "failure"
        } else if any("cancelled") {
            "cancelled"
        } else {
            "success"
        };
        ("completed", Some(conclusion))
    }
}

/// A route of the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    GetAppInstallation(u64),
    CreateAccessToken(u64),
    GetRepoInstallation,
    ListRuns,
    ListJobs(u64),
    GetJob(u64),
    CreateRegistrationToken,
    GenerateJitConfig,
    ListRunners,
    GetRunner(u64),
    DeleteRunner(u64),
}

impl Endpoint {
    fn route(self) -> &'static str {
        match self {
            Endpoint::GetAppInstallation(_) => "GET /app/installations/{installation_id}",
            Endpoint::CreateAccessToken(_) => {
                "POST /app/installations/{installation_id}/access_tokens"
            }
            Endpoint::GetRepoInstallation => "GET /repos/{owner}/{repo}/installation",
            Endpoint::ListRuns => "GET /repos/{owner}/{repo}/actions/runs",
            Endpoint::ListJobs(_) => "GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs",
            Endpoint::GetJob(_) => "GET /repos/{owner}/{repo}/actions/jobs/{job_id}",
            Endpoint::CreateRegistrationToken => {
                "POST /repos/{owner}/{repo}/actions/runners/registration-token"
            }
            Endpoint::GenerateJitConfig => {
                "POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig"
            }
            Endpoint::ListRunners => "GET /repos/{owner}/{repo}/actions/runners",
            Endpoint::GetRunner(_) => "GET /repos/{owner}/{repo}/actions/runners/{runner_id}",
            Endpoint::DeleteRunner(_) => "DELETE /repos/{owner}/{repo}/actions/runners/{runner_id}",
        }
    }

    /// The repository permission the route needs (API-CONTRACTS §1.1–1.6).
    fn permission(self) -> Option<(&'static str, &'static str)> {
        match self {
            Endpoint::ListRuns | Endpoint::ListJobs(_) | Endpoint::GetJob(_) => {
                Some(("actions", "read"))
            }
            Endpoint::ListRunners | Endpoint::GetRunner(_) => Some(("administration", "read")),
            Endpoint::CreateRegistrationToken
            | Endpoint::GenerateJitConfig
            | Endpoint::DeleteRunner(_) => Some(("administration", "write")),
            _ => None,
        }
    }

    fn docs(self) -> &'static str {
        match self {
            Endpoint::ListRuns => {
                "https://docs.github.com/rest/actions/workflow-runs#list-workflow-runs-for-a-repository"
            }
            Endpoint::ListJobs(_) | Endpoint::GetJob(_) => {
                "https://docs.github.com/rest/actions/workflow-jobs"
            }
            Endpoint::CreateRegistrationToken
            | Endpoint::GenerateJitConfig
            | Endpoint::ListRunners
            | Endpoint::GetRunner(_)
            | Endpoint::DeleteRunner(_) => {
                "https://docs.github.com/rest/actions/self-hosted-runners"
            }
            _ => "https://docs.github.com/rest/apps/apps",
        }
    }
}

/// The `X-Accepted-GitHub-Permissions` value GitHub sends when a token lacks the permission
/// `method path` needs (e.g. `actions=read`); `None` for a route the twin does not serve or
/// that needs no repository permission (the App's own routes).
pub fn accepted_permissions(method: &Method, path: &str) -> Option<String> {
    let (endpoint, _) = parse_route(method, path)?;
    let (permission, level) = endpoint.permission()?;
    Some(format!("{permission}={level}"))
}

/// Where a repo route points: `/repos/{owner}/{repo}/…` or `/repositories/{id}/…` (the form
/// GitHub uses in `Link` headers).
enum RepoRef {
    Name(String, String),
    Id(u64),
}

fn parse_route(method: &Method, path: &str) -> Option<(Endpoint, Option<RepoRef>)> {
    let segments: Vec<&str> = path.strip_prefix('/')?.split('/').collect();
    let id = |s: &str| s.parse::<u64>().ok();
    let (repo, rest) = match segments.as_slice() {
        ["app", "installations", installation] if method == Method::GET => {
            return Some((Endpoint::GetAppInstallation(id(installation)?), None));
        }
        ["app", "installations", installation, "access_tokens"] if method == Method::POST => {
            return Some((Endpoint::CreateAccessToken(id(installation)?), None));
        }
        ["repos", owner, repo, rest @ ..] => {
            (RepoRef::Name(owner.to_string(), repo.to_string()), rest)
        }
        ["repositories", repo_id, rest @ ..] => (RepoRef::Id(id(repo_id)?), rest),
        _ => return None,
    };
    let endpoint = match (method.as_str(), rest) {
        ("GET", ["installation"]) if matches!(repo, RepoRef::Name(..)) => {
            Endpoint::GetRepoInstallation
        }
        ("GET", ["actions", "runs"]) => Endpoint::ListRuns,
        ("GET", ["actions", "runs", run, "jobs"]) => Endpoint::ListJobs(id(run)?),
        ("GET", ["actions", "jobs", job]) => Endpoint::GetJob(id(job)?),
        ("POST", ["actions", "runners", "registration-token"]) => Endpoint::CreateRegistrationToken,
        ("POST", ["actions", "runners", "generate-jitconfig"]) => Endpoint::GenerateJitConfig,
        ("GET", ["actions", "runners"]) => Endpoint::ListRunners,
        ("GET", ["actions", "runners", runner]) => Endpoint::GetRunner(id(runner)?),
        ("DELETE", ["actions", "runners", runner]) => Endpoint::DeleteRunner(id(runner)?),
        _ => return None,
    };
    Some((endpoint, Some(repo)))
}

/// A response under construction.
struct Reply {
    status: StatusCode,
    headers: Vec<(&'static str, String)>,
    body: Option<Value>,
}

impl Reply {
    fn json(status: StatusCode, body: Value) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: Some(body),
        }
    }

    fn error(status: StatusCode, message: &str, docs: &str) -> Reply {
        Reply::json(
            status,
            json!({ "message": message, "documentation_url": docs }),
        )
    }

    fn not_found() -> Reply {
        Reply::error(StatusCode::NOT_FOUND, "Not Found", DOCS_REST)
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }
}

/// The parts of a request's query the routes read (also the seeded world's in-memory GitHub's).
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    /// From the raw query string, `None` when the URI has none.
    pub(crate) fn parse(raw: Option<&str>) -> Query {
        Query(
            url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn number(&self, key: &str, default: usize) -> usize {
        self.get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    /// Whether a run of `status` and `conclusion` is listed under the runs listing's `status`
    /// filter, which takes a status or a conclusion (`status=success` lists the completed runs
    /// that succeeded: API-CONTRACTS §1.1); every run when there is no filter.
    pub(crate) fn run_status_matches(&self, status: &str, conclusion: Option<&str>) -> bool {
        self.get("status")
            .is_none_or(|wanted| wanted == status || Some(wanted) == conclusion)
    }

    /// Whether a runs listing is a search, whose results GitHub caps at [`RUN_SEARCH_CAP`]:
    /// any of these filters makes it one (API-CONTRACTS §1.1, gotcha 1).
    pub(crate) fn is_run_search(&self) -> bool {
        [
            "actor",
            "branch",
            "check_suite_id",
            "created",
            "event",
            "head_sha",
            "status",
        ]
        .iter()
        .any(|k| self.get(k).is_some())
    }

    /// `per_page`/`page` of `total` items: the range shown and GitHub's `Link` header, with
    /// `next`/`last` when more pages follow and `prev`/`first` after the first; none when
    /// everything fits on one page.
    pub(crate) fn page(
        &self,
        total: usize,
        link_base: &str,
    ) -> (std::ops::Range<usize>, Option<String>) {
        let per_page = self.number("per_page", 30).clamp(1, 100);
        let page = self.number("page", 1).max(1);
        let last = total.div_ceil(per_page).max(1);
        let start = (page - 1).saturating_mul(per_page).min(total);
        let end = (start + per_page).min(total);
        let mut kept: Vec<String> = self
            .0
            .iter()
            .filter(|(k, _)| k != "page" && k != "per_page")
            .map(|(k, v)| {
                format!(
                    "{k}={}",
                    url::form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>()
                )
            })
            .collect();
        kept.push(format!("per_page={per_page}"));
        let url = |p: usize| format!("<{link_base}?{}&page={p}>", kept.join("&"));
        let mut rels = Vec::new();
        if page > 1 {
            rels.push(format!("{}; rel=\"prev\"", url((page - 1).min(last))));
        }
        if page < last {
            rels.push(format!("{}; rel=\"next\"", url(page + 1)));
            rels.push(format!("{}; rel=\"last\"", url(last)));
        }
        if page > 1 {
            rels.push(format!("{}; rel=\"first\"", url(1)));
        }
        (start..end, (!rels.is_empty()).then(|| rels.join(", ")))
    }
}

/// Slices `items` for `per_page`/`page`, with GitHub's `Link` header (see [`Query::page`]).
fn paginate<T: Clone>(items: &[T], query: &Query, link_base: &str) -> (Vec<T>, Option<String>) {
    let (range, link) = query.page(items.len(), link_base);
    (items[range].to_vec(), link)
}

fn etag_of(body: &str) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut hasher);
    format!("W/\"{:016x}\"", hasher.finish())
}

fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = header_text(headers, "authorization")?;
    let (scheme, token) = value.split_once(' ')?;
    matches!(scheme.to_ascii_lowercase().as_str(), "bearer" | "token")
        .then(|| token.trim().to_string())
}

#[derive(serde::Deserialize)]
struct JwtClaims {
    iss: Value,
    iat: i64,
    exp: i64,
}

/// GitHub's answer to a JWT it cannot use.
pub const JWT_UNDECODABLE: &str = "A JSON web token could not be decoded";

/// Checks an App's JWT the way GitHub does: RS256 with the App's key, `exp` in the future but
/// at most 10 minutes ahead, `iat` not in the future (a minute of drift allowed), `iss` the
/// App (GitHub takes the numeric id as a number or a string). `Err` is GitHub's message for
/// the 401. Shared by the twin and the seeded world's in-memory GitHub.
pub fn check_app_jwt(
    jwt: &str,
    key: &DecodingKey,
    app_id: &str,
    now_unix: i64,
) -> Result<(), &'static str> {
    let mut validation = Validation::new(Algorithm::RS256);
    validation.validate_exp = false;
    validation.validate_aud = false;
    // `iss` is checked below: jsonwebtoken's check wants a string. `iat` is required by
    // `JwtClaims` itself.
    validation.set_required_spec_claims(&["exp"]);
    let claims = jsonwebtoken::decode::<JwtClaims>(jwt, key, &validation)
        .map_err(|_| JWT_UNDECODABLE)?
        .claims;
    if claims.exp <= now_unix {
        return Err(
            "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires.",
        );
    }
    if claims.exp > now_unix + JWT_LIFETIME_MAX_S {
        return Err("'Expiration time' claim ('exp') is too far in the future");
    }
    if claims.iat > now_unix + JWT_CLOCK_DRIFT_S {
        return Err(
            "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued.",
        );
    }
    let iss = match &claims.iss {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        _ => return Err(JWT_UNDECODABLE),
    };
    if iss != app_id {
        return Err(JWT_UNDECODABLE);
    }
    Ok(())
}

impl Twin {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.clock_offset
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn repo_mut(&mut self, repo: &RepoName) -> &mut RepoState {
        if !self.repos.contains_key(repo) {
            let id = self.id();
            self.repos.insert(
                repo.clone(),
                RepoState {
                    id,
                    runs: BTreeMap::new(),
                    jobs: BTreeMap::new(),
                    runners: BTreeMap::new(),
                    runs_created: 0,
                },
            );
        }
        self.repos.get_mut(repo).expect("just inserted")
    }

    /// Checks the App's JWT the way GitHub does (see [`check_app_jwt`]).
    fn verify_jwt(&self, headers: &HeaderMap) -> Result<(), Reply> {
        let unauthorized =
            |message: &str| Reply::error(StatusCode::UNAUTHORIZED, message, DOCS_REST);
        let jwt = bearer(headers).ok_or_else(|| unauthorized(JWT_UNDECODABLE))?;
        check_app_jwt(&jwt, &self.app_key, &self.app_id, self.now().timestamp())
            .map_err(unauthorized)
    }

    fn budget(&mut self, holder: &str) -> BudgetState {
        let now = self.now();
        let limit = self.budget_limit;
        let budget = self
            .budgets
            .entry(holder.to_string())
            .or_insert(BudgetState {
                limit,
                used: 0,
                reset_at: now + Duration::hours(1),
            });
        if now >= budget.reset_at {
            budget.used = 0;
            budget.reset_at = now + Duration::hours(1);
        }
        *budget
    }

    fn rate_headers(&mut self, holder: &str, reply: Reply) -> Reply {
        let budget = self.budget(holder);
        reply
            .header("x-ratelimit-limit", budget.limit.to_string())
            .header(
                "x-ratelimit-remaining",
                budget.limit.saturating_sub(budget.used).to_string(),
            )
            .header("x-ratelimit-used", budget.used.to_string())
            .header("x-ratelimit-reset", budget.reset_at.timestamp().to_string())
            .header("x-ratelimit-resource", "core")
    }

    /// The refusal for a holder whose budget is spent or when a limit is forced on.
    fn rate_limited(&mut self, holder: &Holder) -> Option<Reply> {
        let key = holder.key();
        let budget = self.budget(&key);
        let primary_message = match holder {
            Holder::Installation(id) => {
                format!("API rate limit exceeded for installation ID {id}.")
            }
            Holder::Pat(_) => "API rate limit exceeded for user ID 1.".to_string(),
        };
        let exhausted = |status: u16| {
            Reply::error(
                StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN),
                &primary_message,
                DOCS_RATE_LIMITS,
            )
            .header("x-ratelimit-limit", budget.limit.to_string())
            .header("x-ratelimit-remaining", "0")
            .header("x-ratelimit-used", budget.limit.to_string())
            .header("x-ratelimit-reset", budget.reset_at.timestamp().to_string())
            .header("x-ratelimit-resource", "core")
        };
        match self.forced_limit {
            Some(RateLimitAnswer::Primary { status }) => Some(exhausted(status)),
            Some(RateLimitAnswer::Secondary {
                status,
                retry_after_s,
            }) => {
                let reply = Reply::error(
                    StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN),
                    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you reach out to GitHub Support for help, please include the request ID.",
                    DOCS_RATE_LIMITS,
                );
                let reply = match retry_after_s {
                    Some(seconds) => reply.header("retry-after", seconds.to_string()),
                    None => reply,
                };
                Some(self.rate_headers(&key, reply))
            }
            None if budget.used >= budget.limit => Some(exhausted(403)),
            None => None,
        }
    }

    fn count(&mut self, holder: &str) {
        self.budget(holder);
        if let Some(budget) = self.budgets.get_mut(holder) {
            budget.used += 1;
        }
    }

    fn serve(&mut self, method: &Method, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Response {
        let base = format!(
            "http://{}",
            header_text(headers, "host").unwrap_or_else(|| "127.0.0.1".to_string())
        );
        let route = parse_route(method, uri.path());
        let mut entry = LoggedRequest {
            method: method.to_string(),
            endpoint: route.as_ref().map_or("unknown", |(e, _)| e.route()),
            path: uri
                .path_and_query()
                .map_or_else(|| uri.path().to_string(), |p| p.to_string()),
            status: 0,
            counted: false,
            holder: None,
            grant: None,
            accept: header_text(headers, "accept"),
            api_versions: headers
                .get_all("x-github-api-version")
                .iter()
                .filter_map(|v| v.to_str().ok().map(str::to_string))
                .collect(),
            user_agent: header_text(headers, "user-agent"),
        };
        let reply = self.answer(route, method, uri, headers, body, &base, &mut entry);
        let reply = reply
            .header("x-github-api-version-selected", API_VERSION)
            .header("x-github-media-type", "github.v3; format=json");
        entry.status = reply.status.as_u16();
        self.log.push(entry);
        let mut response = Response::builder().status(reply.status);
        for (name, value) in &reply.headers {
            if let Ok(value) = HeaderValue::from_str(value) {
                response = response.header(*name, value);
            }
        }
        let body = match reply.body {
            Some(body) => {
                response = response.header("content-type", "application/json; charset=utf-8");
                Body::from(body.to_string())
            }
            None => Body::empty(),
        };
        response.body(body).expect("valid response")
    }

    #[allow(clippy::too_many_arguments)]
    fn answer(
        &mut self,
        route: Option<(Endpoint, Option<RepoRef>)>,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
        base: &str,
        entry: &mut LoggedRequest,
    ) -> Reply {
        if entry.user_agent.as_deref().is_none_or(str::is_empty) {
            return Reply::error(
                StatusCode::FORBIDDEN,
                "Request forbidden by administrative rules. Please make sure your request has a User-Agent header (https://docs.github.com/en/rest/overview/resources-in-the-rest-api#user-agent-required). Check https://githubstatus.com for possible issues.",
                DOCS_REST,
            );
        }
        if let Some(version) = entry
            .api_versions
            .iter()
            .find(|v| v.as_str() != API_VERSION)
        {
            return Reply::error(
                StatusCode::BAD_REQUEST,
                &format!("API version {version} is not supported."),
                DOCS_REST,
            );
        }
        let Some((endpoint, repo_ref)) = route else {
            return Reply::not_found();
        };
        let Some(repo_ref) = repo_ref.filter(|_| endpoint != Endpoint::GetRepoInstallation) else {
            // App routes: JWT only.
            if let Err(reply) = self.verify_jwt(headers) {
                return reply;
            }
            entry.holder = Some("app".to_string());
            entry.counted = true;
            self.count("app");
            let reply = match endpoint {
                Endpoint::GetAppInstallation(id) => self.app_installation(id, base),
                Endpoint::CreateAccessToken(id) => self.create_access_token(id, body),
                Endpoint::GetRepoInstallation => self.repo_installation(uri, base),
                _ => Reply::not_found(),
            };
            return self.rate_headers("app", reply);
        };
        let Some(token) = bearer(headers) else {
            return Reply::error(
                StatusCode::UNAUTHORIZED,
                "Requires authentication",
                DOCS_REST,
            );
        };
        let now = self.now();
        let grant = match self.tokens.get(&token) {
            Some(grant) if grant.expires_at.is_none_or(|t| t > now) => grant.clone(),
            _ => return Reply::error(StatusCode::UNAUTHORIZED, "Bad credentials", DOCS_REST),
        };
        let holder = grant.holder.key();
        entry.holder = Some(holder.clone());
        entry.grant = Some(grant.view());
        if let Some(refusal) = self.rate_limited(&grant.holder) {
            return refusal;
        }
        let repo = match repo_ref {
            RepoRef::Name(owner, name) => RepoName::parse(&format!("{owner}/{name}")),
            RepoRef::Id(id) => self
                .repos
                .iter()
                .find(|(_, state)| state.id == id)
                .map(|(name, _)| name.clone()),
        };
        let reply = match repo.filter(|r| self.repos.contains_key(r) && grant.covers(r)) {
            None => Reply::not_found(),
            Some(repo) => match endpoint.permission() {
                Some((permission, level)) if !grant.allows(permission, level) => {
                    let message = match grant.holder {
                        Holder::Installation(_) => "Resource not accessible by integration",
                        Holder::Pat(_) => "Resource not accessible by personal access token",
                    };
                    Reply::error(StatusCode::FORBIDDEN, message, endpoint.docs()).header(
                        "x-accepted-github-permissions",
                        format!("{permission}={level}"),
                    )
                }
                _ if endpoint == Endpoint::GenerateJitConfig => {
                    self.generate_jit_config(&repo, body)
                }
                _ => self.repo_endpoint(endpoint, &repo, &Query::parse(uri.query()), base),
            },
        };
        // Conditional requests: a matching `If-None-Match` is answered 304 and not charged.
        if method == Method::GET && reply.status == StatusCode::OK {
            let text = reply
                .body
                .as_ref()
                .map(Value::to_string)
                .unwrap_or_default();
            let etag = etag_of(&text);
            if header_text(headers, "if-none-match").as_deref() == Some(etag.as_str()) {
                let not_modified = Reply {
                    status: StatusCode::NOT_MODIFIED,
                    headers: Vec::new(),
                    body: None,
                }
                .header("etag", etag);
                return self.rate_headers(&holder, not_modified);
            }
            entry.counted = true;
            self.count(&holder);
            let reply = reply.header("etag", etag);
            return self.rate_headers(&holder, reply);
        }
        entry.counted = true;
        self.count(&holder);
        self.rate_headers(&holder, reply)
    }

    fn installation_json(
        &self,
        owner: &str,
        installation: &InstallationState,
        base: &str,
    ) -> Value {
        let mut value = TEMPLATES.installation.clone();
        value["id"] = json!(installation.id);
        value["account"]["login"] = json!(owner);
        value["account"]["url"] = json!(format!("{base}/users/{owner}"));
        value["account"]["html_url"] = json!(format!("{base}/{owner}"));
        value["access_tokens_url"] = json!(format!(
            "{base}/app/installations/{}/access_tokens",
            installation.id
        ));
        value["repositories_url"] = json!(format!("{base}/installation/repositories"));
        if let Ok(app_id) = self.app_id.parse::<u64>() {
            value["app_id"] = json!(app_id);
        }
        value["target_id"] = json!(installation.id);
        value["permissions"] = json!(installation.permissions);
        value["repository_selection"] = json!("all");
        value
    }

    fn app_installation(&self, id: u64, base: &str) -> Reply {
        match self.installations.iter().find(|(_, i)| i.id == id) {
            Some((owner, installation)) => Reply::json(
                StatusCode::OK,
                self.installation_json(owner, installation, base),
            ),
            None => Reply::not_found(),
        }
    }

    fn repo_installation(&self, uri: &Uri, base: &str) -> Reply {
        let segments: Vec<&str> = uri.path().split('/').collect();
        let repo = match segments.as_slice() {
            ["", "repos", owner, name, "installation"] => {
                RepoName::parse(&format!("{owner}/{name}"))
            }
            _ => None,
        };
        let Some(repo) = repo.filter(|r| self.repos.contains_key(r)) else {
            return Reply::not_found();
        };
        match self.installations.get(repo.owner()) {
            Some(installation) => Reply::json(
                StatusCode::OK,
                self.installation_json(repo.owner(), installation, base),
            ),
            None => Reply::not_found(),
        }
    }

    fn create_access_token(&mut self, id: u64, body: &[u8]) -> Reply {
        let request: Value = if body.is_empty() {
            json!({})
        } else {
            match serde_json::from_slice(body) {
                Ok(value) => value,
                Err(_) => {
                    return Reply::error(
                        StatusCode::BAD_REQUEST,
                        "Problems parsing JSON",
                        TEMPLATES_DOCS_TOKEN,
                    );
                }
            }
        };
        let reply = self.grant_access_token(id, &request);
        self.token_requests.push(TokenRequest {
            installation_id: id,
            body: request,
            status: reply.status.as_u16(),
        });
        reply
    }

    fn grant_access_token(&mut self, id: u64, request: &Value) -> Reply {
        let Some((owner, installation)) = self.installations.iter().find(|(_, i)| i.id == id)
        else {
            return Reply::not_found();
        };
        let owner = owner.clone();
        let installable: Vec<RepoName> = self
            .repos
            .keys()
            .filter(|r| r.owner() == owner)
            .cloned()
            .collect();
        let repos = match request.get("repositories") {
            None => None,
            Some(Value::Array(names)) => {
                let mut repos = BTreeSet::new();
                for name in names {
                    let found = name.as_str().and_then(|n| {
                        installable
                            .iter()
                            .find(|r| r.name().eq_ignore_ascii_case(n))
                    });
                    match found {
                        Some(repo) => repos.insert(repo.clone()),
                        None => {
                            return Reply::error(
                                StatusCode::UNPROCESSABLE_ENTITY,
                                "There is at least one repository that does not exist or is not accessible to the parent installation.",
                                TEMPLATES_DOCS_TOKEN,
                            );
                        }
                    };
                }
                Some(repos)
            }
            Some(_) => {
                return Reply::error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid request.",
                    TEMPLATES_DOCS_TOKEN,
                );
            }
        };
        let permissions = match request.get("permissions").and_then(Value::as_object) {
            None => installation.permissions.clone(),
            Some(asked) => {
                let mut granted = BTreeMap::new();
                for (name, level) in asked {
                    let level = level.as_str().unwrap_or_default();
                    let allowed = match installation.permissions.get(name).map(String::as_str) {
                        Some("write") | Some("admin") => matches!(level, "read" | "write"),
                        Some("read") => level == "read",
                        _ => false,
                    };
                    if !allowed {
                        return Reply::error(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            "The permissions requested are not granted to this installation.",
                            TEMPLATES_DOCS_TOKEN,
                        );
                    }
                    granted.insert(name.clone(), level.to_string());
                }
                granted
            }
        };
        let token = stateless_installation_token(
            &self.app_id,
            id,
            &random_string(
                16,
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
            ),
        );
        let expires_at = self.now() + TOKEN_LIFETIME;
        let listed: Vec<RepoName> = match &repos {
            Some(repos) => repos.iter().cloned().collect(),
            None => installable,
        };
        let repositories: Vec<Value> = listed
            .iter()
            .map(|repo| {
                let mut value = TEMPLATES.token_repository.clone();
                value["id"] = json!(self.repos.get(repo).map_or(0, |s| s.id));
                value["name"] = json!(repo.name());
                value["full_name"] = json!(repo.to_string());
                value["owner"]["login"] = json!(repo.owner());
                value
            })
            .collect();
        let mut body = TEMPLATES.access_token.clone();
        body["token"] = json!(token);
        body["expires_at"] = json!(time(expires_at));
        body["permissions"] = json!(permissions);
        body["repository_selection"] = json!(if repos.is_some() { "selected" } else { "all" });
        body["repositories"] = json!(repositories);
        self.tokens.insert(
            token.clone(),
            Grant {
                holder: Holder::Installation(id),
                repos,
                owner: Some(owner),
                permissions,
                expires_at: Some(expires_at),
            },
        );
        self.issued.push(token);
        Reply::json(StatusCode::CREATED, body)
    }

    /// `POST …/actions/runners/generate-jitconfig` (API-CONTRACTS §1.5): validates the body
    /// as GitHub documents it, registers the runner offline under the given name and labels,
    /// and answers 201 with the runner and an encoded configuration that is a fresh secret.
    fn generate_jit_config(&mut self, repo: &RepoName, body: &[u8]) -> Reply {
        let request = match JitRequest::parse(body) {
            Ok(request) => request,
            Err((status, message)) => return Reply::error(status, &message, DOCS_JIT),
        };
        let name = request.name;
        if self
            .repos
            .get(repo)
            .is_some_and(|state| state.runners.values().any(|r| r.name == name))
        {
            return Reply::error(StatusCode::CONFLICT, JIT_NAME_TAKEN, DOCS_JIT);
        }
        let id = self.id();
        let secret = random_string(40, b"abcdefghijklmnopqrstuvwxyz0123456789");
        use base64::Engine;
        let encoded = base64::engine::general_purpose::STANDARD
            .encode(json!({ ".runner": name, ".credentials": secret }).to_string());
        let body = jit_config_json(id, &name, &request.labels, &encoded);
        self.issued.push(encoded);
        let runner = RunnerState {
            id,
            name,
            labels: request.labels,
            online: false,
            busy: false,
        };
        self.repo_mut(repo).runners.insert(id, runner);
        Reply::json(StatusCode::CREATED, body)
    }

    fn repo_endpoint(
        &mut self,
        endpoint: Endpoint,
        repo: &RepoName,
        query: &Query,
        base: &str,
    ) -> Reply {
        let now = self.now();
        let state = self.repos.get(repo).expect("checked by the caller");
        let links = format!("{base}/repositories/{}", state.id);
        match endpoint {
            Endpoint::ListRuns => {
                let mut runs: Vec<&RunState> = state
                    .runs
                    .values()
                    .filter(|run| {
                        let (status, conclusion) = state.run_status(run);
                        query.run_status_matches(status, conclusion)
                    })
                    .collect();
                runs.sort_by_key(|run| std::cmp::Reverse(run.id));
                if query.is_run_search() {
                    runs.truncate(RUN_SEARCH_CAP);
                }
                let total = runs.len();
                let (page, link) = paginate(&runs, query, &format!("{links}/actions/runs"));
                let runs: Vec<Value> = page
                    .iter()
                    .map(|run| run_json(repo, state, run, base))
                    .collect();
                let reply = Reply::json(
                    StatusCode::OK,
                    json!({ "total_count": total, "workflow_runs": runs }),
                );
                with_link(reply, link)
            }
            Endpoint::ListJobs(run_id) => {
                let Some(run) = state.runs.get(&run_id) else {
                    return Reply::not_found();
                };
                let all = query.get("filter") == Some("all");
                let jobs: Vec<&JobState> = state
                    .jobs
                    .values()
                    .filter(|j| j.run_id == run_id && (all || j.attempt == run.attempt))
                    .collect();
                let total = jobs.len();
                let (page, link) =
                    paginate(&jobs, query, &format!("{links}/actions/runs/{run_id}/jobs"));
                let jobs: Vec<Value> = page.iter().map(|job| job_json(repo, job, base)).collect();
                with_link(
                    Reply::json(
                        StatusCode::OK,
                        json!({ "total_count": total, "jobs": jobs }),
                    ),
                    link,
                )
            }
            Endpoint::GetJob(job_id) => match state.jobs.get(&job_id) {
                Some(job) => Reply::json(StatusCode::OK, job_json(repo, job, base)),
                None => Reply::not_found(),
            },
            // Served by `generate_jit_config`, which registers the runner.
            Endpoint::GenerateJitConfig => Reply::not_found(),
            Endpoint::CreateRegistrationToken => {
                let token = random_string(29, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567");
                let mut body = TEMPLATES.registration_token.clone();
                body["token"] = json!(token);
                body["expires_at"] =
                    json!((now + TOKEN_LIFETIME).to_rfc3339_opts(SecondsFormat::Millis, true));
                self.issued.push(token);
                Reply::json(StatusCode::CREATED, body)
            }
            Endpoint::ListRunners => {
                let name = query.get("name");
                let runners: Vec<&RunnerState> = state
                    .runners
                    .values()
                    .filter(|r| name.is_none_or(|n| n == r.name))
                    .collect();
                let total = runners.len();
                let (page, link) = paginate(&runners, query, &format!("{links}/actions/runners"));
                let runners: Vec<Value> = page.iter().map(|r| runner_json(r)).collect();
                with_link(
                    Reply::json(
                        StatusCode::OK,
                        json!({ "total_count": total, "runners": runners }),
                    ),
                    link,
                )
            }
            Endpoint::GetRunner(id) => match state.runners.get(&id) {
                Some(runner) => Reply::json(StatusCode::OK, runner_json(runner)),
                None => Reply::not_found(),
            },
            Endpoint::DeleteRunner(id) => {
                let Some(runner) = state.runners.get(&id) else {
                    return Reply::not_found();
                };
                if runner.busy {
                    return Reply::error(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        &format!(
                            "Bad request - Runner \"{}\" is still running a job\"",
                            runner.name
                        ),
                        endpoint.docs(),
                    );
                }
                let name = runner.name.clone();
                self.repo_mut(repo).runners.remove(&id);
                self.deleted_runners.push(DeletedRunner {
                    repo: repo.clone(),
                    id,
                    name,
                    at: std::time::Instant::now(),
                });
                Reply {
                    status: StatusCode::NO_CONTENT,
                    headers: Vec::new(),
                    body: None,
                }
            }
            Endpoint::GetAppInstallation(_)
            | Endpoint::CreateAccessToken(_)
            | Endpoint::GetRepoInstallation => Reply::not_found(),
        }
    }
}

const TEMPLATES_DOCS_TOKEN: &str =
    "https://docs.github.com/rest/apps/apps#create-an-installation-access-token-for-an-app";

fn with_link(reply: Reply, link: Option<String>) -> Reply {
    match link {
        Some(link) => reply.header("link", link),
        None => reply,
    }
}

fn run_json(repo: &RepoName, state: &RepoState, run: &RunState, base: &str) -> Value {
    let (status, conclusion) = state.run_status(run);
    let api = format!("{base}/repos/{repo}/actions/runs/{}", run.id);
    let mut value = TEMPLATES.run.clone();
    value["id"] = json!(run.id);
    value["run_number"] = json!(run.run_number);
    value["run_attempt"] = json!(run.attempt);
    value["status"] = json!(status);
    value["conclusion"] = json!(conclusion);
    value["created_at"] = json!(time(run.created_at));
    value["updated_at"] = json!(time(run.updated_at));
    value["run_started_at"] = json!(time(run.created_at));
    value["url"] = json!(api);
    value["html_url"] = json!(format!("{base}/{repo}/actions/runs/{}", run.id));
    value["jobs_url"] = json!(format!("{api}/jobs"));
    value["logs_url"] = json!(format!("{api}/logs"));
    value["artifacts_url"] = json!(format!("{api}/artifacts"));
    value["cancel_url"] = json!(format!("{api}/cancel"));
    value["rerun_url"] = json!(format!("{api}/rerun"));
    value["repository"]["id"] = json!(state.id);
    value["repository"]["name"] = json!(repo.name());
    value["repository"]["full_name"] = json!(repo.to_string());
    value["repository"]["owner"]["login"] = json!(repo.owner());
    value
}

fn job_json(repo: &RepoName, job: &JobState, base: &str) -> Value {
    let mut value = TEMPLATES.job.clone();
    value["id"] = json!(job.id);
    value["run_id"] = json!(job.run_id);
    value["run_url"] = json!(format!("{base}/repos/{repo}/actions/runs/{}", job.run_id));
    value["url"] = json!(format!("{base}/repos/{repo}/actions/jobs/{}", job.id));
    value["html_url"] = json!(format!(
        "{base}/{repo}/actions/runs/{}/job/{}",
        job.run_id, job.id
    ));
    value["status"] = json!(job.status.as_str());
    value["conclusion"] = json!(job.conclusion);
    // GitHub fills `started_at` with the creation time while a job waits.
    value["started_at"] = json!(time(job.started_at.unwrap_or(job.created_at)));
    value["completed_at"] = json!(job.completed_at.map(time));
    value["labels"] = json!(job.labels);
    value["runner_id"] = json!(job.runner_id);
    value["runner_name"] = json!(job.runner_name);
    let assigned = job.runner_name.is_some();
    value["runner_group_id"] = if assigned { json!(1) } else { Value::Null };
    value["runner_group_name"] = if assigned {
        json!("Default")
    } else {
        Value::Null
    };
    if job.status == TwinJobStatus::Queued {
        value["steps"] = json!([]);
    }
    // Required by the schema although the documentation example lacks them.
    value["created_at"] = json!(time(job.created_at));
    value["run_attempt"] = json!(job.attempt);
    value
}

fn runner_json(runner: &RunnerState) -> Value {
    let mut value = TEMPLATES.runner.clone();
    value["id"] = json!(runner.id);
    value["name"] = json!(runner.name);
    value["os"] = json!("linux");
    value["status"] = json!(if runner.online { "online" } else { "offline" });
    value["busy"] = json!(runner.busy);
    // The daemon registers only JIT runners, which GitHub removes after one job.
    value["ephemeral"] = json!(true);
    value["labels"] = runner_labels_json(&runner.labels);
    value
}

/// The labels GitHub gives a self-hosted runner by itself (its "default labels"):
/// `self-hosted`, the OS (`Linux`, `Windows`, `macOS`) and the architecture (`X64`, `ARM`,
/// `ARM64`). GitHub lists these as `read-only` and every other label as `custom` (as the
/// examples do: `macOS` is read-only, `no-gpu` custom); names compare without regard to case,
/// as `runs-on` matching does.
const DEFAULT_LABELS: [&str; 7] = [
    "self-hosted",
    "linux",
    "windows",
    "macos",
    "x64",
    "arm",
    "arm64",
];

/// A runner's `labels` as GitHub lists them: `{id, name, type}` in the given order.
pub(crate) fn runner_labels_json<L: AsRef<str>>(labels: &[L]) -> Value {
    let labels: Vec<Value> = labels
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let name = name.as_ref();
            let default = DEFAULT_LABELS.contains(&name.to_ascii_lowercase().as_str());
            json!({
                "id": i + 1,
                "name": name,
                "type": if default { "read-only" } else { "custom" },
            })
        })
        .collect();
    json!(labels)
}

/// The 201 body of `generate-jitconfig`, built from that endpoint's own example: its `runner`
/// is a runner as just registered (`os: "unknown"`, `status: "offline"`, not busy, and no
/// `ephemeral` field, unlike the get-runner example), with the given id, name and labels.
pub(crate) fn jit_config_json<L: AsRef<str>>(
    id: u64,
    name: &str,
    labels: &[L],
    encoded_jit_config: &str,
) -> Value {
    let mut body = TEMPLATES.jit_config.clone();
    body["runner"]["id"] = json!(id);
    body["runner"]["name"] = json!(name);
    body["runner"]["labels"] = runner_labels_json(labels);
    body["encoded_jit_config"] = json!(encoded_jit_config);
    body
}

/// Documentation of `generate-jitconfig`, named by its refusals.
pub(crate) const DOCS_JIT: &str = "https://docs.github.com/rest/actions/self-hosted-runners#create-configuration-for-a-just-in-time-runner-for-a-repository";
/// The 409 of `generate-jitconfig` when the name is registered already.
pub(crate) const JIT_NAME_TAKEN: &str = "Already exists - A runner with the name already exists.";

/// A `generate-jitconfig` request body that GitHub accepts (API-CONTRACTS §1.5).
pub(crate) struct JitRequest {
    pub(crate) name: String,
    pub(crate) labels: Vec<String>,
}

impl JitRequest {
    /// Validates `body` as GitHub does: 400 when it is not JSON; 422 without `name`, without
    /// `runner_group_id` (required even for a repo, whose default group is 1: gotcha 5), or
    /// without 1 to 100 string labels. The refusal is the status and GitHub's message.
    pub(crate) fn parse(body: &[u8]) -> Result<JitRequest, (StatusCode, String)> {
        let Ok(request) = serde_json::from_slice::<Value>(body) else {
            return Err((StatusCode::BAD_REQUEST, "Problems parsing JSON".to_string()));
        };
        let invalid = |what: &str| {
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("Invalid request.\n\n{what}"),
            )
        };
        let Some(name) = request["name"].as_str() else {
            return Err(invalid("\"name\" wasn't supplied."));
        };
        if request["runner_group_id"].as_u64().is_none() {
            return Err(invalid("\"runner_group_id\" wasn't supplied."));
        }
        let labels: Option<Vec<String>> = request["labels"].as_array().and_then(|labels| {
            labels
                .iter()
                .map(|l| l.as_str().map(str::to_string))
                .collect()
        });
        let Some(labels) = labels.filter(|l| (1..=100).contains(&l.len())) else {
            return Err(invalid("\"labels\" must be an array of 1 to 100 strings."));
        };
        if !request["work_folder"].is_null() && !request["work_folder"].is_string() {
            return Err(invalid("\"work_folder\" must be a string."));
        }
        Ok(JitRequest {
            name: name.to_string(),
            labels,
        })
    }
}

async fn serve(
    State(twin): State<GitHubTwin>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let latency = twin.latency_us.load(Ordering::Relaxed);
    if latency > 0 {
        tokio::time::sleep(std::time::Duration::from_micros(latency)).await;
    }
    twin.lock().serve(&method, &uri, &headers, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_latency_delays_every_answer_by_that_much_and_none_answers_at_once() {
        use tower::Service;
        let twin = GitHubTwin::new();
        let mut router = twin.router();
        let request = || {
            axum::http::Request::get("/repos/acme/api/actions/runs")
                .header("user-agent", "latency-test")
                .body(Body::empty())
                .expect("a request")
        };
        let started = tokio::time::Instant::now();
        let answer = router.call(request()).await.expect("an answer");
        assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(started.elapsed(), std::time::Duration::ZERO);

        twin.set_latency(std::time::Duration::from_millis(120));
        let started = tokio::time::Instant::now();
        let answer = router.call(request()).await.expect("an answer");
        assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(started.elapsed(), std::time::Duration::from_millis(120));
    }

    #[test]
    fn pagination_links_follow_github() {
        let items: Vec<u32> = (0..250).collect();
        let query = Query(vec![
            ("status".into(), "queued".into()),
            ("per_page".into(), "100".into()),
            ("page".into(), "2".into()),
        ]);
        let (page, link) = paginate(&items, &query, "http://h/repositories/1/actions/runs");
        assert_eq!(page.first(), Some(&100));
        assert_eq!(page.len(), 100);
        let link = link.unwrap();
        assert!(link.contains(r#"<http://h/repositories/1/actions/runs?status=queued&per_page=100&page=3>; rel="next""#), "{link}");
        assert!(link.contains(r#"page=3>; rel="last""#), "{link}");
        assert!(link.contains(r#"page=1>; rel="prev""#), "{link}");
        assert!(link.contains(r#"page=1>; rel="first""#), "{link}");

        let (_, link) = paginate(&items[..5], &Query(vec![]), "http://h/x");
        assert_eq!(link, None, "one page: no Link header");
    }

    #[test]
    fn run_status_follows_the_latest_attempt() {
        let twin = GitHubTwin::new();
        let repo = RepoName::parse("acme/api").unwrap();
        let ids = twin.add_run(&repo, vec![vec!["self-hosted"], vec!["self-hosted"]]);
        let status = |twin: &GitHubTwin| {
            let t = twin.lock();
            let state = t.repos.get(&repo).unwrap();
            let run = state.runs.get(&ids.run_id).unwrap();
            let (s, c) = state.run_status(run);
            (s, c)
        };
        assert_eq!(status(&twin), ("queued", None));
        twin.start_job(&repo, ids.job_ids[0], "r1").unwrap();
        assert_eq!(status(&twin), ("in_progress", None));
        twin.complete_job(&repo, ids.job_ids[0], "success").unwrap();
        assert_eq!(status(&twin), ("in_progress", None));
        twin.cancel_job(&repo, ids.job_ids[1]).unwrap();
        assert_eq!(status(&twin), ("completed", Some("cancelled")));
        twin.rerun(&repo, ids.run_id).unwrap();
        assert_eq!(status(&twin), ("queued", None));
    }
}
