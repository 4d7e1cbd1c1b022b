//! GitHub's REST API over the simulated world, in memory: the seeded world's `app` and
//! `vault` repos are served to the real [`GitHub`](crate::clients::github::GitHub) client
//! through a `tower` service instead of a socket (sockets under a paused clock misbehave), so
//! the client logic the benchmark measures runs inside the sweep: App JWTs and installation
//! tokens narrowed to one repo and permission, conditional requests with ETags, rate-limit
//! headers read into budgets, the 403-versus-429 classification, pagination by `Link`,
//! timeouts.
//!
//! Every request first meets the seed's faults through [`Sim::fault`](super::ports::Sim::fault)
//! (scoped like the loop's own calls, so the invariant checker knows what a fault excuses),
//! rendered as HTTP: a 502 or 503, a connection reset, a request that never answers (the
//! client's timeout fires on the paused clock), a 200 whose JSON is cut off, a 403 with
//! `x-ratelimit-remaining: 0` or a 429 with `retry-after`. Then the holder's primary budget
//! (5,000 requests per virtual hour) is checked and spent; a `304 Not Modified` spends nothing.
//!
//! Bodies follow the documentation examples in `tests/fixtures/github/` (as the twin's do):
//! the fields the world knows are filled in, the others kept from the example, except that a
//! run's `repository` and `head_repository` keep only their identifying fields (see
//! `minimal_repository` in `listings`).
//!
//! # Layout
//!
//! - `service`: [`GitHubHttp`] as a `tower` service, the bookkeeping it keeps between
//!   requests, and the three ways a request ends.
//! - `serve`: the path of one request, in order: route, bill, faults, credential, budget,
//!   answer, charge.
//! - `billing`: whose budget a request spends and which scope of the loop it serves.
//! - `faults`: the seed's faults rendered as HTTP.
//! - `auth`: the App's JWT, its installations, installation tokens and polling tokens.
//! - `listings`: the run and job listings, their ETags and their bodies.
//! - `runners`: registration tokens, JIT configurations, runner listings and deletions.
//! - `forge`: the ports the loop calls ([`GitHubForge`], [`SimSecrets`]), over the real client.

mod auth;
mod billing;
mod faults;
mod forge;
mod listings;
mod runners;
mod serve;
mod service;
#[cfg(test)]
mod tests;

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};

use super::world::EPOCH_UNIX;
pub use forge::{GitHubForge, SimSecrets};
pub use service::GitHubHttp;

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
