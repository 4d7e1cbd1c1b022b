//! The named scenarios: each is a function from the seed's generator to [`Options`], starting
//! from the baseline and pushing on one thing the daemon must get right. The enum itself and
//! its names live in [`super::scenario_name`]; this file imports [`Options`], never the
//! other way round.

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;

use super::options::{FaultRates, ForeignLoad, Options, Service, Webhooks, fleet, outage};
pub use super::scenario_name::Scenario;

impl Scenario {
    /// Draws the options of one run.
    pub fn options(self, rng: &mut StdRng) -> Options {
        let scenario = match self {
            Scenario::Mixed => *Scenario::NAMED.choose(rng).expect("non-empty"),
            named => named,
        };
        let mut o = Options::baseline(scenario, rng);
        match scenario {
            Scenario::Steady | Scenario::Mixed => {}
            Scenario::Idle => idle(&mut o),
            Scenario::Fleet500 => fleet_500(&mut o, rng),
            Scenario::Burst => burst(&mut o, rng),
            Scenario::SameLabelRace => same_label_race(&mut o, rng),
            Scenario::SupersetLabels => superset_labels(&mut o, rng),
            Scenario::Cancellations => cancellations(&mut o, rng),
            Scenario::ClusterFull => cluster_full(&mut o, rng),
            Scenario::CrashLoop => crash_loop(&mut o, rng),
            Scenario::Outages => outages(&mut o, rng),
            Scenario::RateLimited => rate_limited(&mut o, rng),
            Scenario::TakeBacks => take_backs(&mut o, rng),
        }
        o
    }
}

/// No work, no fault: only what reading queues costs.
fn quiet(o: &mut Options, repos: usize, length_s: u64) {
    o.repos = fleet(repos);
    o.max_in_flight = None;
    o.burst_runs = 0;
    o.runs_per_hour = 0.0;
    o.stale_jobs = 0;
    o.cancel_per_s = 0.0;
    o.rerun_probability = 0.0;
    o.crash_probability = 0.0;
    o.arrivals_end_s = length_s;
    o.faults_end_s = length_s;
    o.faults = Service::ALL
        .iter()
        .map(|s| (*s, FaultRates::default()))
        .collect();
    o.outages.clear();
    o.bad_document = None;
    o.foreign_load = None;
}

fn idle(o: &mut Options) {
    quiet(o, 50, 3 * 3600);
}

/// One busy hour: nine runs in ten land in ten hot repos, the tenth anywhere (mostly in a
/// repo read at its idle interval, which only a webhook wakes early).
fn fleet_500(o: &mut Options, rng: &mut StdRng) {
    quiet(o, 500, 3600);
    o.idle_poll_interval_s = 300;
    o.runs_per_hour = rng.random_range(40.0..80.0);
    o.jobs_per_run = (1, 3);
    o.hot_repos = Some((10, 0.9));
    o.cluster_slots = 40;
    o.webhooks = Some(Webhooks {
        lost: rng.random_range(0.05..=0.10),
        delay_s: (0, 1),
    });
}

fn burst(o: &mut Options, rng: &mut StdRng) {
    o.burst_runs = rng.random_range(8..=20);
    o.jobs_per_run = (1, rng.random_range(2..=5));
    o.runs_per_hour = rng.random_range(0.0..6.0);
    o.arrivals_end_s = rng.random_range(5..=15) * 60;
    o.faults_end_s = o.faults_end_s.min(o.arrivals_end_s + 600);
}

/// Every run lands in one bucket: the first label set of the first repo.
fn same_label_race(o: &mut Options, rng: &mut StdRng) {
    for repo in &mut o.repos {
        repo.label_sets.truncate(1);
    }
    o.repos.truncate(if rng.random_bool(0.5) { 1 } else { 3 });
    o.burst_runs = rng.random_range(3..=10);
    o.jobs_per_run = (2, rng.random_range(3..=6));
    o.needs_probability = 0.0;
    o.boot_s = (5, rng.random_range(6..=20));
}

/// Only the label sets that have a superset (or are one) in the same repo.
fn superset_labels(o: &mut Options, rng: &mut StdRng) {
    o.burst_runs = rng.random_range(2..=6);
    o.runs_per_hour = rng.random_range(20.0..60.0);
    // The superset label set is drawn as often as all the others together.
    for repo in &mut o.repos {
        if let Some(widest) = repo.label_sets.iter().max_by_key(|l| l.len()).cloned() {
            let n = repo.label_sets.len();
            repo.label_sets.extend(std::iter::repeat_n(widest, n - 1));
        }
    }
}

fn cancellations(o: &mut Options, rng: &mut StdRng) {
    o.cancel_per_s = rng.random_range(1.0 / 300.0..1.0 / 30.0);
    o.rerun_probability = rng.random_range(0.2..0.6);
    o.runs_per_hour = rng.random_range(20.0..60.0);
    o.stale_jobs = rng.random_range(1..=4);
    // Slow boots leave time for a job to be cancelled before its runner comes up.
    o.boot_s = (20, 60);
}

fn cluster_full(o: &mut Options, rng: &mut StdRng) {
    o.cluster_slots = rng.random_range(1..=4);
    o.burst_runs = rng.random_range(2..=8);
    let start_s = rng.random_range(0..=10) * 60;
    // Sometimes for over an hour: children stay pending without an allocation all that time.
    let length_s = if rng.random_bool(0.3) {
        rng.random_range(61..=70) * 60
    } else {
        rng.random_range(5..=30) * 60
    };
    o.foreign_load = Some(ForeignLoad {
        start_s,
        end_s: start_s + length_s,
        slots: o.cluster_slots,
    });
    o.faults_end_s = o.faults_end_s.max(start_s + length_s);
    o.arrivals_end_s = o.arrivals_end_s.min(o.faults_end_s);
}

fn crash_loop(o: &mut Options, rng: &mut StdRng) {
    o.crash_probability = rng.random_range(0.3..0.9);
    // A crash-looping image often takes the daemon's node down with it, or is fixed by a
    // deploy that restarts the daemon too: the backoff must survive that.
    o.restart_probability = 0.8;
    o.boot_s = (5, rng.random_range(10..=60));
}

fn outages(o: &mut Options, rng: &mut StdRng) {
    o.faults_end_s = o.faults_end_s.max(rng.random_range(25..=40) * 60);
    for _ in 0..rng.random_range(1..=4) {
        let service = *Service::ALL.choose(rng).expect("non-empty");
        // Some longer than the ten-minute reaping grace window.
        let length = if rng.random_bool(0.5) {
            (660, 1500)
        } else {
            (30, 300)
        };
        o.outages.push(outage(rng, service, o.faults_end_s, length));
    }
}

/// One `app` repo with room under its cap and runs arriving every minute or two, many cancelled
/// while their runner boots: the runner left idle is taken back (its registration deleted
/// first) while the next job of its bucket is on its way.
fn take_backs(o: &mut Options, rng: &mut StdRng) {
    o.repos.retain(|r| r.name == "afreidah/munchbox");
    if let Some(repo) = o.repos.first_mut() {
        repo.entry["maxConcurrent"] = rng.random_range(3..=6).into();
    }
    o.max_in_flight = None;
    o.burst_runs = rng.random_range(0..=2);
    o.runs_per_hour = rng.random_range(30.0..90.0);
    o.jobs_per_run = (1, 2);
    o.needs_probability = 0.0;
    o.cancel_per_s = rng.random_range(1.0 / 600.0..1.0 / 90.0);
    o.rerun_probability = rng.random_range(0.0..0.3);
    o.boot_s = (20, 60);
    // Runners wait long enough to be taken back rather than leave on their own.
    o.idle_timeout_s = 30 * 60;
    o.arrivals_end_s = rng.random_range(30..=45) * 60;
    o.faults_end_s = o.arrivals_end_s;
}

fn rate_limited(o: &mut Options, rng: &mut StdRng) {
    o.rate_limit_reset_s = (30, rng.random_range(300..=900));
    for service in [Service::GitHub, Service::Forgejo] {
        o.faults.insert(
            service,
            FaultRates {
                transient: 0.005,
                malformed: 0.0,
                rate_limited: rng.random_range(0.01..0.08),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;
    use crate::config::{ConfigDefaults, parse_document};

    #[test]
    fn every_scenario_document_passes_validation() {
        for scenario in Scenario::NAMED.into_iter().chain(Scenario::HAZARDS) {
            for seed in 0..20 {
                let options = scenario.options(&mut StdRng::seed_from_u64(seed));
                if let Err(errors) =
                    parse_document(options.document().as_bytes(), &ConfigDefaults::default())
                {
                    panic!("{scenario} seed {seed}: {errors:?}");
                }
            }
        }
    }
}
