//! Plan: a pure function from what was observed to what should be done.
//!
//! No I/O, no clock reads, no logging: `now` is an input and the output is plain data in
//! which every decision carries its reason, so "why didn't it scale?" has an answer in the
//! log, in `once --dry-run` and in `status`.
//!
//! Per bucket (repo, label set):
//! `demand = queued jobs + jobs in progress on this bucket's runners`,
//! `supply = our in-flight children`, `missing = demand − supply − spare runners of a wider
//! label set of the same repo` (`wider.rs`), then capped by the profile's, the repo's and the
//! global cap, where every in-flight child counts against the caps and buckets that share a
//! cap are served oldest queued job first.

pub mod hands_off;
mod index;
pub mod reap;
mod wider;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use chrono::{DateTime, Utc};

use crate::config::{Config, Mode, RepoConfig, Route, Unroutable};
use crate::model::{BucketKey, ChildId, LabelRejection, LabelSet, RepoName, RunnerName};
use crate::observe::{Child, JobState, Snapshot};
use hands_off::HandsOff;
use reap::{Allocation, Nomination, ReapPolicy, RunnerApi};

use index::{Bucket, Buckets, JobsOfRepo, LabelSets, QueuedJobs, RepoSlot, Repos};

/// Limits from process settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PlanSettings {
    /// `--max-in-flight`: caps all our in-flight children; `None` leaves only the per-repo caps.
    pub max_in_flight: Option<u32>,
    /// When runners are taken back.
    pub reap: ReapPolicy,
    /// `--vault-children-cleanup`: the daemon may stop and purge children of `vault` mode
    /// repos (see [`hands_off`]).
    pub vault_children_cleanup: bool,
}

/// A bucket whose runners keep failing to start (BRIEF lesson 7): its dispatches back off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashBackoff {
    /// Failed starts in a row, since a runner of the bucket last took a job.
    pub failed_starts: u32,
    /// No dispatch before this; from then on one at a time, a probe, until a runner takes a
    /// job.
    pub next_dispatch_at: DateTime<Utc>,
    /// When the child of the streak's first failed start was submitted: a clean exit of a
    /// child submitted no later is older news than the streak and does not end it (a new
    /// term sees every dead child Nomad still lists at once, in no order).
    pub since: DateTime<Utc>,
}

/// Dispatching held back by something the loop learned earlier (a refusal, an error that
/// waits for a fix), kept by the control loop and honoured here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holds {
    /// (parent, repo) → why dispatching that parent for that repo is held.
    pub parents: BTreeMap<(String, RepoName), String>,
    /// repo → why dispatching for the repo is held (e.g. minting was refused).
    pub repos: BTreeMap<RepoName, String>,
    /// Buckets backing off after failed starts.
    pub crash_backoff: BTreeMap<BucketKey, CrashBackoff>,
    /// Why every dispatch is paused (the operator's pause key), if it is.
    pub paused: Option<String>,
}

/// Everything the planner reads.
#[derive(Clone, Copy, Debug)]
pub struct PlanInput<'a> {
    pub config: &'a Config,
    pub snapshot: &'a Snapshot,
    pub settings: PlanSettings,
    pub holds: &'a Holds,
    pub now: DateTime<Utc>,
}

/// Why a bucket gets fewer runners than it is missing, or none.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum HoldReason {
    /// Supply already meets demand.
    Satisfied,
    /// The repo's `maxConcurrent` is 0.
    Paused,
    /// The operator's pause key stops every dispatch.
    PausedByOperator(String),
    ProfileCap,
    RepoCap,
    GlobalCap,
    /// The repo's jobs could not be read this tick.
    QueueUnknown(String),
    /// A parent's children could not be listed, so the in-flight count is not fresh.
    InFlightUnknown(String),
    /// The bucket's jobs have no parent to go to.
    Unroutable(String),
    /// The repo left the document; its children are only shown and purged.
    NotConfigured,
    /// Held by an earlier refusal until it is fixed or retried.
    Held(String),
    /// Its runners keep failing to start: no dispatch before `until`, then one at a time.
    CrashLoop {
        failed_starts: u32,
        until: DateTime<Utc>,
    },
    /// Backing off after failed starts: one runner (a probe) goes out at a time.
    Probing {
        failed_starts: u32,
    },
    /// Spare runners of a wider label set of the same repo will take the queued jobs.
    CoveredByWider {
        runners: u32,
    },
    /// The repo's queue was not polled this tick (adaptive polling, or a tick woken by a
    /// webhook for another repo): the reading is from `read_at`, too old to dispatch on.
    NotPolled {
        read_at: DateTime<Utc>,
    },
}

impl fmt::Display for HoldReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HoldReason::Satisfied => f.write_str("in-flight runners cover demand"),
            HoldReason::Paused => f.write_str("repo paused (maxConcurrent 0)"),
            HoldReason::PausedByOperator(why) => write!(f, "paused: {why}"),
            HoldReason::ProfileCap => f.write_str("profile cap reached"),
            HoldReason::RepoCap => f.write_str("repo cap reached"),
            HoldReason::GlobalCap => f.write_str("global cap (--max-in-flight) reached"),
            HoldReason::QueueUnknown(why) => write!(f, "queue unknown: {why}"),
            HoldReason::InFlightUnknown(why) => write!(f, "in-flight count unknown: {why}"),
            HoldReason::Unroutable(why) => write!(f, "unroutable: {why}"),
            HoldReason::NotConfigured => f.write_str("repo not in the document"),
            HoldReason::Held(why) => write!(f, "held: {why}"),
            HoldReason::CrashLoop {
                failed_starts,
                until,
            } => write!(
                f,
                "crash loop: {failed_starts} failed start(s) in a row; next dispatch at {}",
                until.to_rfc3339()
            ),
            HoldReason::Probing { failed_starts } => write!(
                f,
                "crash loop: {failed_starts} failed start(s) in a row; one runner at a time until one takes a job"
            ),
            HoldReason::NotPolled { read_at } => write!(
                f,
                "queue not polled this tick (last read at {}): dispatches wait for its next poll",
                read_at.to_rfc3339()
            ),
            HoldReason::CoveredByWider { runners } => write!(
                f,
                "{runners} spare runner(s) of a wider label set will take the queued jobs"
            ),
        }
    }
}

/// The plan for one bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketPlan {
    pub key: BucketKey,
    /// The parent job its jobs route to, when they route.
    pub parent: Option<String>,
    pub queued: u32,
    /// Jobs in progress on this bucket's runners.
    pub in_progress: u32,
    /// Our in-flight children of this bucket (pending or running, placed or not).
    pub in_flight: u32,
    /// Of those, children whose runner's registration the daemon deleted: they count against
    /// the caps until stopped, never as supply (no job comes to them).
    pub deregistered: u32,
    /// Of those, children stopped whose allocation still runs (inside its `kill_timeout`):
    /// they count against the caps until Nomad reports the allocation ended, never as supply.
    pub stopping: u32,
    /// Missing runners that spare runners of a wider label set of the same repo cover: they
    /// take this bucket's jobs, so none is dispatched for them.
    pub covered_by_wider: u32,
    /// The tightest cap that applies: profile, repo or global.
    pub cap: Option<u32>,
    pub missing: u32,
    pub to_dispatch: u32,
    /// Set whenever `to_dispatch < missing`, or when nothing is missing.
    pub reason: Option<HoldReason>,
    pub oldest_queued_at: Option<DateTime<Utc>>,
    /// Seconds the oldest queued job has waited, at `now`.
    pub oldest_wait_s: Option<u64>,
}

/// One runner to dispatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedDispatch {
    pub bucket: BucketKey,
    pub parent: String,
}

/// Why a job cannot be served by any runner of ours.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnroutableReason {
    LabelRejected(LabelRejection),
    NoRoute(Unroutable),
}

impl fmt::Display for UnroutableReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnroutableReason::LabelRejected(why) => write!(f, "label rejected: {why}"),
            UnroutableReason::NoRoute(why) => write!(f, "{why}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnroutableJob {
    pub repo: RepoName,
    pub job_id: u64,
    pub reason: UnroutableReason,
}

/// A child the rules put up for teardown, with what [`reap::decide`] needs besides the
/// readings the loop takes afterwards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nominated {
    pub child: ChildId,
    pub nomination: Nomination,
    /// The document's repo it runs for, if it names one.
    pub repo: Option<RepoName>,
    pub labels: Option<LabelSet>,
    pub runner: Option<RunnerName>,
    pub api: RunnerApi,
    /// As the listing shows it; the act step re-reads before stopping an unplaced child.
    pub allocation: Allocation,
    /// Since the child was submitted.
    pub age: std::time::Duration,
    /// Since the child was placed (since it was submitted when that is not known): what the
    /// hard bound is measured against. No job starts before its runner is placed, and a child
    /// may wait most of the placement timeout for a node.
    pub running_for: std::time::Duration,
    /// With the profile's hard bound, where it sets one.
    pub policy: ReapPolicy,
}

/// What one tick should do, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub buckets: Vec<BucketPlan>,
    /// In the order to carry them out: oldest queued job first.
    pub dispatches: Vec<PlannedDispatch>,
    /// Our children whose status is dead (to be re-read before purging), except those left
    /// to Nomad's garbage collection ([`hands_off`]).
    pub purges: Vec<ChildId>,
    /// Children put up for teardown, in child id order.
    pub nominations: Vec<Nominated>,
    pub unroutable: Vec<UnroutableJob>,
    /// Queued jobs across all repos read this tick.
    pub queued_total: u32,
    /// Our in-flight children across all parents listed this tick.
    pub in_flight_total: u32,
    /// How long a credential wrapped for this tick's dispatches may be unwrapped
    /// ([`credential_ttl`]).
    pub credential_ttl: std::time::Duration,
}

/// Time a placed runner gets to boot (image pulled, container started) and unwrap its
/// credential.
pub const CREDENTIAL_BOOT_MARGIN: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// The longest a wrapped credential lives: a GitHub registration token's hour.
pub const CREDENTIAL_TTL_MAX: std::time::Duration = std::time::Duration::from_secs(3600);

/// How long a wrapped credential may wait in Nomad's dispatch meta: a child unplaced past the
/// placement timeout is stopped and replaced with a fresh credential, so its own need outlive
/// that only by the time a runner placed at the last moment takes to boot; any longer, and a
/// wrapping token read from Nomad's state stays good for nothing but an attacker.
pub fn credential_ttl(placement_timeout: std::time::Duration) -> std::time::Duration {
    (placement_timeout + CREDENTIAL_BOOT_MARGIN).min(CREDENTIAL_TTL_MAX)
}

/// Computes the plan. Pure: the same input always gives the same plan.
pub fn plan(input: PlanInput<'_>) -> Plan {
    let PlanInput {
        config,
        snapshot,
        settings,
        holds,
        now,
    } = input;
    let mut out = Plan {
        credential_ttl: credential_ttl(settings.reap.placement_timeout),
        ..Plan::default()
    };
    let mut repos = Repos::new(config);
    let mut label_sets = LabelSets::new();
    let mut buckets = Buckets::default();

    // Supply, counted from Nomad's own listing.
    let listed: usize = snapshot.parents.values().flatten().map(Vec::len).sum();
    // runner name → the bucket of the child it runs in.
    let mut runners: HashMap<&str, usize> = HashMap::with_capacity(listed);
    // `repo_url` meta → repo slot: a repo's children share one URL.
    let mut repo_of_url: HashMap<&str, Option<usize>> =
        HashMap::with_capacity(snapshot.repo_urls.len());
    // Every in-flight child of ours with its repo slot and bucket, for the nominations.
    let mut flight: Vec<(&Child, Option<usize>, Option<usize>)> = Vec::with_capacity(listed);
    // The runners of children whose registration the daemon deleted, with their bucket and
    // whether their allocation runs: no supply unless a job in progress names them.
    let mut retiring_runners: HashMap<&str, (usize, bool)> = HashMap::new();
    let hands_off = HandsOff::new(config, settings.vault_children_cleanup);
    for child in snapshot.our_listed_children() {
        if !child.holds_slot() {
            let repo = snapshot.repo_of(child).and_then(|r| config.repos.get(r));
            if !hands_off.covers(repo, &child.id) {
                out.purges.push(child.id.clone());
            }
            continue;
        }
        // Stopped, its task still inside `kill_timeout`: it holds its slot under every cap
        // until its allocation ends, takes no job, and is neither nominated nor purged yet.
        let stopping = child.is_stopping();
        out.in_flight_total += 1;
        let repo = match child.repo_url.as_deref() {
            Some(url) => *repo_of_url
                .entry(url)
                .or_insert_with(|| snapshot.repo_of(child).map(|r| repos.intern(r))),
            None => None,
        };
        let Some(repo) = repo else {
            if !stopping {
                flight.push((child, None, None));
            }
            continue;
        };
        repos.slots[repo].in_flight += 1;
        let Some(labels) = child
            .labels
            .as_deref()
            .and_then(|meta| label_sets.of_meta(meta))
        else {
            if !stopping {
                flight.push((child, Some(repo), None));
            }
            continue;
        };
        let bucket = buckets.get_or_insert(repo, labels);
        if stopping {
            buckets.all[bucket].stopping += 1;
            continue;
        }
        if !snapshot.deregistered.is_empty() && snapshot.deregistered.contains_key(&child.id) {
            // Its registration is gone, so GitHub gives it no job: it is no supply and lends
            // nothing, though its allocation still holds its slot under every cap.
            buckets.all[bucket].retiring += 1;
            if let Some(name) = &child.runner_name {
                retiring_runners.insert(&name.0, (bucket, child.placement.is_placed()));
            }
            flight.push((child, Some(repo), Some(bucket)));
            continue;
        }
        buckets.all[bucket].supply += 1;
        if child.placement.is_placed() {
            buckets.all[bucket].placed += 1;
        }
        if let Some(name) = &child.runner_name {
            runners.insert(&name.0, bucket);
        }
        flight.push((child, Some(repo), Some(bucket)));
    }
    // Runners a job in progress names: busy, whatever else is said of them.
    let mut named_busy: HashSet<&str> = HashSet::new();
    out.purges.sort();

    // Demand, from the forges.
    let mut queued_jobs = QueuedJobs::default();
    for (name, listing) in &snapshot.repos {
        let repo = repos.intern(name);
        let listing = match listing {
            Ok(listing) => listing,
            Err(gap) => {
                repos.slots[repo].queue_gap = Some(gap);
                continue;
            }
        };
        repos.slots[repo].read_earlier_at = snapshot.unpolled.get(name).copied();
        let mut routing = JobsOfRepo::new(repo);
        for job in &listing.jobs {
            let labels = match routing.labels(&job.labels, &mut label_sets) {
                Ok(labels) => labels,
                Err(why) => {
                    if job.state == JobState::Queued {
                        out.unroutable.push(UnroutableJob {
                            repo: name.clone(),
                            job_id: job.id,
                            reason: UnroutableReason::LabelRejected(why),
                        });
                    }
                    continue;
                }
            };
            match &job.state {
                JobState::Queued => {
                    out.queued_total += 1;
                    // The loop fills in first sightings; a job without one sorts as if queued now.
                    let queued_at = job.queued_at.unwrap_or(now);
                    let bucket = routing.bucket(labels, &mut buckets);
                    queued_jobs.push(&mut buckets.all[bucket], bucket, queued_at, job.id);
                }
                // A job counts in the bucket of the runner that runs it, which may differ
                // from its own labels when a runner with more labels took it.
                JobState::InProgress { runner: Some(name) } => {
                    if let Some(&bucket) = runners.get(name.0.as_str())
                        && buckets.all[bucket].repo == repo
                    {
                        buckets.all[bucket].in_progress += 1;
                        named_busy.insert(name.0.as_str());
                    } else if let Some(&(bucket, placed)) = retiring_runners.get(name.0.as_str())
                        && buckets.all[bucket].repo == repo
                    {
                        // It took this job before its registration was deleted (GitHub has
                        // let such a delete succeed): it serves the job, as supply does.
                        retiring_runners.remove(name.0.as_str());
                        let b = &mut buckets.all[bucket];
                        b.retiring -= 1;
                        b.supply += 1;
                        b.placed += u32::from(placed);
                        b.in_progress += 1;
                        named_busy.insert(name.0.as_str());
                    }
                }
                JobState::InProgress { runner: None } => {}
                JobState::Claimed => {
                    let bucket = routing.bucket(labels, &mut buckets);
                    buckets.all[bucket].claimed += 1;
                }
            }
        }
    }

    // Each bucket routes once; its children count against their profile's cap.
    let mut routes: Vec<Option<Result<Route, Unroutable>>> = buckets
        .all
        .iter()
        .map(|b| {
            let repo = &repos.slots[b.repo];
            repo.config.map(|r| r.route(label_sets.get(b.labels)))
        })
        .collect();
    for (bucket, route) in buckets.all.iter().zip(&routes) {
        if let Some(Ok(Route {
            profile: Some(index),
            ..
        })) = route
        {
            repos.slots[bucket.repo].profile_in_flight[*index] +=
                bucket.supply + bucket.retiring + bucket.stopping;
        }
    }

    // Each bucket's profile, for the hard bound of its children (the routes move into the
    // bucket plans below).
    let profile_of: Vec<Option<usize>> = routes
        .iter()
        .map(|r| {
            r.as_ref()
                .and_then(|r| r.as_ref().ok())
                .and_then(|r| r.profile)
        })
        .collect();

    // Each repo's parents are checked once, not once per bucket.
    for slot in &mut repos.slots {
        slot.parent_gap = slot.config.and_then(|r| repo_parent_gap(snapshot, r));
    }

    // Every bucket that has demand or supply, in key order: repo, then label set.
    let in_key_order = index::in_key_order(&buckets.all, &repos.ranks(), &label_sets.ranks());
    let cover = wider::cover_from_wider(&buckets.all, &in_key_order, &label_sets);

    let facts = HoldFacts {
        holds,
        parent_holds: holds
            .parents
            .iter()
            .map(|((parent, repo), why)| ((parent.as_str(), repo), why.as_str()))
            .collect(),
        settings,
        global_gap: first_parent_gap(snapshot, snapshot.parents.keys()),
        // Only a failed listing is a gap, so only those few parents are looked up in the
        // document: collecting every parent it names, a set of strings per repo, took a
        // tenth of a plan, every tick, for nothing while all listings succeeded.
        lingering_gap: first_parent_gap(
            snapshot,
            snapshot
                .parents
                .iter()
                .filter(|(_, listing)| listing.is_err())
                .map(|(parent, _)| parent)
                .filter(|parent| !names_parent(config, parent)),
        ),
        undiscovered: snapshot.undiscovered.as_ref().map(|gap| {
            format!(
                "the parents of our children could not be listed: {}",
                gap.message
            )
        }),
    };

    struct Candidate {
        /// Index into `out.buckets`.
        index: usize,
        repo: usize,
        profile: Option<usize>,
        /// Failed starts in a row of a bucket that is probing: one dispatch this tick at most.
        probing: Option<u32>,
    }
    let mut candidates = Vec::new();
    // Every missing runner as (when the job it would serve was queued, candidate), the time
    // as whole seconds and nanoseconds: thousands of them sort quicker as integers than as
    // `DateTime`s, in the same order.
    let mut units: Vec<(i64, u32, usize)> = Vec::with_capacity(out.queued_total as usize);
    let mut queued_jobs = queued_jobs.by_bucket(&buckets.all);
    out.buckets.reserve(in_key_order.len());
    for &b in &in_key_order {
        let bucket = buckets.all[b];
        let Bucket {
            repo,
            labels,
            supply,
            queued,
            ..
        } = bucket;
        let owned_route = routes[b].take();
        let route = owned_route.as_ref();
        let slot = &repos.slots[repo];
        let jobs = queued_jobs.of(b);
        jobs.sort_unstable();
        let in_progress = bucket.running();
        let covered_by_wider = cover.covered[b];
        let missing = bucket.deficit() - covered_by_wider;
        let key = BucketKey {
            repo: slot.name.clone(),
            labels: label_sets.get(labels).clone(),
        };
        if let Some(Err(why)) = route {
            out.unroutable
                .extend(jobs.iter().map(|(_, id)| UnroutableJob {
                    repo: key.repo.clone(),
                    job_id: *id,
                    reason: UnroutableReason::NoRoute(why.clone()),
                }));
        }
        let crash = holds.crash_backoff.get(&key);
        let hold = hold_before_caps(missing, slot, route, &facts).or_else(|| {
            crash
                .filter(|c| missing > 0 && now < c.next_dispatch_at)
                .map(|c| HoldReason::CrashLoop {
                    failed_starts: c.failed_starts,
                    until: c.next_dispatch_at,
                })
        });
        let reason = if hold.is_some() {
            hold
        } else if missing == 0 && covered_by_wider > 0 {
            Some(HoldReason::CoveredByWider {
                runners: covered_by_wider,
            })
        } else if missing == 0 {
            Some(HoldReason::Satisfied)
        } else {
            if let Some(Ok(route)) = route {
                let first = jobs.len() - missing as usize;
                let c = candidates.len();
                candidates.push(Candidate {
                    index: out.buckets.len(),
                    repo,
                    profile: route.profile,
                    probing: crash.map(|c| c.failed_starts),
                });
                units.extend(
                    jobs[first..]
                        .iter()
                        .map(|(t, _)| (t.timestamp(), t.timestamp_subsec_nanos(), c)),
                );
            }
            None
        };
        let cap = slot.config.map(|r| tightest_cap(r, route, settings));
        out.buckets.push(BucketPlan {
            key,
            parent: owned_route.and_then(Result::ok).map(|r| r.parent),
            queued,
            in_progress,
            in_flight: supply + bucket.retiring + bucket.stopping,
            deregistered: bucket.retiring,
            stopping: bucket.stopping,
            covered_by_wider,
            cap,
            missing,
            to_dispatch: 0,
            reason,
            oldest_queued_at: jobs.first().map(|(t, _)| *t),
            oldest_wait_s: jobs
                .first()
                .map(|(t, _)| (now - *t).num_seconds().max(0) as u64),
        });
    }

    out.unroutable
        .sort_by(|a, b| (&a.repo, a.job_id).cmp(&(&b.repo, b.job_id)));

    // Share the caps: every missing runner in the order of the job it would serve. Ties are
    // broken by bucket order, which is deterministic (the order of bucket keys); candidates
    // are numbered in that order, and no two units of one candidate differ.
    index::sort_by_time(&mut units);
    // From here on the in-flight counts also count the runners planned so far.
    let mut total_used = out.in_flight_total;
    for (_, _, c) in units {
        let cand = &candidates[c];
        let bucket = &mut out.buckets[cand.index];
        let used = &mut repos.slots[cand.repo];
        let repo_config = used.config.expect("candidates have a route, so a config");
        let blocked = if let Some(failed_starts) = cand.probing
            && bucket.to_dispatch >= 1
        {
            Some(HoldReason::Probing { failed_starts })
        } else if settings.max_in_flight.is_some_and(|cap| total_used >= cap) {
            Some(HoldReason::GlobalCap)
        } else if used.in_flight >= repo_config.max_concurrent {
            Some(HoldReason::RepoCap)
        } else if let Some(index) = cand.profile
            && let Some(cap) = repo_config.profiles[index].max_concurrent
            && used.profile_in_flight[index] >= cap
        {
            Some(HoldReason::ProfileCap)
        } else {
            None
        };
        match blocked {
            Some(reason) => {
                // The first cap that stopped a bucket is its reason.
                bucket.reason.get_or_insert(reason);
            }
            None => {
                used.in_flight += 1;
                total_used += 1;
                if let Some(index) = cand.profile {
                    used.profile_in_flight[index] += 1;
                }
                bucket.to_dispatch += 1;
                out.dispatches.push(PlannedDispatch {
                    bucket: bucket.key.clone(),
                    parent: bucket.parent.clone().expect("candidates have a route"),
                });
            }
        }
    }
    // Never nominated, so never stopped: see `hands_off`.
    flight.retain(|(child, repo, _)| {
        !hands_off.covers(repo.and_then(|r| repos.slots[r].config), &child.id)
    });
    out.nominations = nominate(
        &flight,
        &Attribution {
            buckets: &buckets.all,
            slots: &repos.slots,
            label_sets: &label_sets,
            profile_of: &profile_of,
            lent: &cover.lent,
        },
        &named_busy,
        &snapshot.deregistered,
        settings.reap,
        now,
    );
    out
}

/// What the planner learnt of each bucket, for the nominations.
struct Attribution<'p, 'a> {
    buckets: &'p [Bucket],
    slots: &'p [RepoSlot<'a>],
    label_sets: &'p LabelSets<'a>,
    /// Each bucket's profile, by bucket index.
    profile_of: &'p [Option<usize>],
    /// Each bucket's runners counted for a narrower bucket's jobs, by bucket index.
    lent: &'p [u32],
}

/// The rules' nominations (see [`reap::Nomination`]), in child id order. A child is
/// nominated once, for the first of: unplaced past the placement timeout, older than its
/// hard bound, its registration deleted and a fresh queue reading taken at least
/// `--job-listing-lag` after the delete naming it in no job, surplus in its bucket, or
/// (app mode) placed past the grace window and named by no job in progress.
fn nominate(
    flight: &[(&Child, Option<usize>, Option<usize>)],
    known: &Attribution<'_, '_>,
    named_busy: &HashSet<&str>,
    deregistered: &std::collections::BTreeMap<ChildId, DateTime<Utc>>,
    policy: ReapPolicy,
    now: DateTime<Utc>,
) -> Vec<Nominated> {
    let Attribution {
        buckets,
        slots,
        label_sets,
        profile_of,
        lent,
    } = known;
    let age_of = |child: &Child| -> std::time::Duration {
        child
            .submitted_at
            .and_then(|t| (now - t).to_std().ok())
            // A child without a submit time has no known age: never old enough to nominate.
            .unwrap_or_default()
    };
    let busy = |child: &Child| {
        child
            .runner_name
            .as_ref()
            .is_some_and(|n| named_busy.contains(n.0.as_str()))
    };
    // Surplus per bucket: which of its children go, unplaced ones first (no runner exists),
    // then the oldest. Never one a job in progress names.
    let mut surplus: HashSet<&ChildId> = HashSet::new();
    // How many of a bucket's idle children are surplus: none while it has jobs queued.
    let spare = |b: usize| -> usize {
        let (bucket, lent) = (&buckets[b], lent[b]);
        if bucket.queued > 0 {
            return 0;
        }
        // Runners counted for a narrower bucket's queued jobs are about to take them.
        (bucket.supply - bucket.running()).saturating_sub(lent) as usize
    };
    // Only the idle children of buckets with some to spare are gathered, as (bucket, child):
    // most buckets have jobs queued, and a list per bucket in a map cost an allocation and a
    // keyed hash for each of thousands of buckets, only to be thrown away.
    let mut idle_of_spare: Vec<(usize, &Child)> = Vec::new();
    // A reading carried from an earlier tick may miss that a job was taken or cancelled
    // since: no runner is taken back on it.
    let demand_known = |repo: &Option<usize>| {
        repo.is_some_and(|r| slots[r].queue_gap.is_none() && slots[r].read_earlier_at.is_none())
    };
    for (child, repo, bucket) in flight {
        // Taken back already: stopped by its own rule below, never counted as surplus.
        if deregistered.contains_key(&child.id) {
            continue;
        }
        // A child the planner cannot attribute to a bucket of a readable queue has no demand
        // it could serve: a leftover of a repo that left the document, or of an edit.
        let demand_known = demand_known(repo);
        let bucket = match (bucket, demand_known) {
            (Some(b), true) => Some(*b),
            (_, true) => None,
            (_, false) if repo.is_some_and(|r| slots[r].config.is_some()) => continue,
            _ => None,
        };
        if busy(child) {
            continue;
        }
        match bucket {
            // No bucket, so no demand: every idle one is surplus.
            None => {
                surplus.insert(&child.id);
            }
            Some(b) if spare(b) > 0 => idle_of_spare.push((b, child)),
            Some(_) => {}
        }
    }
    // By bucket, and within one the order its own list was sorted in: unplaced ones first,
    // then the oldest.
    idle_of_spare.sort_by_key(|(b, c)| (*b, c.placement.is_placed(), c.submitted_at, &c.id));
    for idle in idle_of_spare.chunk_by(|x, y| x.0 == y.0) {
        let excess = spare(idle[0].0);
        surplus.extend(idle.iter().take(excess).map(|(_, c)| &c.id));
    }

    let mut out = Vec::new();
    for (child, repo, bucket) in flight {
        let config = repo.and_then(|r| slots[r].config);
        let mut child_policy = policy;
        if let (Some(config), Some(Some(profile))) = (config, bucket.map(|b| profile_of[b]))
            && let Some(bound) = config.profiles[profile].hard_bound
        {
            child_policy.hard_bound = bound;
        }
        let age = age_of(child);
        let placed = child.placement.is_placed();
        let running_for = child
            .placed_at
            .and_then(|at| (now - at).to_std().ok())
            .filter(|_| placed)
            .unwrap_or(age);
        let app = config.is_some_and(|c| matches!(c.mode, Mode::App));
        let nomination = if !placed && age >= child_policy.placement_timeout {
            Nomination::PlacementTimeout
        } else if running_for >= child_policy.hard_bound {
            Nomination::Wedged
        } else if let Some(deleted_at) = deregistered.get(&child.id) {
            // A job it took just before the delete landed shows in a listing only after a
            // lag: the child is stopped on a reading of this tick that the lag could not hide
            // such a job from, never on one from an earlier tick.
            let read_after_lag = (now - *deleted_at)
                .to_std()
                .is_ok_and(|since| since >= child_policy.job_listing_lag);
            if busy(child) || !demand_known(repo) || !read_after_lag {
                continue;
            }
            Nomination::Deregistered
        } else if surplus.contains(&child.id) {
            Nomination::Surplus
        } else if app
            && !busy(child)
            // Issue 19, defect 2: "no job names it" means something only on a queue reading
            // of this tick; with the reading missing or carried, a runner whose registration
            // went while it took a job has no busy signal left.
            && demand_known(repo)
            && child
                .placed_at
                .and_then(|at| (now - at).to_std().ok())
                .is_some_and(|placed_for| placed_for >= child_policy.orphan_grace)
        {
            // Counted from placement: a runner cannot register before its allocation runs.
            Nomination::Unregistered
        } else {
            continue;
        };
        out.push(Nominated {
            child: child.id.clone(),
            nomination,
            repo: config.map(|c| c.repo.clone()),
            // A child of a repo outside the document has no bucket: its meta still says.
            labels: match bucket {
                Some(b) => Some(label_sets.get(buckets[*b].labels).clone()),
                None => child
                    .labels
                    .as_deref()
                    .and_then(|m| LabelSet::from_meta(m).ok()),
            },
            runner: child.runner_name.clone(),
            api: if app {
                RunnerApi::Registrations
            } else {
                RunnerApi::None
            },
            allocation: if placed {
                Allocation::Live
            } else {
                Allocation::None
            },
            age,
            running_for,
            policy: child_policy,
        });
    }
    out.sort_by(|a, b| a.child.cmp(&b.child));
    out
}

/// The tightest of the caps that apply to a bucket.
fn tightest_cap(
    repo: &RepoConfig,
    route: Option<&Result<Route, Unroutable>>,
    settings: PlanSettings,
) -> u32 {
    let profile_cap = route
        .and_then(|r| r.as_ref().ok())
        .and_then(|r| r.profile)
        .and_then(|i| repo.profiles[i].max_concurrent);
    [
        Some(repo.max_concurrent),
        profile_cap,
        settings.max_in_flight,
    ]
    .into_iter()
    .flatten()
    .min()
    .unwrap_or(repo.max_concurrent)
}

/// The first listing gap among `parents`, in the order given, as a message.
fn first_parent_gap<'a>(
    snapshot: &Snapshot,
    parents: impl IntoIterator<Item = &'a String>,
) -> Option<String> {
    parents
        .into_iter()
        .find_map(|parent| parent_gap(snapshot, parent))
}

/// Whether any repo of the document can dispatch `parent`: [`Config::parents`] contains it.
fn names_parent(config: &Config, parent: &str) -> bool {
    config.repos.values().any(|repo| {
        repo.default_job.as_deref() == Some(parent) || repo.profiles.iter().any(|p| p.job == parent)
    })
}

/// Why `parent`'s children are not known this tick, if they are not.
fn parent_gap(snapshot: &Snapshot, parent: &str) -> Option<String> {
    match snapshot.parents.get(parent) {
        Some(Ok(_)) => None,
        Some(Err(gap)) => Some(format!("list children of {parent}: {}", gap.message)),
        None => Some(format!("children of {parent} were not listed")),
    }
}

/// The first listing gap among the parents a repo can use, in name order (the order of
/// [`RepoConfig::parents`], without building that set).
fn repo_parent_gap(snapshot: &Snapshot, repo: &RepoConfig) -> Option<String> {
    repo.profiles
        .iter()
        .map(|p| p.job.as_str())
        .chain(repo.default_job.as_deref())
        .filter(|parent| !matches!(snapshot.parents.get(*parent), Some(Ok(_))))
        .min()
        .and_then(|parent| parent_gap(snapshot, parent))
}

/// What every bucket's hold is decided from.
struct HoldFacts<'a> {
    holds: &'a Holds,
    /// `holds.parents`, looked up without building an owned key per bucket.
    parent_holds: HashMap<(&'a str, &'a RepoName), &'a str>,
    settings: PlanSettings,
    /// The first parent listing that failed, if any.
    global_gap: Option<String>,
    /// The first failed listing of a parent the document no longer names but that still
    /// holds children of ours (an edit moved its repos elsewhere): those children may belong
    /// to any repo, so none may dispatch without them counted.
    lingering_gap: Option<String>,
    /// Why children of parents the document does not name may be missing from the counts.
    undiscovered: Option<String>,
}

/// What stops a bucket from dispatching regardless of caps, in order of precedence.
fn hold_before_caps(
    missing: u32,
    slot: &RepoSlot<'_>,
    route: Option<&Result<Route, Unroutable>>,
    facts: &HoldFacts<'_>,
) -> Option<HoldReason> {
    let Some(repo) = slot.config else {
        return Some(HoldReason::NotConfigured);
    };
    // The document keys each repo by its own name, so the slot's queue is `repo.repo`'s.
    if let Some(gap) = slot.queue_gap {
        return Some(HoldReason::QueueUnknown(gap.message.clone()));
    }
    let route = match route {
        Some(Ok(route)) => route,
        Some(Err(why)) => return Some(HoldReason::Unroutable(why.to_string())),
        None => return Some(HoldReason::NotConfigured),
    };
    if missing == 0 {
        return None;
    }
    // Never dispatch on a queue reading from an earlier tick: a job it shows queued may have
    // been taken, and its runner may have left, since.
    if let Some(read_at) = slot.read_earlier_at {
        return Some(HoldReason::NotPolled { read_at });
    }
    // Never dispatch without a fresh in-flight count: every parent of the repo counts
    // against its cap, and every parent listed counts against the global cap.
    if let Some(gap) = &slot.parent_gap {
        return Some(HoldReason::InFlightUnknown(gap.clone()));
    }
    if let Some(gap) = &facts.undiscovered {
        return Some(HoldReason::InFlightUnknown(gap.clone()));
    }
    if let Some(gap) = &facts.lingering_gap {
        return Some(HoldReason::InFlightUnknown(gap.clone()));
    }
    if facts.settings.max_in_flight.is_some()
        && let Some(gap) = &facts.global_gap
    {
        return Some(HoldReason::InFlightUnknown(gap.clone()));
    }
    if let Some(why) = &facts.holds.paused {
        return Some(HoldReason::PausedByOperator(why.clone()));
    }
    if repo.max_concurrent == 0 {
        return Some(HoldReason::Paused);
    }
    if let Some(why) = facts.holds.repos.get(&repo.repo) {
        return Some(HoldReason::Held(why.clone()));
    }
    if let Some(why) = facts.parent_holds.get(&(route.parent.as_str(), &repo.repo)) {
        return Some(HoldReason::Held(why.to_string()));
    }
    None
}

#[cfg(test)]
mod agreement;
#[cfg(test)]
mod reap_table;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
