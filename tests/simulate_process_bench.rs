//! `simulate --bench-process`: the daemon as its own process against the twins, measured.
//! The figures are only sanity-checked: they depend on the machine.

use std::process::{Command, Output};

use serde_json::Value;

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
    ] {
        assert!(report.get(key).is_some(), "no {key} in {report:#}");
    }
    assert_eq!(report["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(report["window_s"], 4.0);
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
    assert!(
        count("dispatches") >= 1,
        "the daemon dispatched nothing: {report:#}"
    );
    assert!(
        count("purges") >= 1,
        "the daemon purged nothing: {report:#}"
    );
    assert!(count("purges") <= count("dispatches"), "{report:#}");
    assert_eq!(report["daemon_exit_code"], 0, "{report:#}");
    // The daemon's log is its own: none of it reaches the bench's stdout.
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!stdout.contains("poll complete"), "{stdout}");
}

#[test]
fn a_window_without_the_process_bench_or_of_zero_is_a_bad_flag() {
    let output = simulate(&["--window", "4s"]);
    assert_eq!(output.status.code(), Some(64), "{}", shown(&output));
    let output = simulate(&["--bench-process", "--window", "0s"]);
    assert_eq!(output.status.code(), Some(64), "{}", shown(&output));
    let output = simulate(&["--bench-process", "--window", "soon"]);
    assert_eq!(output.status.code(), Some(64), "{}", shown(&output));
    let output = simulate(&["--bench-process", "--scenario", "mixed"]);
    assert_eq!(output.status.code(), Some(64), "{}", shown(&output));
}
