//! The routes the twin serves, as GitHub documents them: which request is which endpoint, the
//! repository permission each needs (API-CONTRACTS §1.1–1.6) and the documentation its
//! refusals name. A repo route comes in either of GitHub's forms, by name or by id.

use axum::http::Method;

/// A route of the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Endpoint {
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
    pub(super) fn route(self) -> &'static str {
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
    pub(super) fn permission(self) -> Option<(&'static str, &'static str)> {
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

    pub(super) fn docs(self) -> &'static str {
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
pub(super) enum RepoRef {
    Name(String, String),
    Id(u64),
}

pub(super) fn parse_route(method: &Method, path: &str) -> Option<(Endpoint, Option<RepoRef>)> {
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
