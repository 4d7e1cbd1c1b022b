//! The seeded simulator: the real controller over the simulated world, seeds swept in
//! parallel, every invariant checked every step; the same seed replays exactly; and mutant
//! planners with known bugs make the sweep fail.

use std::process::Command;

use runner_scaler::sim::seeded::mutants::{
    ignores_unplaced_children, never_dispatches, one_extra_runner,
};
use runner_scaler::sim::seeded::{
    RunSettings, Scenario, SweepReport, run_seed, run_seed_with, sweep, sweep_with,
};

fn failures(report: &SweepReport) -> String {
    report
        .failures
        .iter()
        .filter_map(|f| f.failure_line())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn two_hundred_mixed_seeds_hold_every_invariant() {
    let report = sweep(Scenario::Mixed, 1..=200, 2);
    assert!(report.ok(), "{}", failures(&report));
    assert_eq!(report.passed, 200);
    // Mixed really mixes: every named scenario is drawn.
    assert_eq!(
        report.picked.len(),
        Scenario::NAMED.len(),
        "{:?}",
        report.picked
    );
    // The world did what it is for: work, faults of each kind, cross-bucket takes.
    let c = &report.totals;
    assert!(c.jobs > 1000 && c.dispatches > 1000, "{c:?}");
    assert!(
        c.failed_starts > 0 && c.jobs_cancelled > 0 && c.cross_bucket_takes > 0,
        "{c:?}"
    );
    assert!(
        c.dispatches_deduplicated > 0,
        "no lost dispatch response was replayed: {c:?}"
    );
    assert_eq!(c.escaped_busy, 0);
}

#[test]
fn every_named_scenario_holds_for_a_few_seeds() {
    for scenario in Scenario::NAMED {
        let report = sweep(scenario, 1000..1008, 2);
        assert!(report.ok(), "{scenario}: {}", failures(&report));
        assert_eq!(
            report.picked.keys().collect::<Vec<_>>(),
            [scenario.as_str()]
        );
    }
}

#[test]
fn a_seed_replays_exactly_and_seeds_differ() {
    let first = run_seed(Scenario::Mixed, 42);
    let again = run_seed(Scenario::Mixed, 42);
    assert_eq!(first.trace_hash, again.trace_hash);
    assert_eq!(first.trace_events, again.trace_events);
    assert_eq!(first.counts, again.counts);
    // Keeping the trace as text changes nothing about the run.
    let kept = run_seed_with(
        Scenario::Mixed,
        42,
        RunSettings {
            keep_trace: true,
            ..Default::default()
        },
    );
    assert_eq!(kept.trace_hash, first.trace_hash);
    assert_eq!(kept.trace.len() as u64, kept.trace_events);

    let hashes: std::collections::BTreeSet<String> = (1..=20)
        .map(|seed| run_seed(Scenario::Steady, seed).trace_hash)
        .collect();
    assert_eq!(hashes.len(), 20, "two seeds gave the same trace");
}

#[test]
fn replayed_trace_names_what_was_dispatched_and_why_buckets_were_held() {
    let outcome = run_seed_with(
        Scenario::ClusterFull,
        3,
        RunSettings {
            keep_trace: true,
            ..Default::default()
        },
    );
    assert!(outcome.ok(), "{:?}", outcome.failure_line());
    assert!(outcome.trace.iter().any(|e| e.contains("dispatched ")));
    let bound = outcome
        .convergence
        .expect("the run reached its convergence phase");
    assert!(bound.bound_s > bound.from_s);
    assert!(outcome.simulated_s <= bound.bound_s);
}

#[test]
fn a_planner_that_ignores_unplaced_children_fails_the_cluster_full_sweep() {
    let report = sweep_with(
        Scenario::ClusterFull,
        1..=20,
        2,
        RunSettings {
            planner: Some(ignores_unplaced_children),
            keep_trace: false,
            ..RunSettings::default()
        },
    );
    assert!(!report.ok(), "the mutant survived 20 cluster-full seeds");
    for failure in &report.failures {
        let v = failure
            .violation
            .as_ref()
            .expect("failures carry a violation");
        assert!(
            v.invariant == "I3" || v.invariant == "I7",
            "{}",
            failure.failure_line().unwrap_or_default()
        );
        assert!(failure.replay_command().ends_with(&format!(
            "simulate --scenario cluster-full --seed {}",
            failure.seed
        )));
    }
}

#[test]
fn a_planner_that_never_dispatches_fails_on_timeliness() {
    let report = sweep_with(
        Scenario::Steady,
        1..=4,
        2,
        RunSettings {
            planner: Some(never_dispatches),
            keep_trace: false,
            ..RunSettings::default()
        },
    );
    assert_eq!(report.failures.len(), 4, "{}", failures(&report));
    // Work left waiting past its deadline (I2), or never drained (I6) where a seed's first
    // jobs arrive while the leader may still wait (a lock delay, an idle repo's first read).
    for failure in &report.failures {
        let invariant = failure.violation.as_ref().map(|v| v.invariant);
        assert!(
            matches!(invariant, Some("I2" | "I6")),
            "{}",
            failures(&report)
        );
    }
    assert!(
        report
            .failures
            .iter()
            .any(|f| f.violation.as_ref().map(|v| v.invariant) == Some("I2")),
        "{}",
        failures(&report)
    );
}

#[test]
fn a_planner_that_overdispatches_fails_on_caps_or_storms() {
    let report = sweep_with(
        Scenario::Burst,
        1..=6,
        2,
        RunSettings {
            planner: Some(one_extra_runner),
            keep_trace: false,
            ..RunSettings::default()
        },
    );
    assert!(!report.failures.is_empty());
    for failure in &report.failures {
        let invariant = failure.violation.as_ref().map(|v| v.invariant);
        assert!(
            matches!(invariant, Some("I3" | "I7")),
            "{}",
            failure.failure_line().unwrap_or_default()
        );
    }
}

fn simulate(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_runner-scaler"))
        .arg("simulate")
        .args(args)
        .output()
        .expect("run runner-scaler");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn simulate_sweeps_replays_and_refuses_what_it_cannot_do() {
    let (code, stdout, _) = simulate(&["--scenario", "steady", "--seeds", "4"]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("seeds 1..=4"), "{stdout}");
    assert!(stdout.contains("passed 4 of 4"), "{stdout}");
    // Every invariant is judged: none is left pending.
    assert!(!stdout.contains("pending"), "{stdout}");

    let (code, stdout, _) = simulate(&["--scenario", "outages", "--seed", "7"]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("trace hash "), "{stdout}");
    assert!(stdout.contains("I6 bound: converge by t="), "{stdout}");
    assert!(!stdout.contains("CANARY"), "a token reached the output");

    let (code, stdout, _) = simulate(&["--scenario", "burst", "--seed", "7", "--json"]);
    assert_eq!(code, Some(0));
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("--json prints JSON");
    assert_eq!(json["scenario"], "burst");
    assert_eq!(json["seed"], 7);
    assert!(json["violation"].is_null());

    let (code, _, stderr) = simulate(&["--scenario", "nonsense", "--seeds", "1"]);
    assert_eq!(code, Some(64));
    assert!(
        stderr.contains("same-label-race") && stderr.contains("mixed"),
        "{stderr}"
    );

    let (code, _, stderr) = simulate(&["--bench", "--seed", "3"]);
    assert_eq!(code, Some(64));
    assert!(stderr.contains("--seeds N"), "{stderr}");

    let (code, _, stderr) = simulate(&["--scenario", "steady", "--seeds", "1", "--strategy", "x"]);
    assert_eq!(code, Some(64));
    assert!(stderr.contains("ephemerd-pre-veto"), "{stderr}");
}

#[test]
fn the_bench_prints_one_row_per_strategy_and_scenario_with_the_documented_keys() {
    let (code, stdout, stderr) = simulate(&[
        "--bench",
        "--scenario",
        "same-label-race",
        "--seeds",
        "2",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout).expect("--json prints JSON");
    let strategies: Vec<&str> = rows.iter().filter_map(|r| r["strategy"].as_str()).collect();
    assert_eq!(strategies, ["ours", "seed", "ephemerd-pre-veto"]);
    for row in &rows {
        assert_eq!(row["scenario"], "same-label-race");
        assert_eq!(row["seeds"], 2);
        for key in [
            "poll_interval_s",
            "queue_to_dispatch_p50_s",
            "queue_to_dispatch_p99_s",
            "queue_to_start_p50_s",
            "queue_to_start_p99_s",
            "wasted_dispatches",
            "busy_runners_destroyed",
            "stranded_jobs",
            "github_rate_limited_requests_per_repo_hour",
            "nomad_requests_per_tick",
        ] {
            assert!(row[key].is_number(), "{key} in {row}");
        }
        // Every strategy dispatched and some work started, so the latencies were measured.
        assert!(row["dispatches"].as_u64() > Some(0), "{row}");
        assert!(
            row["queue_to_start_p99_s"].as_u64() >= row["queue_to_start_p50_s"].as_u64(),
            "{row}"
        );
    }
}

/// The benchmark reports what a take-back costs: registrations deleted, and jobs a delete
/// killed inside the window no signal closes, per 1,000 take-backs of the seeds whose GitHub
/// kills such a job; ours kills none outside it.
#[test]
fn the_take_backs_bench_reports_kills_in_the_delete_window_per_thousand_take_backs() {
    let (code, stdout, stderr) = simulate(&[
        "--bench",
        "--scenario",
        "take-backs",
        "--seeds",
        "6",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout).expect("--json prints JSON");
    let ours = rows
        .iter()
        .find(|r| r["strategy"] == "ours")
        .expect("a row for ours");
    assert!(ours["take_backs"].as_u64() > Some(0), "{ours}");
    assert!(ours["take_backs_pessimistic"].as_u64() <= ours["take_backs"].as_u64());
    assert!(ours["kills_in_delete_window"].is_u64(), "{ours}");
    assert_eq!(ours["kills_outside_delete_window"], 0, "{ours}");
    let per_1000 = &ours["kills_in_delete_window_per_1000_take_backs"];
    match ours["take_backs_pessimistic"].as_u64() {
        Some(0) => assert!(per_1000.is_null(), "{ours}"),
        _ => assert!(per_1000.is_number(), "{ours}"),
    }
}

#[test]
fn every_mutant_is_caught_by_the_invariant_it_is_named_for() {
    // CI hunts on fewer seeds than `simulate --mutants` does by default.
    let (code, stdout, stderr) = simulate(&["--mutants", "--seeds", "200"]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let count = runner_scaler::sim::seeded::mutants::Mutant::ALL.len();
    assert!(
        stdout.contains(&format!("{count} of {count} mutants caught")),
        "{stdout}"
    );
    for (mutant, invariants) in [
        ("lock-key-not-watched", &["I8"][..]),
        ("deregistered-counted", &["I2", "I4"][..]),
        ("backoff-forgotten-at-restart", &["I7"][..]),
        ("dispatches-on-stale-listing", &["I3", "I7"][..]),
        ("forgejo-task-counted-waiting", &["I7", "I3"][..]),
        ("stopping-frees-its-slot", &["I3"][..]),
    ] {
        assert!(
            invariants.iter().any(|invariant| {
                stdout.contains(&format!("mutant {mutant}: caught by {invariant} at seed"))
            }),
            "{mutant} not caught by {invariants:?}: {stdout}"
        );
    }
    assert!(!stdout.contains("unbroken daemon fails too"), "{stdout}");
}

/// Two daemons blocked on the same lock key wake in one order on every run: a seed whose
/// daemons race for the key after it changes replays exactly (tokio's `watch` woke them in
/// an order drawn at random, so about a third of such replays told another story).
#[test]
fn seeds_where_two_daemons_race_for_the_lock_replay_exactly() {
    for seed in [1, 26, 78] {
        let first = run_seed(Scenario::CrashLoop, seed).trace_hash;
        for _ in 0..4 {
            assert_eq!(
                run_seed(Scenario::CrashLoop, seed).trace_hash,
                first,
                "crash-loop seed {seed} told another story on a replay"
            );
        }
    }
}
