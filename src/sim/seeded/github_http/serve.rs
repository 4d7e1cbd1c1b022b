//! The path of one request through the in-memory GitHub, in order: the route; whose budget it
//! spends and which scope of the loop it serves; the seed's faults; the credential; the
//! primary budget; the answer (a listing whose ETag the client sent is a free 304); then the
//! charge, and the cut-off body a malformed fault asks for.

use http::request::Parts;
use http::{HeaderValue, Method, Response, StatusCode};
use serde_json::json;

use super::BUDGET_LIMIT;
use super::auth::{authorize, installations, mint_access_token, repo_installation, verify_jwt};
use super::billing::{bill, charge, exhausted};
use super::faults::faulted;
use super::listings::{jobs_page, render_jobs, render_runs, runs_page};
use super::runners::{
    delete_runner, generate_jit_config, get_runner, list_runners, registration_token,
};
use super::service::{GitHubHttp, Served};
use crate::model::{ErrorClass, RepoName};
use crate::observe::PortError;
use crate::sim::seeded::options::Service;
use crate::sim::seeded::ports::{Call, Fault, Scope, Sim, lock};
use crate::sim::seeded::world::EPOCH_UNIX;
use crate::sim::twins::github::Query;

pub(super) const DOCS_REST: &str = "https://docs.github.com/rest";
/// Ids of repos (`/repositories/{id}` in `Link` URLs) count from here, in document order.
const REPO_ID_BASE: u64 = 70_000;

/// The route of a request the daemon makes.
pub(super) enum Route {
    RepoInstallation(RepoName),
    AccessToken(u64),
    ListRuns(RepoName),
    ListJobs(RepoName, u64),
    RegistrationToken(RepoName),
    GenerateJitConfig(RepoName),
    ListRunners(RepoName),
    GetRunner(RepoName, u64),
    DeleteRunner(RepoName, u64),
}

/// An answer under construction.
pub(super) struct Reply {
    pub(super) status: StatusCode,
    pub(super) headers: Vec<(&'static str, String)>,
    pub(super) body: String,
}

impl Reply {
    pub(super) fn json(status: StatusCode, body: String) -> Reply {
        Reply {
            status,
            headers: vec![("content-type", "application/json; charset=utf-8".into())],
            body,
        }
    }

    pub(super) fn error(status: StatusCode, message: &str, docs: &str) -> Reply {
        Reply::json(
            status,
            json!({ "message": message, "documentation_url": docs }).to_string(),
        )
    }

    pub(super) fn not_found() -> Reply {
        Reply::error(StatusCode::NOT_FOUND, "Not Found", DOCS_REST)
    }

    pub(super) fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }

    pub(super) fn rate(self, limit: u64, used: u64, reset_s: u64) -> Reply {
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

    pub(super) fn into_response(self) -> Response<String> {
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

pub(super) fn repo_id(sim: &Sim, repo: &RepoName) -> u64 {
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
            Route::GetRunner(..) => "GET runner",
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
        ("GET", ["actions", "runners", runner]) => Some(Route::GetRunner(repo, id(runner)?)),
        ("DELETE", ["actions", "runners", runner]) => Some(Route::DeleteRunner(repo, id(runner)?)),
        _ => None,
    }
}

impl GitHubHttp {
    pub(super) fn serve(&self, parts: &Parts, body: &[u8]) -> Served {
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
        let (billing, token_request) = match bill(&route, sim, &state, &installations, body) {
            Ok(billed) => billed,
            Err(refusal) => return Served::Answer(refusal.into_response()),
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
        if let (Some(fault), Some(ask)) = (&fault, &token_request)
            && ask.repos.len() > 1
        {
            let e = fault.error(billing.what);
            for repo in &ask.repos {
                sim.record_fault(&Scope::Queue(repo.clone()), Service::GitHub, &e);
                sim.record_fault(&Scope::Runners(repo.clone()), Service::GitHub, &e);
            }
        }
        let window = *state.window(&billing.holder, t);
        if let Some(served) = faulted(fault, &billing, window, t) {
            return served;
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
            Route::ListRunners(repo) | Route::GetRunner(repo, _) => {
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
            Route::RepoInstallation(repo) => Ok(repo_installation(&installations, repo)),
            Route::AccessToken(installation) => Ok(mint_access_token(
                &mut state,
                sim,
                *installation,
                token_request.expect("set for this route"),
                t,
            )),
            Route::ListRuns(repo) => {
                let page = runs_page(sim, repo, &query);
                listed(page.etag.clone(), page.link.clone(), &|| render_runs(&page))
            }
            Route::ListJobs(repo, run) => match jobs_page(sim, repo, *run, &query) {
                Some((run, page)) => {
                    // A page the client can read tells it who runs what (a 304 repeats
                    // what it already holds).
                    if !malformed {
                        for job in page.running() {
                            sim.world.job_served_running(job, t);
                        }
                    }
                    listed(page.etag.clone(), page.link.clone(), &|| {
                        render_jobs(run, &page)
                    })
                }
                None => Ok(Reply::not_found()),
            },
            Route::RegistrationToken(_) => Ok(registration_token(sim, t)),
            Route::GenerateJitConfig(repo) => Ok(generate_jit_config(sim, repo, body, t)),
            Route::ListRunners(repo) => Ok(list_runners(sim, repo, &query, t, !malformed)),
            Route::GetRunner(repo, id) => Ok(get_runner(sim, repo, *id, t, !malformed)),
            Route::DeleteRunner(repo, id) => Ok(delete_runner(sim, repo, *id, t)),
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
        let window = charge(&mut state, sim, &billing, route.kind(), t);
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
