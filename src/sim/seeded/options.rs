//! Everything a run derives from its seed (swarm testing): the document, the repos and the
//! label sets their jobs carry, how work arrives, how the cluster and the runners behave, and
//! which faults each service suffers, when.
//!
//! Times are whole simulated seconds from the start of the run.

use std::collections::BTreeMap;

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};

use super::latency::{self, Latency};
use super::lock::LockHazard;
use super::scenario_name::Scenario;

/// A service the world can make fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Service {
    GitHub,
    Forgejo,
    Nomad,
    /// Holds the polling token of `vault` repos and the API token of `forgejo` repos: while it
    /// is out, every forge call of those repos fails.
    Vault,
    /// Holds the document; while it is out the daemon runs on the last good one.
    Consul,
}

impl Service {
    pub const ALL: [Service; 5] = [
        Service::GitHub,
        Service::Forgejo,
        Service::Nomad,
        Service::Vault,
        Service::Consul,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Service::GitHub => "github",
            Service::Forgejo => "forgejo",
            Service::Nomad => "nomad",
            Service::Vault => "vault",
            Service::Consul => "consul",
        }
    }
}

/// Probabilities, per call, of each kind of injected failure.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultRates {
    /// 5xx, timeouts, connection resets.
    pub transient: f64,
    /// A body that does not parse.
    pub malformed: f64,
    /// A 403/429 rate limit that exhausts the caller's budget until a reset.
    pub rate_limited: f64,
}

/// A window during which a whole service answers nothing useful.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outage {
    pub service: Service,
    pub start_s: u64,
    pub end_s: u64,
}

/// Foreign workloads that occupy cluster slots for a window (the cluster is full for a reason
/// of its own, and our children stay pending without an allocation meanwhile).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForeignLoad {
    pub start_s: u64,
    pub end_s: u64,
    pub slots: u32,
}

/// The forge a repo lives on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ForgeKind {
    GitHub,
    Forgejo,
}

/// One repo of the generated document, with the label sets its workflows use.
#[derive(Clone, Debug, PartialEq)]
pub struct RepoSpec {
    pub name: &'static str,
    pub forge: ForgeKind,
    /// `runs-on` label lists, each routable under the repo's document entry.
    pub label_sets: Vec<Vec<&'static str>>,
    /// The repo's entry in the Consul document.
    pub entry: Value,
}

/// How a run moves, all derived from the seed.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// The scenario the options were drawn from (for `mixed`, the one it picked).
    pub scenario: Scenario,
    pub poll_interval_s: u64,
    /// How often the daemon reads an idle repo's queue (adaptive polling).
    pub idle_poll_interval_s: u64,
    pub repos: Vec<RepoSpec>,
    /// `--max-in-flight`.
    pub max_in_flight: Option<u32>,
    /// Runs arriving at the start, at once.
    pub burst_runs: u32,
    /// Runs arriving per hour afterwards, until `arrivals_end_s`.
    pub runs_per_hour: f64,
    pub jobs_per_run: (u32, u32),
    /// Chance that a job of a run waits (`needs:`) for the job before it.
    pub needs_probability: f64,
    /// Chance per second that a queued job is cancelled.
    pub cancel_per_s: f64,
    /// Chance that a finished or cancelled run is re-run (new job ids).
    pub rerun_probability: f64,
    /// Jobs present at the start that were queued almost 24 hours ago, so GitHub cancels them
    /// during the run unless a runner takes them first.
    pub stale_jobs: u32,
    pub arrivals_end_s: u64,
    pub boot_s: (u64, u64),
    pub job_s: (u64, u64),
    /// Delay before Nomad places a child, once the cluster has room.
    pub place_delay_s: (u64, u64),
    pub cluster_slots: u32,
    pub foreign_load: Option<ForeignLoad>,
    /// Chance that a runner crashes at boot, before registering (a failed start).
    pub crash_probability: f64,
    /// An idle registered runner gives up, deregisters and exits after this long.
    pub idle_timeout_s: u64,
    /// GitHub status changes reach the job listings after 0..=this many seconds.
    pub status_lag_max_s: u64,
    /// A status-filtered run search shows a change 0..=this many seconds after the job
    /// listings do.
    pub search_lag_max_s: u64,
    /// The `busy` flag of a runner that took a job shows 0..=this many seconds later, drawn
    /// per job apart from the job's own lag (GitHub's has read false for up to a minute).
    pub busy_flag_lag_max_s: u64,
    /// A registration delete that lands on a runner that took a job whose flag does not show
    /// yet (GitHub lets it through) kills the job; otherwise the runner keeps it.
    pub delete_kills_job: bool,
    /// How long an idle runner's allocation takes to end once its child is stopped (the
    /// listener's Ctrl-C, its session closed): the job reads `dead` at once, the slot stays
    /// taken meanwhile.
    pub stop_wind_down_s: u64,
    pub faults: BTreeMap<Service, FaultRates>,
    pub outages: Vec<Outage>,
    /// Range of the waits a rate limit asks for.
    pub rate_limit_reset_s: (u64, u64),
    /// No fault (and no boot crash, no foreign load) after this.
    pub faults_end_s: u64,
    /// A window during which the document in Consul is an invalid edit (a typo someone then
    /// fixes): the daemon must keep running on the last good one.
    pub bad_document: Option<(u64, u64)>,
    /// `--orphan-grace`, drawn short as well as at its default so reaping meets the races.
    pub orphan_grace_s: u64,
    /// `--idle-confirm`.
    pub idle_confirm_s: u64,
    /// A few busy repos: this share of the runs lands in the first this-many repos, the rest
    /// anywhere (a fleet of mostly idle repos).
    pub hot_repos: Option<(usize, f64)>,
    /// GitHub delivers a `workflow_job` webhook for each job queued in a GitHub repo, and
    /// the driver passes it to the daemon as a hint.
    pub webhooks: Option<Webhooks>,
    /// How long each service takes to answer, each way (see [`super::latency`]).
    pub latency: BTreeMap<Service, Latency>,
    /// How many daemons share the lock (one leads, the other stands by).
    pub daemons: usize,
    /// What someone else does to the lock key, and when.
    pub lock_hazards: Vec<(u64, LockHazard)>,
    /// Daemons killed and started again: (when, which, how long it stays down), drawn with
    /// this probability.
    pub restarts: Vec<(u64, usize, u64)>,
    pub restart_probability: f64,
}

/// How webhooks reach the daemon.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Webhooks {
    /// The share of deliveries lost on the way.
    pub lost: f64,
    /// Delivery delay after the job is queued, in whole seconds (0 = within the second).
    pub delay_s: (u64, u64),
}

/// The Forgejo instance of the generated document.
pub const FORGEJO_URL: &str = "http://forgejo.service.consul:30028";

impl Options {
    /// Options every scenario starts from: moderate arrivals, a roomy cluster, rare faults.
    pub fn baseline(scenario: Scenario, rng: &mut StdRng) -> Options {
        let arrivals_end_s = rng.random_range(15..=35) * 60;
        let mut options = Options {
            scenario,
            poll_interval_s: 15,
            idle_poll_interval_s: 60,
            repos: repos(rng),
            max_in_flight: rng.random_bool(0.3).then(|| rng.random_range(3..=10)),
            burst_runs: rng.random_range(0..=3),
            runs_per_hour: rng.random_range(6.0..30.0),
            jobs_per_run: (1, rng.random_range(1..=4)),
            needs_probability: rng.random_range(0.0..0.5),
            cancel_per_s: *[0.0, 1.0 / 3600.0, 1.0 / 600.0]
                .choose(rng)
                .expect("non-empty"),
            rerun_probability: rng.random_range(0.0..0.1),
            stale_jobs: rng.random_range(0..=1),
            arrivals_end_s,
            boot_s: (5, 60),
            job_s: (20, rng.random_range(60..=300)),
            place_delay_s: (1, rng.random_range(2..=20)),
            cluster_slots: rng.random_range(6..=20),
            foreign_load: None,
            crash_probability: *[0.0, 0.0, 0.02, 0.05].choose(rng).expect("non-empty"),
            idle_timeout_s: rng.random_range(5..=10) * 60,
            status_lag_max_s: 3,
            // Drawn by `draw_lags` from a stream of its own.
            search_lag_max_s: 0,
            busy_flag_lag_max_s: 3,
            delete_kills_job: false,
            stop_wind_down_s: 0,
            faults: Service::ALL
                .iter()
                .map(|s| (*s, low_fault_rates(rng)))
                .collect(),
            outages: Vec::new(),
            rate_limit_reset_s: (30, 300),
            faults_end_s: arrivals_end_s + rng.random_range(0..=10) * 60,
            bad_document: None,
            // Drawn by `draw_reaping` from a stream of their own, so that adding them kept
            // every seed's world as it was.
            orphan_grace_s: 600,
            idle_confirm_s: 120,
            hot_repos: None,
            webhooks: None,
            // Drawn by `draw_latencies` and `draw_daemons` from streams of their own.
            latency: BTreeMap::new(),
            daemons: 1,
            lock_hazards: Vec::new(),
            restarts: Vec::new(),
            restart_probability: 0.3,
        };
        if rng.random_bool(0.3) {
            let start = rng.random_range(60..=options.faults_end_s.max(61));
            let end = (start + rng.random_range(60..=1200)).min(options.faults_end_s.max(start));
            options.bad_document = Some((start, end));
        }
        if rng.random_bool(0.3) {
            let service = *Service::ALL.choose(rng).expect("non-empty");
            let outage = outage(rng, service, options.faults_end_s, (30, 300));
            options.outages.push(outage);
        }
        options
    }
}

/// Swarm testing: a service is often perfect, sometimes a little flaky.
fn low_fault_rates(rng: &mut StdRng) -> FaultRates {
    let pick = |rng: &mut StdRng| *[0.0, 0.0, 0.005, 0.02].choose(rng).expect("non-empty");
    FaultRates {
        transient: pick(rng),
        malformed: pick(rng) / 2.0,
        rate_limited: pick(rng) / 4.0,
    }
}

/// An outage of `service` somewhere before `faults_end_s`, lasting within `length_s`.
pub fn outage(
    rng: &mut StdRng,
    service: Service,
    faults_end_s: u64,
    length_s: (u64, u64),
) -> Outage {
    let length = rng.random_range(length_s.0..=length_s.1);
    let latest_start = faults_end_s.saturating_sub(length).max(1);
    // The daemon reads the document once before Consul may go away: a daemon that starts
    // during an outage has nothing to run on, which is not what the outage tests.
    let earliest_start = u64::from(service == Service::Consul);
    let start_s = rng.random_range(earliest_start..=latest_start.max(earliest_start));
    Outage {
        service,
        start_s,
        end_s: (start_s + length).min(faults_end_s),
    }
}

/// The repos of the document: the three of BRIEF.md (one per mode) with caps drawn from the
/// seed, and sometimes a second `app` repo with a profile. Label sets include supersets (a
/// `[go, vm]` runner can take a `[go]` job), so runners of one bucket take another's jobs.
fn repos(rng: &mut StdRng) -> Vec<RepoSpec> {
    let go_cap = rng.random_range(1..=3);
    let build_cap = rng.random_range(1..=2);
    let mut repos = vec![
        RepoSpec {
            name: "afreidah/munchbox",
            forge: ForgeKind::GitHub,
            label_sets: vec![vec!["self-hosted"], vec!["self-hosted", "linux"]],
            entry: json!({ "maxConcurrent": rng.random_range(1..=4), "mode": "app" }),
        },
        RepoSpec {
            name: "alex/s3-orchestrator",
            forge: ForgeKind::Forgejo,
            label_sets: vec![vec!["build"], vec!["build", "docker"]],
            entry: json!({
                "mode": "forgejo", "forgejoUrl": FORGEJO_URL,
                "maxConcurrent": build_cap + rng.random_range(0..=1), "vaultPath": "forgejo/scaler",
                "profiles": [ { "job": "forgejo-build-runner", "label": "build", "maxConcurrent": build_cap } ]
            }),
        },
        RepoSpec {
            name: "ev-the-dev/moat",
            forge: ForgeKind::GitHub,
            label_sets: vec![vec!["self-hosted", "go"], vec!["self-hosted", "go", "vm"]],
            entry: json!({
                "mode": "vault", "vaultPath": "github/moat-poll", "registerVaultPath": "github/moat-runner",
                "profiles": [
                    { "job": "github-runner-moat-vm", "label": "vm", "maxConcurrent": 1 },
                    { "job": "go-ci-runner", "label": "go", "maxConcurrent": go_cap }
                ]
            }),
        },
    ];
    if rng.random_bool(0.5) {
        repos.push(RepoSpec {
            name: "afreidah/api",
            forge: ForgeKind::GitHub,
            label_sets: vec![
                vec!["self-hosted"],
                vec!["self-hosted", "gpu"],
                vec!["self-hosted", "gpu", "large"],
            ],
            entry: json!({
                "mode": "app", "maxConcurrent": rng.random_range(1..=3),
                "profiles": [ { "job": "gpu-runner", "label": "gpu", "maxConcurrent": 1 } ],
                "defaultJob": "ci-runner"
            }),
        });
    }
    repos
}

/// Names of the repos of the scale scenarios, one owner (one installation).
static FLEET_NAMES: std::sync::LazyLock<Vec<String>> =
    std::sync::LazyLock::new(|| (0..500).map(|i| format!("fleet/repo-{i:03}")).collect());

/// `count` `app` repos of one owner, one label set each, two runners at most.
pub fn fleet(count: usize) -> Vec<RepoSpec> {
    FLEET_NAMES
        .iter()
        .take(count)
        .map(|name| RepoSpec {
            name: name.as_str(),
            forge: ForgeKind::GitHub,
            label_sets: vec![vec!["self-hosted"]],
            entry: json!({ "maxConcurrent": 2, "mode": "app" }),
        })
        .collect()
}

impl Options {
    /// The Consul document of the run, as users would write it.
    pub fn document(&self) -> String {
        let doc: serde_json::Map<String, Value> = self
            .repos
            .iter()
            .map(|r| (r.name.to_string(), r.entry.clone()))
            .collect();
        serde_json::to_string_pretty(&Value::Object(doc)).expect("a JSON value serialises")
    }

    /// The document as it reads while [`Options::bad_document`] lasts: the first repo's cap
    /// written as a word.
    pub fn bad_document_text(&self) -> String {
        let mut doc: serde_json::Map<String, Value> = self
            .repos
            .iter()
            .map(|r| (r.name.to_string(), r.entry.clone()))
            .collect();
        if let Some(Value::Object(entry)) = doc.values_mut().next() {
            entry.insert("maxConcurrent".into(), Value::String("three".into()));
        }
        serde_json::to_string_pretty(&Value::Object(doc)).expect("a JSON value serialises")
    }

    /// The outage of `service` covering `t`, if any.
    pub fn outage_at(&self, service: Service, t: u64) -> Option<&Outage> {
        self.outages
            .iter()
            .find(|o| o.service == service && o.start_s <= t && t < o.end_s)
    }

    /// Cluster slots foreign workloads hold at `t`.
    pub fn foreign_slots_at(&self, t: u64) -> u32 {
        match self.foreign_load {
            Some(load) if load.start_s <= t && t < load.end_s => load.slots,
            _ => 0,
        }
    }

    /// Draws `--orphan-grace` and `--idle-confirm`: short as well as at their defaults, so
    /// reaping meets the races.
    pub fn draw_reaping(&mut self, rng: &mut StdRng) {
        self.orphan_grace_s = *[60, 300, 600].choose(rng).expect("non-empty");
        self.idle_confirm_s = *[20, 60, 120].choose(rng).expect("non-empty");
    }

    /// Draws the lags of GitHub's views apart: the job listings, the status-filtered run
    /// searches (later still), and the runner's `busy` flag (up to 90 s, independent of the
    /// job's), and whether a delete that slips into the flag's lag kills the job. The
    /// listings and searches together stay within the daemon's `--job-listing-lag`, as that
    /// setting promises its operator.
    pub fn draw_lags(&mut self, rng: &mut StdRng) {
        self.status_lag_max_s = *[3, 5, 10, 20].choose(rng).expect("non-empty");
        self.search_lag_max_s = *[0, 2, 5, 10].choose(rng).expect("non-empty");
        self.busy_flag_lag_max_s = *[3, 30, 60, 90].choose(rng).expect("non-empty");
        self.delete_kills_job = rng.random_bool(0.5);
        self.stop_wind_down_s = *[0, 2, 5, 15].choose(rng).expect("non-empty");
    }

    /// A busy runner told to stop is killed after the task's `kill_timeout`: the parents ask
    /// for 2m, and a Nomad client's default `max_kill_timeout` cuts that to 30s.
    pub const KILL_TIMEOUT_S: u64 = 30;

    /// The longest a job's change takes to reach every listing the daemon reads.
    pub fn listing_lag_max_s(&self) -> u64 {
        self.status_lag_max_s + self.search_lag_max_s
    }

    /// The daemon's reaping settings in this run; bounds it does not vary keep their
    /// defaults.
    pub fn reap_policy(&self) -> crate::plan::reap::ReapPolicy {
        crate::plan::reap::ReapPolicy {
            orphan_grace: std::time::Duration::from_secs(self.orphan_grace_s),
            idle_confirm: std::time::Duration::from_secs(self.idle_confirm_s),
            ..Default::default()
        }
    }

    /// Draws how long each service takes to answer.
    pub fn draw_latencies(&mut self, rng: &mut StdRng) {
        self.latency = latency::draw(rng);
    }

    /// Draws how many daemons run and what happens to their lock key: often a standby beside
    /// the leader, sometimes the key deleted or rewritten under the holder while faults last.
    pub fn draw_daemons(&mut self, rng: &mut StdRng) {
        self.daemons = if rng.random_bool(0.3) { 2 } else { 1 };
        if rng.random_bool(0.25) {
            let at = rng.random_range(60..=self.faults_end_s.max(61));
            let hazard = if rng.random_bool(0.5) {
                LockHazard::Deleted
            } else {
                LockHazard::TakenOver {
                    held_s: rng.random_range(10..=120),
                }
            };
            self.lock_hazards.push((at, hazard));
        }
        // A daemon killed where it stands (OOM, a node drained, a deploy) and started again a
        // little later, its memory gone.
        if rng.random_bool(self.restart_probability) {
            for _ in 0..rng.random_range(1..=2) {
                let at = rng.random_range(60..=self.faults_end_s.max(61));
                let daemon = rng.random_range(0..self.daemons);
                let down_s = rng.random_range(1..=90);
                self.restarts.push((at, daemon, down_s));
            }
            self.restarts.sort_unstable();
        }
    }

    pub fn latency(&self, service: Service) -> Latency {
        self.latency.get(&service).copied().unwrap_or(Latency::NONE)
    }

    pub fn rates(&self, service: Service) -> FaultRates {
        self.faults.get(&service).copied().unwrap_or_default()
    }
}
