//! What the loop remembers and reads to take runners back: failed starts and the crash-loop
//! backoff of their buckets (BRIEF lesson 7), and the readings of nominated runners that
//! [`decide`] judges (lessons 2 and 3).
//!
//! Everything here is memory and I/O at the edge; the decisions themselves are the planner's
//! nominations and the pure [`decide`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::{debug, error, info, warn};

use crate::act::RunnerRegistry;
use crate::clock::after;
use crate::config::{Config, Mode};
use crate::model::{BucketKey, ChildId, LabelSet, RepoName, RunnerName};
use crate::observe::{ChildStatus, JobState, Placement, PortError, RunnerRegistration, Snapshot};
use crate::plan::reap::{
    Allocation, Judgement, Nomination, Outcome, RunnerApi, StaleRegistration, Verdict, decide,
};
use crate::plan::{CrashBackoff, Plan};

/// The first pause after a failed start; doubled for each further one in a row.
pub const CRASH_BACKOFF_FIRST: Duration = Duration::from_secs(30);
/// The longest pause: with one probe per pause, a bucket whose runners always die at boot
/// gets at most six dispatches in ten minutes (issue 10).
pub const CRASH_BACKOFF_MAX: Duration = Duration::from_secs(600);
/// Offline registrations of our runners are looked for this often per `app` repo even when
/// no runner is nominated (a runner killed with its allocation leaves one behind): once after
/// a start, then only where children of ours ran or registrations of ours were left.
pub const STALE_SWEEP_INTERVAL: Duration = Duration::from_secs(30 * 60);
/// Sweeps per tick at most, oldest first: after a start, a fleet of hundreds of repos is swept
/// over minutes instead of in one burst against GitHub's per-minute limit.
pub const SWEEPS_PER_TICK_MAX: usize = 8;

/// The pause before a bucket's next dispatch after `failed_starts` failed starts in a row.
pub fn crash_delay(failed_starts: u32) -> Duration {
    let doublings = failed_starts.saturating_sub(1).min(16);
    CRASH_BACKOFF_FIRST
        .saturating_mul(1 << doublings)
        .min(CRASH_BACKOFF_MAX)
}

/// What one reading of a nominated runner said, when it said something other than busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadingKind {
    Idle,
    Absent,
    Unknown,
}

/// A reading and since when the same reading has held.
#[derive(Clone, Copy, Debug)]
struct Reading {
    kind: ReadingKind,
    since: DateTime<Utc>,
}

/// The memory of taking runners back.
/// The runner contract's exit code (`nomad/runner/entrypoint.sh`) for a runner that left
/// without ever being assigned a job.
pub const RUNNER_EXIT_IDLE: i32 = 3;
/// ... and for one whose wrapped credential someone else had already unwrapped.
pub const RUNNER_EXIT_CREDENTIAL_USED: i32 = 4;

#[derive(Default)]
pub struct TakeBackMemory {
    /// Runners a job in progress has named: they took a job, so their end is no failed start.
    took_job: BTreeSet<RunnerName>,
    /// Dead children whose end was already judged.
    ends_judged: BTreeSet<ChildId>,
    /// Children the daemon stopped: however their runner ended, it was no failed start.
    stopped: BTreeSet<ChildId>,
    /// Forgejo jobs seen claimed (Forgejo names no runner; a new claim is a runner at work).
    claims_seen: BTreeSet<(RepoName, u64)>,
    /// Buckets backing off after failed starts.
    crash: BTreeMap<BucketKey, CrashBackoff>,
    /// Readings of nominated runners, by child; dropped when a child is no longer nominated,
    /// so an idle reading is confirmed only across consecutive nominations.
    readings: BTreeMap<ChildId, Reading>,
    /// When each `app` repo's registrations were last swept for stale ones.
    swept_at: BTreeMap<RepoName, DateTime<Utc>>,
    /// Repos where a sweep may find something: children of ours ran there since the last
    /// sweep, or it found registrations named like ours.
    sweep_again: BTreeSet<RepoName>,
    /// The registration id GitHub gave each JIT runner when the daemon minted its config: its
    /// registration is found by this id, whatever else is registered under its name.
    jit_ids: BTreeMap<RunnerName, u64>,
    /// Children whose runner's registration is gone, with a time by which it was: deleted by
    /// the daemon (taking it back), or read registered and then absent. No job comes to them;
    /// the planner stops them on the first fresh reading that shows none ran on them.
    deregistered: BTreeMap<ChildId, DateTime<Utc>>,
}

/// Every child of ours the snapshot shows, by runner name, with its bucket.
fn runners_of(
    snapshot: &Snapshot,
) -> BTreeMap<&RunnerName, (Option<BucketKey>, &crate::observe::Child)> {
    snapshot
        .our_children()
        .filter_map(|c| {
            let bucket = match (c.repo, c.labels) {
                (Some(repo), Some(labels)) => Some(BucketKey { repo, labels }),
                _ => None,
            };
            c.child
                .runner_name
                .as_ref()
                .map(|name| (name, (bucket, c.child)))
        })
        .collect()
}

impl TakeBackMemory {
    /// The crash-loop holds for the planner.
    pub fn crash_backoff(&self) -> &BTreeMap<BucketKey, CrashBackoff> {
        &self.crash
    }

    /// Takes over what an earlier term carried: its crash-loop backoff (where this term has
    /// none of its own for the bucket) and the children whose registration it had deleted.
    pub fn adopt(
        &mut self,
        crash: BTreeMap<BucketKey, CrashBackoff>,
        deregistered: BTreeMap<ChildId, DateTime<Utc>>,
    ) {
        for (bucket, backoff) in crash {
            self.crash.entry(bucket).or_insert(backoff);
        }
        for (child, by) in deregistered {
            self.deregistered.entry(child).or_insert(by);
        }
    }

    /// What this memory hands on to the next term (see `control_loop::carried`).
    pub fn carried(&self) -> super::carried::Carried {
        super::carried::Carried::of(&self.crash, &self.deregistered)
    }

    /// The children of `snapshot` whose registration is known gone, for the planner; the
    /// others are forgotten once every listing was read without them (stopped or purged).
    pub fn deregistered(&mut self, snapshot: &Snapshot) -> BTreeMap<ChildId, DateTime<Utc>> {
        if snapshot.parents.values().all(Result::is_ok) {
            let in_flight: BTreeSet<&ChildId> = snapshot
                .our_listed_children()
                .filter(|c| c.status.is_in_flight())
                .map(|c| &c.id)
                .collect();
            self.deregistered.retain(|id, _| in_flight.contains(id));
        }
        self.deregistered.clone()
    }

    /// Learns from what the tick observed: runners that took a job end their bucket's
    /// backoff; children that turned dead with a failed allocation, whose runner never took
    /// a job, are failed starts and back their bucket off.
    /// Dead children of ours whose allocation failed and whose end is not judged yet: how
    /// their runner exited tells a failed start from an idle exit or a stolen credential.
    pub fn ends_to_read(&self, snapshot: &Snapshot) -> Vec<ChildId> {
        snapshot
            .our_children()
            .map(|c| c.child)
            .filter(|c| {
                c.status == ChildStatus::Dead
                    && c.placement == Placement::Failed
                    && !self.ends_judged.contains(&c.id)
                    && !self.stopped.contains(&c.id)
            })
            .map(|c| c.id.clone())
            .collect()
    }

    /// Learns from the snapshot, with the runner exit codes read for [`Self::ends_to_read`].
    pub fn learn_from_snapshot(
        &mut self,
        snapshot: &Snapshot,
        exit_codes: &BTreeMap<ChildId, i32>,
        now: DateTime<Utc>,
    ) {
        let runners = runners_of(snapshot);
        // A JIT id is needed while its child is listed; once every listing was read and the
        // child is gone, so is the need.
        if snapshot.parents.values().all(Result::is_ok) {
            self.jit_ids.retain(|name, _| runners.contains_key(name));
        }
        // Failed starts first, then runners seen at work: both happened since the last
        // tick, in an order the listings do not tell, and a runner at work is the newer news
        // more often than not (it took a job after booting, the others crashed at boot).
        // A runner that exited cleanly on its own booted and registered: the image works,
        // even if the daemon never saw the job it took (its queue was unreadable meanwhile).
        let mut worked: Vec<(&BucketKey, Option<DateTime<Utc>>)> = Vec::new();
        for (name, (bucket, child)) in &runners {
            if child.status != ChildStatus::Dead || !self.ends_judged.insert(child.id.clone()) {
                continue;
            }
            let Some(bucket) = bucket else { continue };
            if self.stopped.contains(&child.id) {
                continue;
            }
            if child.placement == Placement::Finished || self.took_job.contains(*name) {
                // Each runner ends a streak once: when it is first seen taking a job, or at
                // its clean exit if that was never seen.
                if !self.took_job.contains(*name) {
                    worked.push((bucket, child.submitted_at));
                }
                continue;
            }
            if child.placement != Placement::Failed {
                continue;
            }
            match exit_codes.get(&child.id) {
                // The runner contract's idle exit: it booted and registered, and no job came.
                Some(&RUNNER_EXIT_IDLE) => {
                    debug!(child = %child.id, "the runner left idle: no failed start");
                    worked.push((bucket, child.submitted_at));
                    continue;
                }
                Some(&RUNNER_EXIT_CREDENTIAL_USED) => {
                    error!(
                        bucket = %bucket,
                        child = %child.id,
                        runner = %name,
                        "possible credential theft: the runner found its wrapped credential \
                         already unwrapped by someone else (exit 4); rotate what it guards and \
                         check who can read the runners' namespace"
                    );
                    continue;
                }
                _ => {}
            }
            let entry = self.crash.entry(bucket.clone()).or_insert(CrashBackoff {
                failed_starts: 0,
                next_dispatch_at: now,
                since: child.submitted_at.unwrap_or(now),
            });
            entry.failed_starts += 1;
            let delay = crash_delay(entry.failed_starts);
            entry.next_dispatch_at = entry.next_dispatch_at.max(after(now, delay));
            warn!(
                bucket = %bucket,
                child = %child.id,
                failed_starts = entry.failed_starts,
                "failed start: the runner exited with an error before taking a job; \
                 backing the bucket off for {} (one runner at a time until one takes a job)",
                humantime::format_duration(delay)
            );
        }
        let all_listed = snapshot.parents.values().all(Result::is_ok);
        let mut claimed_now = BTreeSet::new();
        for (repo, listing) in &snapshot.repos {
            let Ok(listing) = listing else {
                // Unread: its claims are neither new nor gone.
                claimed_now.extend(self.claims_seen.iter().filter(|(r, _)| r == repo).cloned());
                continue;
            };
            for job in &listing.jobs {
                match &job.state {
                    JobState::InProgress { runner: Some(name) } => {
                        // The first sighting only: a runner seen at work once ends its
                        // bucket's streak; seen again on later ticks, it says nothing new.
                        if let Some((Some(bucket), _)) = runners.get(name)
                            && bucket.repo == *repo
                            && self.took_job.insert(name.clone())
                            && let Some(backoff) = self.crash.remove(bucket)
                        {
                            info!(bucket = %bucket, failed_starts = backoff.failed_starts, "a runner took a job: crash-loop backoff over");
                        }
                    }
                    // Forgejo names no runner: a new claim is taken as one of our placed
                    // runners at work.
                    JobState::Claimed => {
                        // Without every listing of children the runner that took it may be
                        // missing: the claim stays new until it can be attributed.
                        if !all_listed {
                            continue;
                        }
                        claimed_now.insert((repo.clone(), job.id));
                        if !self.claims_seen.insert((repo.clone(), job.id)) {
                            continue;
                        }
                        let Ok(labels) = LabelSet::parse(&job.labels) else {
                            continue;
                        };
                        // Any placed runner of the repo whose labels cover the job's may be
                        // the one that took it: each such bucket's streak ends.
                        let candidates: Vec<(&RunnerName, &BucketKey)> = runners
                            .iter()
                            .filter(|(_, (_, child))| child.placement.is_placed())
                            .filter_map(|(name, (b, _))| b.as_ref().map(|b| (*name, b)))
                            .filter(|(_, b)| b.repo == *repo && labels.is_subset(&b.labels))
                            .collect();
                        // Their later clean exits say nothing new.
                        self.took_job
                            .extend(candidates.iter().map(|(name, _)| (*name).clone()));
                        let takers: BTreeSet<&BucketKey> =
                            candidates.into_iter().map(|(_, b)| b).collect();
                        for bucket in takers {
                            if let Some(backoff) = self.crash.remove(bucket) {
                                info!(bucket = %bucket, failed_starts = backoff.failed_starts, "a runner took a job: crash-loop backoff over");
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        if all_listed {
            self.claims_seen.retain(|claim| claimed_now.contains(claim));
        }
        for (bucket, submitted_at) in worked {
            // A child submitted before the streak began exited cleanly before it, as far as
            // anything tells: old news, not a sign the image works now.
            let older = |b: &CrashBackoff| submitted_at.is_some_and(|at| at <= b.since);
            if self.crash.get(bucket).is_some_and(older) {
                debug!(bucket = %bucket, "a runner submitted before the crash loop began exited cleanly: the backoff holds");
                continue;
            }
            if let Some(backoff) = self.crash.remove(bucket) {
                info!(bucket = %bucket, failed_starts = backoff.failed_starts, "a runner exited cleanly: crash-loop backoff over");
            }
        }
        // Forget what Nomad no longer lists (purged), but only where every listing was read.
        if snapshot.parents.values().all(Result::is_ok) {
            let listed: BTreeSet<&ChildId> =
                snapshot.our_listed_children().map(|c| &c.id).collect();
            self.ends_judged.retain(|id| listed.contains(id));
            self.stopped.retain(|id| listed.contains(id));
            self.took_job.retain(|name| runners.contains_key(name));
        }
    }

    /// A dispatch went out for a bucket that is backing off: the next one waits a full pause.
    pub fn probe_dispatched(&mut self, bucket: &BucketKey, now: DateTime<Utc>) {
        if let Some(backoff) = self.crash.get_mut(bucket) {
            backoff.next_dispatch_at = after(now, crash_delay(backoff.failed_starts));
        }
    }

    /// The `app` repos whose registrations this tick reads: those with a nominated runner
    /// whose allocation runs, and up to [`SWEEPS_PER_TICK_MAX`] due a sweep for stale
    /// registrations whose queue was read this tick (a repo GitHub refuses is not asked once
    /// more for a sweep), never swept first, then the longest unswept.
    pub fn repos_to_read(
        &mut self,
        config: &Config,
        snapshot: &Snapshot,
        plan: &Plan,
        now: DateTime<Utc>,
    ) -> BTreeSet<RepoName> {
        let mut repos: BTreeSet<RepoName> = plan
            .nominations
            .iter()
            .filter(|n| {
                n.api == RunnerApi::Registrations
                    && n.nomination != Nomination::Deregistered
                    && n.allocation == Allocation::Live
                    && n.age >= n.policy.orphan_grace
            })
            .filter_map(|n| n.repo.clone())
            .collect();
        self.sweep_again
            .extend(snapshot.our_children().filter_map(|c| c.repo));
        self.sweep_again.retain(|r| config.repos.contains_key(r));
        self.swept_at.retain(|r, _| config.repos.contains_key(r));
        let read = |repo: &RepoName| matches!(snapshot.repos.get(repo), Some(Ok(_)));
        let mut due: Vec<(Option<DateTime<Utc>>, &RepoName)> = config
            .repos
            .values()
            .filter(|r| matches!(r.mode, Mode::App) && read(&r.repo))
            .filter_map(|r| {
                let swept_at = self.swept_at.get(&r.repo).copied();
                let due = swept_at.is_none_or(|at| {
                    self.sweep_again.contains(&r.repo)
                        && (now - at).to_std().unwrap_or_default() >= STALE_SWEEP_INTERVAL
                });
                due.then_some((swept_at, &r.repo))
            })
            .collect();
        due.sort();
        repos.extend(
            due.into_iter()
                .take(SWEEPS_PER_TICK_MAX)
                .map(|(_, repo)| repo.clone()),
        );
        repos
    }

    /// Judges every nomination from the readings: a job in progress naming the runner, its
    /// registration and `busy` flag, and how long a reading has held.
    /// `read_by` is when the registration listings had all been answered: a registration
    /// read before and missing from them was gone by then.
    pub fn judge(
        &mut self,
        snapshot: &Snapshot,
        plan: &Plan,
        registrations: &BTreeMap<RepoName, Result<Vec<RunnerRegistration>, PortError>>,
        now: DateTime<Utc>,
        read_by: DateTime<Utc>,
    ) -> Vec<Judgement> {
        let mut busy_names: BTreeSet<(&RepoName, &RunnerName)> = BTreeSet::new();
        for (repo, listing) in &snapshot.repos {
            if let Ok(listing) = listing {
                for job in &listing.jobs {
                    if let JobState::InProgress { runner: Some(name) } = &job.state {
                        busy_names.insert((repo, name));
                    }
                }
            }
        }
        let mut judged = Vec::with_capacity(plan.nominations.len());
        let mut still_read = BTreeSet::new();
        for nominated in &plan.nominations {
            let child = &nominated.child;
            let mut runner_id = None;
            // A deregistered runner is judged on the jobs that name it: its registration is
            // gone, so nothing is asked of GitHub for it.
            let reading = if nominated.allocation == Allocation::None
                || nominated.api == RunnerApi::None
                || nominated.nomination == Nomination::Deregistered
                || nominated.age < nominated.policy.orphan_grace
            {
                None
            } else {
                let named_busy = match (&nominated.repo, &nominated.runner) {
                    (Some(repo), Some(name)) => busy_names.contains(&(repo, name)),
                    _ => false,
                };
                let listing = nominated.repo.as_ref().and_then(|r| registrations.get(r));
                match (named_busy, listing, &nominated.runner) {
                    (true, _, _) => Some(None),
                    (false, Some(Ok(registered)), Some(name)) => {
                        let jit_id = self.jit_ids.get(name);
                        let found = registered.iter().find(|r| match jit_id {
                            Some(id) => r.id == *id,
                            None => r.name == *name,
                        });
                        match found {
                            Some(r) if r.busy => Some(None),
                            Some(r) => {
                                runner_id = Some(r.id);
                                Some(Some(ReadingKind::Idle))
                            }
                            None => Some(Some(ReadingKind::Absent)),
                        }
                    }
                    _ => Some(Some(ReadingKind::Unknown)),
                }
            };
            let verdict = match reading {
                None => Verdict::NotAsked,
                Some(None) => Verdict::Busy,
                Some(Some(kind)) => {
                    still_read.insert(child.clone());
                    // Read registered, then absent: its registration was deleted (by an
                    // operator, or GitHub) by the time this listing was answered.
                    if kind == ReadingKind::Absent
                        && self
                            .readings
                            .get(child)
                            .is_some_and(|r| r.kind == ReadingKind::Idle)
                    {
                        info!(child = %child, runner = ?nominated.runner, "a registration read before is gone: its runner takes no job and is stopped once no job names it");
                        self.deregistered.entry(child.clone()).or_insert(read_by);
                    }
                    let since = match self.readings.get(child) {
                        Some(r) if r.kind == kind => r.since,
                        _ => {
                            self.readings
                                .insert(child.clone(), Reading { kind, since: now });
                            now
                        }
                    };
                    let held_for = (now - since).to_std().unwrap_or_default();
                    let confirmed = held_for >= nominated.policy.idle_confirm;
                    match kind {
                        ReadingKind::Idle => Verdict::Idle { confirmed },
                        ReadingKind::Absent => Verdict::Absent { confirmed },
                        ReadingKind::Unknown => Verdict::Unknown { held_for },
                    }
                }
            };
            let decision = decide(&crate::plan::reap::ReapInput {
                nomination: nominated.nomination,
                api: nominated.api,
                allocation: nominated.allocation,
                verdict,
                age: nominated.age,
                running_for: nominated.running_for,
                policy: nominated.policy,
            });
            judged.push(Judgement {
                nominated: nominated.clone(),
                verdict,
                runner_id,
                decision,
            });
        }
        self.readings.retain(|child, _| still_read.contains(child));
        judged
    }

    /// Offline registrations named like our runners whose runner no child of ours runs.
    /// Only where every listing of children was read: a runner of a child Nomad did not list
    /// this tick is not stale.
    pub fn stale_registrations(
        &mut self,
        config: &Config,
        snapshot: &Snapshot,
        registrations: &BTreeMap<RepoName, Result<Vec<RunnerRegistration>, PortError>>,
        now: DateTime<Utc>,
    ) -> Vec<StaleRegistration> {
        if snapshot.undiscovered.is_some() || snapshot.parents.values().any(Result::is_err) {
            return Vec::new();
        }
        let ours: BTreeSet<&RunnerName> = snapshot
            .our_listed_children()
            .filter_map(|c| c.runner_name.as_ref())
            .collect();
        let mut stale = Vec::new();
        for (repo, listing) in registrations {
            let Ok(registered) = listing else { continue };
            self.swept_at.insert(repo.clone(), now);
            let Some(config) = config.repos.get(repo) else {
                continue;
            };
            let stems: Vec<String> = config.parents().iter().map(|p| runner_stem(p)).collect();
            let named_like_ours =
                |r: &RunnerRegistration| stems.iter().any(|stem| is_runner_of(&r.name, stem));
            if registered.iter().any(named_like_ours) {
                self.sweep_again.insert(repo.clone());
            } else {
                self.sweep_again.remove(repo);
            }
            for r in registered {
                if r.online || r.busy || ours.contains(&r.name) {
                    continue;
                }
                if named_like_ours(r) {
                    stale.push(StaleRegistration {
                        repo: repo.clone(),
                        runner_id: r.id,
                        name: r.name.clone(),
                    });
                }
            }
        }
        stale
    }

    /// The runners that the children about to be purged registered on a Forgejo (ephemeral
    /// runners, one per dispatch): deleted by the act step once each child is confirmed gone.
    /// Only ids learnt at dispatch: after a restart the daemon does not know them.
    pub fn registered_of_purges(
        &self,
        config: &Config,
        snapshot: &Snapshot,
        plan: &Plan,
    ) -> BTreeMap<ChildId, StaleRegistration> {
        let purged: BTreeSet<&ChildId> = plan.purges.iter().collect();
        snapshot
            .our_children()
            .filter(|c| purged.contains(&c.child.id))
            .filter_map(|c| {
                let repo = c.repo?;
                let forgejo = config
                    .repos
                    .get(&repo)
                    .is_some_and(|r| matches!(r.mode, Mode::Forgejo { .. }));
                let name = c.child.runner_name.as_ref().filter(|_| forgejo)?;
                let runner_id = *self.jit_ids.get(name)?;
                Some((
                    c.child.id.clone(),
                    StaleRegistration {
                        repo,
                        runner_id,
                        name: name.clone(),
                    },
                ))
            })
            .collect()
    }

    /// What the dispatches left behind: the registration ids of the runners dispatched with
    /// a credential bound to one runner (GitHub JIT configs, Forgejo ephemeral runners), and
    /// the repos where a minted credential may have registered a runner no child will run
    /// (the wrap or the dispatch failed after the mint): their next stale sweep is due like
    /// that of a repo where runners of ours ran, or every retry would leave one behind.
    pub fn learn_from_dispatches(&mut self, dispatches: &[crate::act::execute::DispatchOutcome]) {
        use crate::act::execute::DispatchOutcome;
        for d in dispatches {
            match d {
                DispatchOutcome::Dispatched {
                    runner_name,
                    runner_id: Some(id),
                    ..
                } => {
                    self.jit_ids.insert(runner_name.clone(), *id);
                }
                DispatchOutcome::MintFailed { bucket, .. }
                | DispatchOutcome::DispatchFailed { bucket, .. } => {
                    self.sweep_again.insert(bucket.repo.clone());
                }
                DispatchOutcome::Dispatched { .. } | DispatchOutcome::Skipped { .. } => {}
            }
        }
    }

    /// What the act step learnt of the runners it tried to take back: a refusal as busy (422)
    /// ends the reading, an unexplained 404 makes it unknown, a stop ends it, and a deleted
    /// registration starts an absent one.
    /// `acted_by` is when the act step had finished: every delete it made had landed by then.
    pub fn learn_from_reaps(
        &mut self,
        reaps: &[crate::act::execute::ReapOutcome],
        now: DateTime<Utc>,
        acted_by: DateTime<Utc>,
    ) {
        use crate::act::execute::ReapOutcome;
        for reap in reaps {
            match reap {
                ReapOutcome::Stopped { child, .. } => {
                    self.readings.remove(child);
                    self.stopped.insert(child.clone());
                }
                // Its registration is gone from now on: the absence it is stopped on counts
                // from the delete, and however its runner ends, it was taken back.
                ReapOutcome::Deregistered { child, .. } => {
                    self.deregistered.insert(child.clone(), acted_by);
                    self.readings.insert(
                        child.clone(),
                        Reading {
                            kind: ReadingKind::Absent,
                            since: now,
                        },
                    );
                    self.stopped.insert(child.clone());
                }
                ReapOutcome::Kept {
                    child,
                    outcome: Outcome::Vetoed,
                    ..
                } => {
                    self.readings.remove(child);
                }
                ReapOutcome::Kept { child, .. } => {
                    self.readings.insert(
                        child.clone(),
                        Reading {
                            kind: ReadingKind::Unknown,
                            since: now,
                        },
                    );
                }
                ReapOutcome::Failed { .. } => {}
            }
        }
    }
}

/// The stem every runner name of `parent` starts with ([`RunnerName::for_parent`]).
fn runner_stem(parent: &str) -> String {
    let sample = RunnerName::for_parent(parent, "000000000000").0;
    sample[..sample.len() - "000000000000".len()].to_string()
}

/// True when `name` is `<stem><12 lower-case hex>`: a name the daemon chose for `stem`'s parent.
fn is_runner_of(name: &RunnerName, stem: &str) -> bool {
    name.0.strip_prefix(stem).is_some_and(|suffix| {
        suffix.len() == 12
            && suffix
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    })
}

/// Reads the registrations of each repo through its registry, one listing per repo.
pub async fn read_registrations(
    to_read: Vec<(
        crate::config::RepoConfig,
        std::sync::Arc<dyn RunnerRegistry>,
    )>,
    concurrency: usize,
) -> BTreeMap<RepoName, Result<Vec<RunnerRegistration>, PortError>> {
    let listings = super::read_each_repo(
        to_read,
        concurrency,
        |repo, registry: std::sync::Arc<dyn RunnerRegistry>| {
            Box::pin(async move { registry.list_runners(&repo).await })
        },
    )
    .await;
    let mut out = BTreeMap::new();
    for (repo, listing) in listings {
        if let Err(e) = &listing {
            warn!(repo = %repo, class = e.class.as_str(), "{}", e.message);
        }
        out.insert(repo, listing);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_backoff_doubles_from_thirty_seconds_to_ten_minutes() {
        let delays: Vec<u64> = (1..=8).map(|n| crash_delay(n).as_secs()).collect();
        assert_eq!(delays, [30, 60, 120, 240, 480, 600, 600, 600]);
        assert_eq!(crash_delay(u32::MAX), CRASH_BACKOFF_MAX);
    }

    /// A new term sees every dead child Nomad still lists at once (a `vault` repo's are left
    /// to Nomad's GC): the clean exit of a runner that took a job before the crash loop began
    /// must not end the backoff it carried over, while one submitted since does.
    #[test]
    fn a_clean_exit_older_than_the_crash_loop_does_not_end_its_backoff() {
        use crate::observe::{Child, Placement, Snapshot};
        let t0 = DateTime::<Utc>::from_timestamp(1_736_150_400, 0).unwrap();
        let repo = RepoName::parse("acme/api").unwrap();
        let labels = LabelSet::parse(&["self-hosted".to_string()]).unwrap();
        let bucket = BucketKey {
            repo: repo.clone(),
            labels: labels.clone(),
        };
        let exited_cleanly = |n: u32, submitted: DateTime<Utc>| Child {
            id: ChildId::new(format!("ci-runner/dispatch-{n}"), "default"),
            parent: "ci-runner".into(),
            status: ChildStatus::Dead,
            placement: Placement::Finished,
            ours: true,
            repo_url: Some("https://github.com/acme/api".into()),
            labels: Some(labels.to_meta()),
            runner_name: Some(RunnerName(format!("ci-runner-{n:012x}"))),
            submitted_at: Some(submitted),
            placed_at: None,
        };
        let snapshot_of = |children: Vec<Child>| {
            let mut snapshot = Snapshot::default();
            snapshot
                .repo_urls
                .insert("https://github.com/acme/api".into(), repo.clone());
            snapshot.parents.insert("ci-runner".into(), Ok(children));
            snapshot
        };
        let carried = || {
            BTreeMap::from([(
                bucket.clone(),
                CrashBackoff {
                    failed_starts: 3,
                    next_dispatch_at: t0 + chrono::Duration::minutes(10),
                    since: t0 + chrono::Duration::minutes(1),
                },
            )])
        };
        let now = t0 + chrono::Duration::minutes(8);

        let mut memory = TakeBackMemory::default();
        memory.adopt(carried(), BTreeMap::new());
        memory.learn_from_snapshot(
            &snapshot_of(vec![exited_cleanly(1, t0)]),
            &BTreeMap::new(),
            now,
        );
        assert_eq!(
            memory.crash_backoff().get(&bucket).map(|b| b.failed_starts),
            Some(3),
            "ended by a clean exit from before the crash loop"
        );

        let mut memory = TakeBackMemory::default();
        memory.adopt(carried(), BTreeMap::new());
        let since = t0 + chrono::Duration::minutes(5);
        memory.learn_from_snapshot(
            &snapshot_of(vec![exited_cleanly(2, since)]),
            &BTreeMap::new(),
            now,
        );
        assert!(
            memory.crash_backoff().is_empty(),
            "a runner submitted since worked"
        );
    }

    #[test]
    fn only_names_the_daemon_chose_for_a_parent_are_its_runners() {
        let stem = runner_stem("ci-runner");
        assert_eq!(stem, "ci-runner-");
        assert!(is_runner_of(
            &RunnerName("ci-runner-3f9c2a1b7d04".into()),
            &stem
        ));
        for other in [
            "ci-runner-3f9c2a1b7d0",
            "ci-runner-3f9c2a1b7d04x",
            "ci-runner-3F9C2A1B7D04",
            "ci-runner-gpu-3f9c2a1b7d04",
            "my-laptop",
        ] {
            assert!(!is_runner_of(&RunnerName(other.into()), &stem), "{other}");
        }
    }
}
