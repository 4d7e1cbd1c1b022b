//! The world the daemon runs against: the twins provisioned with the scenario's document,
//! the world's timings scaled to the poll interval, and where and when jobs arrive (the
//! demo's mix, or the fleet's hot repos and its long tail).

use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;

use super::{FLEET_REPOS, ProcessScenario};
use crate::config::{Config, ConfigDefaults, parse_document};
use crate::sim::world::{SimTwins, WorldOptions, burst, fleet_repo};

/// Repos of the fleet that get most of its jobs, at a steady pace.
const FLEET_HOT_REPOS: usize = 10;
/// The share of the fleet's jobs that land in its hot repos; the rest land anywhere.
const FLEET_HOT_SHARE: f64 = 0.8;

/// The world's movement, its timings scaled to the poll interval. The demo's runners boot
/// within a third of a tick and run jobs of half a tick to two ticks. The fleet's run jobs
/// of one to four ticks (15 s to a minute at its poll) on a cluster big enough for its busy
/// repos, and its world moves less often: the twins share the machine with the daemon.
pub(super) fn world_options(
    scenario: ProcessScenario,
    seed: u64,
    poll_interval: Duration,
    window: Duration,
) -> WorldOptions {
    let poll = poll_interval.as_millis() as u64;
    let demo = WorldOptions {
        seed,
        poll_interval,
        step: Duration::from_millis(50),
        cluster_slots: 6,
        boot_ms: (poll / 10, poll / 3),
        job_ms: (poll / 2, poll * 2),
        runner_idle_timeout: poll_interval * 4,
        deadline: window,
    };
    match scenario {
        ProcessScenario::Demo => demo,
        ProcessScenario::Fleet500 => WorldOptions {
            step: Duration::from_millis(100),
            cluster_slots: 40,
            job_ms: (poll, poll * 4),
            ..demo
        },
    }
}

/// Where and when the world queues jobs.
pub(super) enum Arrivals {
    /// The demo's mix of repos and label sets, a job about every three quarters of a tick:
    /// below what the document's caps let the daemon serve, so the queue stays steady rather
    /// than growing without end.
    Demo(Vec<(&'static str, Vec<&'static str>)>),
    /// A job about every third of a tick, most in the hot repos (about one a minute each at
    /// a 15 s poll, under their cap of two in flight), the rest in any repo of the fleet:
    /// most repos see no job in the window, some one now and then.
    Fleet { hot: Vec<String>, repos: usize },
}

/// The label set of every fleet job: one bucket per repo.
const FLEET_LABELS: &[&str] = &["self-hosted"];

impl Arrivals {
    pub(super) fn new(scenario: ProcessScenario, rng: &mut StdRng) -> Arrivals {
        match scenario {
            ProcessScenario::Demo => Arrivals::Demo(burst()),
            ProcessScenario::Fleet500 => {
                let mut hot: Vec<usize> = Vec::new();
                while hot.len() < FLEET_HOT_REPOS {
                    let i = rng.random_range(0..FLEET_REPOS);
                    if !hot.contains(&i) {
                        hot.push(i);
                    }
                }
                Arrivals::Fleet {
                    hot: hot.into_iter().map(fleet_repo).collect(),
                    repos: FLEET_REPOS,
                }
            }
        }
    }

    /// The job queued before the daemon starts, so that its first tick has work.
    pub(super) fn first(&self) -> (String, Vec<&'static str>) {
        match self {
            Arrivals::Demo(mix) => (mix[0].0.to_string(), mix[0].1.clone()),
            Arrivals::Fleet { hot, .. } => (hot[0].clone(), FLEET_LABELS.to_vec()),
        }
    }

    pub(super) fn pick(&self, rng: &mut StdRng) -> (String, Vec<&'static str>) {
        match self {
            Arrivals::Demo(mix) => {
                let (repo, labels) = &mix[rng.random_range(0..mix.len())];
                (repo.to_string(), labels.clone())
            }
            Arrivals::Fleet { hot, repos } => {
                let repo = if rng.random_bool(FLEET_HOT_SHARE) {
                    hot[rng.random_range(0..hot.len())].clone()
                } else {
                    fleet_repo(rng.random_range(0..*repos))
                };
                (repo, FLEET_LABELS.to_vec())
            }
        }
    }

    pub(super) fn gap(&self, rng: &mut StdRng, poll_interval: Duration) -> Duration {
        let mean = match self {
            Arrivals::Demo(_) => 0.75,
            Arrivals::Fleet { .. } => 1.0 / 3.0,
        };
        poll_interval.mul_f64(mean * rng.random_range(0.5..1.5))
    }
}

/// Starts the twins and sets the scenario's world up on them; returns the document.
pub(super) async fn provision(
    scenario: ProcessScenario,
) -> Result<(SimTwins, Config, usize), String> {
    let twins = SimTwins::start().await?;
    let document = match scenario {
        ProcessScenario::Demo => twins.provision(),
        ProcessScenario::Fleet500 => twins.provision_fleet(FLEET_REPOS),
    };
    let config = parse_document(document.as_bytes(), &ConfigDefaults::default())
        .map_err(|errors| format!("the {} document is invalid: {errors:?}", scenario.as_str()))?;
    let repos = config.repos.len();
    Ok((twins, config, repos))
}
