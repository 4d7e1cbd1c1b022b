//! The run of one seed: the world, the daemons (or a baseline) built from the seed's streams,
//! then run on a paused tokio clock: the world steps every whole second in a task of its own,
//! the daemons run the real `run` path in theirs, and every call they make takes time, so
//! the world moves while a tick is in progress. The invariants are checked after every step,
//! until the run converges or its bound passes. The sweep and the benchmark call it once per
//! seed; a replay calls it with the trace kept.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

use super::daemon::{Daemon, DaemonSettings, SimClock, TickLog};
use super::github_http::GitHubHttp;
use super::invariants::{self, ConvergenceBound, Violation};
use super::log_watch::LogWatch;
use super::ports::{self, Shared, Sim, lock};
use super::world::{EPOCH_UNIX, World};
use super::{
    BASELINE_TAIL_S, RunSettings, STEP_S, Scenario, SeedOutcome, Strategy, baselines, bench,
    options, trace,
};
use crate::config::{ConfigDefaults, parse_document};
use crate::control_loop::LoopSettings;
use crate::plan::PlanSettings;

/// The session TTL the world's daemons hold the leader lock with (the shipped default).
pub const LOCK_TTL: Duration = crate::leader::LOCK_TTL_DEFAULT;

/// The lock timings the world's daemons run with, all derived from [`LOCK_TTL`] by the
/// leader's own rules (the invariants read the lock delay and takeover bound from here).
pub fn lock_timings() -> crate::leader::LeaderSettings {
    crate::leader::LeaderSettings {
        key: super::lock::LEADER_KEY.into(),
        ttl: LOCK_TTL,
        holder: crate::leader::Holder {
            holder: "the world's daemons".into(),
            pid: 0,
        },
    }
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
    // Drawn, not used: the stream the world's own Consul watcher once took keeps every
    // later stream where it was.
    let _ = rng.next_u64();
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
    let mut latency_rng = StdRng::seed_from_u64(rng.next_u64());
    options.draw_latencies(&mut latency_rng);
    options.draw_daemons(&mut StdRng::seed_from_u64(rng.next_u64()));
    let mut lags_rng = StdRng::seed_from_u64(rng.next_u64());
    options.draw_lags(&mut lags_rng);
    let mut world = World::new(&options, repo_urls)
        .with_arrivals(arrivals_rng)
        .with_lags(lags_rng);
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
        latency_rng,
        trace::Trace::new(settings.keep_trace),
    )));
    let mut actor = match settings.strategy {
        Strategy::Ours => Actor::Ours {
            rng: controller_rng,
            planner: settings.planner,
            mutant: settings.mutant,
        },
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

    let logs = LogWatch::from_env();
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
        drive(&mut actor, &shared, &loop_settings, &logs)
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
    outcome.tick_ms_max = driven.tick_virtual_ms.iter().copied().max().unwrap_or(0);
    m.tick_virtual_ms = driven.tick_virtual_ms;
    m.wasted_dispatches = sim.world.wasted_dispatches();
    m.stranded_jobs = sim.world.stranded_jobs();
    m.requests = sim.requests.clone();
    m.delete_kills_job = sim.options.delete_kills_job;
    m.github_repos = sim
        .options
        .repos
        .iter()
        .filter(|r| r.forge == options::ForgeKind::GitHub)
        .count() as u64;
    outcome.wall_ms = started.elapsed().as_millis();
    outcome
}

/// Who acts on the world: our daemons (built once the runtime runs), or a baseline.
enum Actor {
    Ours {
        rng: StdRng,
        planner: Option<fn(crate::plan::PlanInput<'_>) -> crate::plan::Plan>,
        mutant: Option<super::mutants::Mutant>,
    },
    Seed(baselines::SeedPoller),
    Ephemerd(baselines::EphemerdPreVeto),
}

struct Driven {
    violation: Option<Violation>,
    convergence: Option<ConvergenceBound>,
    ticks: u64,
    tick_wall_us: Vec<u64>,
    tick_virtual_ms: Vec<u64>,
}

fn drive(
    actor: &mut Actor,
    shared: &Shared,
    loop_settings: &LoopSettings,
    logs: &LogWatch,
) -> Driven {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("build a current-thread runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, world(actor, shared, loop_settings, logs))
}

/// The world's own task: one step per simulated second, the invariants after each, until
/// the run is over. Our daemons run beside it in tasks of their own; a baseline is stepped
/// from here.
async fn world(
    actor: &mut Actor,
    shared: &Shared,
    loop_settings: &LoopSettings,
    logs: &LogWatch,
) -> Driven {
    let start = tokio::time::Instant::now();
    let (poll_s, idle_s, converge_from_s) = {
        let sim = lock(shared);
        let o = &sim.options;
        (
            o.poll_interval_s,
            o.idle_poll_interval_s,
            o.faults_end_s.max(o.arrivals_end_s),
        )
    };
    lock(shared).checker = Some(invariants::Checker::new(poll_s, idle_s, STEP_S));
    let mut driven = Driven {
        violation: None,
        convergence: None,
        ticks: 0,
        tick_wall_us: Vec::new(),
        tick_virtual_ms: Vec::new(),
    };
    let tick_log = Arc::new(Mutex::new(TickLog::default()));
    let mut daemons: Vec<Daemon> = Vec::new();
    lock(shared).started = start;
    let (daemon_count, restarts) = {
        let sim = lock(shared);
        (sim.options.daemons, sim.options.restarts.clone())
    };
    let daemon_settings = match actor {
        Actor::Ours {
            rng,
            planner,
            mutant,
        } => {
            let settings = DaemonSettings {
                loop_settings: loop_settings.clone(),
                lock_ttl: LOCK_TTL,
                planner: *planner,
                mutant: *mutant,
                clock: SimClock { start },
                github: GitHubHttp::new(shared),
            };
            for id in 0..daemon_count {
                daemons.push(Daemon::start(
                    shared,
                    &settings,
                    id,
                    1,
                    rng,
                    tick_log.clone(),
                ));
            }
            Some(settings)
        }
        _ => None,
    };
    let mut converged_since: Option<u64> = None;
    let mut t = 0;
    let ended = loop {
        tokio::time::sleep_until(start + Duration::from_secs(t)).await;
        let config = {
            let mut sim = lock(shared);
            sim.advance(t);
            let hazards: Vec<_> = sim
                .options
                .lock_hazards
                .iter()
                .filter(|(at, _)| *at == t)
                .map(|(_, hazard)| *hazard)
                .collect();
            for hazard in hazards {
                sim.lock_hazard(hazard);
            }
            drop(sim);
            if let (Some(settings), Actor::Ours { rng, .. }) = (&daemon_settings, &mut *actor) {
                for &(at, id, down_s) in &restarts {
                    if at == t
                        && let Some(i) = daemons.iter().position(|d| d.id == id)
                    {
                        lock(shared)
                            .trace
                            .record(t, format!("daemon {id} killed; up again in {down_s} s"));
                        daemons.swap_remove(i).crash(shared);
                    }
                    if at + down_s == t && !daemons.iter().any(|d| d.id == id) {
                        let incarnation = restarts
                            .iter()
                            .filter(|(a, d, down)| *d == id && a + down <= t)
                            .count() as u32
                            + 1;
                        lock(shared)
                            .trace
                            .record(t, format!("daemon {id} started again"));
                        daemons.push(Daemon::start(
                            shared,
                            settings,
                            id,
                            incarnation,
                            rng,
                            tick_log.clone(),
                        ));
                    }
                }
            }
            let mut sim = lock(shared);
            sim.reap_sessions();
            if sim
                .options
                .outage_at(super::options::Service::Consul, t)
                .is_some()
            {
                // Blocked reads fail when Consul goes away under them.
                sim.lock.poke();
            }
            bench::note_cap_room(&mut sim);
            let now = sim_time(t);
            for repo in sim.world.webhooks_arriving(t) {
                for daemon in &daemons {
                    daemon.deliver_webhook(repo.clone(), now);
                }
            }
            // A bad edit or an outage must leave each loop on the last good document.
            let strays = sim.daemon_configs.iter().any(|(_, rx)| {
                rx.borrow()
                    .config
                    .as_deref()
                    .is_some_and(|c| *c != sim.config)
            });
            if strays {
                break Some(Violation {
                    invariant: "config",
                    step: t,
                    message: "a loop runs on a document other than the last good one".into(),
                });
            }
            Arc::new(sim.config.clone())
        };
        let poll = t % poll_s == 0;
        match actor {
            Actor::Ours { .. } => {}
            Actor::Seed(seed) => {
                if poll {
                    driven.ticks += 1;
                    seed.tick(&config).await;
                    lock(shared).trace.record(t, "seed poller tick");
                }
            }
            Actor::Ephemerd(ephemerd) => {
                if poll {
                    driven.ticks += 1;
                }
                ephemerd.step(&config, t, poll).await
            }
        }
        if let Some(line) = logs.leak() {
            break Some(Violation {
                invariant: "I5",
                step: t,
                message: format!("a registration token appears in a log line: {line}"),
            });
        }
        let mut sim = lock(shared);
        sim.judge();
        if let Some(v) = sim.violation.take() {
            if matches!(actor, Actor::Ours { .. }) {
                break Some(v);
            }
            // A baseline is judged until its first violation, then only measured.
            sim.checker = None;
            driven.violation.get_or_insert(v);
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
                Actor::Ours { .. } => bound.bound_s,
                _ => bound.bound_s.min(converge_from_s + BASELINE_TAIL_S),
            };
            if quiet || t >= horizon {
                break driven
                    .violation
                    .take()
                    .or_else(|| invariants::i6(&sim, bound));
            }
        }
        drop(sim);
        t += STEP_S;
    };
    for daemon in daemons {
        daemon.crash(shared);
    }
    if matches!(actor, Actor::Ours { .. }) {
        let log = std::mem::take(&mut *tick_log.lock().unwrap_or_else(|p| p.into_inner()));
        driven.ticks = log.ticks;
        driven.tick_wall_us = log.wall_us;
        driven.tick_virtual_ms = log.virtual_ms;
    }
    driven.violation = ended;
    driven
}

/// The wall-clock instant of simulated second `t`.
fn sim_time(t: u64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(EPOCH_UNIX + t as i64, 0).expect("simulated time is in range")
}
