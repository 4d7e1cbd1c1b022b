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
use axum::extract::{Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest as _, Sha256};

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
    /// The bearer token `/status` and `/metrics` require (`RUNNER_SCALER_LISTEN_TOKEN`);
    /// `None` serves them to anyone who reaches the address, which [`exposure_problem`]
    /// allows only on loopback.
    pub read_token: Option<ReadToken>,
}

/// Where `/status` and `/metrics` may be read, read once: they name private repos, parent
/// jobs, child ids and internal addresses, and a runner's job steps may share a network with
/// the daemon. Only the SHA-256 of the token is kept: comparing digests takes the same time
/// whatever prefix of the token a guess gets right.
#[derive(Clone)]
pub struct ReadToken([u8; 32]);

impl ReadToken {
    pub fn new(token: &SecretString) -> ReadToken {
        ReadToken(Sha256::digest(token.expose_secret().trim().as_bytes()).into())
    }

    fn admits(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        digest == self.0
    }
}

/// Why `addr` may not serve without a token: any address but loopback is reachable from
/// other hosts, and from job steps wherever runners share the network.
pub fn exposure_problem(addr: SocketAddr, token: Option<&ReadToken>) -> Option<String> {
    if token.is_some() || addr.ip().is_loopback() {
        return None;
    }
    Some(format!(
        "--listen {addr} is reachable beyond this host, and /status and /metrics name private \
         repos, parent jobs and child ids: set RUNNER_SCALER_LISTEN_TOKEN_FILE (a bearer \
         token Prometheus and `runner-scaler status` present; /livez and /healthz stay open), \
         or listen on 127.0.0.1"
    ))
}

pub fn router(endpoints: Endpoints) -> Router {
    // Health checks (Nomad's, a load balancer's) carry no token and learn nothing private.
    let guarded = Router::new()
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .route_layer(middleware::from_fn_with_state(
            endpoints.clone(),
            require_read_token,
        ));
    Router::new()
        .route("/livez", get(livez))
        .route("/healthz", get(healthz))
        .merge(guarded)
        .with_state(endpoints)
}

/// 401 unless the request carries `Authorization: Bearer <the read token>`, when there is one.
async fn require_read_token(State(e): State<Endpoints>, request: Request, next: Next) -> Response {
    let Some(token) = &e.read_token else {
        return next.run(request).await;
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, credential)| credential.trim());
    if presented.is_some_and(|p| token.admits(p)) {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, r#"Bearer realm="runner-scaler""#)],
        "a bearer token is required (RUNNER_SCALER_LISTEN_TOKEN)\n",
    )
        .into_response()
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
