//! The daemon's one HTTP listener (`--listen`): `/metrics`, `/livez`, `/healthz`, `/status`.
//!
//! Read-only: every handler reads [`Metrics`], the last tick's view the loop published and
//! the clock; none reaches the loop or a service, so a request can neither slow a tick nor
//! trigger one.
//!
//! Both listeners serve through [`listener`]: HTTP/1.1 only, one request per connection,
//! header and request deadlines, a connection cap, and a shutdown that waits for nobody idle.

pub mod health;
pub mod listener;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use tokio::sync::watch;

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::report::TickView;
use crate::report::live::{LiveStatus, Role};

/// The content type `prometheus-client` writes (OpenMetrics text, which Prometheus asks for
/// first).
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the handlers read.
#[derive(Clone)]
pub struct Endpoints {
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    /// The view of the last tick, as the loop publishes it; `None` before the first.
    pub last_tick: watch::Receiver<Option<TickView>>,
    /// Who this daemon is: leader, standby or shadow.
    pub role: watch::Receiver<Role>,
}

pub fn router(endpoints: Endpoints) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(livez))
        .route("/healthz", get(healthz))
        .route("/status", get(status))
        .with_state(endpoints)
}

#[derive(serde::Deserialize)]
struct StatusQuery {
    format: Option<String>,
}

/// `GET /status`: the live status as JSON, or with `?format=text` the table
/// `runner-scaler status` prints. No secret is in it: the view carries names, counts and
/// reasons only.
async fn status(State(e): State<Endpoints>, Query(query): Query<StatusQuery>) -> Response {
    let role = e.role.borrow().clone();
    let live = LiveStatus {
        tick: match role {
            // A standby runs no ticks; the leader has the status.
            Role::Standby { .. } => None,
            _ => e.last_tick.borrow().clone(),
        },
        role,
    };
    match query.format.as_deref() {
        Some("text") => (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            live.render_text(),
        )
            .into_response(),
        _ => axum::Json(live).into_response(),
    }
}

async fn metrics(State(e): State<Endpoints>) -> Response {
    ([(header::CONTENT_TYPE, OPENMETRICS)], e.metrics.encode()).into_response()
}

async fn livez(State(e): State<Endpoints>) -> Response {
    answer(health::livez(&e.metrics.health_facts(), e.clock.now()))
}

async fn healthz(State(e): State<Endpoints>) -> Response {
    answer(health::healthz(&e.metrics.health_facts(), e.clock.now()))
}

/// 200 or 503, with the verdict and its reasons as JSON.
fn answer(health: health::Health) -> Response {
    let status = if health.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(health)).into_response()
}

/// Binds `addr`; the error names the address and the cause (a bad setting: exit 64).
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, String> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("listen on {addr} (--listen, RUNNER_SCALER_LISTEN): {e}"))
}

/// Serves `router` on `listener` under the shipped [`listener::Limits`] until `shutdown`
/// completes, then until its connections have ended (idle ones at once, a request in flight
/// within [`listener::SHUTDOWN_GRACE`]); `what` names it in log lines
/// (`/metrics, /livez and /healthz`, `webhooks`).
pub fn spawn(
    what: &'static str,
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    listener::spawn(
        what,
        listener,
        router,
        listener::Limits::default(),
        shutdown,
    )
}
