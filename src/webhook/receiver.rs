//! The webhook listener's routes. Each handler verifies, looks up and hands a hint over; it
//! does no I/O, so it answers in microseconds and a flood of deliveries cannot slow a tick.
//!
//! Order of checks, each of which ends the request: the declared body size (413, before a
//! byte of the body is read), the body's size as it streams in (413, at the cap), signature
//! (401), delivery id present and well-formed (400), repeated delivery id or body (200),
//! event kind (200), payload shape (400), repo of the document (200), and only then a hint
//! (202). Until the signature holds, nothing is remembered. The connection around the
//! request (deadlines, cap, HTTP/1.1 only) is `serve::listener`'s.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use hyper::body::Body as _;
use tracing::debug;

use super::deliveries::{BodyDigest, DeliveryId, SeenDeliveries};
use super::hints::{Hints, Offered, WebhookForge};
use super::{WebhookSecrets, signature};
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::model::RepoName;

/// Largest body read, 64 KiB: a `workflow_job` delivery is a few KiB (the fixture's is
/// 7.5 KiB). It is the most an unauthenticated client makes the daemon hold per connection
/// before the signature is checked (issue 17: at 1 MiB, 60 half-sent bodies took 60 MB).
pub const WEBHOOK_BODY_MAX_BYTES: usize = 64 * 1024;

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
    // No `DefaultBodyLimit`: the handlers take the body unread and cap it themselves,
    // declared length first (`read_body`).
    router.with_state(receiver)
}

/// What became of one delivery; the `outcome` label of
/// `runner_scaler_webhook_deliveries_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// A hint was handed to the loop.
    Accepted,
    /// The delivery id, or the body under another id, was seen in the last ten minutes.
    Duplicate,
    BadSignature,
    /// Signed, but without a delivery id, or with one that is no forge's (over 128
    /// characters, or not printable ASCII).
    BadDeliveryId,
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
            Outcome::BadDeliveryId => "bad_delivery_id",
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
            Outcome::Malformed | Outcome::BadDeliveryId => StatusCode::BAD_REQUEST,
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

    /// Whether the delivery's event may change what a re-read of its repo finds: the kinds
    /// worth a look. `headers` tell Forgejo from Gitea, which post to the same route.
    fn is_hint_event(&self, headers: &HeaderMap, event: &str) -> bool {
        match self.forge {
            WebhookForge::GitHub => event == "workflow_job",
            WebhookForge::Forgejo if headers.contains_key("x-forgejo-event") => {
                is_forgejo_hint(event)
            }
            // Only Gitea's headers: Gitea (>= 1.24) sends job and run events of its own.
            WebhookForge::Forgejo => is_forgejo_hint(event) || is_gitea_hint(event),
        }
    }
}

/// What Forgejo sends that is worth a re-read (through 15.0.3 it has no job or run event,
/// modules/webhook/type.go): a push or a pull request may start runs, whose jobs then wait
/// for a runner (the hint's re-reads at +2 s and +5 s find them once Forgejo has created
/// them); `workflow_dispatch` starts one; `action_run_success`, `_failure` and `_recover`
/// (12.0) say a run ended, which may free a cap's room.
fn is_forgejo_hint(event: &str) -> bool {
    matches!(
        event,
        "push" | "pull_request" | "pull_request_sync" | "workflow_dispatch"
    ) || event
        .strip_prefix("action_run_")
        .is_some_and(|state| !state.is_empty())
}

/// Gitea's job and run events (`workflow_job`, `workflow_run`, 1.24), sent under Gitea's
/// headers only; Forgejo sends neither.
fn is_gitea_hint(event: &str) -> bool {
    matches!(event, "workflow_job" | "workflow_run")
}

async fn github(State(receiver): State<Receiver>, headers: HeaderMap, body: Body) -> Response {
    let body = read_body(body).await;
    receive(
        &receiver,
        &GITHUB,
        receiver.secrets.github.as_ref(),
        &headers,
        body,
    )
}

async fn forgejo(State(receiver): State<Receiver>, headers: HeaderMap, body: Body) -> Response {
    let body = read_body(body).await;
    receive(
        &receiver,
        &FORGEJO,
        receiver.secrets.forgejo.as_ref(),
        &headers,
        body,
    )
}

/// The body, read up to [`WEBHOOK_BODY_MAX_BYTES`]. A body whose declared length
/// (`Content-Length`, which hyper's body reports as its size) is over the cap is refused
/// before a byte of it is read; a streamed one (chunked) as soon as it passes the cap.
async fn read_body(body: Body) -> Result<Bytes, Outcome> {
    if body.size_hint().lower() > WEBHOOK_BODY_MAX_BYTES as u64 {
        return Err(Outcome::TooLarge);
    }
    match Limited::new(body, WEBHOOK_BODY_MAX_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(Outcome::TooLarge),
        // The client broke off, or sent a body hyper could not decode.
        Err(_) => Err(Outcome::Malformed),
    }
}

fn receive(
    receiver: &Receiver,
    forge: &ForgeHeaders,
    secret: Option<&secrecy::SecretString>,
    headers: &HeaderMap,
    body: Result<Bytes, Outcome>,
) -> Response {
    let event = ForgeHeaders::first(headers, forge.event).unwrap_or("");
    // Absent, not text (`to_str` takes visible ASCII only) or not a forge's: no id.
    let delivery = ForgeHeaders::first(headers, forge.delivery).and_then(DeliveryId::parse);
    let (outcome, repo) = judge(
        receiver,
        forge,
        secret,
        headers,
        event,
        delivery.as_ref(),
        body,
    );
    receiver
        .metrics
        .count_webhook_delivery(forge.forge.as_str(), outcome.as_str());
    debug!(
        forge = forge.forge.as_str(),
        event,
        // Only an id that passed the check is logged: the rest is the client's text.
        delivery = delivery.as_ref().map_or("-", DeliveryId::as_str),
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

/// Where a delivery names its repo: at the top (GitHub's and Gitea's events, Forgejo's
/// pushes, pull requests and dispatches) or only under its run (Forgejo's `action_run_*`).
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
    delivery: Option<&DeliveryId>,
    body: Result<Bytes, Outcome>,
) -> (Outcome, Option<RepoName>) {
    let body = match body {
        Ok(body) => body,
        Err(outcome) => return (outcome, None),
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
    // The id is not signed: a delivery without one, or with one no forge sends, could be
    // replayed under ever new ids, so it is refused rather than taken as new.
    let Some(id) = delivery else {
        return (Outcome::BadDeliveryId, None);
    };
    let now = receiver.clock.now();
    // What is signed is the body: the same body under a new id is the same delivery.
    let first = receiver
        .seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .first_sighting(forge.forge, id, BodyDigest::of(&body), now);
    if !first {
        return (Outcome::Duplicate, None);
    }
    if !forge.is_hint_event(headers, event) {
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
