//! The path every request takes through the twin, in GitHub's order: the User-Agent and API
//! version checks, the route, the credential (the App's JWT or a token) and what it grants,
//! the rate limit, the answer, then the conditional request (a matching `If-None-Match` is a
//! 304 that costs nothing) and the charge. Every request leaves a [`LoggedRequest`] behind.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::{Value, json};

use super::app_auth::{GrantView, Holder, bearer};
use super::query::Query;
use super::routes::{Endpoint, RepoRef, parse_route};
use super::state::Twin;
use super::{API_VERSION, GitHubTwin};
use crate::model::RepoName;

pub(super) const DOCS_REST: &str = "https://docs.github.com/rest";

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

/// A response under construction.
pub(super) struct Reply {
    pub(super) status: StatusCode,
    pub(super) headers: Vec<(&'static str, String)>,
    pub(super) body: Option<Value>,
}

impl Reply {
    pub(super) fn json(status: StatusCode, body: Value) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: Some(body),
        }
    }

    pub(super) fn error(status: StatusCode, message: &str, docs: &str) -> Reply {
        Reply::json(
            status,
            json!({ "message": message, "documentation_url": docs }),
        )
    }

    pub(super) fn not_found() -> Reply {
        Reply::error(StatusCode::NOT_FOUND, "Not Found", DOCS_REST)
    }

    pub(super) fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }
}

/// A weak ETag of a body: the same body, the same tag.
fn etag_of(body: &str) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut hasher);
    format!("W/\"{:016x}\"", hasher.finish())
}

pub(super) fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

impl GitHubTwin {
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
}

impl Twin {
    pub(super) fn serve(
        &mut self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Response {
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

    /// A repo route the grant allows, answered from the repo's state (which exists).
    fn repo_endpoint(
        &mut self,
        endpoint: Endpoint,
        repo: &RepoName,
        query: &Query,
        base: &str,
    ) -> Reply {
        match endpoint {
            Endpoint::ListRuns => self.list_runs(repo, query, base),
            Endpoint::ListJobs(run_id) => self.list_jobs(repo, run_id, query, base),
            Endpoint::GetJob(job_id) => self.get_job(repo, job_id, base),
            // Served by `generate_jit_config`, which registers the runner.
            Endpoint::GenerateJitConfig => Reply::not_found(),
            Endpoint::CreateRegistrationToken => self.create_registration_token(),
            Endpoint::ListRunners => self.list_runners(repo, query, base),
            Endpoint::GetRunner(id) => self.get_runner(repo, id),
            Endpoint::DeleteRunner(id) => self.delete_runner(repo, id, endpoint.docs()),
            Endpoint::GetAppInstallation(_)
            | Endpoint::CreateAccessToken(_)
            | Endpoint::GetRepoInstallation => Reply::not_found(),
        }
    }
}
