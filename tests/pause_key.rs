//! The operator's pause key: while `runners/paused` holds a value, `runner-scaler run`
//! dispatches nothing and says why; deleting the key resumes dispatching at the next tick.
//! The daemon runs as its own process against the twins, on real time; every wait polls
//! the twins against a deadline.

mod support;

use std::time::Duration;

use runner_scaler::sim::twins::github::TEST_APP_PRIVATE_KEY_PEM;
use support::daemon_process::{Daemon, wait_until};
use support::twins::{TempFile, Twins};

const PARENT: &str = "ci-runner";
const REPO: &str = "acme/api";
const PAUSE_KEY: &str = "runners/paused";
/// Ticks watched while paused: each would have dispatched for the queued job.
const TICKS: usize = 3;
const DEADLINE: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pause_key_stops_dispatching_until_it_is_deleted() {
    let twins = Twins::start().await;
    twins.provision_one_queued_job(REPO, PARENT);
    twins.consul.set(PAUSE_KEY, "incident 123");
    let key_file = TempFile::with_contents("app-key.pem", TEST_APP_PRIVATE_KEY_PEM);
    let daemon = Daemon::start(&twins, &key_file, &["run", "--poll-interval", "1s"]);

    let ticked = wait_until(DEADLINE, || {
        (twins.listings_of_children(PARENT) > TICKS).then_some(())
    })
    .await;
    assert!(
        ticked.is_some(),
        "the daemon did not tick {TICKS} times; stderr:\n{}",
        daemon.stderr()
    );
    assert_eq!(
        twins.dispatch_requests(PARENT),
        0,
        "dispatched while paused; stderr:\n{}",
        daemon.stderr()
    );
    let paused_lines = daemon
        .stderr()
        .lines()
        .filter(|l| {
            l.contains("dispatching paused by the operator: runners/paused is set: incident 123")
        })
        .count();
    assert_eq!(paused_lines, 1, "the pause is said once, not every tick");

    assert!(twins.consul.delete(PAUSE_KEY));
    let resumed = wait_until(DEADLINE, || {
        (twins.dispatch_requests(PARENT) == 1).then_some(())
    })
    .await;
    let stderr = daemon.stop();
    assert!(
        resumed.is_some(),
        "no dispatch after the pause key was deleted; stderr:\n{stderr}"
    );
    assert!(stderr.contains("dispatching resumed"), "{stderr}");
}
