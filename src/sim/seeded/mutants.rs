//! Deliberately broken daemons, one per guard, each named with the invariant expected to
//! catch it: the world proves it can fail. A mutant breaks one layer through a seam outside
//! the product's decisions (a planner plugged in, or a port of the world's that lies the way
//! the broken code would have read it); the product itself has no test switch.
//! `runner-scaler simulate --mutants` hunts each through the seeds of its scenario and prints
//! the first seed that caught it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

use super::{RunSettings, Scenario, run_seed_with};
use crate::config::RepoConfig;
use crate::leader::{LockError, LockKey, LockStore, SessionId, SessionRequest};
use crate::model::ChildId;
use crate::model::RepoName;
use crate::observe::{
    BudgetReading, Child, ChildSource, ChildStatus, JobState, ParentJob, Placement, PortError,
    QueueSource, ReadPoints, RepoJobs,
};
use crate::plan::{Plan, PlanInput, plan};

/// A broken daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mutant {
    /// The holder never notices its lock key deleted or rewritten under it (it watches only
    /// its session's validity, as the leader did before issue 19).
    LockKeyNotWatched,
    /// Children Nomad could not place yet are not counted (BRIEF lesson 5), so every tick
    /// dispatches again while the cluster is full.
    UnplacedNotCounted,
    /// Never dispatches.
    NeverDispatches,
    /// Dispatches every runner it sends twice.
    Overdispatches,
    /// A runner whose registration the daemon deleted still counts as supply until its
    /// absence is confirmed (issue 19, defect 1): it holds its bucket's demand although no
    /// job can come to it.
    DeregisteredCounted,
    /// A new term (a restart, a new leader) starts without its predecessor's crash-loop
    /// backoff (issue 19, defect 5): it reads nothing from the state key.
    BackoffForgottenAtRestart,
    /// Plans each tick on the previous tick's listing of children instead of a fresh one:
    /// what it dispatched since is not counted, so it dispatches again.
    DispatchesOnStaleListing,
    /// Reads a Forgejo job a runner has taken (it has a `task_id`) as still waiting, so every
    /// such job is demand again.
    ForgejoTaskCountedWaiting,
    /// A stopped child frees its slot as soon as its job reads `dead` (issue 19, defect 7),
    /// while its task still winds down inside `kill_timeout` and holds its allocation.
    StoppingFreesItsSlot,
}

impl Mutant {
    pub const ALL: [Mutant; 9] = [
        Mutant::LockKeyNotWatched,
        Mutant::UnplacedNotCounted,
        Mutant::NeverDispatches,
        Mutant::Overdispatches,
        Mutant::DeregisteredCounted,
        Mutant::BackoffForgottenAtRestart,
        Mutant::DispatchesOnStaleListing,
        Mutant::ForgejoTaskCountedWaiting,
        Mutant::StoppingFreesItsSlot,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mutant::LockKeyNotWatched => "lock-key-not-watched",
            Mutant::UnplacedNotCounted => "unplaced-not-counted",
            Mutant::NeverDispatches => "never-dispatches",
            Mutant::Overdispatches => "overdispatches",
            Mutant::DeregisteredCounted => "deregistered-counted",
            Mutant::BackoffForgottenAtRestart => "backoff-forgotten-at-restart",
            Mutant::DispatchesOnStaleListing => "dispatches-on-stale-listing",
            Mutant::ForgejoTaskCountedWaiting => "forgejo-task-counted-waiting",
            Mutant::StoppingFreesItsSlot => "stopping-frees-its-slot",
        }
    }

    /// The invariants expected to catch it (the first is the one it is named for).
    pub fn caught_by(self) -> &'static [&'static str] {
        match self {
            Mutant::LockKeyNotWatched => &["I8"],
            Mutant::UnplacedNotCounted => &["I3", "I7"],
            Mutant::NeverDispatches => &["I2"],
            Mutant::Overdispatches => &["I3", "I7"],
            Mutant::DeregisteredCounted => &["I2", "I4"],
            Mutant::BackoffForgottenAtRestart => &["I7"],
            Mutant::DispatchesOnStaleListing => &["I3", "I7"],
            Mutant::ForgejoTaskCountedWaiting => &["I7", "I3"],
            Mutant::StoppingFreesItsSlot => &["I3"],
        }
    }

    /// The scenario whose seeds it is hunted in.
    pub fn scenario(self) -> Scenario {
        match self {
            Mutant::LockKeyNotWatched => Scenario::Mixed,
            Mutant::UnplacedNotCounted => Scenario::ClusterFull,
            Mutant::NeverDispatches => Scenario::Steady,
            Mutant::Overdispatches => Scenario::Burst,
            Mutant::DeregisteredCounted => Scenario::TakeBacks,
            Mutant::BackoffForgottenAtRestart => Scenario::CrashLoop,
            Mutant::DispatchesOnStaleListing => Scenario::Burst,
            Mutant::ForgejoTaskCountedWaiting => Scenario::Steady,
            Mutant::StoppingFreesItsSlot => Scenario::TakeBacks,
        }
    }

    /// The run settings that plug it in.
    pub fn settings(self) -> RunSettings {
        let planner: Option<fn(PlanInput<'_>) -> Plan> = match self {
            Mutant::LockKeyNotWatched => None,
            Mutant::UnplacedNotCounted => Some(ignores_unplaced_children),
            Mutant::NeverDispatches => Some(never_dispatches),
            Mutant::Overdispatches => Some(one_extra_runner),
            Mutant::DeregisteredCounted => Some(counts_deregistered_runners),
            Mutant::StoppingFreesItsSlot => Some(frees_stopping_slots),
            Mutant::BackoffForgottenAtRestart => None,
            Mutant::DispatchesOnStaleListing | Mutant::ForgejoTaskCountedWaiting => None,
        };
        RunSettings {
            planner,
            mutant: Some(self),
            ..RunSettings::default()
        }
    }

    /// The daemon's state key, as this mutant sees it.
    pub fn carried_store(
        self,
        store: Arc<dyn crate::act::services::CarriedStore>,
    ) -> Arc<dyn crate::act::services::CarriedStore> {
        match self {
            Mutant::BackoffForgottenAtRestart => Arc::new(ReadsNothing(store)),
            _ => store,
        }
    }

    /// The daemon's listings of children, as this mutant reads them.
    pub fn child_source(self, source: Arc<dyn ChildSource>) -> Arc<dyn ChildSource> {
        match self {
            Mutant::DispatchesOnStaleListing => Arc::new(AnswersWithPreviousListing {
                inner: source,
                previous: Mutex::new(HashMap::new()),
            }),
            _ => source,
        }
    }

    /// The Forgejo queue, as this mutant reads it.
    pub fn forgejo_queue(self, queue: Arc<dyn QueueSource>) -> Arc<dyn QueueSource> {
        match self {
            Mutant::ForgejoTaskCountedWaiting => Arc::new(ClaimedReadAsQueued(queue)),
            _ => queue,
        }
    }

    /// The daemon's lock store, as this mutant sees it.
    pub fn lock_store(self, store: Arc<dyn LockStore>) -> Arc<dyn LockStore> {
        match self {
            Mutant::LockKeyNotWatched => Arc::new(BlindToKeyChanges {
                inner: store,
                held: Mutex::new(None),
            }),
            _ => store,
        }
    }
}

/// A planner that does not count children without an allocation.
pub fn ignores_unplaced_children(input: PlanInput<'_>) -> Plan {
    let mut snapshot = input.snapshot.clone();
    for children in snapshot.parents.values_mut().flatten() {
        children
            .retain(|c| !(c.status == ChildStatus::Pending && c.placement == Placement::Unplaced));
    }
    plan(PlanInput {
        snapshot: &snapshot,
        ..input
    })
}

/// A planner that does not know which registrations the daemon deleted: their runners count
/// as supply, and are stopped only on the absence confirmed over `--idle-confirm`.
pub fn counts_deregistered_runners(input: PlanInput<'_>) -> Plan {
    let mut snapshot = input.snapshot.clone();
    snapshot.deregistered.clear();
    plan(PlanInput {
        snapshot: &snapshot,
        ..input
    })
}

/// A planner that reads a stopped child as gone once its job is dead, whatever its
/// allocation still does.
pub fn frees_stopping_slots(input: PlanInput<'_>) -> Plan {
    let mut snapshot = input.snapshot.clone();
    for children in snapshot.parents.values_mut().flatten() {
        for child in children.iter_mut().filter(|c| c.is_stopping()) {
            child.placement = Placement::Finished;
        }
    }
    plan(PlanInput {
        snapshot: &snapshot,
        ..input
    })
}

pub fn never_dispatches(input: PlanInput<'_>) -> Plan {
    let mut plan = plan(input);
    plan.dispatches.clear();
    plan
}

/// Dispatches one runner more than missing for every runner it sends.
pub fn one_extra_runner(input: PlanInput<'_>) -> Plan {
    let mut plan = plan(input);
    let extra = plan.dispatches.clone();
    plan.dispatches.extend(extra);
    plan
}

/// A state key that always reads empty: every term starts from nothing.
struct ReadsNothing(Arc<dyn crate::act::services::CarriedStore>);

#[async_trait]
impl crate::act::services::CarriedStore for ReadsNothing {
    async fn load(&self) -> Result<Option<Vec<u8>>, crate::model::PortError> {
        Ok(None)
    }

    async fn save(&self, value: Vec<u8>) -> Result<(), crate::model::PortError> {
        self.0.save(value).await
    }
}

/// Answers each listing of a parent's children with the one before it (the first with
/// itself): a plan made on it misses every child dispatched since.
struct AnswersWithPreviousListing {
    inner: Arc<dyn ChildSource>,
    previous: Mutex<HashMap<String, Vec<Child>>>,
}

#[async_trait]
impl ChildSource for AnswersWithPreviousListing {
    async fn list_children(&self, parent: &str) -> Result<Vec<Child>, PortError> {
        let fresh = self.inner.list_children(parent).await?;
        let mut previous = self.previous.lock().unwrap_or_else(|p| p.into_inner());
        Ok(previous
            .insert(parent.to_string(), fresh.clone())
            .unwrap_or(fresh))
    }

    async fn parents_with_our_children(&self) -> Result<BTreeSet<String>, PortError> {
        self.inner.parents_with_our_children().await
    }

    async fn runner_exit_code(&self, child: &ChildId) -> Result<Option<i32>, PortError> {
        self.inner.runner_exit_code(child).await
    }

    async fn read_parent(
        &self,
        parent: &str,
        namespace: Option<&str>,
    ) -> Result<ParentJob, PortError> {
        self.inner.read_parent(parent, namespace).await
    }
}

/// A Forgejo queue whose claimed jobs read as waiting.
struct ClaimedReadAsQueued(Arc<dyn QueueSource>);

#[async_trait]
impl QueueSource for ClaimedReadAsQueued {
    async fn list_jobs(&self, repo: &RepoConfig) -> Result<RepoJobs, PortError> {
        let mut jobs = self.0.list_jobs(repo).await?;
        for job in &mut jobs.jobs {
            if job.state == JobState::Claimed {
                job.state = JobState::Queued;
            }
        }
        Ok(jobs)
    }

    fn budget(&self, repo: &RepoConfig) -> Option<BudgetReading> {
        self.0.budget(repo)
    }

    fn read_points(&self, repo: &RepoConfig) -> Option<ReadPoints> {
        self.0.read_points(repo)
    }

    fn serving(&self, repos: &[&RepoConfig]) {
        self.0.serving(repos)
    }

    fn hinted(&self, repo: &RepoName) {
        self.0.hinted(repo)
    }
}

/// Once this daemon acquired the key, every read of it names this daemon's session, whatever
/// the key says: the holder cannot see it deleted or rewritten.
struct BlindToKeyChanges {
    inner: Arc<dyn LockStore>,
    held: Mutex<Option<SessionId>>,
}

impl BlindToKeyChanges {
    fn held(&self) -> std::sync::MutexGuard<'_, Option<SessionId>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl LockStore for BlindToKeyChanges {
    async fn create_session(&self, request: &SessionRequest) -> Result<SessionId, LockError> {
        self.inner.create_session(request).await
    }

    async fn renew_session(&self, session: &SessionId) -> Result<(), LockError> {
        self.inner.renew_session(session).await
    }

    async fn destroy_session(&self, session: &SessionId) -> Result<(), LockError> {
        *self.held() = None;
        self.inner.destroy_session(session).await
    }

    async fn acquire(
        &self,
        key: &str,
        session: &SessionId,
        value: &[u8],
    ) -> Result<bool, LockError> {
        let acquired = self.inner.acquire(key, session, value).await?;
        if acquired {
            *self.held() = Some(session.clone());
        }
        Ok(acquired)
    }

    async fn release(
        &self,
        key: &str,
        session: &SessionId,
        value: &[u8],
    ) -> Result<bool, LockError> {
        *self.held() = None;
        self.inner.release(key, session, value).await
    }

    async fn read_key(&self, key: &str, index: u64, wait: Duration) -> Result<LockKey, LockError> {
        let mut read = self.inner.read_key(key, index, wait).await?;
        if let Some(held) = self.held().clone() {
            read.session = Some(held.0);
        }
        Ok(read)
    }
}

/// What hunting one mutant found.
#[derive(Clone, Debug, Serialize)]
pub struct Hunt {
    pub mutant: Mutant,
    pub scenario: Scenario,
    pub expected: &'static [&'static str],
    /// The first seed that caught it with an expected invariant, and that invariant; only a
    /// seed the unbroken daemon passes counts.
    pub caught: Option<(u64, &'static str)>,
    /// Seeds that caught it where the unbroken daemon failed too, and on what.
    pub unbroken_fails: Vec<(u64, &'static str)>,
    /// Seeds it met that failed on another invariant first, before it was caught.
    pub other_failures: Vec<(u64, &'static str)>,
    pub seeds_tried: u64,
}

/// Runs `mutant` on seeds 1..=`seeds` of its scenario until an expected invariant catches it,
/// `threads` seeds at a time.
pub fn hunt(mutant: Mutant, seeds: u64, threads: usize) -> Hunt {
    let mut found = Hunt {
        mutant,
        scenario: mutant.scenario(),
        expected: mutant.caught_by(),
        caught: None,
        unbroken_fails: Vec::new(),
        other_failures: Vec::new(),
        seeds_tried: 0,
    };
    let threads = threads.max(1) as u64;
    let mut next = 1;
    while next <= seeds && found.caught.is_none() {
        let batch: Vec<u64> = (next..=(next + threads - 1).min(seeds)).collect();
        next += batch.len() as u64;
        let outcomes: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = batch
                .iter()
                .map(|seed| {
                    let seed = *seed;
                    scope.spawn(move || run_seed_with(mutant.scenario(), seed, mutant.settings()))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a seed's thread panicked"))
                .collect()
        });
        for outcome in outcomes {
            found.seeds_tried += 1;
            let Some(v) = &outcome.violation else {
                continue;
            };
            if found.caught.is_none() && found.expected.contains(&v.invariant) {
                // A catch proves the guard only where the unbroken daemon holds.
                let unbroken =
                    run_seed_with(mutant.scenario(), outcome.seed, RunSettings::default());
                match unbroken.violation {
                    None => found.caught = Some((outcome.seed, v.invariant)),
                    Some(u) => found.unbroken_fails.push((outcome.seed, u.invariant)),
                }
            } else if found.caught.is_none() {
                found.other_failures.push((outcome.seed, v.invariant));
            }
        }
    }
    found
}

/// One line per mutant, then `N of N mutants caught`.
pub fn render(hunts: &[Hunt]) -> String {
    let mut out = String::new();
    for h in hunts {
        let line = match h.caught {
            Some((seed, invariant)) => format!(
                "mutant {}: caught by {invariant} at seed {seed} of {}, which the unbroken daemon passes ({} seed(s) run)",
                h.mutant.name(),
                h.scenario,
                h.seeds_tried
            ),
            None => format!(
                "mutant {}: NOT caught by {} in {} seed(s) of {}",
                h.mutant.name(),
                h.expected.join(" or "),
                h.seeds_tried,
                h.scenario
            ),
        };
        out.push_str(&line);
        if !h.other_failures.is_empty() {
            let others: Vec<String> = h
                .other_failures
                .iter()
                .map(|(seed, invariant)| format!("seed {seed}: {invariant}"))
                .collect();
            out.push_str(&format!(" [failed first elsewhere: {}]", others.join(", ")));
        }
        if !h.unbroken_fails.is_empty() {
            let both: Vec<String> = h
                .unbroken_fails
                .iter()
                .map(|(seed, invariant)| format!("seed {seed}: {invariant}"))
                .collect();
            out.push_str(&format!(
                " [the unbroken daemon fails too: {}]",
                both.join(", ")
            ));
        }
        out.push('\n');
    }
    let caught = hunts.iter().filter(|h| h.caught.is_some()).count();
    out.push_str(&format!("{caught} of {} mutants caught\n", hunts.len()));
    out
}
