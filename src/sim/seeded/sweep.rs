//! The sweep: seeds of one scenario run on several std threads, each seed on its own
//! current-thread runtime, and their outcomes gathered into one report (in seed order, a
//! seed that panicked counted as that seed's failure).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;

use super::invariants::{PENDING, Violation};
use super::run::run_seed_with;
use super::world::Counts;
use super::{RunSettings, Scenario, SeedOutcome, Strategy};

/// What a sweep of seeds showed.
#[derive(Clone, Debug, Serialize)]
pub struct SweepReport {
    pub scenario: Scenario,
    pub first_seed: u64,
    pub last_seed: u64,
    pub seeds: u64,
    pub threads: usize,
    pub passed: u64,
    pub failures: Vec<SeedOutcome>,
    /// For `mixed`: how many seeds each scenario got.
    pub picked: BTreeMap<String, u64>,
    pub totals: Counts,
    pub ticks: u64,
    pub simulated_s: u64,
    pub pending: &'static [&'static str],
    pub wall_ms: u128,
}

impl SweepReport {
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Runs seeds of `scenario` on `threads` workers with the real planner.
pub fn sweep(scenario: Scenario, seeds: impl Iterator<Item = u64>, threads: usize) -> SweepReport {
    sweep_with(scenario, seeds, threads, RunSettings::default())
}

/// Runs seeds on `threads` std threads, each seed on its own current-thread runtime; a seed
/// that panics is a failure of that seed, not of the sweep.
pub fn sweep_with(
    scenario: Scenario,
    seeds: impl Iterator<Item = u64>,
    threads: usize,
    settings: RunSettings,
) -> SweepReport {
    let started = Instant::now();
    let seeds: Vec<u64> = seeds.collect();
    let threads = threads.max(1);
    let outcomes = sweep_outcomes(scenario, seeds.iter().copied(), threads, settings);
    let mut report = SweepReport {
        scenario,
        first_seed: seeds.iter().copied().min().unwrap_or(0),
        last_seed: seeds.iter().copied().max().unwrap_or(0),
        seeds: seeds.len() as u64,
        threads,
        passed: 0,
        failures: Vec::new(),
        picked: BTreeMap::new(),
        totals: Counts::default(),
        ticks: 0,
        simulated_s: 0,
        pending: PENDING,
        wall_ms: 0,
    };
    for outcome in outcomes {
        *report.picked.entry(outcome.picked.to_string()).or_default() += 1;
        report.totals.add(&outcome.counts);
        report.ticks += outcome.ticks;
        report.simulated_s += outcome.simulated_s;
        if outcome.ok() {
            report.passed += 1;
        } else {
            report.failures.push(outcome);
        }
    }
    report.wall_ms = started.elapsed().as_millis();
    report
}

/// Every seed's outcome, in seed order.
pub fn sweep_outcomes(
    scenario: Scenario,
    seeds: impl Iterator<Item = u64>,
    threads: usize,
    settings: RunSettings,
) -> Vec<SeedOutcome> {
    let seeds: Vec<u64> = seeds.collect();
    let next = AtomicUsize::new(0);
    let outcomes: Mutex<Vec<SeedOutcome>> = Mutex::new(Vec::with_capacity(seeds.len()));
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&seed) = seeds.get(i) else { break };
                    let outcome =
                        std::panic::catch_unwind(|| run_seed_with(scenario, seed, settings))
                            .unwrap_or_else(|panic| panicked(scenario, seed, panic));
                    outcomes
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(outcome);
                }
            });
        }
    });
    let mut outcomes = outcomes.into_inner().unwrap_or_else(|p| p.into_inner());
    outcomes.sort_by_key(|o| o.seed);
    outcomes
}

fn panicked(scenario: Scenario, seed: u64, panic: Box<dyn std::any::Any + Send>) -> SeedOutcome {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into());
    let mut outcome = SeedOutcome::empty(scenario, scenario, seed, Strategy::default());
    outcome.violation = Some(Violation {
        invariant: "panic",
        step: 0,
        message: format!("the run panicked: {what}"),
    });
    outcome
}
