//! The runner routes: registration tokens, JIT configurations (which register the runner,
//! offline, under the name asked for), and listing, reading and deleting registrations (a
//! busy runner is refused with a 422). The seeded world's in-memory GitHub shares the JIT
//! request checks, the JIT body and the labels as GitHub lists them.

use axum::http::StatusCode;
use chrono::SecondsFormat;
use serde_json::{Value, json};

use super::app_auth::{TOKEN_LIFETIME, random_string};
use super::query::{Query, paginate, with_link};
use super::requests::Reply;
use super::state::{DeletedRunner, RunnerState, Twin};
use super::templates::TEMPLATES;
use crate::model::RepoName;

impl Twin {
    /// `POST …/actions/runners/generate-jitconfig` (API-CONTRACTS §1.5): validates the body
    /// as GitHub documents it, registers the runner offline under the given name and labels,
    /// and answers 201 with the runner and an encoded configuration that is a fresh secret.
    pub(super) fn generate_jit_config(&mut self, repo: &RepoName, body: &[u8]) -> Reply {
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

    /// `POST …/actions/runners/registration-token`: a fresh token, valid for an hour.
    pub(super) fn create_registration_token(&mut self) -> Reply {
        let now = self.now();
        let token = random_string(29, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567");
        let mut body = TEMPLATES.registration_token.clone();
        body["token"] = json!(token);
        body["expires_at"] =
            json!((now + TOKEN_LIFETIME).to_rfc3339_opts(SecondsFormat::Millis, true));
        self.issued.push(token);
        Reply::json(StatusCode::CREATED, body)
    }

    /// `GET …/actions/runners`, filtered by exact `name`.
    pub(super) fn list_runners(&self, repo: &RepoName, query: &Query, base: &str) -> Reply {
        let state = self.repos.get(repo).expect("checked by the caller");
        let links = format!("{base}/repositories/{}", state.id);
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

    /// `GET …/actions/runners/{runner_id}`.
    pub(super) fn get_runner(&self, repo: &RepoName, id: u64) -> Reply {
        let state = self.repos.get(repo).expect("checked by the caller");
        match state.runners.get(&id) {
            Some(runner) => Reply::json(StatusCode::OK, runner_json(runner)),
            None => Reply::not_found(),
        }
    }

    /// `DELETE …/actions/runners/{runner_id}`: refused with a 422 naming `docs` while the
    /// runner is busy.
    pub(super) fn delete_runner(&mut self, repo: &RepoName, id: u64, docs: &str) -> Reply {
        let state = self.repos.get(repo).expect("checked by the caller");
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
                docs,
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
