//! One tick after another. The [`Controller`] is the only owner of state kept between ticks:
//! first sightings of Forgejo jobs, parents that left the document but still have children,
//! and the backoff of every scope that failed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{FutureExt, StreamExt};
use rand::RngCore;
use tracing::{debug, error, info, warn};

/// Runs `read` on each repo with its port, at most `concurrency` at once; each answer with
/// its repo, in the order they come. Every read is boxed so the tick's future stays `Send`
/// (see `Controller::observe`).
fn read_each_repo<P: Send + 'static, T: Send + 'static>(
    to_read: Vec<(crate::config::RepoConfig, P)>,
    concurrency: usize,
    read: fn(crate::config::RepoConfig, P) -> futures::future::BoxFuture<'static, T>,
) -> impl std::future::Future<Output = Vec<(RepoName, T)>> + Send {
    let reads: Vec<futures::future::BoxFuture<'static, (RepoName, T)>> = to_read
        .into_iter()
        .map(|(repo, port)| {
            let name = repo.repo.clone();
            let answer = read(repo, port);
            let read: futures::future::BoxFuture<'static, (RepoName, T)> =
                Box::pin(async move { (name, answer.await) });
            read
        })
        .collect();
    futures::stream::iter(reads)
        .buffer_unordered(concurrency.max(1))
        .collect::<Vec<_>>()
}

mod held_parents;
pub mod polls;
mod takeback;
mod waits;

pub use takeback::{CRASH_BACKOFF_FIRST, CRASH_BACKOFF_MAX, crash_delay};

use crate::act::execute::{ActReport, DispatchOutcome, RegistrationsToDelete, carry_out};
use crate::act::{
    ChildControl, CredentialWrapper, RegisteredRunners, Registrar, Registrars, RunnerRegistry,
};
use crate::config::watch::{ConfigState, DocumentSource, Fetched};
use crate::config::{Config, Mode};
use crate::model::{BucketKey, ChildId, ErrorClass, RATE_LIMIT_WAIT_MAX_S, RepoName};
use crate::observe::{ChildSource, Gap, PortError, QueueSource, RepoJobs, Snapshot};
use crate::plan::{Holds, Plan, PlanInput, PlanSettings, plan};
use crate::report::{self, TickView};

/// The clients of one forge kind.
pub struct Forge {
    pub queue: Arc<dyn QueueSource>,
    pub registrar: Arc<dyn Registrar>,
    /// Runner registrations the daemon may read and delete (GitHub `app` mode); `None` where
    /// it has no such API, so a runner whose allocation runs is never stopped.
    pub runners: Option<Arc<dyn RunnerRegistry>>,
    /// Runners the daemon registered per dispatch and deletes once their child is purged
    /// (Forgejo 15 and later).
    pub registered: Option<Arc<dyn RegisteredRunners>>,
}

/// Every port the loop uses.
pub struct Services {
    /// Repos in `app` and `vault` mode.
    pub github: Option<Forge>,
    /// Repos in `forgejo` mode.
    pub forgejo: Option<Forge>,
    pub children: Arc<dyn ChildSource>,
    pub control: Arc<dyn ChildControl>,
    /// Vault response wrapping for credentials in dispatch meta; `None` without Vault.
    pub wrapper: Option<Arc<dyn CredentialWrapper>>,
}

impl Services {
    /// Every port, from one client per service: a GitHub and a Forgejo client (each a queue
    /// and a registrar) and a Nomad client.
    pub fn of<G, F, N>(github: Arc<G>, forgejo: Arc<F>, nomad: Arc<N>) -> Services
    where
        G: QueueSource + Registrar + RunnerRegistry + 'static,
        F: QueueSource + Registrar + RegisteredRunners + 'static,
        N: ChildSource + ChildControl + 'static,
    {
        Services {
            github: Some(Forge {
                queue: github.clone(),
                registrar: github.clone(),
                runners: Some(github),
                registered: None,
            }),
            forgejo: Some(Forge {
                queue: forgejo.clone(),
                registrar: forgejo.clone(),
                runners: None,
                registered: Some(forgejo),
            }),
            children: nomad.clone(),
            control: nomad,
            wrapper: None,
        }
    }

    /// Wraps every credential with `wrapper` before it goes into dispatch meta.
    pub fn with_wrapper(mut self, wrapper: Arc<dyn CredentialWrapper>) -> Services {
        self.wrapper = Some(wrapper);
        self
    }

    pub fn forge(&self, mode: &Mode) -> Option<&Forge> {
        if mode.is_github() {
            self.github.as_ref()
        } else {
            self.forgejo.as_ref()
        }
    }
}

impl Registrars for Services {
    fn for_mode(&self, mode: &Mode) -> Option<&dyn Registrar> {
        self.forge(mode).map(|f| f.registrar.as_ref())
    }

    fn runners_for(&self, mode: &Mode) -> Option<&dyn RunnerRegistry> {
        self.runner_registry(mode).map(|r| r.as_ref())
    }

    fn wrapper(&self) -> Option<&dyn CredentialWrapper> {
        self.wrapper.as_deref()
    }

    fn registered_runners(&self, mode: &Mode) -> Option<&dyn RegisteredRunners> {
        self.forge(mode).and_then(|f| f.registered.as_deref())
    }
}

impl Services {
    /// The runner registry of `mode`'s repos. Only `app` mode holds `administration: write`
    /// on the repo; a polling token may not delete registrations, and Forgejo has no such API
    /// before 15.
    fn runner_registry(&self, mode: &Mode) -> Option<&Arc<dyn RunnerRegistry>> {
        if !matches!(mode, Mode::App) {
            return None;
        }
        self.forge(mode).and_then(|f| f.runners.as_ref())
    }
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

/// What failed, so that its backoff and its report are kept apart from other failures.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Queue(RepoName),
    Mint(RepoName),
    Dispatch(String, RepoName),
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Queue(repo) => write!(f, "queue of {repo}"),
            Scope::Mint(repo) => write!(f, "minting for {repo}"),
            Scope::Dispatch(parent, repo) => write!(f, "dispatching {parent} for {repo}"),
        }
    }
}

#[derive(Clone, Debug)]
struct Failure {
    class: ErrorClass,
    message: String,
    consecutive: u32,
    retry_at: DateTime<Utc>,
    /// The config version under which a terminal error was last reported.
    reported_for: Option<u64>,
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
    /// could not be asked whether it can; see [`crate::check::admin_token_holds`].
    admin_token_holds: BTreeMap<RepoName, String>,
    /// The document version Vault was last asked about.
    admin_token_asked_for: Option<u64>,
    /// Parent readings held dispatches were last let go on.
    held_parents: held_parents::HeldParents,
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
    admin_token_probe: Option<Arc<dyn crate::check::CapabilityProbe>>,
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
        }
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
        probe: Option<Arc<dyn crate::check::CapabilityProbe>>,
    ) -> Self {
        self.admin_token_probe = probe;
        self
    }

    async fn check_admin_tokens(&mut self, config: &Config, config_version: u64) {
        let Some(probe) = &self.admin_token_probe else {
            return;
        };
        // Asked again while any repo is refused, so that a fixed policy lifts the hold.
        if self.memory.admin_token_asked_for == Some(config_version)
            && self.memory.admin_token_holds.is_empty()
        {
            return;
        }
        let holds = crate::check::admin_token_holds(config, probe.as_ref()).await;
        for (repo, why) in &holds {
            if self.memory.admin_token_holds.get(repo) != Some(why) {
                error!(repo = %repo, "{why}");
            }
        }
        for repo in self.memory.admin_token_holds.keys() {
            if !holds.contains_key(repo) && config.repos.contains_key(repo) {
                info!(
                    repo = %repo,
                    "vault mode no longer refused: VAULT_TOKEN cannot read its registerVaultPath"
                );
            }
        }
        self.memory.admin_token_holds = holds;
        self.memory.admin_token_asked_for = Some(config_version);
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

    /// Reads the pause key. A key that cannot be read keeps its last known value: an
    /// outage of Consul neither pauses CI nor lifts a pause.
    async fn read_pause_key(&mut self) {
        let Some((key, source)) = &self.pause_key else {
            return;
        };
        let read = source.fetch(0, std::time::Duration::ZERO).await;
        let paused = match read {
            Ok(Fetched::Found { bytes, .. }) => crate::config::pause::pause_reason(key, &bytes),
            Ok(Fetched::Missing { .. }) => None,
            Err(e) => {
                if self.memory.pause_unreadable.as_deref() != Some(e.message.as_str()) {
                    warn!("the pause key could not be read; keeping its last value: {e}");
                    self.memory.pause_unreadable = Some(e.message);
                }
                return;
            }
        };
        self.memory.pause_unreadable = None;
        if paused != self.memory.paused {
            match &paused {
                Some(why) => warn!("dispatching paused by the operator: {why}"),
                None => info!("dispatching resumed: the pause key {key} is gone or false"),
            }
            self.memory.paused = paused;
        }
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
        let snapshot = self.observe(config, config_version, now).await;
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
        let exit_codes = read_exit_codes(
            self.services.children.clone(),
            self.memory.take_back.ends_to_read(&snapshot),
        )
        .await;
        self.memory
            .take_back
            .learn_from_snapshot(&snapshot, &exit_codes, now);
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
        let judgements = self
            .memory
            .take_back
            .judge(&snapshot, &plan, &registrations, now);
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
        self.memory.take_back.learn_from_reaps(&act.reaps, now);
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

    async fn observe(
        &mut self,
        config: &Config,
        config_version: u64,
        now: DateTime<Utc>,
    ) -> Snapshot {
        let mut snapshot = Snapshot::default();
        for repo in config.repos.values() {
            if let Some(forge) = self.services.forge(&repo.mode) {
                let url = forge.registrar.repo_url(repo);
                snapshot
                    .repo_urls
                    .insert(url.trim_end_matches('/').to_string(), repo.repo.clone());
            }
        }
        self.discover_parents(now, &mut snapshot).await;
        let parents: BTreeSet<String> = config
            .parents()
            .into_iter()
            .chain(self.memory.lingering_parents.iter().cloned())
            .collect();

        let children = self.services.children.clone();
        // Boxed so the tick's future stays `Send` (closures returning async blocks inside
        // stream adapters trip rustc's higher-ranked lifetime inference otherwise).
        type Listing = (String, Result<Vec<crate::observe::Child>, PortError>);
        let listings: Vec<futures::future::BoxFuture<'static, Listing>> = parents
            .into_iter()
            .map(|parent| {
                let children = children.clone();
                let listing: futures::future::BoxFuture<'static, Listing> = Box::pin(async move {
                    let result = children.list_children(&parent).await;
                    (parent, result)
                });
                listing
            })
            .collect();
        let listings = futures::stream::iter(listings)
            .buffer_unordered(self.settings.list_concurrency_max)
            .collect::<Vec<_>>();

        for forge in [&self.services.github, &self.services.forgejo]
            .into_iter()
            .flatten()
        {
            let served: Vec<&crate::config::RepoConfig> = config
                .repos
                .values()
                .filter(|r| {
                    self.services
                        .forge(&r.mode)
                        .is_some_and(|f| Arc::ptr_eq(&f.queue, &forge.queue))
                })
                .collect();
            forge.queue.serving(&served);
        }
        // Repos whose queue is backing off are not asked this tick, nor are those that the
        // poll schedule does not find due: they keep their last reading.
        let mut to_ask = Vec::new();
        let intervals = self.poll_intervals();
        self.memory.polls.begin_tick(now, intervals);
        let mut stretched = BTreeMap::new();
        let mut first_reads_left = polls::first_reads_per_tick(config.repos.len(), intervals);
        let mut due = Vec::new();
        for repo in config.repos.values() {
            let scope = Scope::Queue(repo.repo.clone());
            // A budget running low stretches the intervals of every repo that shares it.
            let budget = self
                .services
                .forge(&repo.mode)
                .and_then(|f| f.queue.budget(repo));
            let stretch = budget
                .as_ref()
                .map_or(1.0, |b| polls::budget_stretch(b, now));
            if let Some(budget) = budget.filter(|_| stretch > 1.0) {
                stretched.insert(budget.owner.clone(), (budget, stretch));
            }
            let carried = self
                .memory
                .polls
                .next_read_at(&repo.repo, now, intervals, stretch)
                .and_then(|_| self.memory.polls.read_at(&repo.repo))
                .zip(self.memory.readings.get(&repo.repo));
            if let Some((read_at, reading)) = carried {
                snapshot
                    .repos
                    .insert(repo.repo.clone(), Ok(reading.clone()));
                snapshot.unpolled.insert(repo.repo.clone(), read_at);
                continue;
            }
            if self.memory.polls.first_read_pending(&repo.repo) {
                if first_reads_left == 0 {
                    snapshot.repos.insert(
                        repo.repo.clone(),
                        Err(Gap {
                            class: ErrorClass::RateLimited,
                            message: format!(
                                "not read yet: first reads are spread over the idle poll interval ({})",
                                humantime::format_duration(intervals.idle)
                            ),
                        }),
                    );
                    continue;
                }
                first_reads_left -= 1;
            }
            match self.memory.failures.get(&scope) {
                Some(f) if f.retry_at > now => {
                    snapshot.repos.insert(
                        repo.repo.clone(),
                        Err(Gap {
                            class: f.class,
                            message: format!("{} (next attempt at {})", f.message, f.retry_at),
                        }),
                    );
                }
                _ => match self.services.forge(&repo.mode) {
                    Some(forge) => {
                        due.push(polls::DueRead {
                            urgent: self.memory.polls.urgent(&repo.repo, now),
                            read_at: self.memory.polls.read_at(&repo.repo),
                            points: forge.queue.read_points(repo),
                        });
                        to_ask.push((repo.clone(), forge.queue.clone()));
                    }
                    None => {
                        snapshot.repos.insert(
                            repo.repo.clone(),
                            Err(Gap {
                                class: ErrorClass::Configuration,
                                message: format!("no {} client is configured", repo.mode.as_str()),
                            }),
                        );
                    }
                },
            }
        }
        self.report_stretched(stretched);
        // Idle reads past their owner's points for the minute keep their turn for a later tick.
        let (_, waiting) = polls::within_read_points(&due);
        for i in waiting.iter().rev() {
            let (repo, _) = to_ask.remove(*i);
            let carried = self
                .memory
                .polls
                .read_at(&repo.repo)
                .zip(self.memory.readings.get(&repo.repo));
            match carried {
                Some((read_at, reading)) => {
                    snapshot
                        .repos
                        .insert(repo.repo.clone(), Ok(reading.clone()));
                    snapshot.unpolled.insert(repo.repo.clone(), read_at);
                }
                None => {
                    snapshot.repos.insert(
                        repo.repo.clone(),
                        Err(Gap {
                            class: ErrorClass::RateLimited,
                            message: "not read yet: GitHub's per-minute request points are spent on busier repos this minute".into(),
                        }),
                    );
                }
            }
        }
        if !waiting.is_empty() {
            debug!(
                repos = waiting.len(),
                "idle reads wait for the next minute's request points"
            );
        }
        let queues = read_each_repo(
            to_ask,
            self.settings.list_concurrency_max,
            |repo, queue: Arc<dyn QueueSource>| {
                Box::pin(async move { queue.list_jobs(&repo).await })
            },
        );

        let (listings, queues) = futures::join!(listings, queues);

        self.memory.lingering_parents.clear();
        let mut listed = BTreeSet::new();
        for (parent, result) in listings {
            match result {
                Ok(mut children) => {
                    for child in children.iter_mut().filter(|c| c.ours) {
                        listed.insert(child.id.clone());
                        if child.placement.is_placed() {
                            child.placed_at = Some(
                                *self
                                    .memory
                                    .placed_seen
                                    .entry(child.id.clone())
                                    .or_insert(now),
                            );
                        } else {
                            child.placed_at = self.memory.placed_seen.get(&child.id).copied();
                        }
                    }
                    if children.iter().any(|c| c.ours) {
                        self.memory.lingering_parents.insert(parent.clone());
                    }
                    snapshot.parents.insert(parent, Ok(children));
                }
                Err(e) => {
                    warn!(parent = %parent, class = e.class.as_str(), "list children of {parent}: {}", e.message);
                    self.memory.lingering_parents.insert(parent.clone());
                    snapshot.parents.insert(parent, Err(e.into()));
                }
            }
        }

        if snapshot.parents.values().all(Result::is_ok) {
            self.memory.placed_seen.retain(|id, _| listed.contains(id));
        }
        let mut seen: BTreeSet<(RepoName, u64)> = BTreeSet::new();
        let mut listed_repos = BTreeSet::new();
        for (repo, result) in queues {
            match result {
                Ok(mut jobs) => {
                    self.succeeded(&Scope::Queue(repo.clone()));
                    listed_repos.insert(repo.clone());
                    self.fill_first_sightings(&repo, &mut jobs, now, &mut seen);
                    self.memory.polls.read(&repo, now, !jobs.jobs.is_empty());
                    self.memory.readings.insert(repo.clone(), jobs.clone());
                    if jobs.truncated {
                        warn!(repo = %repo, "run listing reached GitHub's 1,000-result search cap: queued demand may be larger than seen");
                    }
                    snapshot.repos.insert(repo, Ok(jobs));
                }
                Err(e) => {
                    let e = e.context(format!("list jobs for {repo}"));
                    self.failed(Scope::Queue(repo.clone()), &e, config_version, now);
                    snapshot.repos.insert(repo, Err(e.into()));
                }
            }
        }
        // A repo with children of ours in flight is busy, whatever its last reading said.
        let with_children: BTreeSet<RepoName> =
            snapshot.our_children().filter_map(|c| c.repo).collect();
        for repo in &with_children {
            self.memory.polls.children_in_flight(repo);
        }
        let configured: BTreeSet<&RepoName> = config.repos.keys().collect();
        self.memory.polls.retain(&configured);
        self.memory
            .readings
            .retain(|repo, _| configured.contains(repo));
        // Forget sightings of jobs that are gone from repos that were read.
        self.memory
            .first_seen
            .retain(|key, _| !listed_repos.contains(&key.0) || seen.contains(key));
        self.memory.reported_unroutable.retain(|(repo, id)| {
            !listed_repos.contains(repo) || seen.contains(&(repo.clone(), *id))
        });
        snapshot
    }

    /// Finds every parent with children of ours from Nomad alone, on the first tick and then
    /// every `discovery_interval`: after a restart or an edit of the document, children of a
    /// parent the document no longer names still count against their repo's cap and
    /// `--max-in-flight`, and are purged when dead. Until it has succeeded once, nothing is
    /// dispatched (the counts could be short).
    async fn discover_parents(&mut self, now: DateTime<Utc>, snapshot: &mut Snapshot) {
        let due = self.memory.discovered_at.is_none_or(|at| {
            (now - at).to_std().unwrap_or_default() >= self.settings.discovery_interval
        });
        if !due {
            return;
        }
        match self.services.children.parents_with_our_children().await {
            Ok(parents) => {
                for parent in parents {
                    if self.memory.lingering_parents.insert(parent.clone()) {
                        debug!(parent = %parent, "found a parent with children of ours");
                    }
                }
                self.memory.discovered_at = Some(now);
            }
            Err(e) => {
                warn!(class = e.class.as_str(), "{}", e.message);
                if self.memory.discovered_at.is_none() {
                    snapshot.undiscovered = Some(e.into());
                }
            }
        }
    }

    fn fill_first_sightings(
        &mut self,
        repo: &RepoName,
        jobs: &mut RepoJobs,
        now: DateTime<Utc>,
        seen: &mut BTreeSet<(RepoName, u64)>,
    ) {
        for job in &mut jobs.jobs {
            let key = (repo.clone(), job.id);
            seen.insert(key.clone());
            if job.queued_at.is_none() {
                job.queued_at = Some(*self.memory.first_seen.entry(key).or_insert(now));
            }
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

    /// Reads each parent whose dispatch is held for a configuration error, once per tick, and
    /// ends the hold of those that now read right (see `control_loop/held_parents.rs`).
    async fn recheck_held_parents(&mut self, config: &Config, now: DateTime<Utc>) {
        let held: Vec<(String, RepoName)> = self
            .memory
            .failures
            .iter()
            .filter(|(_, f)| {
                f.retry_at > now
                    && matches!(f.class, ErrorClass::Configuration | ErrorClass::NotFound)
            })
            .filter_map(|(scope, _)| match scope {
                Scope::Dispatch(parent, repo) => Some((parent.clone(), repo.clone())),
                _ => None,
            })
            .collect();
        // One read per parent and namespace, however many repos wait on it.
        let mut readings: BTreeMap<(Option<String>, String), Option<crate::observe::ParentJob>> =
            BTreeMap::new();
        for (parent, repo) in held {
            let Some(repo_config) = config.repos.get(&repo) else {
                continue;
            };
            let namespace = repo_config.nomad_namespace.clone();
            let key = (namespace.clone(), parent.clone());
            if !readings.contains_key(&key) {
                let read = self
                    .services
                    .children
                    .read_parent(&parent, namespace.as_deref())
                    .await;
                if let Err(e) = &read {
                    debug!("re-check of a held dispatch: {e}");
                }
                readings.insert(key.clone(), read.ok());
            }
            let Some(reading) = &readings[&key] else {
                continue;
            };
            let problems = crate::observe::parent_problems(repo_config, &parent, reading);
            let retried_on = self.memory.held_parents.retried_on(&parent, &repo);
            if held_parents::recheck(reading, &problems, retried_on) == held_parents::Recheck::Retry
            {
                info!(
                    repo = %repo,
                    parent = %parent,
                    "parent job {parent} now reads right for {repo}: its held dispatch goes again"
                );
                self.memory
                    .failures
                    .remove(&Scope::Dispatch(parent.clone(), repo.clone()));
                self.memory
                    .held_parents
                    .retrying(&parent, &repo, reading.clone());
            }
        }
    }

    fn succeeded(&mut self, scope: &Scope) {
        if let Scope::Dispatch(parent, repo) = scope {
            self.memory.held_parents.dispatched(parent, repo);
        }
        if let Some(f) = self.memory.failures.remove(scope) {
            debug!("{scope} recovered after {} failure(s)", f.consecutive);
        }
    }

    /// Records a failure and decides when the scope is next tried: transient errors back off
    /// exponentially from the next tick, rate limits wait as asked, terminal errors are
    /// reported once per config version and retried slowly.
    fn failed(&mut self, scope: Scope, error: &PortError, config_version: u64, now: DateTime<Utc>) {
        let previous = self.memory.failures.remove(&scope);
        let consecutive = previous.as_ref().map_or(1, |f| f.consecutive + 1);
        let poll = self.settings.poll_interval;
        let (delay, terminal) = match error.class {
            ErrorClass::Transient | ErrorClass::Malformed => {
                // The first failure is retried at the next tick; then 1, 2, 4… polls.
                let doublings = consecutive.saturating_sub(2).min(16);
                let base = if consecutive < 2 {
                    Duration::ZERO
                } else {
                    poll.saturating_mul(1 << doublings)
                };
                let capped = base.min(self.settings.transient_backoff_max);
                // Up to a quarter of jitter keeps repos that failed together from retrying
                // together.
                let jitter_ms = (capped.as_millis() as u64 / 4).max(1);
                (
                    capped + Duration::from_millis(self.rng.next_u64() % jitter_ms),
                    false,
                )
            }
            ErrorClass::RateLimited => (
                Duration::from_secs(error.retry_after_s.unwrap_or(60).min(RATE_LIMIT_WAIT_MAX_S)),
                false,
            ),
            ErrorClass::Unauthorized
            | ErrorClass::Forbidden
            | ErrorClass::NotFound
            | ErrorClass::Configuration => (self.settings.terminal_retry, true),
        };
        let mut reported_for = previous.as_ref().and_then(|f| f.reported_for);
        if terminal {
            let same_kind = previous.as_ref().is_some_and(|f| f.class == error.class);
            if !(same_kind && reported_for == Some(config_version)) {
                error!(
                    class = error.class.as_str(),
                    "{}; retrying in {}",
                    error.message,
                    humantime::format_duration(delay)
                );
                reported_for = Some(config_version);
            } else {
                debug!(class = error.class.as_str(), "{}", error.message);
            }
        } else {
            warn!(
                class = error.class.as_str(),
                attempt = consecutive,
                "{}",
                error.message
            );
        }
        let retry_at = crate::clock::after(now, delay);
        self.memory.failures.insert(
            scope,
            Failure {
                class: error.class,
                message: error.message.clone(),
                consecutive,
                retry_at,
                reported_for,
            },
        );
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

/// How the runners of children that just ended with a failed allocation exited: one
/// allocation listing per such child, only in the tick it turned dead. A code that cannot be
/// read leaves the end judged as before: a failed start.
async fn read_exit_codes(
    children: Arc<dyn ChildSource>,
    ended: Vec<ChildId>,
) -> BTreeMap<ChildId, i32> {
    let mut codes = BTreeMap::new();
    for child in ended {
        match children.runner_exit_code(&child).await {
            Ok(Some(code)) => {
                codes.insert(child, code);
            }
            Ok(None) => {}
            Err(e) => debug!("{e}"),
        }
    }
    codes
}

/// The repos of the next due webhook hint; never completes without hints.
async fn next_hinted(
    hints: Option<&crate::webhook::Hints>,
    clock: &dyn crate::clock::Clock,
) -> Vec<RepoName> {
    match hints {
        Some(hints) => hints.next_hinted(clock).await,
        None => std::future::pending().await,
    }
}

/// Runs ticks until `shutdown` completes: a tick at start, then one every poll interval. A
/// shutdown lets the tick in progress finish and starts no new one. Without a valid
/// document it dispatches nothing and says why once per change of reason. With `dry_run`
/// (shadow mode) every tick plans and reports and writes nothing.
///
/// With webhook hints ([`Controller::with_hints`]), the seam is here and only here: the
/// hints follow each document applied (so the receiver refuses repos it does not name, and
/// every hint once the loop stops), a due hint wakes the wait between ticks, and every tick,
/// hinted or not, counts as the hint-poll of whatever is due by then. A hinted tick is a
/// full tick for now; polling only the hinted repos comes with adaptive polling.
pub async fn run(
    mut controller: Controller,
    mut config: tokio::sync::watch::Receiver<ConfigState>,
    clock: &dyn crate::clock::Clock,
    dry_run: bool,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut interval = tokio::time::interval(controller.settings.poll_interval);
    // A tick that overran is not followed by a burst of catch-up ticks.
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut applied: Option<u64> = None;
    let mut last_idle_reason: Option<String> = None;
    let metrics = controller.settings.metrics.clone();
    metrics.set_poll_interval(controller.settings.poll_interval);
    // Until the leader lock exists, the copy that runs ticks is the leader.
    metrics.set_leader(true);
    let hints = controller.hints.clone();
    loop {
        // Without a document, a change of the watcher's state is worth a tick at once: the
        // first read lands moments after start, and waiting a whole poll interval for it
        // would delay the first dispatch for nothing.
        let without_document = config.borrow().config.is_none();
        let mut hinted = Vec::new();
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            _ = interval.tick() => {}
            Ok(()) = config.changed(), if without_document => {}
            due = next_hinted(hints.as_ref(), clock) => {
                debug!(repos = ?due.iter().map(ToString::to_string).collect::<Vec<_>>(), "ticking now for webhook hints");
                hinted = due;
            }
        }
        if let Some(hints) = &hints {
            // Whatever woke the loop, this tick serves the hints due by now: their repos are
            // read in it, whatever their poll schedule says.
            hinted.extend(hints.take_due(clock.now()));
            let now = clock.now();
            for repo in &hinted {
                controller.hint(repo, now);
            }
        }
        let state = config.borrow_and_update().clone();
        metrics.set_config_valid(state.config.is_some());
        let Some(document) = state.config.clone() else {
            metrics.loop_turned(clock.now());
            // Before the watcher's first answer there is nothing to say yet.
            if state == ConfigState::default() {
                continue;
            }
            let why = state.problems().join("; ");
            if last_idle_reason.as_deref() != Some(why.as_str()) {
                warn!("dispatching nothing: {why}");
                last_idle_reason = Some(why);
            }
            continue;
        };
        last_idle_reason = None;
        let version = state.applied_index.unwrap_or(0);
        if applied != Some(version) {
            if applied.is_some() {
                controller.config_changed();
            }
            if let Some(hints) = &hints {
                hints.follow(&document);
            }
            applied = Some(version);
        }
        // The tick runs to its end even if shutdown is asked meanwhile. A panic inside it (a
        // bug met by some input) costs that tick, not the daemon: the next tick starts from
        // a fresh observation.
        let tick = controller.tick(&document, version, clock.now(), dry_run);
        match std::panic::AssertUnwindSafe(tick).catch_unwind().await {
            Ok(view) if dry_run => report::log_shadow_tick(&view),
            Ok(_) => {}
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                error!("tick aborted by a bug: {what}; the next tick starts afresh");
            }
        }
    }
    if let Some(hints) = &hints {
        hints.stop_following();
    }
}
