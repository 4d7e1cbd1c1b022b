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
//!
//! # Layout
//!
//! - this file: the [`GitHubTwin`] handle, its test App, its clock and the HTTP entry point
//!   (where the latency is added).
//! - `state`: what the twin holds (repos with their runs, jobs and runners; tokens, budgets
//!   and records) and the views the world and tests read.
//! - `world`: the levers that move runs, jobs and runner registrations.
//! - `requests`: the path every request takes, in GitHub's order, and the log it leaves.
//! - `routes`: the documented routes and the repository permission each needs.
//! - `app_auth`: App JWTs, installations, installation tokens and PATs.
//! - `rate_limits`: primary budgets, their headers, and the refusals a test can force on.
//! - `runs`: the run and job routes; `runners`: registration tokens, JIT configs, runners.
//! - `query`: the query string, the runs filter and GitHub's pagination (`Link`).
//! - `templates`: the documentation examples the bodies are built from.

mod app_auth;
mod query;
mod rate_limits;
mod requests;
mod routes;
mod runners;
mod runs;
mod state;
mod templates;
mod world;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use chrono::{DateTime, Duration, Utc};
use jsonwebtoken::DecodingKey;

use super::TwinServer;
pub use app_auth::{
    GrantView, JWT_UNDECODABLE, TokenRequest, check_app_jwt, stateless_installation_token,
};
pub(crate) use query::Query;
pub use query::RUN_SEARCH_CAP;
pub use rate_limits::{BUDGET_LIMIT_DEFAULT, RateLimitAnswer};
pub use requests::LoggedRequest;
pub use routes::accepted_permissions;
pub(crate) use runners::{
    DOCS_JIT, JIT_NAME_TAKEN, JitRequest, jit_config_json, runner_labels_json,
};
use state::Twin;
pub use state::{
    DeletedRunner, JobView, RunGate, RunIds, RunnerPresence, RunnerView, TwinJobStatus,
};
pub(crate) use templates::TEMPLATES;

/// The App id of the twin's test App.
pub const TEST_APP_ID: &str = "12345";
/// Private key of the twin's test App. A throw-away key that protects nothing (see
/// `tests/fixtures/README.md`); the daemon signs with it in tests and `simulate`.
pub const TEST_APP_PRIVATE_KEY_PEM: &str =
    include_str!("../../../../tests/fixtures/github/test-only-app-key.pem");
pub const TEST_APP_PUBLIC_KEY_PEM: &str =
    include_str!("../../../../tests/fixtures/github/test-only-app-key.pub.pem");

/// The only API version the twin serves; GitHub answers 400 to a version it does not know.
pub const API_VERSION: &str = "2022-11-28";

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
            state: Arc::new(Mutex::new(Twin::new(app_id, app_key))),
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
    use axum::body::Body;
    use axum::http::StatusCode;

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
}
