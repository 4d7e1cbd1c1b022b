//! The deterministic simulated world: the daemon as `run` runs it (the real leader lock
//! logic, the real document watcher, the real [`Controller`](crate::control_loop::Controller)
//! with its real planner, act step and backoff) over in-memory ports, on virtual time, judged
//! after every step and after every call that changes the world.
//!
//! Modelled on TigerBeetle's simulator: a printed seed, everything derived from it (the
//! document, arrivals, the cluster, the faults, every call's latency and the daemon's own
//! randomness), invariants checked all along, then faults and arrivals off and convergence
//! demanded within a bound. Everything runs on one current-thread tokio runtime with a paused
//! clock: the world steps once per simulated second in a task of its own while the daemon
//! runs in others, and every call the daemon makes travels for a latency drawn from the seed,
//! so the world moves while a tick is in progress and what a tick read may no longer hold
//! when its writes land. Seeded streams and ordered maps make the same seed replay exactly:
//! the event trace's FNV-1a hash says so.
//!
//! # Layout
//!
//! - This file: how one seed is run ([`RunSettings`]) and what it showed ([`SeedOutcome`]).
//! - [`options`]: what a run derives from its seed; [`scenarios`]: the named scenarios, by
//!   name in [`scenario_name`]; [`latency`]: how long each service takes to answer.
//! - [`world`]: GitHub's, Forgejo's and Nomad's truth and how it moves.
//! - [`ports`]: the loop's ports over the world, with faults injected per service.
//! - [`github_http`]: GitHub's REST API over the world, in memory, for the real client.
//! - [`consul`]: the document key behind a blocking query; [`lock`]: Consul's side of the
//!   leader lock (sessions, TTLs, lock delay, the key), whose truth judges one actor at a time.
//! - [`daemon`]: a daemon process of the world, started, crashed and started again.
//! - [`invariants`]: the invariants I1 to I8; [`mutants`]: broken daemons they must catch.
//! - [`trace`]: the event trace and its hash.
//! - [`run`]: the run of one seed; `sweep`: seeds across threads; `render`: the text a sweep
//!   and a replay print; `log_watch`: the log sink that catches a leaked token.

pub mod baselines;
pub mod bench;
pub mod consul;
pub mod daemon;
pub mod github_http;
pub mod invariants;
pub mod latency;
pub mod lock;
mod log_watch;
pub mod mutants;
pub mod options;
pub mod ports;
mod render;
pub mod run;
pub mod scenario_name;
pub mod scenarios;
mod sweep;
pub mod trace;
pub mod world;

use serde::Serialize;

use crate::plan::{Plan, PlanInput};
pub use bench::{BenchRow, Strategy};
pub use invariants::{ConvergenceBound, PENDING, Violation};
use ports::Requests;
pub use render::{REPLAY_EVENTS_SHOWN, render_replay};
pub use run::{run_seed, run_seed_with};
pub use scenario_name::Scenario;
pub use sweep::{SweepReport, sweep, sweep_outcomes, sweep_with};
use world::Counts;

/// A baseline's run ends this long after arrivals and faults stop, if it has not drained by
/// then; what is still queued is stranded and what is still in flight was wasted.
pub const BASELINE_TAIL_S: u64 = 2 * 3600;

/// The world moves in steps of this many simulated seconds (the daemon's calls land between
/// them, to the millisecond).
pub const STEP_S: u64 = 1;

/// How one seed is run.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunSettings {
    /// Replaces the planner (a mutant, to prove the invariants catch it).
    pub planner: Option<fn(PlanInput<'_>) -> Plan>,
    /// A broken daemon (its planner is in `planner`; other layers are broken through the
    /// world's ports).
    pub mutant: Option<mutants::Mutant>,
    /// Keep the event trace as text (a replay prints it).
    pub keep_trace: bool,
    /// Who runs the runners: our controller, or a baseline the benchmark compares it to.
    /// Baselines are measured, not judged: their violations are counted and the run goes on.
    pub strategy: Strategy,
    /// Take runners back with the shipped `--orphan-grace` and `--idle-confirm` (the
    /// benchmark measures what operators run) instead of the short ones a sweep draws to meet
    /// the races.
    pub default_reaping: bool,
}

/// What one seed showed.
#[derive(Clone, Debug, Serialize)]
pub struct SeedOutcome {
    pub scenario: Scenario,
    /// The scenario the options were drawn from (for `mixed`, the one the seed picked).
    pub picked: Scenario,
    pub seed: u64,
    pub violation: Option<Violation>,
    /// FNV-1a 64 of the event trace, as 16 hex digits.
    pub trace_hash: String,
    pub trace_events: u64,
    pub convergence: Option<ConvergenceBound>,
    pub simulated_s: u64,
    pub poll_interval_s: u64,
    pub ticks: u64,
    /// Virtual time the longest tick took, from its start to its view (time passes inside a
    /// tick: every call travels).
    pub tick_ms_max: u64,
    pub counts: Counts,
    pub faults_injected: u64,
    pub log_lines: u64,
    pub pending: &'static [&'static str],
    /// Real time the seed took; not part of the trace.
    pub wall_ms: u128,
    #[serde(skip)]
    pub trace: Vec<String>,
    /// What the benchmark reads.
    #[serde(skip)]
    pub measured: Measured,
}

/// One seed's figures for the benchmark.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    pub strategy: Strategy,
    pub queue_to_dispatch_s: Vec<u64>,
    pub queue_to_start_s: Vec<u64>,
    /// Seconds from cap room to dispatch, and whether the job's webhook arrived.
    pub dispatch_lag_s: Vec<(u64, Option<bool>)>,
    /// The same from the first second the API also showed the job queued.
    pub dispatch_lag_visible_s: Vec<(u64, Option<bool>)>,
    /// Host wall time of each of our ticks, in microseconds.
    pub tick_wall_us: Vec<u64>,
    /// Virtual time each of our ticks took, in milliseconds.
    pub tick_virtual_ms: Vec<u64>,
    pub wasted_dispatches: u64,
    pub stranded_jobs: u64,
    pub requests: Requests,
    pub github_repos: u64,
    /// This seed's GitHub kills the job of a runner whose registration is deleted under it
    /// (the pessimistic half of the seeds; the others leave the job running).
    pub delete_kills_job: bool,
    /// The first invariant that did not hold (a baseline runs on past it).
    pub first_violation: Option<Violation>,
}

impl SeedOutcome {
    /// An outcome with nothing measured yet.
    fn empty(scenario: Scenario, picked: Scenario, seed: u64, strategy: Strategy) -> SeedOutcome {
        SeedOutcome {
            scenario,
            picked,
            seed,
            violation: None,
            trace_hash: String::new(),
            trace_events: 0,
            convergence: None,
            simulated_s: 0,
            poll_interval_s: 0,
            ticks: 0,
            tick_ms_max: 0,
            counts: Counts::default(),
            faults_injected: 0,
            log_lines: 0,
            pending: PENDING,
            wall_ms: 0,
            trace: Vec::new(),
            measured: Measured {
                strategy,
                ..Measured::default()
            },
        }
    }

    pub fn ok(&self) -> bool {
        self.violation.is_none()
    }

    /// The command that replays this seed.
    pub fn replay_command(&self) -> String {
        replay_command(self.scenario, self.seed)
    }

    /// One line per failure: the invariant, the seed, where, and how to replay it.
    pub fn failure_line(&self) -> Option<String> {
        self.violation.as_ref().map(|v| {
            format!(
                "{} violated: seed {} ({}), step {} (t={}s): {}\n  replay: {}",
                v.invariant,
                self.seed,
                self.picked,
                v.step,
                v.step * STEP_S,
                v.message,
                self.replay_command()
            )
        })
    }
}

pub fn replay_command(scenario: Scenario, seed: u64) -> String {
    format!("runner-scaler simulate --scenario {scenario} --seed {seed}")
}
