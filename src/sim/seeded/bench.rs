//! The benchmark: each strategy over the same seeds of each scenario, one row per
//! (strategy, scenario).
//!
//! Every strategy meets the same world: the seed draws the options, the arrivals, the cluster
//! and the faults before the strategy acts, and a strategy's own randomness comes from a
//! separate stream. Latencies are simulated seconds; request counts are what the services would
//! bill. Figures are reported, never asserted.
//!
//! What the newer keys measure:
//!
//! - `dispatch_lag_p50_s`/`_p99_s`: what the loop adds to a job's wait, as opposed to what
//!   caps impose. Every simulated second, before the strategy acts, the queued jobs not yet
//!   matched to a dispatch are taken oldest first and each takes a unit of room under every
//!   cap it counts against (`--max-in-flight`, the repo's `maxConcurrent`, its profile's),
//!   counting our children in flight; a job that gets one is stamped with that second, once
//!   ([`note_cap_room`]). Its lag runs from the stamp to the dispatch matched to it (see
//!   [`super::world::Latencies`]). The API's 0–3 s lag, faults and backoff are in it: they
//!   are what the loop meets. Runs with webhooks split the lag by whether the job's webhook
//!   arrived (`_webhook_`) or was lost (`_webhook_lost_`).
//! - `dispatch_lag_visible_webhook_p50_s`/`_p99_s`: the same for jobs whose webhook arrived,
//!   counted from the first second the API also showed the job queued (and the caps left
//!   room): the part of the lag that is the loop's own, without the API's.
//! - `secondary_points_per_min_max`: GitHub's secondary-limit points of the busiest owner in
//!   its busiest 60 seconds (GET 1, POST/DELETE 5, `304`s included), over every seed.
//! - `concurrent_requests_max`: the most GitHub requests entered in the in-memory service and
//!   not yet answered to the client at once.
//! - `token_mints_per_hour`: installation tokens, JIT configurations and registration tokens
//!   GitHub created, per simulated hour.
//! - `github_primary_per_owner_hour_max`: primary-limit requests of the busiest budget owner
//!   (an installation, a polling token, the App itself) per simulated hour, the worst seed.
//! - `github_requests_sent_per_repo_hour`: every request that reached GitHub, `304`s and
//!   refusals included, per repo-hour: a strategy over its primary budget is refused (and
//!   then billed no more), so this is what it asks for where the primary count shows what it
//!   got.
//! - `tick_wall_ms_p99`: host wall time of `Controller::tick`, ours only (the baselines print
//!   `-`); it depends on the machine and its load, so it is reported, never asserted.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::ports::Sim;
use super::scenarios::Scenario;
use super::world::Job;
use super::{RunSettings, SeedOutcome, sweep_outcomes};
use crate::model::{LabelSet, RepoName};

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
    /// Registrations deleted to take a runner back, over every seed.
    pub take_backs: u64,
    /// Of those, on the seeds whose GitHub kills the job of a runner deregistered under it.
    pub take_backs_pessimistic: u64,
    /// Jobs killed by a delete inside the window no signal closes (the busy flag lagging, the
    /// job not yet listed): counted, reported, never excused silently.
    pub kills_in_delete_window: u64,
    /// Those kills per 1,000 take-backs of the pessimistic seeds.
    pub kills_in_delete_window_per_1000_take_backs: Option<f64>,
    /// Jobs killed by a delete outside that window (a failed seed for ours).
    pub kills_outside_delete_window: u64,
    pub github_rate_limited_requests_per_repo_hour: f64,
    pub nomad_requests_per_tick: f64,
    pub dispatch_lag_p50_s: Option<u64>,
    pub dispatch_lag_p99_s: Option<u64>,
    /// Jobs whose webhook arrived (runs with webhooks only).
    pub dispatch_lag_webhook_p50_s: Option<u64>,
    pub dispatch_lag_webhook_p99_s: Option<u64>,
    /// Jobs whose webhook was lost (runs with webhooks only).
    pub dispatch_lag_webhook_lost_p50_s: Option<u64>,
    pub dispatch_lag_webhook_lost_p99_s: Option<u64>,
    /// For jobs whose webhook arrived, from the first second the API showed them queued.
    pub dispatch_lag_visible_webhook_p50_s: Option<u64>,
    pub dispatch_lag_visible_webhook_p99_s: Option<u64>,
    pub secondary_points_per_min_max: Option<u64>,
    pub concurrent_requests_max: Option<u64>,
    pub token_mints_per_hour: Option<f64>,
    pub github_primary_per_owner_hour_max: Option<f64>,
    /// Every request that reached GitHub (billed, `304`, or refused by a limit) per repo and
    /// simulated hour: what a strategy asks for, where the primary count shows what it got.
    pub github_requests_sent_per_repo_hour: Option<f64>,
    /// Primary-limit requests by what they did, over every seed (where a repo's cost goes).
    pub github_primary_by_kind: BTreeMap<&'static str, u64>,
    pub tick_wall_ms_p99: Option<f64>,
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
        take_backs: 0,
        take_backs_pessimistic: 0,
        kills_in_delete_window: 0,
        kills_in_delete_window_per_1000_take_backs: None,
        kills_outside_delete_window: 0,
        github_rate_limited_requests_per_repo_hour: 0.0,
        nomad_requests_per_tick: 0.0,
        dispatch_lag_p50_s: None,
        dispatch_lag_p99_s: None,
        dispatch_lag_webhook_p50_s: None,
        dispatch_lag_webhook_p99_s: None,
        dispatch_lag_webhook_lost_p50_s: None,
        dispatch_lag_webhook_lost_p99_s: None,
        dispatch_lag_visible_webhook_p50_s: None,
        dispatch_lag_visible_webhook_p99_s: None,
        secondary_points_per_min_max: None,
        concurrent_requests_max: None,
        token_mints_per_hour: None,
        github_primary_per_owner_hour_max: None,
        github_requests_sent_per_repo_hour: None,
        github_primary_by_kind: BTreeMap::new(),
        tick_wall_ms_p99: None,
        jobs: 0,
        dispatches: 0,
        simulated_hours: 0.0,
        seeds_with_violations: 0,
        first_violations: BTreeMap::new(),
    };
    let (mut github, mut github_repo_s, mut nomad, mut ticks) = (0u64, 0u64, 0u64, 0u64);
    let (mut lag, mut lag_webhook, mut lag_lost) = (Vec::new(), Vec::new(), Vec::new());
    let mut lag_visible_webhook = Vec::new();
    let (mut mints, mut tick_wall_us, mut seconds, mut sent) = (0u64, Vec::new(), 0u64, 0u64);
    for o in outcomes {
        let m = &o.measured;
        for &(s, webhook) in &m.dispatch_lag_s {
            lag.push(s);
            // Only ours takes the hints: a baseline's jobs are not split by their webhook.
            match webhook.filter(|_| strategy == Strategy::Ours) {
                Some(true) => lag_webhook.push(s),
                Some(false) => lag_lost.push(s),
                None => {}
            }
        }
        if strategy == Strategy::Ours {
            lag_visible_webhook.extend(
                m.dispatch_lag_visible_s
                    .iter()
                    .filter(|(_, webhook)| *webhook == Some(true))
                    .map(|(s, _)| *s),
            );
        }
        let r = &m.requests;
        if r.github_primary + r.github_not_modified > 0 {
            row.secondary_points_per_min_max = row
                .secondary_points_per_min_max
                .max(Some(r.secondary.per_min_max));
            row.concurrent_requests_max = row
                .concurrent_requests_max
                .max(Some(r.github_concurrent_max));
            if o.simulated_s > 0
                && let Some(most) = r.github_primary_by_owner.values().max()
            {
                let per_hour = round2(*most as f64 * 3600.0 / o.simulated_s as f64);
                row.github_primary_per_owner_hour_max = Some(
                    row.github_primary_per_owner_hour_max
                        .map_or(per_hour, |p| p.max(per_hour)),
                );
            }
        }
        mints += r.github_token_mints;
        for (kind, n) in &r.github_primary_by_kind {
            *row.github_primary_by_kind.entry(kind).or_default() += n;
        }
        sent += r.github_sent;
        seconds += o.simulated_s;
        tick_wall_us.extend_from_slice(&m.tick_wall_us);
        dispatch.extend_from_slice(&m.queue_to_dispatch_s);
        start.extend_from_slice(&m.queue_to_start_s);
        row.wasted_dispatches += m.wasted_dispatches;
        row.busy_runners_destroyed += o.counts.escaped_busy;
        row.stranded_jobs += m.stranded_jobs;
        row.take_backs += o.counts.deregistrations;
        if m.delete_kills_job {
            row.take_backs_pessimistic += o.counts.deregistrations;
        }
        row.kills_in_delete_window += o.counts.kills_in_window;
        row.kills_outside_delete_window += o.counts.kills_outside_window;
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
        if sent > 0 {
            row.github_requests_sent_per_repo_hour =
                Some(round2(sent as f64 * 3600.0 / github_repo_s as f64));
        }
    }
    if ticks > 0 {
        row.nomad_requests_per_tick = round2(nomad as f64 / ticks as f64);
    }
    if row.take_backs_pessimistic > 0 {
        row.kills_in_delete_window_per_1000_take_backs = Some(round2(
            row.kills_in_delete_window as f64 * 1000.0 / row.take_backs_pessimistic as f64,
        ));
    }
    row.dispatch_lag_p50_s = percentile(&mut lag, 50.0);
    row.dispatch_lag_p99_s = percentile(&mut lag, 99.0);
    row.dispatch_lag_webhook_p50_s = percentile(&mut lag_webhook, 50.0);
    row.dispatch_lag_webhook_p99_s = percentile(&mut lag_webhook, 99.0);
    row.dispatch_lag_webhook_lost_p50_s = percentile(&mut lag_lost, 50.0);
    row.dispatch_lag_webhook_lost_p99_s = percentile(&mut lag_lost, 99.0);
    row.dispatch_lag_visible_webhook_p50_s = percentile(&mut lag_visible_webhook, 50.0);
    row.dispatch_lag_visible_webhook_p99_s = percentile(&mut lag_visible_webhook, 99.0);
    if seconds > 0 {
        row.token_mints_per_hour = Some(round2(mints as f64 * 3600.0 / seconds as f64));
    }
    row.tick_wall_ms_p99 = percentile(&mut tick_wall_us, 99.0).map(|us| round2(us as f64 / 1000.0));
    row.simulated_hours = round2(row.simulated_hours);
    row
}

/// Stamps the queued jobs the caps leave room for at this second (see the module's notes on
/// `dispatch_lag`): our children in flight count against the global cap, their repo's and
/// their profile's; each waiting job, oldest first, takes a unit under each of its caps.
pub fn note_cap_room(sim: &mut Sim) {
    let mut total = 0u32;
    let mut repos: BTreeMap<RepoName, u32> = BTreeMap::new();
    let mut profiles: BTreeMap<(RepoName, usize), u32> = BTreeMap::new();
    let profile_of = |repo: &RepoName, labels: &LabelSet| {
        sim.config
            .repos
            .get(repo)
            .and_then(|r| r.route(labels).ok())
            .and_then(|route| route.profile)
    };
    for (_, child) in sim.world.in_flight() {
        total += 1;
        let Some(repo) = &child.repo else { continue };
        *repos.entry(repo.clone()).or_default() += 1;
        if let Some(index) = profile_of(repo, &child.labels) {
            *profiles.entry((repo.clone(), index)).or_default() += 1;
        }
    }
    let global = sim.options.max_in_flight;
    let config = &sim.config;
    let mut has_room = |job: &Job| {
        let Some(repo) = config.repos.get(&job.repo) else {
            return false;
        };
        let Ok(route) = repo.route(&job.labels) else {
            return false;
        };
        let profile_cap = route
            .profile
            .and_then(|i| repo.profiles[i].max_concurrent.map(|cap| (i, cap)));
        let repo_used = repos.get(&job.repo).copied().unwrap_or(0);
        let profile_full = profile_cap.is_some_and(|(i, cap)| {
            profiles.get(&(job.repo.clone(), i)).copied().unwrap_or(0) >= cap
        });
        if global.is_some_and(|cap| total >= cap)
            || repo_used >= repo.max_concurrent
            || profile_full
        {
            return false;
        }
        total += 1;
        *repos.entry(job.repo.clone()).or_default() += 1;
        if let Some((i, _)) = profile_cap {
            *profiles.entry((job.repo.clone(), i)).or_default() += 1;
        }
        true
    };
    let t = sim.t;
    sim.world.note_cap_room(t, &mut has_room);
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
    let optf = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    let pair = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (None, None) => "-".to_string(),
        _ => format!("{}/{}", opt(a), opt(b)),
    };
    let mut out = format!(
        "{:<16} {:<18} {:>5} {:>8} {:>8} {:>8} {:>8} {:>7} {:>5} {:>8} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>7} {:>5} {:>7} {:>10} {:>8} {:>9} {:>8} {:>7}\n",
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
        "nomad/tick",
        "lag50/99",
        "hook50/99",
        "vis50/99",
        "lost50/99",
        "sec/min",
        "conc",
        "mints/h",
        "owner/h",
        "tick99ms",
        "takebacks",
        "kills/1k",
        "kills!w"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<16} {:<18} {:>5} {:>8} {:>8} {:>8} {:>8} {:>7} {:>5} {:>8} {:>10.1} {:>10.2} {:>9} {:>9} {:>9} {:>9} {:>7} {:>5} {:>7} {:>10} {:>8} {:>9} {:>8} {:>7}\n",
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
            r.nomad_requests_per_tick,
            pair(r.dispatch_lag_p50_s, r.dispatch_lag_p99_s),
            pair(r.dispatch_lag_webhook_p50_s, r.dispatch_lag_webhook_p99_s),
            pair(
                r.dispatch_lag_visible_webhook_p50_s,
                r.dispatch_lag_visible_webhook_p99_s
            ),
            pair(
                r.dispatch_lag_webhook_lost_p50_s,
                r.dispatch_lag_webhook_lost_p99_s
            ),
            opt(r.secondary_points_per_min_max),
            opt(r.concurrent_requests_max),
            optf(r.token_mints_per_hour),
            optf(r.github_primary_per_owner_hour_max),
            r.tick_wall_ms_p99
                .map_or("-".to_string(), |v| format!("{v:.2}")),
            r.take_backs,
            optf(r.kills_in_delete_window_per_1000_take_backs),
            r.kills_outside_delete_window
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
    fn the_new_keys_are_folded_from_what_each_seed_measured() {
        let mut outcome =
            SeedOutcome::empty(Scenario::Fleet500, Scenario::Fleet500, 1, Strategy::Ours);
        outcome.simulated_s = 1800;
        let m = &mut outcome.measured;
        m.dispatch_lag_s = vec![
            (0, Some(true)),
            (1, Some(true)),
            (9, Some(false)),
            (30, None),
        ];
        m.dispatch_lag_visible_s = vec![(0, Some(true)), (2, Some(true)), (7, Some(false))];
        m.tick_wall_us = vec![1_000, 2_500];
        m.requests.github_primary = 10;
        m.requests.github_token_mints = 3;
        m.requests.github_concurrent_max = 4;
        m.requests.github_primary_by_owner = [("installation".to_string(), 10)].into();
        m.requests
            .secondary
            .spend("installation", &http::Method::POST, 5);
        m.requests
            .secondary
            .spend("installation", &http::Method::GET, 6);
        let mut other = outcome.clone();
        other.seed = 2;
        other.measured.requests.github_concurrent_max = 7;
        other.measured.dispatch_lag_s.clear();
        other.measured.tick_wall_us.clear();

        let row = row(Strategy::Ours, Scenario::Fleet500, &[outcome, other]);
        assert_eq!(row.dispatch_lag_p50_s, Some(1));
        assert_eq!(row.dispatch_lag_p99_s, Some(30));
        assert_eq!(row.dispatch_lag_webhook_p50_s, Some(0));
        assert_eq!(row.dispatch_lag_webhook_p99_s, Some(1));
        assert_eq!(row.dispatch_lag_webhook_lost_p50_s, Some(9));
        // Counted from visibility, webhook delivered only.
        assert_eq!(row.dispatch_lag_visible_webhook_p50_s, Some(0));
        assert_eq!(row.dispatch_lag_visible_webhook_p99_s, Some(2));
        assert_eq!(row.secondary_points_per_min_max, Some(6));
        assert_eq!(row.concurrent_requests_max, Some(7));
        // 6 mints over two half-hours.
        assert_eq!(row.token_mints_per_hour, Some(6.0));
        assert_eq!(row.github_primary_per_owner_hour_max, Some(20.0));
        assert_eq!(row.tick_wall_ms_p99, Some(2.5));

        // A baseline takes no hints and its ticks are not timed: those keys stay empty.
        let mut baseline = SeedOutcome::empty(Scenario::Idle, Scenario::Idle, 1, Strategy::Seed);
        baseline.simulated_s = 3600;
        baseline.measured.dispatch_lag_s = vec![(2, Some(true))];
        let row = super::row(Strategy::Seed, Scenario::Idle, &[baseline]);
        assert_eq!(row.tick_wall_ms_p99, None);
        assert_eq!(row.dispatch_lag_webhook_p50_s, None);
        assert_eq!(row.dispatch_lag_p50_s, Some(2));
        assert_eq!(row.secondary_points_per_min_max, None);
        let text = render_text(std::slice::from_ref(&row));
        assert!(
            text.lines().nth(1).is_some_and(|l| l.contains(" - ")),
            "{text}"
        );
    }

    #[test]
    fn strategy_names_round_trip() {
        for s in Strategy::ALL {
            assert_eq!(Strategy::parse(s.as_str()), Some(s));
        }
    }
}
