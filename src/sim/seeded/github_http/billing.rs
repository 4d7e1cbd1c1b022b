//! Whose budget a request spends and which scope of the loop it serves: the App's budget for
//! JWT requests, the installation's or the polling token's for repo requests, each scoped as
//! the loop's own call is so that the invariant checker knows what a fault excuses. Also the
//! charge of an answered request and GitHub's refusal when a primary budget is spent.

use std::collections::BTreeMap;

use http::StatusCode;

use super::auth::{TokenAsk, token_ask};
use super::serve::{Reply, Route};
use super::service::{HttpState, Window};
use super::{APP_BUDGET, BUDGET_LIMIT};
use crate::config::{Mode, RepoConfig};
use crate::model::RepoName;
use crate::sim::seeded::ports::{Scope, Sim, budget_of};
use crate::sim::twins::github::TEST_APP_ID;

pub(super) const DOCS_RATE_LIMITS: &str =
    "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api";

/// One request as it meets faults and budgets: on whose budget, in which scope.
pub(super) struct Billing {
    pub(super) holder: String,
    pub(super) scope: Scope,
    pub(super) repo: RepoName,
    pub(super) what: &'static str,
    /// The rate-limit message of this holder.
    pub(super) exceeded: String,
}

/// Bills `route`: the repo, budget and scope of the request, and for a token request what it
/// asks for. `Err` is GitHub's answer to a request that names no known repo or installation,
/// or a token request it refuses.
pub(super) fn bill(
    route: &Route,
    sim: &Sim,
    state: &HttpState,
    installations: &BTreeMap<String, u64>,
    body: &[u8],
) -> Result<(Billing, Option<TokenAsk>), Reply> {
    let mut token_request = None;
    let billing = match route {
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
            let ask = token_ask(sim, installations, *installation, body)?;
            let TokenAsk {
                owner,
                repos,
                permissions: granted,
            } = &ask;
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
            token_request = Some(ask);
            app_billing(repo, scope, "create an installation access token")
        }
        Route::ListRuns(repo) | Route::ListJobs(repo, _) => {
            let Some(config) = sim.config.repos.get(repo) else {
                return Err(Reply::not_found());
            };
            repo_billing(config, installations, Scope::Queue(repo.clone()), "list")
        }
        Route::RegistrationToken(repo) | Route::GenerateJitConfig(repo) => {
            let Some(config) = sim.config.repos.get(repo) else {
                return Err(Reply::not_found());
            };
            repo_billing(
                config,
                installations,
                Scope::Mint(repo.clone()),
                "create a registration token",
            )
        }
        Route::ListRunners(repo) | Route::GetRunner(repo, _) | Route::DeleteRunner(repo, _) => {
            let Some(config) = sim.config.repos.get(repo) else {
                return Err(Reply::not_found());
            };
            repo_billing(
                config,
                installations,
                Scope::Runners(repo.clone()),
                match route {
                    Route::ListRunners(_) => "list runners",
                    Route::GetRunner(..) => "read a runner",
                    _ => "delete a runner",
                },
            )
        }
    };
    Ok((billing, token_request))
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
pub(super) fn exhausted(billing: &Billing, reset_s: u64) -> Reply {
    Reply::error(StatusCode::FORBIDDEN, &billing.exceeded, DOCS_RATE_LIMITS).rate(
        BUDGET_LIMIT,
        BUDGET_LIMIT,
        reset_s,
    )
}

/// Spends one request of the holder's window and counts it by repo, kind and holder; marks
/// the holder low past three quarters of its budget and out at the limit, as the client will
/// read them from the headers. The window as it stands after the charge.
pub(super) fn charge(
    state: &mut HttpState,
    sim: &mut Sim,
    billing: &Billing,
    kind: &'static str,
    t: u64,
) -> Window {
    let window = state.window(&billing.holder, t);
    window.used += 1;
    let window = *window;
    sim.requests.github_primary += 1;
    *sim.requests
        .github_primary_by_repo
        .entry(billing.repo.to_string())
        .or_default() += 1;
    *sim.requests.github_primary_by_kind.entry(kind).or_default() += 1;
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
    window
}
