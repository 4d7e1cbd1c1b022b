//! The invariants a run is judged by, checked from the world's truth after every step.
//!
//! - I1: no runner executing a job is destroyed (and no foreign child is touched): no stop or
//!   purge of a busy child, and no job killed by a registration delete outside the window no
//!   signal closes (sent after a daemon was served a sign of the job, or on a reading of the
//!   runner older than one round trip). Kills inside it are counted, not excused silently.
//! - I2: demand visible in a bucket with cap room and no excusing fault is met by a dispatch
//!   within one poll interval (plus one step: a tick takes no virtual time), or by a spare
//!   placed runner of a wider label set of the same repo, which will take it. A repo that was
//!   idle at its last read (no job in the reading, no child in flight) may wait for its next
//!   idle read instead: by that read plus one poll interval. Room a bucket whose runner just
//!   left (or was stopped) may take first for its own, possibly older, jobs is not owed to the
//!   buckets beside it under a shared cap: the daemon serves the oldest jobs first.
//! - I3: no cap is exceeded, counting pending children.
//! - I4: surplus is reaped: a registered `app` runner idle past the grace window and the
//!   idle confirmation is taken back within two polls, and a child unplaced past the
//!   placement timeout is stopped, unless a fault excuses it or its repo is in `vault` mode
//!   (never stopped: its namespace grants no `submit-job`; it waits for a slot instead).
//! - I5: no secret in any log line or output (checked by the driver).
//! - I6: after faults and arrivals stop, everything drains within a bound.
//! - I7: no dispatch storm: overall, dispatches never exceed jobs plus what excuses a
//!   replacement; per bucket, at most six dispatches in ten minutes while its runners keep
//!   failing to start.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;

use super::STEP_S;
use super::options::ForgeKind;
use super::ports::{Scope, Sim};
use super::world::{Counts, Phase, Visible};
use crate::config::{Mode, Route};
use crate::model::{BucketKey, ChildId, LabelSet, RepoName, RunnerName};

/// Invariants that cannot be judged yet, shown in every summary: none.
pub const PENDING: &[&str] = &[];

/// A tick's own work besides its calls, and the rounding of their times to whole seconds.
pub const TICK_SLACK_S: u64 = 2;

/// How long a tick takes at the latencies of each service's body (not its tail; a call
/// drawn from a service's tail excuses what it holds back, as a fault does, until it is
/// over), when it sends `dispatches` runners. Its reads first, a round trip each: a GitHub
/// repo's runs by each status that can hold a queued job, then the jobs of each of its open
/// runs, then its registrations, one after another (GitHub asks for requests in series);
/// a Forgejo repo's one search; repos `list_concurrency_max` at a time. Then Nomad's
/// discovery, listings and re-reads, and the lock's renew. Then, for each runner, a mint
/// (an installation token and a JIT configuration) and a dispatch, one after another. The
/// world moves meanwhile.
pub fn tick_time_s(sim: &Sim, dispatches: u64) -> u64 {
    use super::options::Service;
    let o = &sim.options;
    let round_trip = |service: Service| 2 * o.latency(service).body_ms.1;
    let github = round_trip(Service::GitHub);
    let forgejo = round_trip(Service::Forgejo);
    let nomad = round_trip(Service::Nomad);
    let mut runs: BTreeMap<&RepoName, BTreeSet<u64>> = BTreeMap::new();
    for job in sim.world.jobs.values() {
        if job.visible != Visible::Hidden && job.forge == ForgeKind::GitHub {
            runs.entry(&job.repo).or_default().insert(job.run);
        }
    }
    let statuses = crate::clients::github::RUN_STATUSES_WITH_QUEUED_JOBS.len() as u64;
    let per_repo: Vec<u64> = o
        .repos
        .iter()
        .map(|r| match r.forge {
            ForgeKind::GitHub => {
                let open = RepoName::parse(r.name)
                    .and_then(|name| runs.get(&name).map(|runs| runs.len() as u64))
                    .unwrap_or(0);
                (statuses + open + 1) * github
            }
            ForgeKind::Forgejo => forgejo,
        })
        .collect();
    let at_once = crate::control_loop::LoopSettings::default().list_concurrency_max as u64;
    let forge_reads_ms = per_repo
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(per_repo.iter().sum::<u64>().div_ceil(at_once.max(1)));
    let reads_ms = forge_reads_ms + 3 * nomad + round_trip(Service::Consul);
    let per_runner_ms = 2 * github.max(forgejo) + nomad;
    (reads_ms + dispatches * per_runner_ms).div_ceil(1000) + TICK_SLACK_S
}

/// The most runners one tick can send: every cap's room at once.
pub fn dispatches_max(sim: &Sim) -> u64 {
    let repos: u64 = sim
        .config
        .repos
        .values()
        .map(|r| u64::from(r.max_concurrent))
        .sum();
    sim.options
        .max_in_flight
        .map_or(repos, |cap| repos.min(u64::from(cap)))
}

/// Dispatches a crash-looping bucket may get in [`CRASH_WINDOW_S`] (issue 10).
pub const CRASH_DISPATCHES_MAX: usize = 6;
pub const CRASH_WINDOW_S: u64 = 600;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub invariant: &'static str,
    /// Steps are simulated seconds, so the step is also the time.
    pub step: u64,
    pub message: String,
}

/// How long after faults and arrivals stop the world must be drained, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ConvergenceBound {
    /// When the last fault and the last arrival were behind us.
    pub from_s: u64,
    /// Rounds of (dispatch, place, boot, run, release) the open work needs at the cap that
    /// binds longest, and how long that takes.
    pub waves: u64,
    pub binding_s: u64,
    /// Rounds more for the dispatches open work can still cause (a runner taken by another
    /// bucket, a level of `needs:`), each as long as the longest round.
    pub extra_waves: u64,
    pub wave_s: u64,
    /// The longest wait a fault can have left behind: transient backoff with its jitter, the
    /// longest rate-limit reset, or a crash-loop pause and its probe.
    pub backoff_s: u64,
    pub bound_s: u64,
}

/// I1–I4 and I7 after every step; I2 keeps, per bucket, since when demand exceeded supply,
/// and I4, per child, since when it should have been taken back.
pub struct Checker {
    /// Per short bucket: since when, and by when a dispatch is owed.
    /// Per cap with room while buckets under it are short, one entry per runner owed, the
    /// oldest first: since when, and by when a dispatch is owed.
    short_since: BTreeMap<CapKey, std::collections::VecDeque<(u64, u64)>>,
    dispatch_within_s: u64,
    idle_poll_interval_s: u64,
    /// Child → since when it has been surplus (idle and registered, or unplaced) with no
    /// fault excusing a delay.
    surplus_since: BTreeMap<ChildId, u64>,
}

#[derive(Default)]
struct Load {
    queued: u32,
    in_progress: u32,
    claimed: u32,
    supply: u32,
    /// Children with an allocation.
    placed: u32,
}

impl Load {
    fn running(&self) -> u32 {
        (self.in_progress + self.claimed.min(self.supply)).min(self.supply)
    }

    fn demand(&self) -> u32 {
        self.queued + self.running()
    }
}

/// Per short bucket, how many of its missing runners spare placed runners of a wider label
/// set of the same repo stand for: GitHub offers a job to every runner whose labels include
/// the job's, so such a runner takes it and a dispatch beside it would be wasted. Claimed
/// Forgejo jobs that no child of their own bucket explains are set against the wider
/// buckets first (they may run there). Narrower buckets borrow in key order.
fn covered_by_wider(loads: &BTreeMap<BucketKey, Load>) -> BTreeMap<BucketKey, u32> {
    let mut spare: BTreeMap<&BucketKey, u32> = loads
        .iter()
        .map(|(key, l)| {
            let idle = l.supply.saturating_sub(l.demand());
            (key, idle.min(l.placed.saturating_sub(l.running())))
        })
        .collect();
    let wider = |narrow: &BucketKey, wide: &BucketKey| {
        narrow != wide && narrow.repo == wide.repo && narrow.labels.is_subset(&wide.labels)
    };
    let mut lend = |narrow: &BucketKey, mut short: u32| {
        let mut lent = 0;
        for (wide, room) in spare.iter_mut() {
            if short > 0 && wider(narrow, wide) {
                let take = short.min(*room);
                *room -= take;
                short -= take;
                lent += take;
            }
        }
        lent
    };
    for (key, l) in loads {
        lend(key, l.claimed.saturating_sub(l.supply));
    }
    loads
        .iter()
        .map(|(key, l)| (key.clone(), lend(key, l.demand().saturating_sub(l.supply))))
        .collect()
}

impl Checker {
    pub fn new(poll_interval_s: u64, idle_poll_interval_s: u64, step_s: u64) -> Checker {
        Checker {
            short_since: BTreeMap::new(),
            dispatch_within_s: poll_interval_s + step_s,
            idle_poll_interval_s,
            surplus_since: BTreeMap::new(),
        }
    }

    pub fn after_step(&mut self, sim: &Sim) -> Option<Violation> {
        let found = i1(sim)
            .map(|m| ("I1", m))
            .or_else(|| i3(sim).map(|m| ("I3", m)))
            .or_else(|| i7(&sim.world.counts).map(|m| ("I7", m)))
            .or_else(|| i7_per_bucket(sim).map(|m| ("I7", m)))
            .or_else(|| self.i2(sim).map(|m| ("I2", m)))
            .or_else(|| self.i4(sim).map(|m| ("I4", m)));
        found.map(|(invariant, message)| Violation {
            invariant,
            step: sim.t,
            message,
        })
    }

    fn i2(&mut self, sim: &Sim) -> Option<String> {
        let t = sim.t;
        let world = &sim.world;
        let mut loads: BTreeMap<BucketKey, Load> = BTreeMap::new();
        let mut runners: BTreeMap<&RunnerName, BucketKey> = BTreeMap::new();
        for (_, child) in world.in_flight() {
            let Some(repo) = &child.repo else { continue };
            // A live allocation whose runner can take no job supplies nothing (it still
            // holds its slot under the caps: see `CapUse`).
            if !child.can_take_a_job() {
                continue;
            }
            let key = BucketKey {
                repo: repo.clone(),
                labels: child.labels.clone(),
            };
            let load = loads.entry(key.clone()).or_default();
            load.supply += 1;
            if !matches!(child.phase, Phase::Unplaced { .. }) {
                load.placed += 1;
            }
            if let Some(runner) = &child.runner {
                runners.insert(runner, key);
            }
        }
        for job in world.jobs.values() {
            let own = || BucketKey {
                repo: job.repo.clone(),
                labels: job.labels.clone(),
            };
            // What the status-filtered searches show, the latest of GitHub's views: a busy
            // repo's jobs are found through them.
            match (&job.searched, job.forge) {
                (Visible::Hidden, _) => {}
                (Visible::Queued, _) => loads.entry(own()).or_default().queued += 1,
                // GitHub names the runner: the job counts in that runner's bucket.
                (Visible::Running(runner), ForgeKind::GitHub) => {
                    if let Some(key) = runners.get(runner)
                        && key.repo == job.repo
                    {
                        loads.entry(key.clone()).or_default().in_progress += 1;
                    }
                }
                (Visible::Running(_), ForgeKind::Forgejo) => {
                    loads.entry(own()).or_default().claimed += 1
                }
            }
        }
        let used = CapUse::of(sim);
        let covered = covered_by_wider(&loads);
        // A tick that sends every runner the queue asks for (as far as the caps allow) takes
        // that much longer to reach the last of them.
        let queued: u64 = loads.values().map(|l| u64::from(l.queued)).sum();
        // The tick under way when room opens may have read before it did, and the next starts
        // a poll interval after it began, or when it ends if it overran.
        let tick_s = tick_time_s(sim, queued.min(dispatches_max(sim)));
        let within_s = self.dispatch_within_s.max(tick_s + STEP_S) + tick_s;
        // Each short bucket, unless something excuses it: how many runners it misses, the caps
        // it counts against and by when a runner is owed to room that opens now.
        struct Short {
            key: BucketKey,
            missing: u32,
            caps: Vec<CapKey>,
            load: String,
        }
        let mut short = Vec::new();
        // Buckets excused for now that still miss runners, with the caps they count against:
        // the daemon serves the oldest jobs first, and theirs may be older, so room they can
        // take is not owed to the short buckets beside them.
        let mut excused_missing: Vec<(u32, Vec<CapKey>)> = Vec::new();
        for (key, load) in &loads {
            let demand = load.demand();
            if demand <= load.supply + covered[key] {
                continue;
            }
            let Some(repo) = sim.config.repos.get(&key.repo) else {
                continue;
            };
            let Ok(route) = repo.route(&key.labels) else {
                continue;
            };
            let excuse = used
                .full(sim, &key.repo, &route)
                .or_else(|| leader_excuse(sim))
                .or_else(|| slow_call_excuse(sim))
                .or_else(|| fault_excuse(sim, &key.repo, &route))
                .or_else(|| crash_excuse(sim, key, within_s));
            if excuse.is_some() {
                continue;
            }
            // Room that just opened in this bucket is still owed by its own deadline; the
            // daemon may give it, or older room, to this bucket's older jobs first.
            if freed_by_stop(sim, &key.repo, within_s)
                .or_else(|| left_after_its_job(sim, key, within_s))
                .is_some()
            {
                excused_missing.push((
                    demand - load.supply - covered[key],
                    CapKey::of(sim, &key.repo, &route),
                ));
                continue;
            }
            // A repo idle at its last read is read again an idle interval later; one not read
            // in this term yet, within the term's first idle interval (a daemon spreads a
            // fleet's first reads over it; a webhook hint is read at once all the same).
            let read_due_s = match sim.queue_reads.get(&key.repo) {
                Some(read) if !read.busy => read.at_s + self.idle_poll_interval_s,
                None => sim.lock.term().map_or(0, |term| term.began_s) + self.idle_poll_interval_s,
                Some(_) => 0,
            };
            if t < read_due_s {
                continue;
            }
            short.push(Short {
                key: key.clone(),
                missing: demand - load.supply - covered[key],
                caps: CapKey::of(sim, &key.repo, &route),
                load: format!(
                    "demand {demand} (queued {}, in progress {}, claimed {}), supply {} and {} \
                     spare wider runners",
                    load.queued, load.in_progress, load.claimed, load.supply, covered[key]
                ),
            });
        }
        // Room under a cap while buckets under it are short is owed their runners: each unit
        // of room from the moment it opened, the oldest first (a dispatch for any bucket under
        // the cap uses the oldest), so room a dispatch used for one bucket does not count
        // against another, and room that opens later owes from then.
        let mut still_owed = BTreeMap::new();
        // Room under a cap that the excused buckets under it may take first.
        let available = |cap: &CapKey| {
            let reserved: u32 = excused_missing
                .iter()
                .filter(|(_, caps)| caps.contains(cap))
                .map(|(n, caps)| {
                    let room = caps.iter().map(|c| used.room_under(sim, c)).min();
                    (*n).min(room.unwrap_or(0))
                })
                .sum();
            used.room_under(sim, cap).saturating_sub(reserved)
        };
        for cap in short
            .iter()
            .flat_map(|s| s.caps.iter())
            .collect::<BTreeSet<_>>()
        {
            let under: Vec<&Short> = short.iter().filter(|s| s.caps.contains(cap)).collect();
            // A bucket is owed no more runners than its tightest cap has room for: room under
            // its repo's cap while `--max-in-flight` is full is no room at all.
            let missing: u32 = under
                .iter()
                .map(|s| {
                    let room = s.caps.iter().map(&available).min();
                    s.missing.min(room.unwrap_or(0))
                })
                .sum();
            let owed_units = missing.min(available(cap)) as usize;
            let owed_by = t + within_s;
            let mut units = self.short_since.remove(cap).unwrap_or_default();
            while units.len() > owed_units {
                units.pop_front();
            }
            while units.len() < owed_units {
                units.push_back((t, owed_by));
            }
            if let Some(&(since, deadline)) = units.front()
                && t > deadline
            {
                let buckets: Vec<String> = under
                    .iter()
                    .map(|s| format!("bucket {}: {}", s.key, s.load))
                    .collect();
                return Some(format!(
                    "{cap} had room for a runner from t={since}s to t={t}s, past t={deadline}s, \
                     while {} (no fault excusing it)",
                    buckets.join("; ")
                ));
            }
            if !units.is_empty() {
                still_owed.insert(cap.clone(), units);
            }
        }
        self.short_since = still_owed;
        None
    }
}

/// A cap a bucket counts against.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum CapKey {
    Global,
    Repo(RepoName),
    Profile(RepoName, usize),
}

impl CapKey {
    fn of(sim: &Sim, repo: &RepoName, route: &Route) -> Vec<CapKey> {
        let mut caps = vec![CapKey::Repo(repo.clone())];
        if sim.options.max_in_flight.is_some() {
            caps.push(CapKey::Global);
        }
        if let Some(index) = route.profile
            && sim.config.repos[repo].profiles[index]
                .max_concurrent
                .is_some()
        {
            caps.push(CapKey::Profile(repo.clone(), index));
        }
        caps
    }
}

impl std::fmt::Display for CapKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CapKey::Global => f.write_str("--max-in-flight"),
            CapKey::Repo(repo) => write!(f, "{repo}'s maxConcurrent"),
            CapKey::Profile(repo, index) => write!(f, "{repo}'s profile {index} maxConcurrent"),
        }
    }
}

impl Checker {
    /// I4 from the world's truth. A registered runner of an `app` repo that is idle has no
    /// queued job it could take (the world offers every one at once), so it is surplus: the
    /// daemon must take it back once it is older than the grace window and the idle reading
    /// held for the confirmation, within two polls and the status lag. A child unplaced past
    /// the placement timeout must be stopped within two polls, except a `vault` repo's: the
    /// daemon never stops or purges those (`plan::hands_off`), it places when a slot frees.
    /// Any fault, or a budget spent, restarts the clocks (it may hold a reading unknown or a
    /// stop back).
    fn i4(&mut self, sim: &Sim) -> Option<String> {
        let t = sim.t;
        let o = &sim.options;
        let policy = o.reap_policy();
        let faulted = !sim.faults.failing.is_empty()
            || !sim.faults.injected_now.is_empty()
            || sim.faults.exhausted.values().any(|reset| *reset > t)
            || leader_excuse(sim).is_some()
            || slow_call_excuse(sim).is_some();
        let slack = 2 * o.poll_interval_s
            + o.listing_lag_max_s()
            + 2
            + 2 * tick_time_s(sim, dispatches_max(sim));
        let mut still = BTreeMap::new();
        let mut found = None;
        for (id, child) in sim.world.in_flight() {
            let Some(repo) = &child.repo else { continue };
            let mode = sim.config.repos.get(repo).map(|r| &r.mode);
            let app = matches!(mode, Some(Mode::App));
            let vault = matches!(mode, Some(Mode::Vault { .. }));
            let (became, due_after) = match child.phase {
                Phase::Idle { since } if app && child.registration.is_some() => (
                    since.max(child.submitted_s + policy.orphan_grace.as_secs()),
                    policy.idle_confirm.as_secs() + slack,
                ),
                // Its registration deleted, it waits for nothing: stopped once a reading the
                // job listing's lag could not hide a job from shows none on it.
                Phase::Idle { .. } if app && child.registration.is_none() => (
                    child.deregistered_s.unwrap_or(t),
                    policy.job_listing_lag.as_secs() + slack,
                ),
                Phase::Unplaced { .. } if !vault => (
                    child.submitted_s + policy.placement_timeout.as_secs(),
                    slack,
                ),
                _ => continue,
            };
            if t < became {
                continue;
            }
            let since = if faulted {
                t
            } else {
                // A clock started for one rule does not run for the next (an idle runner
                // whose registration was deleted is owed its stop from the delete).
                self.surplus_since
                    .get(id)
                    .map_or(became, |since| (*since).max(became))
            };
            still.insert(id.clone(), since);
            if found.is_none() && t > since + due_after {
                found = Some(format!(
                    "{id} ({:?}) should have been taken back by t={}s (surplus from t={since}s, no fault since) and was not",
                    child.phase,
                    since + due_after
                ));
            }
        }
        self.surplus_since = still;
        found
    }
}

/// Nobody may act: no daemon holds the lock, its holder's process is down, its term has
/// not had its first tick yet, or Consul failed a lock call lately (a holder whose renews
/// fail closes its fence and may lose the term; a successor takes over within the takeover
/// bound).
fn leader_excuse(sim: &Sim) -> Option<String> {
    let lock = super::run::lock_timings();
    let takeover_s = lock.takeover_bound().as_secs() + tick_time_s(sim, dispatches_max(sim));
    if sim
        .lock
        .last_fault_s
        .is_some_and(|at| sim.t <= at + takeover_s)
    {
        return Some("Consul failed a leader lock call".into());
    }
    match sim.lock.term() {
        None => Some("no daemon holds the leader lock".into()),
        Some(term) if !sim.daemons_up.contains(&term.daemon) => {
            Some("the leader lock's holder is down".into())
        }
        // A new leader waits out the lock delay before its first tick.
        Some(term)
            if sim.t
                <= term.began_s
                    + lock.lock_delay().as_secs()
                    + tick_time_s(sim, dispatches_max(sim)) =>
        {
            Some("a new leader's first tick".into())
        }
        // A daemon keeps the last good document of its own reads only: one whose term's first
        // read (after the lock delay) meets a bad edit has none until the edit is fixed.
        Some(term)
            if sim.options.bad_document.is_some_and(|(start, end)| {
                start <= term.began_s + lock.lock_delay().as_secs() + 2 && sim.t < end
            }) =>
        {
            Some("the leader began during a bad edit and has read no good document".into())
        }
        Some(_) => None,
    }
}

/// A call drawn from a service's latency tail is still in flight (or just ended).
fn slow_call_excuse(sim: &Sim) -> Option<String> {
    (sim.t <= sim.slow_call_until_s).then(|| "a slow call".into())
}

/// A bucket whose runners keep failing to start backs off (BRIEF lesson 7): while its streak
/// runs, and for a poll after a runner ended it, a bucket short of runners is excused.
fn crash_excuse(sim: &Sim, key: &BucketKey, within_s: u64) -> Option<String> {
    let streak = sim
        .world
        .crash_streaks
        .get(&(key.repo.clone(), key.labels.clone()))?;
    let lag = sim.options.listing_lag_max_s();
    let ended_recently = streak
        .ended_s
        .is_some_and(|ended| sim.t <= ended + within_s + lag);
    // Which of a failed start and a runner at work came first inside one poll the daemon
    // cannot tell; its backoff after the last failed start lasts at most the longest pause.
    let backoff_max_s = crate::control_loop::CRASH_BACKOFF_MAX.as_secs();
    let failed_recently =
        streak.last_failed_s > 0 && sim.t <= streak.last_failed_s + backoff_max_s + within_s + lag;
    (streak.failed_starts > 0 || ended_recently || failed_recently)
        .then(|| "crash-loop backoff".into())
}

/// A slot freed by a stop is used at the next tick: the tick that stopped a child planned
/// its dispatches with that child still counted against the caps.
fn freed_by_stop(sim: &Sim, repo: &RepoName, within_s: u64) -> Option<String> {
    let recent = |at: &u64| sim.t <= at + within_s;
    let shares_cap = sim.options.max_in_flight.is_some();
    let freed = sim
        .world
        .last_stop_s
        .iter()
        .any(|(r, at)| (r == repo || shares_cap) && recent(at));
    freed.then(|| "a slot freed by a stop this poll".into())
}

/// A runner that could have covered the bucket left after its job this poll: a tick whose
/// reads straddled its leaving may have read its child still running from Nomad and its job
/// already gone from the listing, and counted it spare until the next tick.
fn left_after_its_job(sim: &Sim, key: &BucketKey, within_s: u64) -> Option<String> {
    let left = sim.world.last_left_s.iter().any(|((repo, labels), at)| {
        *repo == key.repo && key.labels.is_subset(labels) && sim.t <= at + within_s
    });
    left.then(|| "a runner that covered it left after its job this poll".into())
}

/// I7 per bucket: while a bucket's runners keep failing to start, at most
/// [`CRASH_DISPATCHES_MAX`] dispatches in any [`CRASH_WINDOW_S`].
fn i7_per_bucket(sim: &Sim) -> Option<String> {
    for ((repo, labels), streak) in &sim.world.crash_streaks {
        if streak.failed_starts == 0 {
            continue;
        }
        let recent = streak
            .dispatches_s
            .iter()
            .filter(|d| sim.t < **d + CRASH_WINDOW_S)
            .count();
        if recent > CRASH_DISPATCHES_MAX {
            return Some(format!(
                "bucket {repo} {labels}: {recent} dispatches in the last {CRASH_WINDOW_S} s while its runners kept failing to start ({} failed starts in a row), more than {CRASH_DISPATCHES_MAX}",
                streak.failed_starts
            ));
        }
    }
    None
}

/// In-flight children along each cap, from the world's truth (pending ones included).
#[derive(Default)]
struct CapUse {
    total: u32,
    repo: BTreeMap<RepoName, u32>,
    profile: BTreeMap<(RepoName, usize), u32>,
}

impl CapUse {
    fn of(sim: &Sim) -> CapUse {
        let mut used = CapUse::default();
        for (_, child) in sim.world.in_flight() {
            used.total += 1;
            let Some(repo) = &child.repo else { continue };
            *used.repo.entry(repo.clone()).or_default() += 1;
            if let Some(Ok(Route {
                profile: Some(index),
                ..
            })) = sim.config.repos.get(repo).map(|r| r.route(&child.labels))
            {
                *used.profile.entry((repo.clone(), index)).or_default() += 1;
            }
        }
        used
    }

    /// Runners `cap` still leaves room for.
    fn room_under(&self, sim: &Sim, cap: &CapKey) -> u32 {
        match cap {
            CapKey::Global => sim
                .options
                .max_in_flight
                .map_or(u32::MAX, |cap| cap.saturating_sub(self.total)),
            CapKey::Repo(repo) => sim.config.repos[repo]
                .max_concurrent
                .saturating_sub(self.repo.get(repo).copied().unwrap_or(0)),
            CapKey::Profile(repo, index) => sim.config.repos[repo].profiles[*index]
                .max_concurrent
                .map_or(u32::MAX, |cap| {
                    cap.saturating_sub(
                        self.profile
                            .get(&(repo.clone(), *index))
                            .copied()
                            .unwrap_or(0),
                    )
                }),
        }
    }

    /// The cap that leaves a bucket no room, if any.
    fn full(&self, sim: &Sim, repo: &RepoName, route: &Route) -> Option<String> {
        let config = &sim.config.repos[repo];
        if let Some(cap) = sim.options.max_in_flight
            && self.total >= cap
        {
            return Some("global cap".into());
        }
        if self.repo.get(repo).copied().unwrap_or(0) >= config.max_concurrent {
            return Some("repo cap".into());
        }
        if let Some(index) = route.profile
            && let Some(cap) = config.profiles[index].max_concurrent
            && self
                .profile
                .get(&(repo.clone(), index))
                .copied()
                .unwrap_or(0)
                >= cap
        {
            return Some("profile cap".into());
        }
        None
    }
}

/// A fault that holds a bucket back: its repo's queue or minting failing, or Nomad failing
/// for a parent it needs (any parent under a global cap, whose count needs every listing).
fn fault_excuse(sim: &Sim, repo: &RepoName, route: &Route) -> Option<String> {
    let faults = &sim.faults;
    if let Some(config) = sim.config.repos.get(repo)
        && faults
            .low
            .get(&super::ports::budget_of(config))
            .is_some_and(|reset| *reset > sim.t)
    {
        return Some(
            "its rate-limit budget is low: reads stretched to last until the reset".into(),
        );
    }
    let hit = |scope: &Scope| faults.failing.contains(scope) || faults.injected_now.contains(scope);
    if hit(&Scope::Queue(repo.clone())) || hit(&Scope::Mint(repo.clone())) {
        return Some("forge fault".into());
    }
    if !faults.discovered_once && hit(&Scope::Discover) {
        return Some("the parents of our children were never found".into());
    }
    if hit(&Scope::Dispatch(route.parent.clone(), repo.clone())) {
        return Some("dispatch fault".into());
    }
    // A failed dispatch of a parent skips that parent's other dispatches in the same tick.
    let parent_failed_now = faults
        .injected_now
        .iter()
        .any(|s| matches!(s, Scope::Dispatch(p, _) if *p == route.parent));
    if parent_failed_now {
        return Some("dispatch fault this tick".into());
    }
    // Buckets that share a cap are served oldest job first: a mint or dispatch that failed
    // this tick for another bucket under the same repo cap (or under the global cap) took
    // the unit this bucket would have had.
    let shares_cap = |other: &RepoName| other == repo || sim.options.max_in_flight.is_some();
    let sharing_fault_now = faults.injected_now.iter().any(|s| match s {
        Scope::Mint(other) | Scope::Dispatch(_, other) => shares_cap(other),
        _ => false,
    });
    if sharing_fault_now {
        return Some("a fault under a shared cap this tick".into());
    }
    let parents = sim.config.repos[repo].parents();
    let listing_failed = faults
        .failing
        .iter()
        .chain(faults.injected_now.iter())
        .any(|s| match s {
            Scope::List(p) => sim.options.max_in_flight.is_some() || parents.contains(p),
            _ => false,
        });
    listing_failed.then(|| "listing fault".into())
}

fn i1(sim: &Sim) -> Option<String> {
    let counts = &sim.world.counts;
    if let Some(kill) = &sim.world.kill_outside {
        return Some(kill.clone());
    }
    if counts.escaped_busy > 0 {
        return Some(format!(
            "{} child(ren) purged while their runner executed a job (escaped_busy)",
            counts.escaped_busy
        ));
    }
    (counts.foreign_purged > 0).then(|| {
        format!(
            "{} foreign child(ren) purged (no managed_by marker)",
            counts.foreign_purged
        )
    })
}

fn i3(sim: &Sim) -> Option<String> {
    let used = CapUse::of(sim);
    if let Some(cap) = sim.options.max_in_flight
        && used.total > cap
    {
        return Some(format!(
            "{} children in flight, over --max-in-flight {cap}",
            used.total
        ));
    }
    for (repo, n) in &used.repo {
        let config = &sim.config.repos[repo];
        if *n > config.max_concurrent {
            return Some(format!(
                "{repo}: {n} children in flight, over its maxConcurrent {}",
                config.max_concurrent
            ));
        }
    }
    for ((repo, index), n) in &used.profile {
        let profile = &sim.config.repos[repo].profiles[*index];
        if let Some(cap) = profile.max_concurrent
            && *n > cap
        {
            return Some(format!(
                "{repo} profile {:?}: {n} children in flight, over its maxConcurrent {cap}",
                profile.label
            ));
        }
    }
    None
}

fn i7(c: &Counts) -> Option<String> {
    let allowed =
        c.jobs + c.failed_starts + c.jobs_cancelled + c.cross_bucket_takes + c.unplaced_stopped;
    (c.dispatches > allowed).then(|| {
        format!(
            "{} dispatches > {allowed} = jobs {} + failed starts {} + cancelled {} + cross-bucket takes {} + stopped unplaced {}",
            c.dispatches,
            c.jobs,
            c.failed_starts,
            c.jobs_cancelled,
            c.cross_bucket_takes,
            c.unplaced_stopped
        )
    })
}

/// I6: the queue is drained and nothing of ours is in flight.
pub fn i6(sim: &Sim, bound: &ConvergenceBound) -> Option<Violation> {
    if converged(sim) {
        return None;
    }
    let world = &sim.world;
    let open = world.open_jobs();
    let visible = world.visible_jobs();
    let in_flight: Vec<String> = world
        .in_flight()
        .map(|(id, c)| format!("{id} ({:?})", c.phase))
        .collect();
    let open_jobs: Vec<String> = world
        .jobs
        .iter()
        .take(5)
        .map(|(id, j)| format!("{id} {} {} {:?}", j.repo, j.labels, j.truth))
        .collect();
    Some(Violation {
        invariant: "I6",
        step: sim.t,
        message: format!(
            "not converged by t={}s (faults and arrivals stopped at t={}s): {open} open job(s) \
             [{}], {visible} still listed, {} child(ren) in flight [{}]",
            bound.bound_s,
            bound.from_s,
            open_jobs.join("; "),
            in_flight.len(),
            in_flight
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        ),
    })
}

/// The I6 bound, from the options and what is open when faults and arrivals stop: the
/// longest backoff a fault left, then enough rounds for every open job and every child in
/// flight to pass through each cap (cluster slots and `--max-in-flight` for all, then each
/// repo's and profile's cap), the longest of those, two more rounds for the dispatches open
/// work can still cause (a runner taken by another bucket) and one per level of `needs:`,
/// then two polls to see the end and purge.
///
/// A round is placement, boot, and the longer of a job and the time a surplus runner keeps its
/// slot, with a poll and the status lag to notice it. Now that surplus is reaped, a surplus
/// runner of an `app` repo keeps its slot at most the grace window, the idle confirmation and
/// two polls (or its own idle timeout, if shorter); in `vault` and `forgejo` mode, where the
/// daemon never stops a runner whose allocation runs, until its idle timeout.
pub fn convergence_bound(
    sim: &Sim,
    transient_backoff_max: Duration,
    from_s: u64,
) -> ConvergenceBound {
    let o = &sim.options;
    let policy = o.reap_policy();
    let reaped_hold_s =
        (policy.orphan_grace + policy.idle_confirm).as_secs() + 2 * o.poll_interval_s;
    let round_s = |hold_s: u64| {
        o.poll_interval_s
            + o.listing_lag_max_s()
            + o.place_delay_s.1
            + o.boot_s.1
            + o.job_s.1.max(hold_s)
            + 2
            + tick_time_s(sim, dispatches_max(sim))
    };
    let repo_round_s = |repo: &RepoName| match sim.config.repos.get(repo).map(|r| &r.mode) {
        Some(Mode::App) => round_s(o.idle_timeout_s.min(reaped_hold_s)),
        _ => round_s(o.idle_timeout_s),
    };
    let longest_round_s = sim
        .config
        .repos
        .keys()
        .map(repo_round_s)
        .max()
        .unwrap_or_else(|| round_s(o.idle_timeout_s));
    let mut per_repo: BTreeMap<RepoName, u64> = BTreeMap::new();
    let mut per_profile: BTreeMap<(RepoName, usize), u64> = BTreeMap::new();
    let mut total = 0;
    let mut count = |repo: &RepoName, labels: &LabelSet, n: u64| {
        total += n;
        if let Some(Ok(Route {
            profile: Some(index),
            ..
        })) = sim.config.repos.get(repo).map(|r| r.route(labels))
        {
            *per_profile.entry((repo.clone(), index)).or_default() += n;
        }
        *per_repo.entry(repo.clone()).or_default() += n;
    };
    for ((repo, labels), n) in sim.world.open_jobs_by_bucket() {
        count(&repo, &labels, n);
    }
    for (_, child) in sim.world.in_flight() {
        if let Some(repo) = &child.repo {
            count(repo, &child.labels, 1);
        }
    }
    let global = o.max_in_flight.unwrap_or(u32::MAX);
    let turns_at = |n: u64, cap: u32| n.div_ceil(u64::from(cap.min(global).max(1)));
    // (rounds, their length) per cap; the one that takes longest binds.
    let mut caps = vec![(turns_at(total, o.cluster_slots), longest_round_s)];
    for (repo, n) in &per_repo {
        caps.push((
            turns_at(*n, sim.config.repos[repo].max_concurrent),
            repo_round_s(repo),
        ));
    }
    for ((repo, index), n) in &per_profile {
        let config = &sim.config.repos[repo];
        let cap = config.profiles[*index]
            .max_concurrent
            .unwrap_or(u32::MAX)
            .min(config.max_concurrent);
        caps.push((turns_at(*n, cap), repo_round_s(repo)));
    }
    let (waves, wave_len_s) = caps
        .into_iter()
        .max_by_key(|(turns, len)| turns * len)
        .unwrap_or((0, longest_round_s));
    let binding_s = waves * wave_len_s;
    let extra_waves = 2 + sim.world.needs_depth();
    // A bucket whose runners crashed at boot until the faults stopped may still be pausing,
    // then sends one probe at a time until one is seen at work.
    let crash_s = if o.crash_probability > 0.0 {
        crate::control_loop::CRASH_BACKOFF_MAX.as_secs() + longest_round_s
    } else {
        0
    };
    let backoff_s = (transient_backoff_max.as_secs() * 5 / 4)
        .max(o.rate_limit_reset_s.1)
        .max(crash_s);
    let bound_s =
        from_s + backoff_s + binding_s + extra_waves * longest_round_s + 2 * o.poll_interval_s;
    ConvergenceBound {
        from_s,
        waves,
        binding_s,
        extra_waves,
        wave_s: longest_round_s,
        backoff_s,
        bound_s,
    }
}

/// Everything drained: no job open or listed, nothing of ours in flight.
pub fn converged(sim: &Sim) -> bool {
    let world = &sim.world;
    world.open_jobs() == 0 && world.visible_jobs() == 0 && world.in_flight().next().is_none()
}
