//! The simulated world: the real daemon against every twin, in process and as `simulate`.
//!
//! Each full run takes several seconds of real time: this file runs exactly two.

use runner_scaler::sim::world::{WorldOptions, run_world};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_world_serves_every_job_within_every_cap_and_purges_every_child() {
    let summary = run_world(WorldOptions::default())
        .await
        .expect("the world starts");
    let shown = summary.render_text();
    assert!(summary.ok(), "{shown}");
    assert!(!summary.timed_out, "{shown}");
    assert!(summary.jobs_total > 0);
    assert_eq!(summary.jobs_served, summary.jobs_total, "{shown}");
    assert!(summary.cap_violations.is_empty(), "{shown}");
    assert!(summary.dispatches >= summary.jobs_total, "{shown}");
    // Every child is purged but vault mode's, which Nomad's GC removes (ev-the-dev/moat's
    // go and vm runners).
    assert!(summary.left_to_nomad_gc > 0, "{shown}");
    assert_eq!(
        summary.purges + summary.left_to_nomad_gc,
        summary.dispatches,
        "{shown}"
    );
    // Every cap of the document was watched, and none was exceeded.
    assert_eq!(summary.in_flight_max.len(), 6, "{shown}");
    for (cap, (seen, limit)) in &summary.in_flight_max {
        assert!(seen <= limit, "{cap}: {seen} of {limit}");
    }
    assert!(summary.cross_bucket_takes <= summary.jobs_served);
    let json = serde_json::to_value(&summary).expect("a summary serialises");
    assert!(json["cross_bucket_takes"].is_u64(), "{json}");
    assert!(shown.contains("superset takes"), "{shown}");
}

#[test]
fn the_simulate_command_exits_0_with_its_summary_on_stdout_and_logs_on_stderr() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_runner-scaler"))
        .arg("simulate")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .expect("run runner-scaler simulate");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("jobs served"), "{stdout}");
    assert!(stdout.contains("cap violations       none"), "{stdout}");
    assert!(stderr.contains("poll complete"), "{stderr}");
    assert!(!stdout.contains("poll complete"), "logs leaked to stdout");
}
