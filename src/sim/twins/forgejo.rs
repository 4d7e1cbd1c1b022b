//! Twin of the Forgejo API the daemon uses: the version, the repo runner-job search, the
//! repo registration token and, from Forgejo 15, repo runners registered one by one
//! (`POST …/actions/runners` → 201 `{id, uuid, token}`, `DELETE …/actions/runners/{id}` → 204).
//!
//! Behaviour follows Forgejo v11.0.0 (API-CONTRACTS §5): the job search returns a bare array
//! of the repo's `waiting` and `running` jobs whose every `runs_on` label is among the
//! `labels` asked for, JSON `null` when none match, no pagination, and nothing at all when
//! `labels` is omitted or empty; before v11 the route does not exist (404). Tokens are taken
//! from `Authorization: token <t>` or `Bearer <t>` (any case of `bearer`, but only lower-case
//! `token`); errors are `{"message", "url"}`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use rand::Rng;
use rand::distr::Alphanumeric;
use serde_json::{Value, json};

use super::TwinServer;

/// Status of a job, as Forgejo names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForgejoJobStatus {
    Waiting,
    Running,
    Success,
    Failure,
    Cancelled,
}

impl ForgejoJobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ForgejoJobStatus::Waiting => "waiting",
            ForgejoJobStatus::Running => "running",
            ForgejoJobStatus::Success => "success",
            ForgejoJobStatus::Failure => "failure",
            ForgejoJobStatus::Cancelled => "cancelled",
        }
    }
}

/// One job of a workflow run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForgejoJob {
    pub id: u64,
    /// `owner/name`, lower-case.
    pub repo: String,
    pub repo_id: u64,
    pub owner_id: u64,
    pub name: String,
    pub needs: Vec<String>,
    pub runs_on: Vec<String>,
    /// The latest task (attempt) of the job; 0 until a runner claims it.
    pub task_id: u64,
    pub status: ForgejoJobStatus,
}

/// One request as the twin saw it. The token itself is not kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForgejoRequest {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    /// The scheme word of the `Authorization` header (`token`, `Bearer`, ...), if any.
    pub auth_scheme: Option<String>,
    pub status: u16,
}

/// Which repos an API token may administer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenAccess {
    All,
    Repos(BTreeSet<String>),
}

struct TwinRepo {
    id: u64,
    owner_id: u64,
    registration_token: Option<String>,
}

/// A runner registered through `POST …/actions/runners` (Forgejo 15 and later).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisteredRunner {
    pub id: u64,
    pub repo: String,
    pub name: String,
    pub uuid: String,
    pub token: String,
    pub ephemeral: bool,
}

struct ForgejoState {
    version: String,
    runners: BTreeMap<u64, RegisteredRunner>,
    next_runner_id: u64,
    tokens: HashMap<String, TokenAccess>,
    repos: BTreeMap<String, TwinRepo>,
    owners: BTreeMap<String, u64>,
    jobs: BTreeMap<u64, ForgejoJob>,
    next_job_id: u64,
    next_task_id: u64,
    outage: bool,
    requests: Vec<ForgejoRequest>,
}

impl Default for ForgejoState {
    fn default() -> Self {
        ForgejoState {
            version: "11.0.0+gitea-1.22.0".to_string(),
            runners: BTreeMap::new(),
            next_runner_id: 1,
            tokens: HashMap::new(),
            repos: BTreeMap::new(),
            owners: BTreeMap::new(),
            jobs: BTreeMap::new(),
            next_job_id: 1,
            next_task_id: 1,
            outage: false,
            requests: Vec::new(),
        }
    }
}

/// Shared handle on the twin's state.
#[derive(Clone, Default)]
pub struct ForgejoTwin {
    state: Arc<Mutex<ForgejoState>>,
}

fn repo_key(repo: &str) -> String {
    repo.trim().to_ascii_lowercase()
}

fn random_token() -> String {
    rand::rng()
        .sample_iter(Alphanumeric)
        .take(40)
        .map(char::from)
        .collect()
}

/// The leading major number of a version string.
fn major_of(version: &str) -> u64 {
    version
        .trim_start_matches('v')
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

impl ForgejoTwin {
    pub fn new() -> ForgejoTwin {
        ForgejoTwin::default()
    }

    fn lock(&self) -> MutexGuard<'_, ForgejoState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub async fn serve(&self) -> std::io::Result<TwinServer> {
        TwinServer::start(self.router()).await
    }

    pub fn router(&self) -> Router {
        Router::new()
            .route("/api/v1/version", get(version))
            .route(
                "/api/v1/repos/{owner}/{repo}/actions/runners/jobs",
                get(search_jobs),
            )
            .route(
                "/api/v1/repos/{owner}/{repo}/actions/runners/registration-token",
                get(registration_token),
            )
            .route(
                "/api/v1/repos/{owner}/{repo}/actions/runners",
                post(register_runner),
            )
            .route(
                "/api/v1/repos/{owner}/{repo}/actions/runners/{runner_id}",
                delete(delete_runner),
            )
            .fallback(not_found)
            .with_state(self.clone())
    }

    /// The version `GET /api/v1/version` reports; below 11 the job search route is absent.
    pub fn set_version(&self, version: &str) {
        self.lock().version = version.to_string();
    }

    /// Accepts `token` for every repo.
    pub fn add_token(&self, token: &str) {
        self.lock()
            .tokens
            .insert(token.to_string(), TokenAccess::All);
    }

    /// Accepts `token` as the administrator of these repos only; others answer 403.
    pub fn add_token_for(&self, token: &str, repos: &[&str]) {
        let repos = repos.iter().map(|r| repo_key(r)).collect();
        self.lock()
            .tokens
            .insert(token.to_string(), TokenAccess::Repos(repos));
    }

    pub fn revoke_token(&self, token: &str) {
        self.lock().tokens.remove(token);
    }

    /// Creates `owner/name` if absent.
    pub fn add_repo(&self, repo: &str) {
        let mut state = self.lock();
        Self::ensure_repo(&mut state, &repo_key(repo));
    }

    fn ensure_repo(state: &mut ForgejoState, key: &str) -> (u64, u64) {
        if let Some(repo) = state.repos.get(key) {
            return (repo.id, repo.owner_id);
        }
        let owner = key.split('/').next().unwrap_or_default().to_string();
        let next_owner = state.owners.len() as u64 + 1;
        let owner_id = *state.owners.entry(owner).or_insert(next_owner);
        let id = state.repos.len() as u64 + 1;
        state.repos.insert(
            key.to_string(),
            TwinRepo {
                id,
                owner_id,
                registration_token: None,
            },
        );
        (id, owner_id)
    }

    /// Queues a job (`waiting`, no task) in `repo`; returns its id.
    pub fn add_job(&self, repo: &str, name: &str, runs_on: &[&str]) -> u64 {
        let mut state = self.lock();
        let key = repo_key(repo);
        let (repo_id, owner_id) = Self::ensure_repo(&mut state, &key);
        let id = state.next_job_id;
        state.next_job_id += 1;
        state.jobs.insert(
            id,
            ForgejoJob {
                id,
                repo: key,
                repo_id,
                owner_id,
                name: name.to_string(),
                needs: Vec::new(),
                runs_on: runs_on.iter().map(|l| l.to_string()).collect(),
                task_id: 0,
                status: ForgejoJobStatus::Waiting,
            },
        );
        id
    }

    fn update(&self, job_id: u64, change: impl FnOnce(&mut ForgejoJob, &mut u64)) {
        let mut state = self.lock();
        let state = &mut *state;
        if let Some(job) = state.jobs.get_mut(&job_id) {
            change(job, &mut state.next_task_id);
        }
    }

    /// A runner picked the job: it has a task now but still reads `waiting` for a moment.
    pub fn claim(&self, job_id: u64) {
        self.update(job_id, |job, next_task| {
            if job.task_id == 0 {
                job.task_id = *next_task;
                *next_task += 1;
            }
        });
    }

    /// The job runs (claiming it first if nobody had).
    pub fn start(&self, job_id: u64) {
        self.claim(job_id);
        self.update(job_id, |job, _| job.status = ForgejoJobStatus::Running);
    }

    /// The job succeeded; it leaves the search.
    pub fn finish(&self, job_id: u64) {
        self.update(job_id, |job, _| job.status = ForgejoJobStatus::Success);
    }

    /// The job was cancelled; it leaves the search.
    pub fn cancel(&self, job_id: u64) {
        self.update(job_id, |job, _| job.status = ForgejoJobStatus::Cancelled);
    }

    pub fn job(&self, job_id: u64) -> Option<ForgejoJob> {
        self.lock().jobs.get(&job_id).cloned()
    }

    pub fn jobs(&self) -> Vec<ForgejoJob> {
        self.lock().jobs.values().cloned().collect()
    }

    /// The runners registered through the API and not deleted, in id order.
    pub fn registered_runners(&self) -> Vec<RegisteredRunner> {
        self.lock().runners.values().cloned().collect()
    }

    /// The repo's active registration token, if one was created.
    pub fn registration_token(&self, repo: &str) -> Option<String> {
        self.lock()
            .repos
            .get(&repo_key(repo))
            .and_then(|r| r.registration_token.clone())
    }

    /// Deactivates the repo's registration token; the next request creates a new one.
    pub fn reset_registration_token(&self, repo: &str) {
        if let Some(r) = self.lock().repos.get_mut(&repo_key(repo)) {
            r.registration_token = None;
        }
    }

    /// While on, every request answers 502 Bad Gateway from the proxy in front of Forgejo.
    pub fn set_outage(&self, outage: bool) {
        self.lock().outage = outage;
    }

    pub fn requests(&self) -> Vec<ForgejoRequest> {
        self.lock().requests.clone()
    }
}

fn error(status: StatusCode, message: &str, headers: &HeaderMap) -> Response {
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let body = json!({ "message": message, "url": format!("http://{host}/api/swagger") });
    (status, axum::Json(body)).into_response()
}

/// The token as Forgejo parses it: exactly two fields, the first `token` or any case of
/// `bearer`.
fn token_of(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("authorization")?.to_str().ok()?;
    let fields: Vec<&str> = value.split_whitespace().collect();
    match fields.as_slice() {
        [scheme, token] if *scheme == "token" || scheme.eq_ignore_ascii_case("bearer") => {
            Some(token.to_string())
        }
        _ => None,
    }
}

impl ForgejoTwin {
    fn record(&self, method: &Method, uri: &Uri, headers: &HeaderMap, status: StatusCode) {
        let auth_scheme = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_whitespace().next())
            .map(str::to_string);
        self.lock().requests.push(ForgejoRequest {
            method: method.to_string(),
            path: uri.path().to_string(),
            query: uri.query().map(str::to_string),
            auth_scheme,
            status: status.as_u16(),
        });
    }

    /// Outage, route presence, token and repo checks shared by the repo endpoints. `Ok` holds
    /// the repo key.
    fn admit(
        &self,
        owner: &str,
        repo: &str,
        headers: &HeaderMap,
        since_major: u64,
    ) -> Result<String, Box<Response>> {
        let state = self.lock();
        if state.outage {
            return Err(Box::new(
                (StatusCode::BAD_GATEWAY, "Bad Gateway").into_response(),
            ));
        }
        // A route an older version does not have.
        if major_of(&state.version) < since_major {
            return Err(Box::new(error(
                StatusCode::NOT_FOUND,
                "The target couldn't be found.",
                headers,
            )));
        }
        let Some(access) = token_of(headers).and_then(|t| state.tokens.get(&t).cloned()) else {
            let message = if headers.contains_key("authorization") {
                "invalid username, password or token"
            } else {
                "token is required"
            };
            return Err(Box::new(error(StatusCode::UNAUTHORIZED, message, headers)));
        };
        let key = repo_key(&format!("{owner}/{repo}"));
        if !state.repos.contains_key(&key) {
            return Err(Box::new(error(
                StatusCode::NOT_FOUND,
                "The target couldn't be found.",
                headers,
            )));
        }
        match access {
            TokenAccess::Repos(repos) if !repos.contains(&key) => Err(Box::new(error(
                StatusCode::FORBIDDEN,
                "user should be the repo owner or an admin",
                headers,
            ))),
            _ => Ok(key),
        }
    }
}

async fn version(
    State(twin): State<ForgejoTwin>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let (outage, version) = {
        let state = twin.lock();
        (state.outage, state.version.clone())
    };
    let response = if outage {
        (StatusCode::BAD_GATEWAY, "Bad Gateway").into_response()
    } else {
        axum::Json(json!({ "version": version })).into_response()
    };
    twin.record(&method, &uri, &headers, response.status());
    response
}

async fn search_jobs(
    State(twin): State<ForgejoTwin>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Path((owner, repo)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let response = match twin.admit(&owner, &repo, &headers, 11) {
        Err(refusal) => *refusal,
        Ok(key) => {
            let asked = query.get("labels").map(|l| l.trim()).unwrap_or_default();
            // Forgejo 11.0: an omitted or empty `labels` matches nothing.
            let labels: BTreeSet<&str> = if asked.is_empty() {
                BTreeSet::new()
            } else {
                asked.split(',').collect()
            };
            let state = twin.lock();
            let matching: Vec<Value> = state
                .jobs
                .values()
                .filter(|job| job.repo == key)
                .filter(|job| {
                    matches!(
                        job.status,
                        ForgejoJobStatus::Waiting | ForgejoJobStatus::Running
                    )
                })
                .filter(|job| {
                    !labels.is_empty() && job.runs_on.iter().all(|l| labels.contains(l.as_str()))
                })
                .map(|job| {
                    json!({
                        "id": job.id,
                        "repo_id": job.repo_id,
                        "owner_id": job.owner_id,
                        "name": job.name,
                        "needs": job.needs,
                        "runs_on": job.runs_on,
                        "task_id": job.task_id,
                        "status": job.status.as_str(),
                    })
                })
                .collect();
            // A Go nil slice encodes as `null`, not `[]`.
            let body = if matching.is_empty() {
                Value::Null
            } else {
                Value::Array(matching)
            };
            axum::Json(body).into_response()
        }
    };
    twin.record(&method, &uri, &headers, response.status());
    response
}

async fn registration_token(
    State(twin): State<ForgejoTwin>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Path((owner, repo)): Path<(String, String)>,
) -> Response {
    let response = match twin.admit(&owner, &repo, &headers, 0) {
        Err(refusal) => *refusal,
        Ok(key) => {
            let mut state = twin.lock();
            let token = state.repos.get_mut(&key).map(|r| {
                r.registration_token
                    .get_or_insert_with(random_token)
                    .clone()
            });
            axum::Json(json!({ "token": token })).into_response()
        }
    };
    twin.record(&method, &uri, &headers, response.status());
    response
}

/// Forgejo 15: `RegisterRunnerOptions {name (required), description, ephemeral}`.
async fn register_runner(
    State(twin): State<ForgejoTwin>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Path((owner, repo)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let response = match twin.admit(&owner, &repo, &headers, 15) {
        Err(refusal) => *refusal,
        Ok(key) => match serde_json::from_slice::<Value>(&body) {
            Err(_) => error(
                StatusCode::BAD_REQUEST,
                "invalid RegisterRunnerOptions",
                &headers,
            ),
            Ok(options) => match options["name"].as_str().filter(|n| !n.is_empty()) {
                None => error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "[Name]: Required",
                    &headers,
                ),
                Some(name) => {
                    let mut state = twin.lock();
                    let id = state.next_runner_id;
                    state.next_runner_id += 1;
                    let runner = RegisteredRunner {
                        id,
                        repo: key,
                        name: name.to_string(),
                        uuid: uuid_like(),
                        token: random_token(),
                        ephemeral: options["ephemeral"].as_bool().unwrap_or(false),
                    };
                    let body = json!({ "id": id, "uuid": runner.uuid, "token": runner.token });
                    state.runners.insert(id, runner);
                    (StatusCode::CREATED, axum::Json(body)).into_response()
                }
            },
        },
    };
    twin.record(&method, &uri, &headers, response.status());
    response
}

async fn delete_runner(
    State(twin): State<ForgejoTwin>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Path((owner, repo, runner_id)): Path<(String, String, String)>,
) -> Response {
    let response = match twin.admit(&owner, &repo, &headers, 15) {
        Err(refusal) => *refusal,
        Ok(key) => {
            let mut state = twin.lock();
            let found = runner_id
                .parse::<u64>()
                .ok()
                .filter(|id| state.runners.get(id).is_some_and(|r| r.repo == key));
            match found {
                Some(id) => {
                    state.runners.remove(&id);
                    StatusCode::NO_CONTENT.into_response()
                }
                None => error(
                    StatusCode::NOT_FOUND,
                    "The target couldn't be found.",
                    &headers,
                ),
            }
        }
    };
    twin.record(&method, &uri, &headers, response.status());
    response
}

/// A random version-4-shaped UUID, as Forgejo gives its runners.
fn uuid_like() -> String {
    let hex: String = (0..32)
        .map(|_| char::from_digit(rand::rng().random_range(0..16), 16).unwrap_or('0'))
        .collect();
    format!(
        "{}-{}-4{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

async fn not_found(
    State(twin): State<ForgejoTwin>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let response = error(
        StatusCode::NOT_FOUND,
        "The target couldn't be found.",
        &headers,
    );
    twin.record(&method, &uri, &headers, response.status());
    response
}
