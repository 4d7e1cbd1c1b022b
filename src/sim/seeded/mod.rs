//! The deterministic simulated world: the real [`Controller`] (real planner, real act step,
//! real backoff) over in-memory ports, on virtual time, judged after every step.
//!
//! Modelled on TigerBeetle's simulator: a printed seed, everything derived from it (the
//! document, arrivals, the cluster, the faults and the controller's own randomness), invariants
//! checked every step, then faults and arrivals off and convergence demanded within a bound.
//! One `StdRng` per seed drives everything; maps are ordered; the controller's ticks run on a
//! current-thread tokio runtime with a paused clock (the act step's retry pauses complete at
//! once). The same seed replays exactly: the event trace's FNV-1a hash says so.
//!
//! # Layout
//!
//! - [`options`]: what a run derives from its seed; [`scenarios`]: the named scenarios.
//! - [`world`]: GitHub's, Forgejo's and Nomad's truth and how it moves.
//! - [`ports`]: the loop's ports over the world, with faults injected per service.
//! - [`github_http`]: GitHub's REST API over the world, in memory, for the real client.
//! - [`invariants`]: the invariants I1 to I7.
//! - [`trace`]: the event trace and its hash.

pub mod baselines;
pub mod bench;
pub mod consul;
pub mod github_http;
pub mod invariants;
pub mod options;
pub mod ports;
pub mod scenarios;
pub mod trace;
pub mod world;

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use serde::Serialize;

use crate::config::{ConfigDefaults, parse_document};
use crate::control_loop::{Controller, LoopSettings};
use crate::plan::{Plan, PlanInput, PlanSettings};
pub use bench::{BenchRow, Strategy};
pub use invariants::{ConvergenceBound, PENDING, Violation};
use ports::{CANARY, Requests, Shared, Sim, lock};
pub use scenarios::Scenario;
use world::{Counts, EPOCH_UNIX, World};

/// A baseline's run ends this long after arrivals and faults stop, if it has not drained by
/// then; what is still queued is stranded and what is still in flight was wasted.
pub const BASELINE_TAIL_S: u64 = 2 * 3600;

/// The world moves in steps of this many simulated seconds.
pub const STEP_S: u64 = 1;

/// How one seed is run.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunSettings {
    /// Replaces the planner (a mutant, to prove the invariants catch it).
    pub planner: Option<fn(PlanInput<'_>) -> Plan>,
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
    pub wasted_dispatches: u64,
    pub stranded_jobs: u64,
    pub requests: Requests,
    pub github_repos: u64,
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

/// Runs one seed of `scenario` with the real planner.
pub fn run_seed(scenario: Scenario, seed: u64) -> SeedOutcome {
    run_seed_with(scenario, seed, RunSettings::default())
}

/// Runs one seed: builds the world and the controller from the seed, then steps the world,
/// ticks the controller every poll interval and checks the invariants after every step, until
/// the convergence bound.
pub fn run_seed_with(scenario: Scenario, seed: u64, settings: RunSettings) -> SeedOutcome {
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut options = scenario.options(&mut rng);
    let picked = options.scenario;
    let mut outcome = SeedOutcome::empty(scenario, picked, seed, settings.strategy);
    outcome.poll_interval_s = options.poll_interval_s;
    let config = match parse_document(options.document().as_bytes(), &ConfigDefaults::default()) {
        Ok(config) => config,
        Err(errors) => {
            outcome.violation = Some(Violation {
                invariant: "setup",
                step: 0,
                message: format!(
                    "the scenario's document is invalid: {}",
                    errors
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            });
            return outcome;
        }
    };
    // Child generators, so the world and the controller draw from separate streams.
    let controller_rng = StdRng::seed_from_u64(rng.next_u64());
    let world_rng = StdRng::seed_from_u64(rng.next_u64());
    let mut consul = consul::ConsulWatch::new(StdRng::seed_from_u64(rng.next_u64()));
    let repo_urls = config
        .repos
        .values()
        .map(|r| (ports::repo_url(r), r.repo.clone()))
        .collect();
    let arrivals_rng = StdRng::seed_from_u64(rng.next_u64());
    let mut reaping_rng = StdRng::seed_from_u64(rng.next_u64());
    if !settings.default_reaping {
        options.draw_reaping(&mut reaping_rng);
    }
    let mut world = World::new(&options, repo_urls).with_arrivals(arrivals_rng);
    world.add_foreign_child("ci-runner");
    let loop_settings = LoopSettings {
        poll_interval: std::time::Duration::from_secs(options.poll_interval_s),
        idle_poll_interval: std::time::Duration::from_secs(options.idle_poll_interval_s),
        plan: PlanSettings {
            max_in_flight: options.max_in_flight,
            reap: options.reap_policy(),
            // The seeded world's Nomad is before 1.11.2: vault children are left alone.
            vault_children_cleanup: false,
        },
        ..LoopSettings::default()
    };
    let shared: Shared = Arc::new(Mutex::new(Sim::new(
        options,
        config,
        world,
        world_rng,
        trace::Trace::new(settings.keep_trace),
    )));
    let mut actor = match settings.strategy {
        Strategy::Ours => {
            let mut controller = Controller::new(
                ports::services(&shared),
                loop_settings.clone(),
                Box::new(controller_rng),
            );
            if let Some(planner) = settings.planner {
                controller = controller.with_planner(planner);
            }
            Actor::Ours(Box::new(controller))
        }
        // The seed makes no conditional requests: every listing is billed.
        Strategy::Seed => Actor::Seed(baselines::SeedPoller::new(
            ports::services_with(&shared, false),
            shared.clone(),
        )),
        Strategy::EphemerdPreVeto => Actor::Ephemerd(baselines::EphemerdPreVeto::new(
            ports::services(&shared),
            shared.clone(),
        )),
    };

    let logs = LogWatch::default();
    let subscriber = tracing_subscriber::fmt()
        // Everything the daemon logs is searched for tokens; tower's buffer only says that
        // it passes requests on (several lines per GitHub request, all cost, no content).
        .with_env_filter(tracing_subscriber::EnvFilter::new("trace,tower=off"))
        .with_ansi(false)
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .finish();
    let mut driven = tracing::subscriber::with_default(subscriber, || {
        drive(&mut actor, &mut consul, &shared, &loop_settings, &logs)
    });
    outcome.measured.first_violation = driven.violation.clone();
    if settings.strategy != Strategy::Ours {
        // A baseline is measured, not judged.
        driven.violation = None;
    }
    outcome.violation = driven.violation;
    outcome.convergence = driven.convergence;
    outcome.ticks = driven.ticks;
    let mut sim = lock(&shared);
    outcome.simulated_s = sim.t;
    outcome.counts = sim.world.counts.clone();
    outcome.faults_injected = sim.faults.injected_total;
    outcome.trace_hash = format!("{:016x}", sim.trace.hash());
    outcome.trace_events = sim.trace.events();
    outcome.trace = sim.trace.take_kept();
    outcome.log_lines = logs.lines();
    let m = &mut outcome.measured;
    m.queue_to_dispatch_s = std::mem::take(&mut sim.world.latencies.queue_to_dispatch_s);
    m.queue_to_start_s = std::mem::take(&mut sim.world.latencies.queue_to_start_s);
    m.dispatch_lag_s = std::mem::take(&mut sim.world.latencies.dispatch_lag_s);
    m.dispatch_lag_visible_s = std::mem::take(&mut sim.world.latencies.dispatch_lag_visible_s);
    m.tick_wall_us = driven.tick_wall_us;
    m.wasted_dispatches = sim.world.wasted_dispatches();
    m.stranded_jobs = sim.world.stranded_jobs();
    m.requests = sim.requests.clone();
    m.github_repos = sim
        .options
        .repos
        .iter()
        .filter(|r| r.forge == options::ForgeKind::GitHub)
        .count() as u64;
    outcome.wall_ms = started.elapsed().as_millis();
    outcome
}

/// Who acts on the world each step.
enum Actor {
    Ours(Box<Controller>),
    Seed(baselines::SeedPoller),
    Ephemerd(baselines::EphemerdPreVeto),
}

struct Driven {
    violation: Option<Violation>,
    convergence: Option<ConvergenceBound>,
    ticks: u64,
    tick_wall_us: Vec<u64>,
}

fn drive(
    actor: &mut Actor,
    consul: &mut consul::ConsulWatch,
    shared: &Shared,
    loop_settings: &LoopSettings,
    logs: &LogWatch,
) -> Driven {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("build a current-thread runtime");
    let (poll_s, idle_s, converge_from_s) = {
        let sim = lock(shared);
        let o = &sim.options;
        (
            o.poll_interval_s,
            o.idle_poll_interval_s,
            o.faults_end_s.max(o.arrivals_end_s),
        )
    };
    let mut checker = invariants::Checker::new(poll_s, idle_s, STEP_S);
    let mut driven = Driven {
        violation: None,
        convergence: None,
        ticks: 0,
        tick_wall_us: Vec::new(),
    };
    // Webhook hints the daemon still owes a read, on the daemon's own schedule: a delivery
    // asks for one at once and again 2 s and 5 s later (the API can lag the webhook), at most
    // one per repo per 2 s, a read asked for sooner held back until then.
    let mut hints = crate::webhook::hints::HintSchedule::default();
    let mut converged_since: Option<u64> = None;
    let mut t = 0;
    loop {
        let config = {
            let mut sim = lock(shared);
            sim.advance(t);
            bench::note_cap_room(&mut sim);
            // Only ours takes hints; the baselines poll (or listen) as they always did.
            let arriving = sim.world.webhooks_arriving(t);
            for repo in arriving
                .into_iter()
                .filter(|_| matches!(actor, Actor::Ours(_)))
            {
                hints.hint(repo, sim_time(t));
            }
            consul.step(&mut sim);
            let config = consul.config();
            // A bad edit or an outage must leave the loop on the last good document; before
            // the first read succeeds it has none and does nothing.
            if config.as_deref().is_some_and(|c| *c != sim.config) {
                driven.violation = Some(Violation {
                    invariant: "config",
                    step: t,
                    message: "the loop runs on a document other than the last good one".into(),
                });
                return driven;
            }
            config
        };
        let config_version = consul.applied_index();
        let poll = t % poll_s == 0;
        if poll {
            driven.ticks += 1;
        }
        match (&mut *actor, config) {
            (_, None) => {
                if poll {
                    lock(shared)
                        .trace
                        .record(t, "no document read yet: nothing done");
                }
            }
            (Actor::Ours(controller), Some(config))
                if poll || hints.next_due().is_some_and(|at| at <= sim_time(t)) =>
            {
                let now = sim_time(t);
                for repo in hints.due(now) {
                    controller.hint(&repo, now);
                }
                if let Some(violation) = tick_ours(
                    controller,
                    &runtime,
                    &config,
                    config_version,
                    t,
                    shared,
                    &mut driven.tick_wall_us,
                ) {
                    driven.violation = Some(violation);
                    return driven;
                }
            }
            (Actor::Ours(_), Some(_)) => {}
            (Actor::Seed(seed), Some(config)) => {
                if poll {
                    runtime.block_on(seed.tick(&config));
                    lock(shared).trace.record(t, "seed poller tick");
                }
            }
            (Actor::Ephemerd(ephemerd), Some(config)) => {
                runtime.block_on(ephemerd.step(&config, t, poll))
            }
        }
        if let Some(line) = logs.leak() {
            driven.violation = Some(Violation {
                invariant: "I5",
                step: t,
                message: format!("a registration token appears in a log line: {line}"),
            });
            return driven;
        }
        let sim = lock(shared);
        // A baseline is judged until its first violation, then only measured.
        if driven.violation.is_none()
            && let Some(v) = checker.after_step(&sim)
        {
            driven.violation = Some(v);
            if matches!(actor, Actor::Ours(_)) {
                return driven;
            }
        }
        if t == converge_from_s {
            driven.convergence = Some(invariants::convergence_bound(
                &sim,
                loop_settings.transient_backoff_max,
                converge_from_s,
            ));
        }
        if let Some(bound) = &driven.convergence {
            // Once drained, two more polls show the loop stays quiet; then the run is over.
            converged_since = match converged_since {
                Some(since) if invariants::converged(&sim) => Some(since),
                _ => invariants::converged(&sim).then_some(t),
            };
            let quiet = converged_since.is_some_and(|since| t >= since + 2 * poll_s);
            // A baseline that never drains (the seed poller fills a full cluster with pending
            // children) is measured up to a horizon, not simulated for days.
            let horizon = match actor {
                Actor::Ours(_) => bound.bound_s,
                _ => bound.bound_s.min(converge_from_s + BASELINE_TAIL_S),
            };
            if quiet || t >= horizon {
                if driven.violation.is_none() {
                    driven.violation = invariants::i6(&sim, bound);
                }
                return driven;
            }
        }
        drop(sim);
        t += STEP_S;
    }
}

/// The wall-clock instant of simulated second `t`.
fn sim_time(t: u64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(EPOCH_UNIX + t as i64, 0).expect("simulated time is in range")
}

/// One tick of the real controller at `t`, traced; a token in its `--json` view is an I5
/// violation.
fn tick_ours(
    controller: &mut Controller,
    runtime: &tokio::runtime::Runtime,
    config: &crate::config::Config,
    config_version: u64,
    t: u64,
    shared: &Shared,
    tick_wall_us: &mut Vec<u64>,
) -> Option<Violation> {
    let now = sim_time(t);
    // Host time of the tick alone (the services it calls are in memory, so this is the
    // daemon's own work plus the simulated services'), reported, never asserted.
    let started = Instant::now();
    let view = runtime.block_on(controller.tick(config, config_version, now, false));
    tick_wall_us.push(started.elapsed().as_micros() as u64);
    let json = serde_json::to_string(&view).expect("a tick view serialises");
    let mut sim = lock(shared);
    if json.contains(CANARY) {
        return Some(Violation {
            invariant: "I5",
            step: t,
            message: "a registration token appears in the tick's --json view".into(),
        });
    }
    sim.trace.record(
        t,
        format!(
            "tick queued={} active={} started={} gaps={} view={:016x}",
            view.queued,
            view.active,
            view.started,
            view.gaps.len(),
            trace::fnv1a(0, json.as_bytes())
        ),
    );
    // Why a bucket that misses runners got fewer: the answer a replay is read for.
    for b in view.buckets.iter().filter(|b| b.to_dispatch < b.missing) {
        sim.trace.record(
            t,
            format!(
                "  held {} [{}]: missing {}, dispatching {}: {}",
                b.repo,
                b.labels,
                b.missing,
                b.to_dispatch,
                b.reason.as_deref().unwrap_or("-")
            ),
        );
    }
    None
}

/// The log sink of one seed: counts lines and remembers the first that carries a token
/// (with the token masked, so the report itself leaks nothing). The fmt layer writes each
/// event in one call, so a token is never split across writes.
#[derive(Clone, Default)]
struct LogWatch(Arc<Mutex<LogState>>);

#[derive(Default)]
struct LogState {
    lines: u64,
    leak: Option<String>,
}

impl LogWatch {
    fn state(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn leak(&self) -> Option<String> {
        self.state().leak.clone()
    }

    fn lines(&self) -> u64 {
        self.state().lines
    }
}

impl io::Write for LogWatch {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let mut state = self.state();
        state.lines += text.matches('\n').count() as u64;
        if state.leak.is_none() && text.contains(CANARY) {
            state.leak = Some(text.replace(CANARY, "<TOKEN>").trim_end().to_string());
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

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

    pub fn render_text(&self) -> String {
        let mut out = format!(
            "scenario {}: seeds {}..={} ({} seeds on {} threads)\n",
            self.scenario, self.first_seed, self.last_seed, self.seeds, self.threads
        );
        for failure in &self.failures {
            if let Some(line) = failure.failure_line() {
                out.push_str(&format!("FAIL {line}\n"));
            }
        }
        if self.scenario == Scenario::Mixed {
            let picks: Vec<String> = self
                .picked
                .iter()
                .map(|(s, n)| format!("{s} {n}"))
                .collect();
            out.push_str(&format!("  picked: {}\n", picks.join(", ")));
        }
        let c = &self.totals;
        out.push_str(&format!(
            "  passed {} of {}; {} failed\n  jobs {}, dispatches {}, failed starts {}, cancelled {}, cross-bucket takes {}, idle exits {}, purges {}\n  {} ticks over {} simulated hours\n",
            self.passed,
            self.seeds,
            self.failures.len(),
            c.jobs,
            c.dispatches,
            c.failed_starts,
            c.jobs_cancelled,
            c.cross_bucket_takes,
            c.idle_exits,
            c.purges,
            self.ticks,
            self.simulated_s / 3600
        ));
        for pending in self.pending {
            out.push_str(&format!("  {pending}\n"));
        }
        out.push_str(&format!(
            "  wall time {:.1} s\n",
            self.wall_ms as f64 / 1000.0
        ));
        out
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

/// Events of the trace a replay shows (the last ones: where a violation happened).
pub const REPLAY_EVENTS_SHOWN: usize = 400;

/// What `simulate --seed S` prints: the trace's tail, every invariant's result, the I6 bound
/// and the trace hash.
pub fn render_replay(outcome: &SeedOutcome) -> String {
    let mut out = format!(
        "scenario {} (options drawn as {}), seed {}: {} simulated s, {} ticks, {} trace events\n",
        outcome.scenario,
        outcome.picked,
        outcome.seed,
        outcome.simulated_s,
        outcome.ticks,
        outcome.trace_events
    );
    // Ticks of an empty world say nothing; they stay in the hash, not on the screen.
    let telling: Vec<&String> = outcome
        .trace
        .iter()
        .filter(|e| !e.contains("tick queued=0 active=0 started=0 gaps=0 "))
        .collect();
    let skipped = telling.len().saturating_sub(REPLAY_EVENTS_SHOWN);
    if skipped > 0 {
        out.push_str(&format!("  ... {skipped} earlier events\n"));
    }
    for event in &telling[skipped..] {
        out.push_str(&format!("  {event}\n"));
    }
    let c = &outcome.counts;
    out.push_str(&format!(
        "counts: jobs {}, completed {}, cancelled {}, dispatches {} (+{} deduplicated), failed starts {}, cross-bucket takes {}, idle exits {}, purges {}, faults injected {}, log lines {}\n",
        c.jobs,
        c.jobs_completed,
        c.jobs_cancelled,
        c.dispatches,
        c.dispatches_deduplicated,
        c.failed_starts,
        c.cross_bucket_takes,
        c.idle_exits,
        c.purges,
        outcome.faults_injected,
        outcome.log_lines
    ));
    let failed = outcome.violation.as_ref().map(|v| v.invariant);
    for invariant in ["I1", "I2", "I3", "I4", "I5", "I6", "I7", "config"] {
        let verdict = match failed {
            Some(f) if f == invariant => "VIOLATED",
            // Checks stop at the first violation; I6 is judged only at the end.
            Some(_) => "not reached",
            None => "held",
        };
        out.push_str(&format!("  {invariant}: {verdict}\n"));
    }
    for pending in outcome.pending {
        out.push_str(&format!("  {pending}\n"));
    }
    match &outcome.convergence {
        Some(b) => out.push_str(&format!(
            "I6 bound: converge by t={}s = faults and arrivals off at t={}s + backoff {}s + {} rounds at the binding cap ({}s) + {} rounds x {}s (poll, lag, placement, boot, longer of a job and a surplus runner's hold) + two polls of {}s\n",
            b.bound_s,
            b.from_s,
            b.backoff_s,
            b.waves,
            b.binding_s,
            b.extra_waves,
            b.wave_s,
            outcome.poll_interval_s
        )),
        None => out.push_str("I6 bound: not reached\n"),
    }
    if let Some(line) = outcome.failure_line() {
        out.push_str(&format!("FAIL {line}\n"));
    }
    out.push_str(&format!("trace hash {}\n", outcome.trace_hash));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_in_a_log_line_is_caught_and_masked_in_the_report() {
        let logs = LogWatch::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer({
                let logs = logs.clone();
                move || logs.clone()
            })
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::trace!("nothing secret here");
            assert_eq!(logs.leak(), None);
            tracing::debug!(token = %format!("{CANARY}000001"), "minted");
        });
        let leak = logs.leak().expect("the token was seen");
        assert!(!leak.contains(CANARY), "{leak}");
        assert!(leak.contains("<TOKEN>000001"), "{leak}");
        assert_eq!(logs.lines(), 2);
    }

    #[test]
    fn scenario_names_round_trip() {
        for scenario in Scenario::NAMED.into_iter().chain([Scenario::Mixed]) {
            assert_eq!(Scenario::parse(scenario.as_str()), Some(scenario));
        }
        assert_eq!(Scenario::parse("demo"), None);
    }

    #[test]
    fn every_scenario_document_passes_validation() {
        for scenario in Scenario::NAMED {
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
