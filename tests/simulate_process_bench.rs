//! `simulate --bench-process`: the daemon as its own process against the twins, measured.
//! The figures are only sanity-checked: they depend on the machine.

mod support;

use std::process::{Command, Output};

use runner_scaler::sim::process_bench::FLEET_REPOS;
use runner_scaler::sim::world::{FLEET_REPO_MAX, fleet_document, fleet_repo};
use serde_json::Value;
use support::twins::TempFile;

fn simulate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runner-scaler"))
        .arg("simulate")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .expect("run runner-scaler simulate")
}

fn shown(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn the_daemon_process_dispatches_and_purges_and_its_cpu_and_peak_rss_are_reported() {
    let output = simulate(&["--bench-process", "--window", "4s", "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", shown(&output));
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}):\n{}", shown(&output)));
    for key in [
        "cpu_s",
        "peak_rss_mib",
        "window_s",
        "poll_interval_s",
        "ticks",
        "dispatches",
        "purges",
        "jobs_queued",
        "version",
        "repos",
        "tick_wall_ms_p50",
        "tick_wall_ms_p99",
        "tick_wall_ms_max",
    ] {
        assert!(report.get(key).is_some(), "no {key} in {report:#}");
    }
    assert_eq!(report["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(report["window_s"], 4.0);
    assert_eq!(report["scenario"], "demo");
    assert_eq!(report["repos"], 3, "the BRIEF document: {report:#}");
    let positive = |key: &str| {
        report[key]
            .as_f64()
            .is_some_and(|v| v.is_finite() && v > 0.0)
    };
    for key in ["cpu_s", "peak_rss_mib", "poll_interval_s"] {
        assert!(
            positive(key),
            "{key} is not a positive number in {report:#}"
        );
    }
    let count = |key: &str| {
        report[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} is not a count in {report:#}"))
    };
    assert!(count("ticks") >= 1, "{report:#}");
    assert!(count("jobs_queued") >= 1, "{report:#}");
    // More than the first job's runner: a daemon that reads idle repos at its 60 s default
    // instead of the window's pace sees no job queued after its first tick.
    assert!(
        count("dispatches") >= 3,
        "the daemon dispatched too little: {report:#}"
    );
    assert!(
        count("purges") >= 1,
        "the daemon purged nothing: {report:#}"
    );
    assert!(count("purges") <= count("dispatches"), "{report:#}");
    assert_tick_times(&report);
    // Idle repos are read four times slower than busy ones, as at the daemon's defaults
    // (15 s and 60 s), set through its environment.
    let poll = report["poll_interval_s"].as_f64().expect("a poll interval");
    assert_eq!(report["idle_poll_interval_s"].as_f64(), Some(poll * 4.0));
    assert_eq!(report["daemon_exit_code"], 0, "{report:#}");
    // The daemon's log is its own: none of it reaches the bench's stdout.
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!stdout.contains("poll complete"), "{stdout}");
}

#[test]
fn a_window_without_the_process_bench_or_of_zero_is_a_bad_flag() {
    let output = simulate(&["--window", "4s"]);
    assert_eq!(output.status.code(), Some(64), "{}", shown(&output));
    let output = simulate(&["--github-latency", "100ms"]);
    assert_eq!(output.status.code(), Some(64), "{}", shown(&output));
    let output = simulate(&["--bench-process", "--window", "0s"]);
    assert_eq!(output.status.code(), Some(64), "{}", shown(&output));
    let output = simulate(&["--bench-process", "--window", "soon"]);
    assert_eq!(output.status.code(), Some(64), "{}", shown(&output));
    let output = simulate(&["--bench-process", "--scenario", "mixed"]);
    assert_eq!(output.status.code(), Some(64), "{}", shown(&output));
    // `idle` names a scenario of `simulate --bench`, not a world of the process bench.
    let output = simulate(&["--bench-process", "--scenario", "idle"]);
    assert_eq!(output.status.code(), Some(64), "{}", shown(&output));
}

/// The tick wall times are present and ordered; their values depend on the machine.
fn assert_tick_times(report: &Value) {
    let ms = |key: &str| {
        report[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} is not a count of ms in {report:#}"))
    };
    assert!(
        ms("tick_wall_ms_p50") <= ms("tick_wall_ms_p99")
            && ms("tick_wall_ms_p99") <= ms("tick_wall_ms_max"),
        "{report:#}"
    );
}

#[test]
fn the_fleet_of_500_repos_runs_against_its_own_daemon_process_whose_ticks_are_timed() {
    let output = simulate(&[
        "--bench-process",
        "--scenario",
        "fleet-500",
        "--window",
        "5s",
        "--json",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", shown(&output));
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}):\n{}", shown(&output)));
    assert_eq!(report["scenario"], "fleet-500");
    assert_eq!(report["repos"], 500, "{report:#}");
    assert_eq!(report["daemon_exit_code"], 0, "{report:#}");
    assert!(
        report["ticks"].as_u64().is_some_and(|t| t >= 1),
        "{report:#}"
    );
    assert!(
        report["dispatches"].as_u64().is_some_and(|d| d >= 1),
        "the daemon dispatched nothing for the fleet: {report:#}"
    );
    assert_tick_times(&report);
    // A window too short for eight 15 s ticks polls at the demo's pace, idle repos four
    // times slower, as `--idle-poll-interval` set through the daemon's environment.
    let poll = report["poll_interval_s"].as_f64().expect("a poll interval");
    assert!(poll < 15.0, "{report:#}");
    assert_eq!(report["idle_poll_interval_s"].as_f64(), Some(poll * 4.0));
    assert_eq!(report["max_concurrent_polls"], 8, "{report:#}");
}

#[test]
fn config_check_accepts_the_fleet_document_of_500_app_repos() {
    let document = fleet_document(FLEET_REPOS);
    let parsed: Value = serde_json::from_str(&document).expect("the document is JSON");
    let entries = parsed.as_object().expect("an object of repos");
    assert_eq!(entries.len(), 500);
    assert_eq!(entries[&fleet_repo(0)]["mode"], "app");
    assert_eq!(entries[&fleet_repo(499)]["maxConcurrent"], FLEET_REPO_MAX);
    let file = TempFile::with_contents("fleet-500.json", &document);
    let output = Command::new(env!("CARGO_BIN_EXE_runner-scaler"))
        .args(["config", "check", &file.path().display().to_string()])
        .env_clear()
        .output()
        .expect("run runner-scaler config check");
    assert_eq!(output.status.code(), Some(0), "{}", shown(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).starts_with("ok: 500 repos\n"),
        "{}",
        shown(&output)
    );
}
