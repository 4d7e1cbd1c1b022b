//! The run of one seed: the world, the controller (or a baseline) and the Consul watch built
//! from the seed's streams, then stepped second by second under a paused tokio clock, the
//! invariants checked after every step, until the run converges or its bound passes. The
//! sweep and the benchmark call it once per seed; a replay calls it with the trace kept.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

use super::invariants::{self, ConvergenceBound, Violation};
use super::log_watch::LogWatch;
use super::ports::{self, CANARY, Shared, Sim, lock};
use super::world::{EPOCH_UNIX, World};
use super::{
    BASELINE_TAIL_S, RunSettings, STEP_S, Scenario, SeedOutcome, Strategy, baselines, bench,
    consul, options, trace,
};
use crate::config::{ConfigDefaults, parse_document};
use crate::control_loop::{Controller, LoopSettings};
use crate::plan::PlanSettings;

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
