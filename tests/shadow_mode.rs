//! `run --dry-run` is shadow mode: the whole loop runs against the real services and says
//! what it would do, and nothing is written. `--log-format json` writes one JSON object per
//! line. `runner-scaler` runs as its own process against the twins, on real time; every wait
//! polls the twins against a deadline.

mod support;

use std::time::Duration;

use runner_scaler::sim::twins::github::TEST_APP_PRIVATE_KEY_PEM;
use serde_json::Value;
use support::daemon_process::{Daemon, wait_until};
use support::twins::{TempFile, Twins};

const PARENT: &str = "ci-runner";
const REPO: &str = "acme/api";
/// Ticks watched: each would have dispatched for the queued job.
const TICKS: usize = 3;
const DEADLINE: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_plans_and_logs_and_writes_nothing() {
    let twins = Twins::start().await;
    twins.provision_one_queued_job(REPO, PARENT);
    let key_file = TempFile::with_contents("app-key.pem", TEST_APP_PRIVATE_KEY_PEM);
    let daemon = Daemon::start(
        &twins,
        &key_file,
        &[
            "run",
            "--dry-run",
            "--poll-interval",
            "1s",
            "--log-format",
            "json",
        ],
    );
    let ticked = wait_until(DEADLINE, || {
        (twins.listings_of_children(PARENT) > TICKS).then_some(())
    })
    .await;
    let stderr = daemon.stop();
    assert!(
        ticked.is_some(),
        "the daemon did not tick {TICKS} times; stderr:\n{stderr}"
    );

    assert_eq!(twins.dispatch_requests(PARENT), 0, "shadow mode dispatched");
    let minted = twins
        .github
        .request_log()
        .iter()
        .filter(|r| r.endpoint.ends_with("/registration-token"))
        .count();
    assert_eq!(minted, 0, "shadow mode minted a registration token");
    let writes: Vec<String> = twins
        .nomad
        .requests()
        .iter()
        .filter(|r| r.method != "GET")
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(writes.is_empty(), "shadow mode wrote to Nomad: {writes:?}");

    let lines: Vec<Value> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}"))
        })
        .collect();
    let would_dispatch = lines
        .iter()
        .filter(|l| l["message"] == "shadow mode: would dispatch a runner")
        .filter(|l| l["repo"] == REPO && l["parent"] == PARENT)
        .count();
    assert!(
        would_dispatch >= TICKS,
        "each tick says what it would dispatch; stderr:\n{stderr}"
    );
    assert!(lines.iter().all(|l| l["level"].is_string()));
}
