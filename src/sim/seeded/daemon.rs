//! A daemon of the world, run the way `runner-scaler run` runs: the real leader lock logic
//! ([`leader::lead`]) over Consul's side of the lock ([`super::lock`]), and in each term the
//! real watcher and control loop ([`serve_term`]) behind the term's fence, on the world's
//! clock. Only the ports are the world's. A daemon can crash (its tasks dropped mid-call, its
//! memory lost, its session left to expire) and start again.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::consul::SimDocument;
use super::github_http::GitHubHttp;
use super::ports::{CANARY, Shared, lock};
use super::world::EPOCH_UNIX;
use super::{invariants::Violation, lock as consul_lock, ports, trace};
use crate::clock::Clock;
use crate::config::ConfigDefaults;
use crate::config::watch::WatchSettings;
use crate::control_loop::{Controller, DocumentWatch, LoopSettings, serve_term};
use crate::leader::{self, Fence, Holder, LeaderSettings, LeaderState, StopTerm};
use crate::model::RepoName;
use crate::plan::{Plan, PlanInput};
use crate::report::TickView;
use crate::webhook::{Hints, WebhookForge};

/// The world's time as the daemon reads it: the run's epoch plus the virtual time elapsed
/// since the run began, to the millisecond.
#[derive(Clone, Copy, Debug)]
pub struct SimClock {
    pub start: Instant,
}

impl Clock for SimClock {
    fn now(&self) -> DateTime<Utc> {
        let elapsed = Instant::now().saturating_duration_since(self.start);
        DateTime::from_timestamp(EPOCH_UNIX, 0).expect("the epoch is in range")
            + chrono::Duration::from_std(elapsed).expect("a run is shorter than chrono's range")
    }
}

/// What every incarnation of every daemon of a run shares.
#[derive(Clone)]
pub struct DaemonSettings {
    pub loop_settings: LoopSettings,
    pub lock_ttl: Duration,
    pub planner: Option<fn(PlanInput<'_>) -> Plan>,
    pub mutant: Option<super::mutants::Mutant>,
    pub clock: SimClock,
    /// GitHub's side of the API, shared by every daemon (budgets are GitHub's).
    pub github: GitHubHttp,
}

/// What a daemon's ticks showed, for the driver: how many, and the host time each took.
#[derive(Default)]
pub struct TickLog {
    pub ticks: u64,
    pub wall_us: Vec<u64>,
    /// Virtual time each tick took, from its `now` to its view being published.
    pub virtual_ms: Vec<u64>,
}

/// One daemon process of the world.
pub struct Daemon {
    pub id: usize,
    /// How many times it has started.
    pub incarnation: u32,
    hints: Hints,
    tasks: Vec<JoinHandle<()>>,
}

impl Daemon {
    /// Starts daemon `id` (its `incarnation`-th start): it stands by for the lock and leads
    /// whenever it holds it.
    pub fn start(
        shared: &Shared,
        settings: &DaemonSettings,
        id: usize,
        incarnation: u32,
        rng: &mut StdRng,
        ticks: Arc<std::sync::Mutex<TickLog>>,
    ) -> Daemon {
        let hints = Hints::new();
        let (published_tx, published_rx) = watch::channel(None);
        let busy_ns = Arc::new(AtomicU64::new(0));
        let mut term_rng = StdRng::seed_from_u64(rand::RngCore::next_u64(rng));
        let mut services = ports::services_over(shared, settings.github.clone(), true, Some(id));
        if let Some(mutant) = settings.mutant {
            services.children = mutant.child_source(services.children);
            if let Some(forge) = services.forgejo.as_mut() {
                forge.queue = mutant.forgejo_queue(forge.queue.clone());
            }
        }
        let store = consul_lock::store(shared, id);
        let store = match settings.mutant {
            Some(mutant) => mutant.lock_store(store),
            None => store,
        };
        let leader = LeaderSettings {
            key: consul_lock::LEADER_KEY.into(),
            ttl: settings.lock_ttl,
            holder: Holder {
                holder: format!("daemon-{id}"),
                pid: incarnation,
            },
        };
        let process = {
            let shared = shared.clone();
            let settings = settings.clone();
            let hints = hints.clone();
            async move {
                let clock = settings.clock;
                let clock = &clock;
                let (state_tx, _state_rx) = watch::channel(LeaderState::NoSession);
                let term = |fence: Fence, stop: StopTerm| {
                    let mut controller = Controller::new(
                        leader::fenced(&services, &fence),
                        settings.loop_settings.clone(),
                        Box::new(StdRng::seed_from_u64(rand::RngCore::next_u64(
                            &mut term_rng,
                        ))),
                    )
                    .with_status_publisher(published_tx.clone())
                    .with_hints(hints.clone())
                    .with_carried(leader::fenced_carried(
                        carried_store(&shared, id, settings.mutant),
                        &fence,
                    ));
                    if let Some(planner) = settings.planner {
                        controller = controller.with_planner(planner);
                    }
                    let document = DocumentWatch {
                        source: SimDocument(shared.clone()),
                        defaults: ConfigDefaults::default(),
                        settings: WatchSettings::default(),
                        jitter: StdRng::seed_from_u64(rand::RngCore::next_u64(&mut term_rng)),
                    };
                    let shared = shared.clone();
                    async move {
                        serve_term(controller, document, clock, false, stop.wait(), |config| {
                            lock(&shared).daemon_configs.insert(id, config.clone());
                        })
                        .await;
                    }
                };
                let outcome =
                    leader::lead(store, leader, state_tx, std::future::pending::<()>(), term).await;
                if let Err(e) = outcome {
                    let mut sim = lock(&shared);
                    let t = sim.t;
                    sim.violation.get_or_insert(Violation {
                        invariant: "setup",
                        step: t,
                        message: format!("daemon {id} could not lead: {e}"),
                    });
                }
            }
        };
        let process = tokio::task::spawn_local(Timed {
            inner: Box::pin(process),
            busy_ns: busy_ns.clone(),
        });
        let observer = tokio::task::spawn_local(observe_ticks(
            shared.clone(),
            settings.clock,
            id,
            published_rx,
            busy_ns,
            ticks,
        ));
        lock(shared).daemons_up.insert(id);
        Daemon {
            id,
            incarnation,
            hints,
            tasks: vec![process, observer],
        }
    }

    /// A `workflow_job` delivery reaches this daemon's receiver (a standby refuses it).
    pub fn deliver_webhook(&self, repo: RepoName, now: DateTime<Utc>) {
        self.hints.offer(WebhookForge::GitHub, repo, now);
    }

    /// The process dies where it stands: every call in flight is dropped, nothing is
    /// released, its session expires on its own.
    pub fn crash(self, shared: &Shared) {
        for task in &self.tasks {
            task.abort();
        }
        let mut sim = lock(shared);
        sim.daemons_up.remove(&self.id);
        sim.daemon_configs.remove(&self.id);
    }
}

/// Daemon `id`'s state key, as its mutant (if any) sees it.
fn carried_store(
    shared: &Shared,
    id: usize,
    mutant: Option<super::mutants::Mutant>,
) -> Arc<dyn crate::act::services::CarriedStore> {
    let store: Arc<dyn crate::act::services::CarriedStore> = Arc::new(consul_lock::SimStateKey {
        shared: shared.clone(),
        daemon: id,
    });
    match mutant {
        Some(mutant) => mutant.carried_store(store),
        None => store,
    }
}

/// Records each tick a daemon publishes: a trace line, the host time it took, and an I5
/// violation if its `--json` view carries a token.
async fn observe_ticks(
    shared: Shared,
    clock: SimClock,
    id: usize,
    mut published: watch::Receiver<Option<TickView>>,
    busy_ns: Arc<AtomicU64>,
    ticks: Arc<std::sync::Mutex<TickLog>>,
) {
    while published.changed().await.is_ok() {
        let Some(view) = published.borrow_and_update().clone() else {
            continue;
        };
        let wall_us = busy_ns.swap(0, Ordering::Relaxed) / 1_000;
        let took_ms = view
            .at
            .map(|at| (clock.now() - at).num_milliseconds().max(0) as u64)
            .unwrap_or(0);
        {
            let mut log = ticks.lock().unwrap_or_else(|p| p.into_inner());
            log.ticks += 1;
            log.wall_us.push(wall_us);
            log.virtual_ms.push(took_ms);
        }
        let json = serde_json::to_string(&view).expect("a tick view serialises");
        let mut sim = lock(&shared);
        let t = sim.t;
        if json.contains(CANARY) {
            sim.violation.get_or_insert(Violation {
                invariant: "I5",
                step: t,
                message: "a registration token appears in the tick's --json view".into(),
            });
        }
        let who = if id == 0 {
            String::new()
        } else {
            format!("daemon {id} ")
        };
        sim.trace.record(
            t,
            format!(
                "{who}tick queued={} active={} started={} gaps={} view={:016x}",
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
    }
}

/// A future whose host time spent being polled is added up (a tick's own work, and the
/// in-memory services it calls), measured, never asserted.
struct Timed<F> {
    inner: Pin<Box<F>>,
    busy_ns: Arc<AtomicU64>,
}

impl<F: Future<Output = ()>> Future for Timed<F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let started = std::time::Instant::now();
        let polled = self.inner.as_mut().poll(cx);
        self.busy_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        polled
    }
}
