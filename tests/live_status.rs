//! `runner-scaler status` asks the running daemon (`GET /status` on its `--listen` address)
//! and shows what the daemon knows: here, a bucket backing off after a failed start.
//! Without a daemon to answer it says so and shows a fresh dry-run tick, which knows the
//! backoff only from the state key the daemon wrote.
//! Every process runs against the twins on real time; every wait polls against a deadline.

mod support;

use std::time::Duration;

use runner_scaler::sim::twins::github::TEST_APP_PRIVATE_KEY_PEM;
use support::daemon_process::{Daemon, status_at, wait_until};
use support::twins::{TempFile, Twins};

const PARENT: &str = "ci-runner";
const REPO: &str = "acme/api";
const DEADLINE: Duration = Duration::from_secs(15);

/// `runner-scaler status --addr ADDR` with the twins' environment: (stdout, stderr).
fn status(twins: &Twins, key_file: &TempFile, addr: &str) -> (String, String) {
    let output = status_at(twins, key_file, addr, &[]);
    assert!(output.status.success(), "{output:?}");
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The address the daemon says it serves on (it binds port 0 against the twins).
fn served_at(stderr: &str) -> Option<String> {
    let at = stderr.find("listen=")? + "listen=".len();
    let addr: String = stderr[at..]
        .chars()
        .take_while(|c| !c.is_whitespace())
        .collect();
    Some(format!("http://{addr}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_running_daemons_backoff_and_a_dry_run_reads_it_from_the_state_key() {
    let twins = Twins::start().await;
    twins.provision_one_queued_job(REPO, PARENT);
    let key_file = TempFile::with_contents("app-key.pem", TEST_APP_PRIVATE_KEY_PEM);
    let daemon = Daemon::start(&twins, &key_file, &["run", "--poll-interval", "1s"]);

    // Its runner dies at boot: a failed start, and the bucket backs off.
    let child = wait_until(DEADLINE, || twins.our_children(PARENT).into_iter().next())
        .await
        .unwrap_or_else(|| panic!("no child dispatched; stderr:\n{}", daemon.stderr()));
    twins.nomad.place(&child.id).unwrap();
    twins.nomad.finish(&child.id, false).unwrap();
    let backing_off = wait_until(DEADLINE, || {
        daemon.stderr().contains("failed start").then_some(())
    })
    .await;
    assert!(backing_off.is_some(), "stderr:\n{}", daemon.stderr());
    let addr = served_at(&daemon.stderr()).expect("the daemon says where it listens");

    let live = wait_until(DEADLINE, || {
        let (out, _) = status(&twins, &key_file, &addr);
        out.contains("crash loop").then_some(out)
    })
    .await;
    let stderr = daemon.stop();
    let live = live.unwrap_or_else(|| panic!("no backoff in the live status; daemon:\n{stderr}"));
    assert!(live.starts_with("leader: this daemon acts"), "{live}");
    assert!(live.contains("1 failed start(s) in a row"), "{live}");
    assert!(live.contains(REPO), "{live}");

    // Nobody answers now (at an address of this test's own: the stopped daemon's port may
    // be anyone's by now): a fresh dry-run tick, said so. It knows the backoff from the state
    // key the daemon wrote (as a restarted daemon would), and of nothing without it.
    let nobody = support::bystander::Bystander::hanging_up().await;
    let (out, err) = status(&twins, &key_file, &nobody.base_url());
    assert!(err.contains("no daemon answered at"), "{err}");
    assert!(err.contains("fresh dry-run tick"), "{err}");
    assert!(out.contains("crash loop: 1 failed start(s)"), "{out}");
    assert!(twins.consul.delete("runners/state"));
    let (out, _) = status(&twins, &key_file, &nobody.base_url());
    assert!(!out.contains("crash loop"), "{out}");
    assert!(
        out.contains(REPO),
        "the dry-run tick still shows the bucket: {out}"
    );
}
