//! The webhook listener's routes. Each handler verifies, looks up and hands a hint over; it
//! does no I/O, so it answers in microseconds and a flood of deliveries cannot slow a tick.
//!
//! Order of checks, each of which ends the request: body size (413), signature (401),
//! repeated delivery id (200), event kind (200), payload shape (400), repo of the document
//! (200), and only then a hint (202). Until the signature holds, nothing is remembered.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tracing::debug;

use super::deliveries::SeenDeliveries;
use super::hints::{Hints, Offered, WebhookForge};
use super::{WebhookSecrets, signature};
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::model::RepoName;

/// Largest body read, 1 MiB: a `workflow_job` payload is a few KiB.
pub const BODY_MAX: usize = 1024 * 1024;

pub const GITHUB_PATH: &str = "/webhook/github";
pub const FORGEJO_PATH: &str = "/webhook/forgejo";

/// What the handlers share.
#[derive(Clone)]
pub struct Receiver {
    secrets: Arc<WebhookSecrets>,
    hints: Hints,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    seen: Arc<Mutex<SeenDeliveries>>,
}

impl Receiver {
    pub fn new(
        secrets: WebhookSecrets,
        hints: Hints,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Receiver {
        Receiver {
            secrets: Arc::new(secrets),
            hints,
            metrics,
            clock,
            seen: Arc::default(),
        }
    }
}

/// The routes of the forges that have a secret. A forge without one gets 404: there is no
/// receiver for it (rather than 503, which says "try later", when only a restart with the
/// secret set changes the answer).
pub fn router(receiver: Receiver) -> Router {
    let mut router = Router::new();
    if receiver.secrets.github.is_some() {
        router = router.route(GITHUB_PATH, post(github));
    }
    if receiver.secrets.forgejo.is_some() {
        router = router.route(FORGEJO_PATH, post(forgejo));
    }
    router
        .layer(DefaultBodyLimit::max(BODY_MAX))
        .with_state(receiver)
}

/// What became of one delivery; the `outcome` label of
/// `runner_scaler_webhook_deliveries_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// A hint was handed to the loop.
    Accepted,
    /// The delivery id was seen in the last ten minutes.
    Duplicate,
    BadSignature,
    TooLarge,
    /// The document has no such repo for this forge.
    UnconfiguredRepo,
    /// Not a job event (`ping`, or anything else the hook sends).
    IgnoredEvent,
    /// Signed, but not JSON with a `repository.full_name` naming a repo.
    Malformed,
    /// This copy runs no loop (a standby): the leader's copy acts on its own deliveries.
    NotLeader,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Duplicate => "duplicate",
            Outcome::BadSignature => "bad_signature",
            Outcome::TooLarge => "too_large",
            Outcome::UnconfiguredRepo => "unconfigured_repo",
            Outcome::IgnoredEvent => "ignored_event",
            Outcome::Malformed => "malformed",
            Outcome::NotLeader => "not_leader",
        }
    }

    fn status(self) -> StatusCode {
        match self {
            Outcome::Accepted => StatusCode::ACCEPTED,
            Outcome::BadSignature => StatusCode::UNAUTHORIZED,
            Outcome::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Outcome::Malformed => StatusCode::BAD_REQUEST,
            Outcome::Duplicate
            | Outcome::UnconfiguredRepo
            | Outcome::IgnoredEvent
            | Outcome::NotLeader => StatusCode::OK,
        }
    }
}

/// The headers one forge sends, in order of preference.
struct ForgeHeaders {
    forge: WebhookForge,
    signature: &'static [&'static str],
    /// Stripped from the signature header's value; the rest is hex.
    signature_prefix: &'static str,
    event: &'static [&'static str],
    delivery: &'static [&'static str],
}

const GITHUB: ForgeHeaders = ForgeHeaders {
    forge: WebhookForge::GitHub,
    signature: &["x-hub-signature-256"],
    signature_prefix: "sha256=",
    event: &["x-github-event"],
    delivery: &["x-github-delivery"],
};

/// Forgejo sends each header under its own name and under Gitea's (and, for the event and
/// the delivery, GitHub's and Gogs'); its own wins when present.
const FORGEJO: ForgeHeaders = ForgeHeaders {
    forge: WebhookForge::Forgejo,
    signature: &["x-forgejo-signature", "x-gitea-signature"],
    signature_prefix: "",
    event: &["x-forgejo-event", "x-gitea-event"],
    delivery: &["x-forgejo-delivery", "x-gitea-delivery"],
};

impl ForgeHeaders {
    fn first<'h>(headers: &'h HeaderMap, names: &[&str]) -> Option<&'h str> {
        // The first header present is the one used: a bad Forgejo signature is not
        // rescued by a good Gitea one.
        let value = names.iter().find_map(|name| headers.get(*name))?;
        value.to_str().ok()
    }

    /// Whether `event` announces a change of a job or a run, the kinds worth a look.
    fn is_job_event(&self, event: &str) -> bool {
        match self.forge {
            WebhookForge::GitHub => event == "workflow_job",
            // Forgejo names one event per state (`workflow_job_waiting` is a job ready for a
            // runner; `workflow_run_waiting`, `workflow_run_running`, …), and older releases
            // send only `action_run_success`/`_failure` when a run ends, which may free a cap's
            // room; Gitea sends `workflow_job` and `workflow_run`.
            WebhookForge::Forgejo => {
                ["workflow_job", "workflow_run", "action_run"]
                    .iter()
                    .any(|kind| {
                        event
                            .strip_prefix(kind)
                            .is_some_and(|rest| rest.is_empty() || rest.starts_with('_'))
                    })
            }
        }
    }
}

async fn github(
    State(receiver): State<Receiver>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    receive(
        &receiver,
        &GITHUB,
        receiver.secrets.github.as_ref(),
        &headers,
        body,
    )
}

async fn forgejo(
    State(receiver): State<Receiver>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    receive(
        &receiver,
        &FORGEJO,
        receiver.secrets.forgejo.as_ref(),
        &headers,
        body,
    )
}

fn receive(
    receiver: &Receiver,
    forge: &ForgeHeaders,
    secret: Option<&secrecy::SecretString>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let event = ForgeHeaders::first(headers, forge.event).unwrap_or("");
    let delivery = ForgeHeaders::first(headers, forge.delivery);
    let (outcome, repo) = judge(receiver, forge, secret, headers, event, delivery, body);
    receiver
        .metrics
        .count_webhook_delivery(forge.forge.as_str(), outcome.as_str());
    debug!(
        forge = forge.forge.as_str(),
        event,
        delivery = delivery.unwrap_or("-"),
        repo = repo.as_ref().map(|r| r.to_string()).unwrap_or_default(),
        outcome = outcome.as_str(),
        "webhook delivery"
    );
    (
        outcome.status(),
        axum::Json(serde_json::json!({ "outcome": outcome.as_str() })),
    )
        .into_response()
}

/// Where a delivery names its repo: at the top (GitHub, Gitea, Forgejo job events of some
/// releases) or only under its run (Forgejo's `action_run_*` and `workflow_run_*`, and job
/// events of later releases).
#[derive(serde::Deserialize)]
struct Payload {
    repository: Option<PayloadRepository>,
    run: Option<PayloadRun>,
}

#[derive(serde::Deserialize)]
struct PayloadRun {
    repository: Option<PayloadRepository>,
}

#[derive(serde::Deserialize)]
struct PayloadRepository {
    full_name: String,
}

impl Payload {
    fn repo(self) -> Option<RepoName> {
        let repository = self
            .repository
            .or_else(|| self.run.and_then(|run| run.repository))?;
        RepoName::parse(&repository.full_name)
    }
}

fn judge(
    receiver: &Receiver,
    forge: &ForgeHeaders,
    secret: Option<&secrecy::SecretString>,
    headers: &HeaderMap,
    event: &str,
    delivery: Option<&str>,
    body: Result<Bytes, BytesRejection>,
) -> (Outcome, Option<RepoName>) {
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return (Outcome::TooLarge, None);
        }
        Err(_) => return (Outcome::Malformed, None),
    };
    let Some(secret) = secret else {
        // Unreachable through the router, which mounts no route without a secret.
        return (Outcome::BadSignature, None);
    };
    let verified = ForgeHeaders::first(headers, forge.signature)
        .and_then(|value| value.strip_prefix(forge.signature_prefix))
        .is_some_and(|tag| signature::verify(secret, &body, tag));
    if !verified {
        return (Outcome::BadSignature, None);
    }
    let now = receiver.clock.now();
    if let Some(id) = delivery {
        let first = receiver
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .first_sighting(forge.forge, id, now);
        if !first {
            return (Outcome::Duplicate, None);
        }
    }
    if !forge.is_job_event(event) {
        return (Outcome::IgnoredEvent, None);
    }
    let Some(repo) = serde_json::from_slice::<Payload>(&body)
        .ok()
        .and_then(Payload::repo)
    else {
        return (Outcome::Malformed, None);
    };
    let outcome = match receiver.hints.offer(forge.forge, repo.clone(), now) {
        Offered::Accepted => Outcome::Accepted,
        Offered::UnconfiguredRepo => Outcome::UnconfiguredRepo,
        Offered::NotLeading => Outcome::NotLeader,
    };
    (outcome, Some(repo))
}

/// Binds `addr`; the error names the address, the setting and the cause (exit 64).
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, String> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        format!(
            "listen for webhooks on {addr} (--webhook-listen, RUNNER_SCALER_WEBHOOK_LISTEN): {e}"
        )
    })
}
