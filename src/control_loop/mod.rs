//! One tick after another. The [`Controller`] is the only owner of state kept between ticks:
//! first sightings of Forgejo jobs, parents that left the document but still have children,
//! and the backoff of every scope that failed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::RngCore;
use tracing::{info, warn};

pub mod admin_token;
pub mod carried;
mod failures;
mod held_parents;
mod pause;
pub mod polls;
mod reading;
mod takeback;
mod term;
mod ticks;
mod waits;

use failures::{Failure, Scope};
use reading::{read_each_repo, read_exit_codes};
pub use term::{DocumentWatch, serve_term};
pub use ticks::run;

pub use takeback::{CRASH_BACKOFF_FIRST, CRASH_BACKOFF_MAX, crash_delay};

use crate::act::execute::{ActReport, DispatchOutcome, RegistrationsToDelete, carry_out};
use crate::config::Config;
use crate::config::watch::DocumentSource;
use crate::model::{BucketKey, ChildId, ErrorClass, RepoName};
use crate::observe::{RepoJobs, Snapshot};
use crate::plan::{Holds, Plan, PlanInput, PlanSettings, plan};
use crate::report::{self, TickView};

pub use crate::act::services::{Forge, Services};

/// `now` moved on by the time the tick has taken since `started`: a time by which what the
/// tick did so far had happened (the tick reads the clock only at its start).
fn elapsed_since(now: DateTime<Utc>, started: tokio::time::Instant) -> DateTime<Utc> {
    crate::clock::after(now, started.elapsed())
}

/// Settings of the loop itself.
#[derive(Clone, Debug)]
pub struct LoopSettings {
    /// Time between ticks, and between reads of a repo with work.
    pub poll_interval: Duration,
    /// Time between reads of an idle repo (no job queued or running at its last read, no
    /// child of ours, no webhook hint in the last minutes).
    pub idle_poll_interval: Duration,
    pub plan: PlanSettings,
    /// Sources asked at once (repos and parents).
    pub list_concurrency_max: usize,
    /// How long a terminal error (permission, configuration) holds its scope before it is
    /// tried again, so a fix made outside the document is noticed.
    pub terminal_retry: Duration,
    /// Ceiling of the exponential backoff of transient errors.
    pub transient_backoff_max: Duration,
    /// How often the parents of our children are found from Nomad alone (besides the first
    /// tick): children of parents the document no longer names keep counting.
    pub discovery_interval: Duration,
    /// Where ticks are counted and health facts kept; the `--listen` server reads it.
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl Default for LoopSettings {
    fn default() -> Self {
        LoopSettings {
            poll_interval: Duration::from_secs(15),
            idle_poll_interval: polls::IDLE_POLL_INTERVAL_DEFAULT,
            plan: PlanSettings::default(),
            list_concurrency_max: 8,
            terminal_retry: Duration::from_secs(600),
            transient_backoff_max: Duration::from_secs(300),
            discovery_interval: Duration::from_secs(600),
            metrics: Arc::default(),
        }
    }
}

/// The state kept between ticks.
#[derive(Default)]
pub struct Memory {
    /// First sighting of each Forgejo job, whose API carries no timestamps.
    first_seen: BTreeMap<(RepoName, u64), DateTime<Utc>>,
    /// Parents whose last listing held children of ours: listed until none are left, even
    /// after they leave the document.
    lingering_parents: BTreeSet<String>,
    failures: BTreeMap<Scope, Failure>,
    /// Unroutable jobs already reported at WARN.
    reported_unroutable: BTreeSet<(RepoName, u64)>,
    /// Failed starts, crash-loop backoff, readings of nominated runners.
    take_back: takeback::TakeBackMemory,
    /// When the parents of our children were last found from Nomad alone; `None` until the
    /// first success.
    discovered_at: Option<DateTime<Utc>>,
    /// When each child of ours was first seen placed.
    placed_seen: BTreeMap<ChildId, DateTime<Utc>>,
    /// Why dispatching is paused by the operator's key, as last read.
    paused: Option<String>,
    /// The pause key could not be read, last time it was asked (said once per change).
    pause_unreadable: Option<String>,
    /// When each bucket last got a runner.
    last_dispatch: BTreeMap<BucketKey, DateTime<Utc>>,
    /// Jobs seen queued, to measure their wait when they start.
    start_waits: waits::StartWaits,
    /// When each repo's queue was read and is next due.
    polls: polls::PollSchedule,
    /// Each repo's last successful queue reading, carried into ticks that do not read it.
    readings: BTreeMap<RepoName, RepoJobs>,
    /// Budgets low enough to stretch read intervals: their owners, and what was said of them.
    stretched_owners: BTreeSet<String>,
    stretched_budgets: Vec<String>,
    /// `vault` repos refused because the daemon's token can read their admin token, or
    /// could not be asked whether it can; see [`admin_token::admin_token_holds`].
    admin_token_holds: BTreeMap<RepoName, String>,
    /// The document version Vault was last asked about.
    admin_token_asked_for: Option<u64>,
    /// Parent readings held dispatches were last let go on.
    held_parents: held_parents::HeldParents,
    /// Whether the state key was read in this term (until it is, every tick tries).
    carried_loaded: bool,
    /// What was last written to the state key, or read from it.
    carried_saved: Option<carried::Carried>,
}

/// Runs ticks over a set of services.
pub struct Controller {
    pub services: Services,
    pub settings: LoopSettings,
    memory: Memory,
    rng: Box<dyn RngCore + Send>,
    /// [`plan`], unless a test plugs in a mutant to prove the simulator catches it.
    planner: fn(PlanInput<'_>) -> Plan,
    /// The operator's pause key and where to read it, read once per tick.
    pause_key: Option<(String, Arc<dyn DocumentSource>)>,
    /// Where each tick's view goes for the live status (`GET /status`).
    published: Option<tokio::sync::watch::Sender<Option<TickView>>>,
    /// Webhook hints (`--webhook-listen`); see [`run`] for how they are consumed.
    hints: Option<crate::webhook::Hints>,
    /// Asks Vault whether the daemon's token can read a `registerVaultPath`.
    admin_token_probe: Option<Arc<dyn crate::secrets::CapabilityProbe>>,
    /// The state key: what this term takes over from the last, and hands on.
    carried: Option<Arc<dyn crate::act::services::CarriedStore>>,
}

impl Controller {
    pub fn new(services: Services, settings: LoopSettings, rng: Box<dyn RngCore + Send>) -> Self {
        Controller {
            services,
            settings,
            memory: Memory::default(),
            rng,
            planner: plan,
            pause_key: None,
            published: None,
            hints: None,
            admin_token_probe: None,
            carried: None,
        }
    }

    /// Reads what earlier terms carried (crash-loop backoff, deleted registrations) from
    /// `store` at the first tick, and writes it there whenever it changes.
    pub fn with_carried(mut self, store: Arc<dyn crate::act::services::CarriedStore>) -> Self {
        self.carried = Some(store);
        self
    }

    /// Follows webhook hints: [`run`] tells `hints` which document it runs on, and ticks
    /// when a hinted repo is due instead of waiting for the poll interval.
    pub fn with_hints(mut self, hints: crate::webhook::Hints) -> Self {
        self.hints = Some(hints);
        self
    }

    /// Asks `probe`, for each new document and at every tick while a repo is refused,
    /// whether the daemon's token can read any `registerVaultPath`; a repo whose admin token
    /// it can read (or that cannot be asked about) dispatches nothing until that changes.
    /// `None` (no Vault): nothing is asked.
    pub fn with_admin_token_guard(
        mut self,
        probe: Option<Arc<dyn crate::secrets::CapabilityProbe>>,
    ) -> Self {
        self.admin_token_probe = probe;
        self
    }

    /// Publishes every tick's view on `tx`: what the running daemon knows (its backoffs,
    /// holds and readings), which a fresh dry-run tick in another process cannot.
    pub fn with_status_publisher(
        mut self,
        tx: tokio::sync::watch::Sender<Option<TickView>>,
    ) -> Self {
        self.published = Some(tx);
        self
    }

    /// Reads `key` from `source` once per tick: while it holds a value other than `false`,
    /// nothing is dispatched (see [`crate::config::pause`]).
    pub fn with_pause_key(mut self, key: String, source: Arc<dyn DocumentSource>) -> Self {
        self.pause_key = Some((key, source));
        self
    }

    /// Replaces the planner. Only the seeded simulator's mutant tests use this: they plug in
    /// a planner with a known bug and assert that the invariants catch it.
    pub fn with_planner(mut self, planner: fn(PlanInput<'_>) -> Plan) -> Self {
        self.planner = planner;
        self
    }

    /// One reconcile tick: observe, plan, act (unless `dry_run`), report.
    pub async fn tick(
        &mut self,
        config: &Config,
        config_version: u64,
        now: DateTime<Utc>,
        dry_run: bool,
    ) -> TickView {
        let started = tokio::time::Instant::now();
        let mut snapshot = self.observe(config, config_version, now).await;
        let mut gaps: Vec<String> = snapshot
            .repos
            .iter()
            .filter_map(|(repo, r)| r.as_ref().err().map(|g| format!("{repo}: {}", g.message)))
            .chain(
                snapshot
                    .parents
                    .iter()
                    .filter_map(|(p, r)| r.as_ref().err().map(|g| format!("{p}: {}", g.message))),
            )
            .collect();
        if let Some(gap) = &snapshot.undiscovered {
            gaps.push(format!("parents of our children: {}", gap.message));
        }
        self.load_carried().await;
        let exit_codes = read_exit_codes(
            self.services.children.clone(),
            self.memory.take_back.ends_to_read(&snapshot),
        )
        .await;
        self.memory
            .take_back
            .learn_from_snapshot(&snapshot, &exit_codes, now);
        snapshot.deregistered = self.memory.take_back.deregistered(&snapshot);
        self.read_pause_key().await;
        self.check_admin_tokens(config, config_version).await;
        self.recheck_held_parents(config, now).await;
        let holds = self.holds(now);
        let plan = (self.planner)(PlanInput {
            config,
            snapshot: &snapshot,
            settings: self.settings.plan,
            holds: &holds,
            now,
        });
        let repos_to_read = self
            .memory
            .take_back
            .repos_to_read(config, &snapshot, &plan, now);
        let to_read: Vec<_> = repos_to_read
            .iter()
            .filter_map(|name| config.repos.get(name))
            .filter_map(|repo| {
                let registry = self.services.runner_registry(&repo.mode)?;
                Some((repo.clone(), registry.clone()))
            })
            .collect();
        let registrations =
            takeback::read_registrations(to_read, self.settings.list_concurrency_max).await;
        let judgements = self.memory.take_back.judge(
            &snapshot,
            &plan,
            &registrations,
            now,
            elapsed_since(now, started),
        );
        report::log_judgements(&judgements);
        let to_delete = RegistrationsToDelete {
            stale: self.memory.take_back.stale_registrations(
                config,
                &snapshot,
                &registrations,
                now,
            ),
            of_purged: self
                .memory
                .take_back
                .registered_of_purges(config, &snapshot, &plan),
        };
        for job in &plan.unroutable {
            if self
                .memory
                .reported_unroutable
                .insert((job.repo.clone(), job.job_id))
            {
                warn!(repo = %job.repo, job_id = job.job_id, "unroutable job: {}", job.reason);
            }
        }
        if dry_run {
            let mut view = TickView::new(&plan, &judgements, None, gaps);
            self.annotate(&mut view, config, &plan, &snapshot, now);
            return view;
        }
        let act = carry_out(
            &plan,
            &judgements,
            &to_delete,
            config,
            &self.services,
            self.services.control.as_ref(),
            self.rng.as_mut(),
        )
        .await;
        self.learn_from(&act, config_version, now);
        self.memory.take_back.learn_from_dispatches(&act.dispatches);
        self.memory
            .take_back
            .learn_from_reaps(&act.reaps, now, elapsed_since(now, started));
        self.save_carried().await;
        report::log_act(&act);
        let mut view = TickView::new(&plan, &judgements, Some(&act), gaps);
        self.annotate(&mut view, config, &plan, &snapshot, now);
        report::log_tick(&view);
        report::record::record_tick(
            &self.settings.metrics,
            &report::record::TickRecord {
                plan: &plan,
                view: &view,
                act: &act,
                crash_backoff: &holds.crash_backoff,
                started_waits: &self.memory.start_waits.observe(&snapshot, now),
                observed_nomad_and_forge: report::record::observed_nomad_and_forge(&snapshot),
                now,
                took: started.elapsed(),
            },
        );
        view
    }

    /// Adds to a tick's view what the loop remembers and the plan does not carry, and
    /// publishes it for the live status.
    fn annotate(
        &self,
        view: &mut TickView,
        config: &Config,
        plan: &Plan,
        snapshot: &Snapshot,
        now: DateTime<Utc>,
    ) {
        view.at = Some(now);
        view.stretched_budgets = self.memory.stretched_budgets.clone();
        view.weaker_credentials = config
            .repos
            .values()
            .filter_map(|repo| {
                let registrar = &self.services.forge(&repo.mode)?.registrar;
                registrar.weaker_credential(repo)
            })
            .collect();
        view.paused = self.memory.paused.clone();
        view.foreign_children = snapshot
            .parents
            .values()
            .flatten()
            .flatten()
            .filter(|c| !c.ours)
            .count() as u32;
        let backoffs = self.memory.take_back.crash_backoff();
        // The view's buckets are the plan's, in the same order.
        for (bucket, planned) in view.buckets.iter_mut().zip(&plan.buckets) {
            let key = &planned.key;
            bucket.last_dispatch_at = self.memory.last_dispatch.get(key).copied();
            bucket.crash_backoff = backoffs.get(key).map(|b| report::BackoffView {
                failed_starts: b.failed_starts,
                next_dispatch_at: b.next_dispatch_at,
            });
        }
        if let Some(tx) = &self.published {
            tx.send_replace(Some(view.clone()));
        }
    }

    /// Takes over what the state key carries, once per term: a restarted daemon, or a new
    /// leader, keeps its predecessor's crash-loop backoff and deleted registrations.
    async fn load_carried(&mut self) {
        let Some(store) = &self.carried else { return };
        if self.memory.carried_loaded {
            return;
        }
        match store.load().await {
            Ok(None) => self.memory.carried_loaded = true,
            Ok(Some(bytes)) => {
                self.memory.carried_loaded = true;
                match carried::Carried::parse(&bytes) {
                    Ok(carried) => {
                        let backoff = carried.crash_backoff();
                        let deregistered = carried.deregistered();
                        if !backoff.is_empty() || !deregistered.is_empty() {
                            info!(
                                buckets_backing_off = backoff.len(),
                                deregistered = deregistered.len(),
                                "took over the state key: crash-loop backoff and deleted registrations of earlier terms"
                            );
                        }
                        self.memory.take_back.adopt(backoff, deregistered);
                        self.memory.carried_saved = Some(carried);
                    }
                    Err(why) => warn!(
                        "the state key holds no state this daemon can read ({why}): starting \
                         without it; it is written over at the next change"
                    ),
                }
            }
            Err(e) => warn!(
                class = e.class.as_str(),
                "{}; crash-loop backoff of earlier terms unknown until it can be read", e.message
            ),
        }
    }

    /// Writes what this term carries to the state key, when it changed since the last write.
    async fn save_carried(&mut self) {
        let Some(store) = &self.carried else { return };
        let now = self.memory.take_back.carried();
        if self.memory.carried_saved.as_ref() == Some(&now)
            || (self.memory.carried_saved.is_none()
                && now.crash_backoff.is_empty()
                && now.deregistered.is_empty())
        {
            return;
        }
        let bytes = serde_json::to_vec(&now).expect("the carried state serialises");
        match store.save(bytes).await {
            Ok(()) => self.memory.carried_saved = Some(now),
            Err(e) => warn!(
                class = e.class.as_str(),
                "{}; written again next tick", e.message
            ),
        }
    }

    /// Holds derived from scopes that are backing off.
    fn holds(&self, now: DateTime<Utc>) -> Holds {
        let mut holds = Holds::default();
        for (scope, f) in &self.memory.failures {
            if f.retry_at <= now {
                continue;
            }
            let why = format!("{} (next attempt at {})", f.message, f.retry_at);
            match scope {
                Scope::Queue(_) => {}
                Scope::Mint(repo) => {
                    holds.repos.insert(repo.clone(), why);
                }
                Scope::Dispatch(parent, repo) => {
                    let why = if matches!(f.class, ErrorClass::Configuration | ErrorClass::NotFound)
                    {
                        format!(
                            "{} (parent job {parent} is read again every poll: fixed, it is \
                             dispatched to at once; else next attempt at {})",
                            f.message, f.retry_at
                        )
                    } else {
                        why
                    };
                    holds.parents.insert((parent.clone(), repo.clone()), why);
                }
            }
        }
        for (repo, why) in &self.memory.admin_token_holds {
            holds.repos.insert(repo.clone(), why.clone());
        }
        holds.crash_backoff = self.memory.take_back.crash_backoff().clone();
        holds.paused = self.memory.paused.clone();
        holds
    }

    fn learn_from(&mut self, act: &ActReport, config_version: u64, now: DateTime<Utc>) {
        for outcome in &act.dispatches {
            match outcome {
                DispatchOutcome::Dispatched { bucket, parent, .. } => {
                    self.memory.last_dispatch.insert(bucket.clone(), now);
                    // Listed from the next tick on even if the document drops it meanwhile.
                    self.memory.lingering_parents.insert(parent.clone());
                    self.memory.take_back.probe_dispatched(bucket, now);
                    self.succeeded(&Scope::Mint(bucket.repo.clone()));
                    self.succeeded(&Scope::Dispatch(parent.clone(), bucket.repo.clone()));
                }
                DispatchOutcome::MintFailed { bucket, error, .. } => {
                    self.failed(Scope::Mint(bucket.repo.clone()), error, config_version, now)
                }
                DispatchOutcome::DispatchFailed {
                    bucket,
                    parent,
                    error,
                } => self.failed(
                    Scope::Dispatch(parent.clone(), bucket.repo.clone()),
                    error,
                    config_version,
                    now,
                ),
                DispatchOutcome::Skipped { .. } => {}
            }
        }
    }

    /// The busy and idle read intervals of repos' queues.
    pub fn poll_intervals(&self) -> polls::PollIntervals {
        polls::PollIntervals {
            busy: self.settings.poll_interval,
            idle: self.settings.idle_poll_interval,
        }
    }

    /// Says once per change which budgets stretch their repos' read intervals, and keeps them
    /// for the tick's view.
    fn report_stretched(
        &mut self,
        stretched: BTreeMap<String, (crate::observe::BudgetReading, f64)>,
    ) {
        let lines: Vec<String> = stretched
            .values()
            .map(|(b, stretch)| {
                format!(
                    "{}: {} of {} requests left until {}: its repos are read {stretch:.1}x less often so it lasts",
                    b.owner,
                    b.remaining,
                    b.limit,
                    b.reset_at.to_rfc3339()
                )
            })
            .collect();
        let owners: BTreeSet<String> = stretched.keys().cloned().collect();
        if owners != self.memory.stretched_owners {
            for line in &lines {
                warn!("rate-limit budget low: {line}");
            }
            for owner in self.memory.stretched_owners.difference(&owners) {
                info!(owner = %owner, "rate-limit budget recovered: its repos are read at their usual intervals");
            }
        }
        self.memory.stretched_owners = owners;
        self.memory.stretched_budgets = lines;
    }

    /// A webhook said something happened in `repo`: its queue is read at the next tick.
    pub fn hint(&mut self, repo: &RepoName, now: DateTime<Utc>) {
        self.memory.polls.hint(repo, now);
        for forge in [&self.services.github, &self.services.forgejo]
            .into_iter()
            .flatten()
        {
            forge.queue.hinted(repo);
        }
    }

    /// A new config version: terminal errors may have been fixed by it, so try them again.
    pub fn config_changed(&mut self) {
        self.memory.held_parents.forget_all();
        self.memory.failures.retain(|_, f| {
            !matches!(
                f.class,
                ErrorClass::Configuration
                    | ErrorClass::NotFound
                    | ErrorClass::Forbidden
                    | ErrorClass::Unauthorized
            )
        });
    }
}
