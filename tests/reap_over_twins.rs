//! Taking a runner back, end to end: `runner-scaler run` as its own process against the
//! twins, in `app` mode, on real time. A queued job makes the daemon dispatch a child; the
//! child is placed and its runner registers; then the job is cancelled, and the runner is
//! surplus. An idle runner must lose its registration first and its child second; a runner
//! that any signal says is at work must keep both.
//!
//! Timing: `--poll-interval 1s --orphan-grace 1s --idle-confirm 2s`, so an idle runner is
//! confirmed idle two or three ticks after the cancellation. Every wait polls the twins'
//! state against a deadline; nothing sleeps to synchronise.

mod support;

use std::time::{Duration, Instant};

use runner_scaler::model::RepoName;
use runner_scaler::sim::twins::github::{RunnerPresence, TEST_APP_PRIVATE_KEY_PEM};
use runner_scaler::sim::twins::nomad::TwinJob;
use support::daemon_process::{Daemon, wait_until};
use support::twins::{CONSUL_TOKEN, NOMAD_TOKEN, TempFile, Twins, VAULT_TOKEN};

const PARENT: &str = "ci-runner";
const REPO: &str = "acme/api";
const LABELS: &[&str] = &["self-hosted"];
/// From cancellation to the registration deleted and the child stopped: the daemon needs a
/// tick past the grace window, two seconds of idle readings and one more tick (about four
/// seconds); ten leave room for a loaded machine.
const TAKE_BACK_DEADLINE: Duration = Duration::from_secs(10);
/// How long a busy runner is watched: three times the idle confirmation, so an idle misread
/// would have been acted on twice over.
const VETO_WINDOW: Duration = Duration::from_secs(6);
/// Ticks the daemon must have run inside the veto window, so the window is not just quiet
/// because the daemon was slow to start or stuck.
const VETO_TICKS_MIN: usize = 4;
const DAEMON_ARGS: &[&str] = &[
    "run",
    "--poll-interval",
    "1s",
    "--orphan-grace",
    "1s",
    "--idle-confirm",
    "2s",
    "--job-listing-lag",
    "1s",
];

/// One app repo, its parent, the document in Consul, and one queued job.
fn provision(twins: &Twins) -> (RepoName, u64) {
    twins.provision_one_queued_job(REPO, PARENT)
}

/// Waits for the daemon's one child and returns it with its runner's name.
async fn dispatched_child(twins: &Twins, daemon: &Daemon) -> (TwinJob, String) {
    let child = wait_until(TAKE_BACK_DEADLINE, || {
        let children = twins.our_children(PARENT);
        (!children.is_empty()).then(|| children[0].clone())
    })
    .await
    .unwrap_or_else(|| panic!("no child dispatched; daemon stderr:\n{}", daemon.stderr()));
    let runner = child
        .meta
        .get("runner_name")
        .cloned()
        .expect("the daemon names its runner in meta");
    (child, runner)
}

/// The runner of a child boots from its JIT config: GitHub registered it (offline) when the
/// daemon minted the config, with the bucket's labels; now it connects and reads as
/// `presence`. Returns its registration id. No registration token was ever minted.
fn boot_jit_runner(twins: &Twins, repo: &RepoName, runner: &str, presence: RunnerPresence) -> u64 {
    let registered: Vec<_> = twins
        .github
        .runners(repo)
        .into_iter()
        .filter(|r| r.name == runner)
        .collect();
    assert_eq!(registered.len(), 1, "one JIT registration for {runner}");
    let jit = &registered[0];
    assert!(!jit.online, "a JIT runner is offline until it boots");
    assert_eq!(
        jit.labels, LABELS,
        "a JIT runner carries its bucket's labels"
    );
    let minted_tokens = twins
        .github
        .request_log()
        .iter()
        .filter(|e| e.endpoint.ends_with("/registration-token"))
        .count();
    assert_eq!(minted_tokens, 0, "app mode mints JIT configs by default");
    assert!(
        twins
            .github
            .set_runner_online(repo, runner, presence.online)
    );
    assert!(twins.github.set_runner_busy(repo, runner, presence.busy));
    jit.id
}

/// The secrets the daemon holds or was handed, none of which may reach its stderr.
fn secrets(twins: &Twins, child: &TwinJob) -> Vec<String> {
    let mut secrets: Vec<String> = [NOMAD_TOKEN, CONSUL_TOKEN, VAULT_TOKEN]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // Installation tokens and registration tokens the GitHub twin issued.
    secrets.extend(twins.github.issued_secrets());
    secrets.extend(child.meta.get("runner_token").cloned());
    secrets.push(
        TEST_APP_PRIVATE_KEY_PEM
            .lines()
            .nth(1)
            .expect("a PEM body")
            .to_string(),
    );
    secrets
}

fn assert_no_secret_in(stderr: &str, secrets: &[String]) {
    assert!(!stderr.is_empty(), "the daemon logged nothing");
    for secret in secrets {
        assert!(!secret.is_empty());
        assert!(
            !stderr.contains(secret.as_str()),
            "a secret ({}…) reached the daemon's stderr",
            &secret[..4.min(secret.len())]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_surplus_runner_loses_its_registration_before_its_child_is_stopped() {
    let twins = Twins::start().await;
    let (repo, job) = provision(&twins);
    let key_file = TempFile::with_contents("app-key.pem", TEST_APP_PRIVATE_KEY_PEM);
    let daemon = Daemon::start(&twins, &key_file, DAEMON_ARGS);

    let (child, runner) = dispatched_child(&twins, &daemon).await;
    // Booted before placed, so no tick sees a placed child whose runner is not connected.
    let runner_id = boot_jit_runner(&twins, &repo, &runner, RunnerPresence::IDLE);
    // A registration under the same name that is not the daemon's runner: the veto must find
    // the runner by the id its JIT config returned, not by its name.
    let impostor = twins
        .github
        .register_runner_as(&repo, &runner, LABELS, RunnerPresence::OFFLINE);
    twins.nomad.place(&child.id).unwrap();
    twins.github.cancel_job(&repo, job).unwrap();

    let taken_back = wait_until(TAKE_BACK_DEADLINE, || {
        let deleted = twins
            .github
            .deleted_runners()
            .into_iter()
            .find(|d| d.id == runner_id)?;
        let stopped_at = twins.nomad.stopped_at(&child.id)?;
        Some((deleted, stopped_at))
    })
    .await;
    let stderr = daemon.stop();
    let (deleted, stopped_at) = taken_back.unwrap_or_else(|| {
        panic!(
            "within {TAKE_BACK_DEADLINE:?}: deleted {:?}, stopped {}; daemon stderr:\n{stderr}",
            twins.github.deleted_runners(),
            twins.nomad.was_stopped(&child.id),
        )
    });

    assert_eq!(deleted.name, runner);
    assert!(
        deleted.at < stopped_at,
        "the child was stopped before its runner's registration was deleted"
    );
    assert_eq!(
        deleted.id, runner_id,
        "the JIT runner's own registration went"
    );
    let left: Vec<u64> = twins.github.runners(&repo).iter().map(|r| r.id).collect();
    assert_eq!(
        left,
        [impostor],
        "the other registration under its name stays"
    );
    assert_eq!(
        twins.dispatch_requests(PARENT),
        1,
        "no runner replaced the one taken back: nothing is queued"
    );
    assert_no_secret_in(&stderr, &secrets(&twins, &child));
}

/// How the runner shows it is at work in the busy cases.
#[derive(Clone, Copy, Debug)]
enum AtWork {
    /// Its registration reads busy; no job the daemon can see names it.
    BusyFlagOnly,
    /// Its registration reads busy and a job in progress names it.
    BusyFlagAndNamedByAJob,
    /// A job in progress names it while its busy flag still lags at false (BRIEF lesson 2).
    NamedByAJobWithTheFlagLagging,
}

async fn a_runner_at_work_is_never_taken_back(at_work: AtWork) {
    let twins = Twins::start().await;
    let (repo, job) = provision(&twins);
    let key_file = TempFile::with_contents("app-key.pem", TEST_APP_PRIVATE_KEY_PEM);
    let daemon = Daemon::start(&twins, &key_file, DAEMON_ARGS);

    let (child, runner) = dispatched_child(&twins, &daemon).await;
    let presence = match at_work {
        AtWork::NamedByAJobWithTheFlagLagging => RunnerPresence::IDLE,
        _ => RunnerPresence::BUSY,
    };
    boot_jit_runner(&twins, &repo, &runner, presence);
    twins.nomad.place(&child.id).unwrap();
    twins.github.cancel_job(&repo, job).unwrap();
    match at_work {
        AtWork::BusyFlagOnly => {}
        AtWork::BusyFlagAndNamedByAJob => {
            twins
                .github
                .add_run_in_progress(&repo, LABELS.to_vec(), &runner);
        }
        AtWork::NamedByAJobWithTheFlagLagging => {
            twins
                .github
                .add_run_in_progress(&repo, LABELS.to_vec(), &runner);
            assert!(twins.github.set_runner_busy(&repo, &runner, false));
        }
    }
    let ticks_before = twins.listings_of_children(PARENT);
    let window_start = Instant::now();

    // Watch the whole window, failing at the first teardown; it ends once the window has
    // passed and the daemon has ticked enough times in it.
    let torn_down = wait_until(TAKE_BACK_DEADLINE + VETO_WINDOW, || {
        if !twins.github.deleted_runners().is_empty() {
            return Some(Err("its registration was deleted"));
        }
        if twins.nomad.was_stopped(&child.id) || twins.nomad.was_purged(&child.id) {
            return Some(Err("its child was stopped"));
        }
        let ticked = twins.listings_of_children(PARENT) - ticks_before;
        (window_start.elapsed() >= VETO_WINDOW && ticked >= VETO_TICKS_MIN).then_some(Ok(()))
    })
    .await;
    let stderr = daemon.stop();

    match torn_down {
        Some(Ok(())) => {}
        Some(Err(what)) => panic!("{at_work:?}: {what}; daemon stderr:\n{stderr}"),
        None => panic!(
            "{at_work:?}: the daemon ticked {} times in {:?}; daemon stderr:\n{stderr}",
            twins.listings_of_children(PARENT) - ticks_before,
            window_start.elapsed()
        ),
    }
    if matches!(at_work, AtWork::BusyFlagOnly) {
        // Only the registration says busy: the daemon must have read it, tick after tick.
        let readings = twins
            .github
            .request_log()
            .iter()
            .filter(|e| e.endpoint == "GET /repos/{owner}/{repo}/actions/runners")
            .count();
        assert!(
            readings >= 2,
            "the registrations were read {readings} times"
        );
    }
    assert_eq!(
        twins.github.runners(&repo).len(),
        1,
        "{at_work:?}: nothing deleted"
    );
    let job = twins
        .nomad
        .job(&child.id)
        .expect("the child is still there");
    assert!(!job.stop, "{at_work:?}");
    assert_no_secret_in(&stderr, &secrets(&twins, &child));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_whose_registration_reads_busy_keeps_its_registration_and_child() {
    a_runner_at_work_is_never_taken_back(AtWork::BusyFlagOnly).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_runner_named_by_a_job_in_progress_keeps_its_registration_and_child() {
    a_runner_at_work_is_never_taken_back(AtWork::BusyFlagAndNamedByAJob).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_named_by_a_job_in_progress_is_kept_while_its_busy_flag_lags() {
    a_runner_at_work_is_never_taken_back(AtWork::NamedByAJobWithTheFlagLagging).await;
}
