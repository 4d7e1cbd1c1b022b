//! Webhooks as hints, over real HTTP: the receiver (`runner_scaler::webhook::router`) served
//! on 127.0.0.1:0 and asked with reqwest, as GitHub and Forgejo would. Every refusal is
//! checked twice: by its status and outcome, and by the hint board, which must be unchanged.
//! The receiver's clock is set by the test, so the re-polls at +2 s and +5 s are read off
//! the board without waiting.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use runner_scaler::clock::Clock;
use runner_scaler::metrics::Metrics;
use runner_scaler::model::RepoName;
use runner_scaler::serve::spawn;
use runner_scaler::webhook::signature::sign;
use runner_scaler::webhook::{
    Hints, Receiver, WEBHOOK_BODY_MAX_BYTES, WebhookSecrets, bind, router,
};
use secrecy::SecretString;
use support::fixtures::fixture_text;
use support::twins::{config, repo};

const GITHUB_SECRET: &str = "canary-github-webhook-secret-6d1e";
const FORGEJO_SECRET: &str = "canary-forgejo-webhook-secret-a93b";
/// The fixture's repository (`Codertocat/Hello-World`), as the document keys it.
const FIXTURE_REPO: &str = "codertocat/hello-world";

/// The document the loop runs on: the fixture's repo on GitHub, one Forgejo repo.
const DOCUMENT: &str = r#"{
  "codertocat/hello-world": { "mode": "app" },
  "forge/builds": { "mode": "forgejo", "forgejoUrl": "https://forgejo.example", "vaultPath": "forgejo/builds", "labels": ["build"] }
}"#;

/// The time the receiver reads, set by the test.
struct TestClock(Mutex<DateTime<Utc>>);

impl Clock for TestClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap()
    }
}

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_790_000_000, 0).unwrap()
}

fn at(ms: i64) -> DateTime<Utc> {
    t0() + chrono::Duration::milliseconds(ms)
}

struct Served {
    base: String,
    hints: Hints,
    metrics: Arc<Metrics>,
    http: reqwest::Client,
}

async fn serve_with(secrets: WebhookSecrets) -> Served {
    let hints = Hints::new();
    hints.follow(&config(DOCUMENT));
    let metrics = Arc::new(Metrics::default());
    let clock = Arc::new(TestClock(Mutex::new(t0())));
    let receiver = Receiver::new(secrets, hints.clone(), metrics.clone(), clock);
    let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    spawn(
        "webhooks",
        listener,
        router(receiver),
        std::future::pending(),
    );
    Served {
        base,
        hints,
        metrics,
        http: http(),
    }
}

fn http() -> reqwest::Client {
    runner_scaler::clients::http::install_crypto_provider();
    reqwest::Client::new()
}

async fn serve() -> Served {
    serve_with(WebhookSecrets {
        github: Some(SecretString::from(GITHUB_SECRET)),
        forgejo: Some(SecretString::from(FORGEJO_SECRET)),
    })
    .await
}

fn queued_payload() -> String {
    fixture_text("github", "webhook-workflow_job-queued.payload.json")
}

/// A `workflow_job` payload for `full_name`, the fixture's own shape.
fn payload_for(full_name: &str) -> String {
    let mut value: serde_json::Value = serde_json::from_str(&queued_payload()).unwrap();
    value["repository"]["full_name"] = full_name.into();
    value.to_string()
}

/// [`payload_for`] about job `job_id`: another event, so another body (and digest).
fn job_payload(full_name: &str, job_id: u64) -> String {
    let mut value: serde_json::Value = serde_json::from_str(&payload_for(full_name)).unwrap();
    value["workflow_job"]["id"] = job_id.into();
    value.to_string()
}

impl Served {
    /// A GitHub delivery, signed with `secret`: (status, outcome).
    async fn github(&self, event: &str, delivery: &str, body: &str, secret: &str) -> (u16, String) {
        let signature = format!("sha256={}", sign(secret, body.as_bytes()));
        self.post(
            "/webhook/github",
            &[
                ("X-GitHub-Event", event),
                ("X-GitHub-Delivery", delivery),
                ("X-Hub-Signature-256", &signature),
            ],
            body.as_bytes().to_vec(),
        )
        .await
    }

    async fn post(&self, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> (u16, String) {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("Content-Type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request
            .body(body)
            .send()
            .await
            .expect("the receiver answers");
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        (status, body["outcome"].as_str().unwrap_or("").to_string())
    }

    /// `runner_scaler_webhook_deliveries_total{forge, outcome}`, 0 when absent.
    fn count(&self, forge: &str, outcome: &str) -> u64 {
        let text = self.metrics.encode();
        let series = format!(
            "runner_scaler_webhook_deliveries_total{{forge=\"{forge}\",outcome=\"{outcome}\"}} "
        );
        text.lines()
            .find_map(|line| line.strip_prefix(&series))
            .map_or(0, |n| n.trim().parse().unwrap())
    }

    /// Asserts that the board holds no hint at all.
    fn assert_no_hint(&self) {
        assert_eq!(self.hints.next_due(), None, "a hint was handed over");
        assert!(self.hints.take_due(at(60_000)).is_empty());
    }
}

#[tokio::test]
async fn a_good_delivery_for_a_configured_repo_asks_for_polls_at_once_and_at_two_and_five_seconds()
{
    let served = serve().await;
    let (status, outcome) = served
        .github("workflow_job", "d-1", &queued_payload(), GITHUB_SECRET)
        .await;
    assert_eq!((status, outcome.as_str()), (202, "accepted"));
    assert_eq!(served.count("github", "accepted"), 1);

    let hinted: Vec<RepoName> = vec![repo(FIXTURE_REPO)];
    assert_eq!(served.hints.next_due(), Some(t0()));
    assert_eq!(served.hints.take_due(t0()), hinted);
    assert!(served.hints.take_due(at(1_999)).is_empty());
    assert_eq!(served.hints.next_due(), Some(at(2_000)));
    assert_eq!(served.hints.take_due(at(2_000)), hinted);
    assert!(served.hints.take_due(at(4_999)).is_empty());
    assert_eq!(served.hints.take_due(at(5_000)), hinted);
    assert_eq!(served.hints.next_due(), None);
}

#[tokio::test]
async fn a_bad_signature_is_refused_with_401_and_changes_nothing() {
    let served = serve().await;
    let body = queued_payload();
    let (status, outcome) = served
        .github("workflow_job", "d-1", &body, "not-the-secret")
        .await;
    assert_eq!((status, outcome.as_str()), (401, "bad_signature"));
    // No signature at all, and a signature without GitHub's `sha256=` prefix.
    let bare = sign(GITHUB_SECRET, body.as_bytes());
    for headers in [
        vec![("X-GitHub-Event", "workflow_job")],
        vec![
            ("X-GitHub-Event", "workflow_job"),
            ("X-Hub-Signature-256", bare.as_str()),
        ],
    ] {
        let (status, _) = served
            .post("/webhook/github", &headers, body.clone().into_bytes())
            .await;
        assert_eq!(status, 401);
    }
    assert_eq!(served.count("github", "bad_signature"), 3);
    served.assert_no_hint();

    // The refused delivery's id was not remembered: signed right, it is accepted.
    let (status, _) = served
        .github("workflow_job", "d-1", &body, GITHUB_SECRET)
        .await;
    assert_eq!(status, 202);
}

#[tokio::test]
async fn a_repeated_delivery_gives_no_second_hint() {
    let served = serve().await;
    let body = queued_payload();
    assert_eq!(
        served
            .github("workflow_job", "d-7", &body, GITHUB_SECRET)
            .await
            .0,
        202
    );
    // The first hint's polls, all served.
    for ms in [0, 2_000, 5_000] {
        assert_eq!(served.hints.take_due(at(ms)).len(), 1);
    }
    let (status, outcome) = served
        .github("workflow_job", "d-7", &body, GITHUB_SECRET)
        .await;
    assert_eq!((status, outcome.as_str()), (200, "duplicate"));
    assert_eq!(served.count("github", "duplicate"), 1);
    served.assert_no_hint();
}

/// Takes the first hint's three polls (at once, +2 s, +5 s), leaving the board empty.
fn take_first_hint(served: &Served) {
    for ms in [0, 2_000, 5_000] {
        assert_eq!(served.hints.take_due(at(ms)), vec![repo(FIXTURE_REPO)]);
    }
    served.assert_no_hint();
}

/// The signature covers the body only: a captured delivery replayed under a fresh id is still
/// signed right, and must not cost another full read of the repo.
#[tokio::test]
async fn the_same_signed_body_under_a_new_id_gives_no_second_hint() {
    let served = serve().await;
    let body = queued_payload();
    let (status, _) = served
        .github("workflow_job", "d-1", &body, GITHUB_SECRET)
        .await;
    assert_eq!(status, 202);
    take_first_hint(&served);
    for id in ["d-2", "72d3162e-cc78-11e3-81ab-4c9367dc0958"] {
        let (status, outcome) = served
            .github("workflow_job", id, &body, GITHUB_SECRET)
            .await;
        // 2xx: GitHub should not retry what it would only be refused again.
        assert_eq!((status, outcome.as_str()), (200, "duplicate"), "{id}");
    }
    assert_eq!(served.count("github", "duplicate"), 2);
    served.assert_no_hint();
}

#[tokio::test]
async fn another_event_under_a_new_id_is_a_hint() {
    let served = serve().await;
    let (status, _) = served
        .github("workflow_job", "d-1", &queued_payload(), GITHUB_SECRET)
        .await;
    assert_eq!(status, 202);
    take_first_hint(&served);
    // The next hint of the same repo is due 2 s after the last one served.
    let (status, outcome) = served
        .github(
            "workflow_job",
            "d-2",
            &job_payload(FIXTURE_REPO, 2),
            GITHUB_SECRET,
        )
        .await;
    assert_eq!((status, outcome.as_str()), (202, "accepted"));
    assert!(
        served.hints.next_due().is_some(),
        "a new event was taken for a replay"
    );
}

#[tokio::test]
async fn a_signed_delivery_without_an_id_is_refused_with_400_and_changes_nothing() {
    let served = serve().await;
    let body = queued_payload();
    let signature = format!("sha256={}", sign(GITHUB_SECRET, body.as_bytes()));
    let (status, outcome) = served
        .post(
            "/webhook/github",
            &[
                ("X-GitHub-Event", "workflow_job"),
                ("X-Hub-Signature-256", &signature),
            ],
            body.clone().into_bytes(),
        )
        .await;
    assert_eq!((status, outcome.as_str()), (400, "bad_delivery_id"));
    // An empty id is no id.
    let (status, _) = served
        .github("workflow_job", "", &body, GITHUB_SECRET)
        .await;
    assert_eq!(status, 400);
    assert_eq!(served.count("github", "bad_delivery_id"), 2);
    served.assert_no_hint();
    // Nothing was remembered: the same body under an id of its own is the first sighting.
    let (status, _) = served
        .github("workflow_job", "d-1", &body, GITHUB_SECRET)
        .await;
    assert_eq!(status, 202);
}

#[tokio::test]
async fn a_delivery_id_no_forge_sends_is_refused_with_400_and_changes_nothing() {
    let served = serve().await;
    let body = queued_payload();
    let longest = "d".repeat(128);
    let too_long = "d".repeat(129);
    for id in [too_long.as_str(), "d 1", "d-\u{e9}t\u{e9}"] {
        let (status, outcome) = served
            .github("workflow_job", id, &body, GITHUB_SECRET)
            .await;
        assert_eq!(
            (status, outcome.as_str()),
            (400, "bad_delivery_id"),
            "{id:?}"
        );
    }
    served.assert_no_hint();
    // Forgejo's and Gitea's delivery headers are held to the same rule.
    let tag = sign(FORGEJO_SECRET, body.as_bytes());
    for delivery_header in ["X-Forgejo-Delivery", "X-Gitea-Delivery"] {
        let (status, _) = served
            .post(
                "/webhook/forgejo",
                &[
                    ("X-Forgejo-Event", "push"),
                    (delivery_header, &too_long),
                    ("X-Forgejo-Signature", &tag),
                ],
                body.clone().into_bytes(),
            )
            .await;
        assert_eq!(status, 400, "{delivery_header}");
    }
    served.assert_no_hint();
    let (status, _) = served
        .github("workflow_job", &longest, &body, GITHUB_SECRET)
        .await;
    assert_eq!(status, 202, "a 128-character id is taken");
}

#[tokio::test]
async fn an_oversized_body_is_refused_with_413_and_changes_nothing() {
    let served = serve().await;
    // A signed, well-formed delivery one byte over the cap...
    let padded = |len: usize| {
        let mut value: serde_json::Value = serde_json::from_str(&queued_payload()).unwrap();
        value["padding"] = "".into();
        let bare = value.to_string().len();
        value["padding"] = "x".repeat(len - bare).into();
        let body = value.to_string();
        assert_eq!(body.len(), len);
        body
    };
    let over = padded(WEBHOOK_BODY_MAX_BYTES + 1);
    let (status, outcome) = served
        .github("workflow_job", "d-big", &over, GITHUB_SECRET)
        .await;
    assert_eq!((status, outcome.as_str()), (413, "too_large"));
    assert_eq!(served.count("github", "too_large"), 1);
    served.assert_no_hint();
    // ...while one exactly at the cap is read.
    let (status, _) = served
        .github(
            "workflow_job",
            "d-cap",
            &padded(WEBHOOK_BODY_MAX_BYTES),
            GITHUB_SECRET,
        )
        .await;
    assert_eq!(status, 202);
}

#[tokio::test]
async fn a_good_delivery_for_an_unconfigured_repo_changes_nothing() {
    let served = serve().await;
    let (status, outcome) = served
        .github(
            "workflow_job",
            "d-1",
            &payload_for("someone/else"),
            GITHUB_SECRET,
        )
        .await;
    assert_eq!((status, outcome.as_str()), (200, "unconfigured_repo"));
    // A Forgejo repo of the document named by a GitHub delivery is not GitHub's to hint.
    let (status, _) = served
        .github(
            "workflow_job",
            "d-2",
            &payload_for("forge/builds"),
            GITHUB_SECRET,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(served.count("github", "unconfigured_repo"), 2);
    served.assert_no_hint();
}

#[tokio::test]
async fn ping_and_other_events_are_answered_and_ignored() {
    let served = serve().await;
    let (status, outcome) = served
        .github(
            "ping",
            "d-ping",
            r#"{"zen":"Keep it logically awesome."}"#,
            GITHUB_SECRET,
        )
        .await;
    assert_eq!((status, outcome.as_str()), (200, "ignored_event"));
    let (status, _) = served
        .github("workflow_run", "d-run", &queued_payload(), GITHUB_SECRET)
        .await;
    assert_eq!(status, 200);
    assert_eq!(served.count("github", "ignored_event"), 2);
    served.assert_no_hint();
}

#[tokio::test]
async fn a_signed_delivery_that_names_no_repo_is_a_bad_request() {
    let served = serve().await;
    let (status, outcome) = served
        .github("workflow_job", "d-1", "not json", GITHUB_SECRET)
        .await;
    assert_eq!((status, outcome.as_str()), (400, "malformed"));
    served.assert_no_hint();
}

#[tokio::test]
async fn forgejo_signs_with_bare_hex_and_a_push_is_a_hint_as_gitea_job_events_are() {
    let served = serve().await;
    let body = payload_for("forge/builds");
    let tag = sign(FORGEJO_SECRET, body.as_bytes());
    let forgejo = |event: &'static str, delivery: &'static str, signature: String| {
        vec![
            ("X-Forgejo-Event", event.to_string()),
            ("X-Forgejo-Delivery", delivery.to_string()),
            ("X-Forgejo-Signature", signature),
        ]
    };
    let post_body = |headers: Vec<(&'static str, String)>, body: String| {
        let served = &served;
        async move {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            served
                .post("/webhook/forgejo", &headers, body.into_bytes())
                .await
        }
    };
    let post = |headers: Vec<(&'static str, String)>| post_body(headers, body.clone());
    // GitHub's `sha256=` prefix is not Forgejo's format.
    let (status, _) = post(forgejo("push", "f-0", format!("sha256={tag}"))).await;
    assert_eq!(status, 401);
    // Signed with GitHub's secret: refused.
    let wrong = sign(GITHUB_SECRET, body.as_bytes());
    assert_eq!(post(forgejo("push", "f-0", wrong)).await.0, 401);
    served.assert_no_hint();

    // Forgejo sends no job event (through 15.0): a push, which may start runs, is the hint.
    let (status, outcome) = post(forgejo("push", "f-1", tag.clone())).await;
    assert_eq!((status, outcome.as_str()), (202, "accepted"));
    assert_eq!(served.hints.take_due(t0()), vec![repo("forge/builds")]);
    // For Gitea (>= 1.24), which posts here with only its own headers: its `workflow_job`
    // is a hint (another job's event: the same body again would be a replay).
    let other_job = job_payload("forge/builds", 2);
    let (status, _) = post_body(
        vec![
            ("X-Gitea-Event", "workflow_job".into()),
            ("X-Gitea-Delivery", "f-2".into()),
            (
                "X-Gitea-Signature",
                sign(FORGEJO_SECRET, other_job.as_bytes()),
            ),
        ],
        other_job,
    )
    .await;
    assert_eq!(status, 202);
    // Nothing that starts or ends a run, and names only Gitea sends, under Forgejo's
    // headers: nothing to look at.
    for (event, delivery, job) in [
        ("issues", "f-3", 3),
        ("workflow_jobs", "f-4", 4),
        ("workflow_job", "f-5", 5),
        ("action_run_", "f-6", 6),
    ] {
        let body = job_payload("forge/builds", job);
        let tag = sign(FORGEJO_SECRET, body.as_bytes());
        assert_eq!(
            post_body(forgejo(event, delivery, tag), body).await,
            (200, "ignored_event".to_string())
        );
    }
    assert_eq!(served.count("forgejo", "accepted"), 2);
    assert_eq!(served.count("forgejo", "bad_signature"), 2);
}

#[tokio::test]
async fn forgejo_run_ends_and_dispatches_are_hints_and_name_the_repo_under_the_run() {
    let served = serve().await;
    // Forgejo's action run events (12.0) name the repo only under `run`. One run per event:
    // each is an event of its own (the same body twice is a replay).
    let under_run = |run: u64| {
        serde_json::json!({
            "action": "success",
            "run": {
                "id": run,
                "status": "success",
                "repository": { "full_name": "forge/builds" },
            },
        })
        .to_string()
    };
    let without_repo = serde_json::json!({ "action": "failure", "run": { "id": 3 } }).to_string();
    let dispatched = serde_json::json!({
        "workflow": "ci.yml",
        "ref": "refs/heads/main",
        "repository": { "full_name": "forge/builds" },
    })
    .to_string();
    let deliveries = [
        ("action_run_success", &under_run(7), 202, "accepted"),
        ("action_run_failure", &under_run(8), 202, "accepted"),
        ("action_run_recover", &under_run(9), 202, "accepted"),
        ("workflow_dispatch", &dispatched, 202, "accepted"),
        // Gitea's run event, under Forgejo's headers: Forgejo sends none.
        ("workflow_run", &under_run(10), 200, "ignored_event"),
        ("action_run_failure", &without_repo, 400, "malformed"),
    ];
    for (i, (event, body, status, outcome)) in deliveries.into_iter().enumerate() {
        let delivery = format!("r-{i}");
        let signature = sign(FORGEJO_SECRET, body.as_bytes());
        let answer = served
            .post(
                "/webhook/forgejo",
                &[
                    ("X-Forgejo-Event", event),
                    ("X-Forgejo-Delivery", &delivery),
                    ("X-Forgejo-Signature", &signature),
                ],
                body.clone().into_bytes(),
            )
            .await;
        assert_eq!(answer, (status, outcome.to_string()), "{event} {body}");
    }
    assert_eq!(served.hints.take_due(t0()), vec![repo("forge/builds")]);
}

#[tokio::test]
async fn a_forge_without_a_secret_has_no_route() {
    let served = serve_with(WebhookSecrets {
        github: Some(SecretString::from(GITHUB_SECRET)),
        forgejo: None,
    })
    .await;
    let body = payload_for("forge/builds");
    let (status, _) = served
        .post(
            "/webhook/forgejo",
            &[
                ("X-Forgejo-Event", "push"),
                (
                    "X-Forgejo-Signature",
                    &sign(FORGEJO_SECRET, body.as_bytes()),
                ),
            ],
            body.into_bytes(),
        )
        .await;
    assert_eq!(status, 404);
    served.assert_no_hint();
}

#[tokio::test]
async fn a_standby_answers_and_hints_nothing() {
    let served = serve().await;
    // The loop stopped: its leadership term is over.
    served.hints.stop_following();
    let (status, outcome) = served
        .github("workflow_job", "d-1", &queued_payload(), GITHUB_SECRET)
        .await;
    assert_eq!((status, outcome.as_str()), (200, "not_leader"));
    served.assert_no_hint();
}

/// With every crate logging at TRACE, neither secret shows up anywhere, whatever the
/// outcome of the delivery.
#[tokio::test]
async fn the_secrets_never_reach_a_log_line() {
    let capture = support::LogCapture::default();
    let _guard = tracing::subscriber::set_default(capture.subscriber(tracing::Level::TRACE));
    let served = serve().await;
    let body = queued_payload();
    served
        .github("workflow_job", "d-1", &body, GITHUB_SECRET)
        .await;
    served
        .github("workflow_job", "d-1", &body, GITHUB_SECRET)
        .await;
    served.github("workflow_job", "d-2", &body, "wrong").await;
    let tag = sign(FORGEJO_SECRET, body.as_bytes());
    served
        .post(
            "/webhook/forgejo",
            &[("X-Forgejo-Event", "push"), ("X-Forgejo-Signature", &tag)],
            body.clone().into_bytes(),
        )
        .await;
    let text = capture.text();
    assert!(
        text.contains("webhook delivery"),
        "the capture saw the receiver's lines: {text}"
    );
    for secret in [GITHUB_SECRET, FORGEJO_SECRET] {
        assert!(!text.contains(secret), "a secret was logged:\n{text}");
    }
    let secrets = WebhookSecrets {
        github: Some(SecretString::from(GITHUB_SECRET)),
        forgejo: Some(SecretString::from(FORGEJO_SECRET)),
    };
    let debug = format!("{secrets:?}");
    assert!(
        !debug.contains(GITHUB_SECRET) && !debug.contains(FORGEJO_SECRET),
        "{debug}"
    );
}

/// The daemon as its own process against the twins, polling once an hour: after its first
/// tick, a second job is queued; only the webhook can make it look again within the test's
/// deadline, and it does, dispatching a second runner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_re_polls_a_repo_on_a_webhook_hint() {
    use runner_scaler::sim::twins::github::TEST_APP_PRIVATE_KEY_PEM;
    use support::daemon_process::{Daemon, wait_until};
    use support::twins::{TempFile, Twins};

    const PARENT: &str = "ci-runner";
    const DEADLINE: Duration = Duration::from_secs(15);
    let twins = Twins::start().await;
    let (api, _) = twins.provision_one_queued_job("acme/api", PARENT);
    let key_file = TempFile::with_contents("app-key.pem", TEST_APP_PRIVATE_KEY_PEM);
    let daemon = Daemon::start_with_env(
        &twins,
        &key_file,
        &[
            "run",
            "--poll-interval",
            "1h",
            "--webhook-listen",
            "127.0.0.1:0",
        ],
        &[("GITHUB_WEBHOOK_SECRET", GITHUB_SECRET)],
    );
    let first = wait_until(DEADLINE, || twins.our_children(PARENT).into_iter().next()).await;
    assert!(
        first.is_some(),
        "no first dispatch; stderr:\n{}",
        daemon.stderr()
    );
    twins.github.add_run(&api, vec![vec!["self-hosted"]]);

    let stderr = daemon.stderr();
    let at = stderr
        .find("webhook_listen=")
        .expect("the daemon says where")
        + "webhook_listen=".len();
    let addr: String = stderr[at..]
        .chars()
        .take_while(|c| !c.is_whitespace())
        .collect();
    let body = payload_for("acme/api");
    let response = http()
        .post(format!("http://{addr}/webhook/github"))
        .header("X-GitHub-Event", "workflow_job")
        .header("X-GitHub-Delivery", "e2e-1")
        .header(
            "X-Hub-Signature-256",
            format!("sha256={}", sign(GITHUB_SECRET, body.as_bytes())),
        )
        .body(body)
        .send()
        .await
        .expect("the daemon's receiver answers");
    assert_eq!(
        response.status().as_u16(),
        202,
        "{:?}",
        response.text().await
    );

    let second = wait_until(DEADLINE, || {
        (twins.our_children(PARENT).len() >= 2).then_some(())
    })
    .await;
    let stderr = daemon.stop();
    assert!(
        second.is_some(),
        "no re-poll on the hint; stderr:\n{stderr}"
    );
    assert!(stderr.contains("ticking now for webhook hints"), "{stderr}");
    assert!(
        !stderr.contains(GITHUB_SECRET),
        "the secret was logged:\n{stderr}"
    );
}

/// Virtual wall time: `t0` plus the paused tokio clock's progress.
struct VirtualClock {
    t0: DateTime<Utc>,
    start: tokio::time::Instant,
}

impl Clock for VirtualClock {
    fn now(&self) -> DateTime<Utc> {
        self.t0 + chrono::Duration::from_std(self.start.elapsed()).unwrap()
    }
}

/// The seam in the loop, on the in-memory world and a paused clock: polling every 15 s, a
/// hint at 1 s brings ticks at 1 s, 3 s and 6 s; the interval's tick at 15 s is unchanged.
/// Once the loop stops, hints are refused.
#[tokio::test(start_paused = true)]
async fn the_loop_ticks_at_once_and_at_two_and_five_seconds_after_a_hint() {
    use runner_scaler::config::watch::ConfigState;
    use runner_scaler::webhook::{Offered, WebhookForge};
    use support::memory_loop::app_config;

    let clock = Arc::new(VirtualClock {
        t0: t0(),
        start: tokio::time::Instant::now(),
    });
    let world = runner_scaler::sim::memory::MemoryWorld::new(t0());
    let metrics = Arc::new(Metrics::default());
    let hints = Hints::new();
    let mut controller = support::memory_loop::controller(&world).with_hints(hints.clone());
    controller.settings.metrics = metrics.clone();
    assert_eq!(controller.settings.poll_interval, Duration::from_secs(15));
    let (_config_tx, config_rx) = tokio::sync::watch::channel(ConfigState {
        config: Some(Arc::new(app_config(&[("acme/api", 3)]))),
        applied_index: Some(1),
        ..ConfigState::default()
    });
    let ticks = {
        let metrics = metrics.clone();
        move || {
            let text = metrics.encode();
            text.lines()
                .find_map(|l| l.strip_prefix("runner_scaler_ticks_total "))
                .map_or(0, |n| n.trim().parse::<u64>().unwrap())
        }
    };
    let scenario = {
        let (hints, clock) = (hints.clone(), clock.clone());
        async move {
            // (virtual ms to sleep until, ticks by then)
            let until = |ms: u64| tokio::time::sleep_until(clock.start + Duration::from_millis(ms));
            until(900).await;
            assert_eq!(ticks(), 1, "the tick at start");
            until(1_000).await;
            assert_eq!(
                hints.offer(WebhookForge::GitHub, repo("acme/unknown"), clock.now()),
                Offered::UnconfiguredRepo
            );
            assert_eq!(
                hints.offer(WebhookForge::GitHub, repo("acme/api"), clock.now()),
                Offered::Accepted
            );
            for (ms, expected) in [
                (1_100, 2),
                (2_900, 2),
                (3_100, 3),
                (5_900, 3),
                (6_100, 4),
                (14_900, 4),
                (15_100, 5),
            ] {
                until(ms).await;
                assert_eq!(ticks(), expected, "ticks by {ms} ms");
            }
        }
    };
    runner_scaler::control_loop::run(controller, config_rx, clock.as_ref(), false, scenario).await;
    assert_eq!(
        hints.offer(WebhookForge::GitHub, repo("acme/api"), clock.now()),
        Offered::NotLeading
    );
}
