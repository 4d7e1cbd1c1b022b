//! The benchmark: each strategy over the same seeds of each scenario, one row per
//! (strategy, scenario).
//!
//! Every strategy meets the same world: the seed draws the options, the arrivals, the cluster
//! and the faults before the strategy acts, and a strategy's own randomness comes from a
//! separate stream. Latencies are simulated seconds; request counts are what the services would
//! bill. Figures are reported, never asserted.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::scenarios::Scenario;
use super::{RunSettings, SeedOutcome, sweep_outcomes};

/// Who runs the runners in a seed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Strategy {
    /// The real controller: planner, act step, backoff.
    #[default]
    Ours,
    /// The field report's poller (see [`super::baselines::SeedPoller`]).
    Seed,
    /// ephemerd's surplus rules without the veto (see [`super::baselines::EphemerdPreVeto`]).
    EphemerdPreVeto,
}

impl Strategy {
    pub const ALL: [Strategy; 3] = [Strategy::Ours, Strategy::Seed, Strategy::EphemerdPreVeto];

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Ours => "ours",
            Strategy::Seed => "seed",
            Strategy::EphemerdPreVeto => "ephemerd-pre-veto",
        }
    }

    pub fn parse(name: &str) -> Option<Strategy> {
        Strategy::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Strategy {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// One row of the table.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct BenchRow {
    pub strategy: Strategy,
    pub scenario: Scenario,
    pub seeds: u64,
    pub poll_interval_s: u64,
    pub queue_to_dispatch_p50_s: Option<u64>,
    pub queue_to_dispatch_p99_s: Option<u64>,
    pub queue_to_start_p50_s: Option<u64>,
    pub queue_to_start_p99_s: Option<u64>,
    /// Runners that never ran a job.
    pub wasted_dispatches: u64,
    /// Runners destroyed while executing a job, escapes included.
    pub busy_runners_destroyed: u64,
    /// Jobs never served: still queued when the run ended, or cancelled by GitHub after 24 h.
    pub stranded_jobs: u64,
    pub github_rate_limited_requests_per_repo_hour: f64,
    pub nomad_requests_per_tick: f64,
    /// Context for the figures above.
    pub jobs: u64,
    pub dispatches: u64,
    pub simulated_hours: f64,
    /// Seeds in which an invariant did not hold at some step (for baselines, informational).
    pub seeds_with_violations: u64,
    /// Those seeds by the first invariant that did not hold.
    pub first_violations: BTreeMap<&'static str, u64>,
}

/// Nearest-rank percentile of `samples` (sorted in place).
pub fn percentile(samples: &mut [u64], p: f64) -> Option<u64> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    Some(samples[rank.clamp(1, samples.len()) - 1])
}

/// Folds one (strategy, scenario)'s seeds into a row.
pub fn row(strategy: Strategy, scenario: Scenario, outcomes: &[SeedOutcome]) -> BenchRow {
    let mut dispatch = Vec::new();
    let mut start = Vec::new();
    let mut row = BenchRow {
        strategy,
        scenario,
        seeds: outcomes.len() as u64,
        poll_interval_s: outcomes.first().map_or(0, |o| o.poll_interval_s),
        queue_to_dispatch_p50_s: None,
        queue_to_dispatch_p99_s: None,
        queue_to_start_p50_s: None,
        queue_to_start_p99_s: None,
        wasted_dispatches: 0,
        busy_runners_destroyed: 0,
        stranded_jobs: 0,
        github_rate_limited_requests_per_repo_hour: 0.0,
        nomad_requests_per_tick: 0.0,
        jobs: 0,
        dispatches: 0,
        simulated_hours: 0.0,
        seeds_with_violations: 0,
        first_violations: BTreeMap::new(),
    };
    let (mut github, mut github_repo_s, mut nomad, mut ticks) = (0u64, 0u64, 0u64, 0u64);
    for o in outcomes {
        let m = &o.measured;
        dispatch.extend_from_slice(&m.queue_to_dispatch_s);
        start.extend_from_slice(&m.queue_to_start_s);
        row.wasted_dispatches += m.wasted_dispatches;
        row.busy_runners_destroyed += o.counts.escaped_busy;
        row.stranded_jobs += m.stranded_jobs;
        row.jobs += o.counts.jobs;
        row.dispatches += o.counts.dispatches;
        row.simulated_hours += o.simulated_s as f64 / 3600.0;
        if let Some(v) = &m.first_violation {
            row.seeds_with_violations += 1;
            *row.first_violations.entry(v.invariant).or_default() += 1;
        }
        github += m.requests.github_primary;
        github_repo_s += m.github_repos * o.simulated_s;
        nomad += m.requests.nomad;
        ticks += o.ticks;
    }
    row.queue_to_dispatch_p50_s = percentile(&mut dispatch, 50.0);
    row.queue_to_dispatch_p99_s = percentile(&mut dispatch, 99.0);
    row.queue_to_start_p50_s = percentile(&mut start, 50.0);
    row.queue_to_start_p99_s = percentile(&mut start, 99.0);
    if github_repo_s > 0 {
        row.github_rate_limited_requests_per_repo_hour =
            round2(github as f64 * 3600.0 / github_repo_s as f64);
    }
    if ticks > 0 {
        row.nomad_requests_per_tick = round2(nomad as f64 / ticks as f64);
    }
    row.simulated_hours = round2(row.simulated_hours);
    row
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Every strategy over seeds `1..=seeds` of every scenario in `scenarios`.
pub fn run(scenarios: &[Scenario], seeds: u64, threads: usize) -> Vec<BenchRow> {
    let mut rows = Vec::new();
    for &scenario in scenarios {
        for strategy in Strategy::ALL {
            let settings = RunSettings {
                strategy,
                default_reaping: true,
                ..RunSettings::default()
            };
            let outcomes = sweep_outcomes(scenario, 1..=seeds, threads, settings);
            rows.push(row(strategy, scenario, &outcomes));
        }
    }
    rows
}

/// The table as text, one line per row, scenarios grouped.
pub fn render_text(rows: &[BenchRow]) -> String {
    let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    let mut out = format!(
        "{:<16} {:<18} {:>5} {:>8} {:>8} {:>8} {:>8} {:>7} {:>5} {:>8} {:>10} {:>10}\n",
        "scenario",
        "strategy",
        "seeds",
        "disp p50",
        "disp p99",
        "start50",
        "start99",
        "wasted",
        "busy",
        "stranded",
        "gh req/r/h",
        "nomad/tick"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<16} {:<18} {:>5} {:>8} {:>8} {:>8} {:>8} {:>7} {:>5} {:>8} {:>10.1} {:>10.2}\n",
            r.scenario.as_str(),
            r.strategy.as_str(),
            r.seeds,
            opt(r.queue_to_dispatch_p50_s),
            opt(r.queue_to_dispatch_p99_s),
            opt(r.queue_to_start_p50_s),
            opt(r.queue_to_start_p99_s),
            r.wasted_dispatches,
            r.busy_runners_destroyed,
            r.stranded_jobs,
            r.github_rate_limited_requests_per_repo_hour,
            r.nomad_requests_per_tick
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut samples: Vec<u64> = (1..=100).rev().collect();
        assert_eq!(percentile(&mut samples, 50.0), Some(50));
        assert_eq!(percentile(&mut samples, 99.0), Some(99));
        assert_eq!(percentile(&mut [7], 99.0), Some(7));
        assert_eq!(percentile(&mut [], 50.0), None);
    }

    #[test]
    fn strategy_names_round_trip() {
        for s in Strategy::ALL {
            assert_eq!(Strategy::parse(s.as_str()), Some(s));
        }
    }
}
