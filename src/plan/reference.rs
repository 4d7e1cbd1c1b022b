//! The planner as first written: ordered maps keyed by repo and bucket, one pass per concern.
//!
//! Kept only for tests, as the plain formulation the indexed planner in `mod.rs` must agree
//! with on every input (see `agreement.rs`).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};

use super::hands_off::HandsOff;
use super::{
    BucketPlan, HoldReason, Holds, Plan, PlanInput, PlanSettings, PlannedDispatch, UnroutableJob,
    UnroutableReason,
};
use crate::config::{RepoConfig, Route, Unroutable};
use crate::model::{BucketKey, LabelSet, RepoName, RunnerName};
use crate::observe::{JobState, Snapshot};

/// Counters of our in-flight children along each cap.
#[derive(Default)]
struct InFlight {
    total: u32,
    per_repo: BTreeMap<RepoName, u32>,
    per_profile: BTreeMap<(RepoName, usize), u32>,
    per_bucket: BTreeMap<BucketKey, u32>,
    /// Those whose allocation runs.
    placed_per_bucket: BTreeMap<BucketKey, u32>,
    /// runner name → the bucket of the child it runs in.
    runners: BTreeMap<RunnerName, BucketKey>,
}

#[derive(Default)]
struct Demand {
    /// (when queued, job id) of each queued job.
    queued: Vec<(DateTime<Utc>, u64)>,
    in_progress: u32,
    /// Forgejo jobs claimed by a runner it does not name.
    claimed: u32,
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
        credential_ttl: super::credential_ttl(settings.reap.placement_timeout),
        ..Plan::default()
    };

    // Supply, counted from Nomad's own listing.
    let mut in_flight = InFlight::default();
    let hands_off = HandsOff::new(config, settings.vault_children_cleanup);
    for ours in snapshot.our_children() {
        let child = ours.child;
        if !child.holds_slot() {
            let repo = ours.repo.as_ref().and_then(|r| config.repos.get(r));
            if !hands_off.covers(repo, &child.id) {
                out.purges.push(child.id.clone());
            }
            continue;
        }
        in_flight.total += 1;
        let Some(repo) = ours.repo else { continue };
        *in_flight.per_repo.entry(repo.clone()).or_default() += 1;
        let Some(labels) = ours.labels else { continue };
        if let Some(Ok(Route {
            profile: Some(index),
            ..
        })) = config.repos.get(&repo).map(|r| r.route(&labels))
        {
            *in_flight
                .per_profile
                .entry((repo.clone(), index))
                .or_default() += 1;
        }
        let key = BucketKey { repo, labels };
        *in_flight.per_bucket.entry(key.clone()).or_default() += 1;
        if child.placement.is_placed() {
            *in_flight.placed_per_bucket.entry(key.clone()).or_default() += 1;
        }
        if let Some(name) = &child.runner_name {
            in_flight.runners.insert(name.clone(), key);
        }
    }
    out.in_flight_total = in_flight.total;
    out.purges.sort();

    // Demand, from the forges.
    let mut demand: BTreeMap<BucketKey, Demand> = BTreeMap::new();
    for (repo, listing) in &snapshot.repos {
        let Ok(listing) = listing else { continue };
        for job in &listing.jobs {
            let labels = match LabelSet::parse(&job.labels) {
                Ok(labels) => labels,
                Err(why) => {
                    if job.state == JobState::Queued {
                        out.unroutable.push(UnroutableJob {
                            repo: repo.clone(),
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
                    let key = BucketKey {
                        repo: repo.clone(),
                        labels,
                    };
                    // The loop fills in first sightings; a job without one sorts as if queued now.
                    let queued_at = job.queued_at.unwrap_or(now);
                    demand
                        .entry(key)
                        .or_default()
                        .queued
                        .push((queued_at, job.id));
                }
                // A job counts in the bucket of the runner that runs it, which may differ
                // from its own labels when a runner with more labels took it.
                JobState::InProgress { runner: Some(name) } => {
                    if let Some(key) = in_flight.runners.get(name)
                        && &key.repo == repo
                    {
                        demand.entry(key.clone()).or_default().in_progress += 1;
                    }
                }
                JobState::InProgress { runner: None } => {}
                JobState::Claimed => {
                    let key = BucketKey {
                        repo: repo.clone(),
                        labels,
                    };
                    demand.entry(key).or_default().claimed += 1;
                }
            }
        }
    }

    // Every bucket that has demand or supply.
    let keys: BTreeSet<BucketKey> = demand
        .keys()
        .chain(in_flight.per_bucket.keys())
        .cloned()
        .collect();
    let global_gap = first_parent_gap(snapshot, snapshot.parents.keys());
    let named = config.parents();
    let lingering_gap = first_parent_gap(
        snapshot,
        snapshot.parents.keys().filter(|p| !named.contains(*p)),
    );
    // Each repo's parents are checked once, not once per bucket.
    let facts = HoldFacts {
        snapshot,
        holds,
        settings,
        global_gap: global_gap.as_deref(),
        lingering_gap: lingering_gap.as_deref(),
    };
    let repo_gaps: BTreeMap<&RepoName, Option<String>> = config
        .repos
        .iter()
        .map(|(name, repo)| (name, first_parent_gap(snapshot, repo.parents().iter())))
        .collect();

    struct Candidate {
        index: usize,
        profile: Option<usize>,
        /// When the job each missing runner would serve was queued, oldest first.
        serves: Vec<DateTime<Utc>>,
    }
    let mut candidates = Vec::new();
    let covered = covered_by_wider(&keys, &demand, &in_flight);
    for key in keys {
        let covered_by_wider = covered.get(&key).copied().unwrap_or(0);
        let mut d = demand.remove(&key).unwrap_or_default();
        d.queued.sort_unstable();
        let supply = in_flight.per_bucket.get(&key).copied().unwrap_or(0);
        // Forgejo names no runner on a job: a claimed job is assumed to run on one of its
        // bucket's children, up to their number, so a job on someone else's runner never
        // makes us dispatch. A child runs one job at a time, so however many jobs a forge
        // says run on the bucket's children, no more than their number do.
        let in_progress = (d.in_progress + d.claimed.min(supply)).min(supply);
        let queued = d.queued.len() as u32;
        let missing = (queued + in_progress).saturating_sub(supply) - covered_by_wider;
        let repo_config = config.repos.get(&key.repo);
        let route = repo_config.map(|r| r.route(&key.labels));
        let mut bucket = BucketPlan {
            parent: route
                .as_ref()
                .and_then(|r| r.as_ref().ok())
                .map(|r| r.parent.clone()),
            queued,
            in_progress,
            in_flight: supply,
            // Fed no deregistered children (`agreement.rs`): their rules are tabled in
            // `tests.rs`.
            deregistered: 0,
            // Nor stopped children whose allocation still runs.
            stopping: 0,
            covered_by_wider,
            cap: repo_config.map(|r| tightest_cap(r, route.as_ref(), settings)),
            missing,
            to_dispatch: 0,
            reason: None,
            oldest_queued_at: d.queued.first().map(|(t, _)| *t),
            oldest_wait_s: d
                .queued
                .first()
                .map(|(t, _)| (now - *t).num_seconds().max(0) as u64),
            key,
        };
        if let Some(Err(why)) = &route {
            out.unroutable
                .extend(d.queued.iter().map(|(_, id)| UnroutableJob {
                    repo: bucket.key.repo.clone(),
                    job_id: *id,
                    reason: UnroutableReason::NoRoute(why.clone()),
                }));
        }
        let hold = hold_before_caps(
            &bucket,
            repo_config,
            route.as_ref(),
            &facts,
            repo_gaps.get(&bucket.key.repo).cloned().flatten(),
        );
        if let Some(reason) = hold {
            bucket.reason = Some(reason);
        } else if missing == 0 && covered_by_wider > 0 {
            bucket.reason = Some(HoldReason::CoveredByWider {
                runners: covered_by_wider,
            });
        } else if missing == 0 {
            bucket.reason = Some(HoldReason::Satisfied);
        } else if let Some(Ok(route)) = route {
            let first = d.queued.len() - missing as usize;
            candidates.push(Candidate {
                index: out.buckets.len(),
                profile: route.profile,
                serves: d.queued[first..].iter().map(|(t, _)| *t).collect(),
            });
        }
        out.buckets.push(bucket);
    }

    out.unroutable
        .sort_by(|a, b| (&a.repo, a.job_id).cmp(&(&b.repo, b.job_id)));

    // Share the caps: every missing runner in the order of the job it would serve.
    let mut units: Vec<(DateTime<Utc>, usize)> = candidates
        .iter()
        .enumerate()
        .flat_map(|(c, cand)| cand.serves.iter().map(move |t| (*t, c)))
        .collect();
    // Ties are broken by bucket order, which is deterministic (the order of bucket keys).
    units.sort_by_key(|(t, c)| (*t, candidates[*c].index));
    let mut repo_used = in_flight.per_repo.clone();
    let mut profile_used = in_flight.per_profile.clone();
    let mut total_used = in_flight.total;
    for (_, c) in units {
        let cand = &candidates[c];
        let bucket = &mut out.buckets[cand.index];
        let repo_config = &config.repos[&bucket.key.repo];
        let repo_now = repo_used.entry(bucket.key.repo.clone()).or_default();
        let blocked = if settings.max_in_flight.is_some_and(|cap| total_used >= cap) {
            Some(HoldReason::GlobalCap)
        } else if *repo_now >= repo_config.max_concurrent {
            Some(HoldReason::RepoCap)
        } else if let Some(index) = cand.profile
            && let Some(cap) = repo_config.profiles[index].max_concurrent
            && profile_used
                .get(&(bucket.key.repo.clone(), index))
                .copied()
                .unwrap_or(0)
                >= cap
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
                *repo_now += 1;
                total_used += 1;
                if let Some(index) = cand.profile {
                    *profile_used
                        .entry((bucket.key.repo.clone(), index))
                        .or_default() += 1;
                }
                bucket.to_dispatch += 1;
                out.dispatches.push(PlannedDispatch {
                    bucket: bucket.key.clone(),
                    parent: bucket.parent.clone().expect("candidates have a route"),
                });
            }
        }
    }
    out
}

/// Per bucket, its missing runners that spare placed runners of a wider label set of the same
/// repo cover: narrower buckets borrow in key order, from wider buckets in key order, after
/// claimed jobs that no child of their own bucket accounts for have been set against the
/// wider buckets that could be running them.
fn covered_by_wider(
    keys: &BTreeSet<BucketKey>,
    demand: &BTreeMap<BucketKey, Demand>,
    in_flight: &InFlight,
) -> BTreeMap<BucketKey, u32> {
    let count =
        |map: &BTreeMap<BucketKey, u32>, key: &BucketKey| map.get(key).copied().unwrap_or(0);
    // (supply, running, queued, claimed) of a bucket.
    let load = |key: &BucketKey| {
        let supply = count(&in_flight.per_bucket, key);
        let d = demand.get(key);
        let in_progress = d.map_or(0, |d| d.in_progress);
        let claimed = d.map_or(0, |d| d.claimed);
        let running = (in_progress + claimed.min(supply)).min(supply);
        let queued = d.map_or(0, |d| d.queued.len() as u32);
        (supply, running, queued, claimed)
    };
    let mut lendable: BTreeMap<&BucketKey, u32> = keys
        .iter()
        .map(|key| {
            let (supply, running, queued, _) = load(key);
            let placed = count(&in_flight.placed_per_bucket, key);
            let spare = supply.saturating_sub(queued + running);
            (key, spare.min(placed.saturating_sub(running)))
        })
        .collect();
    let wider = |narrow: &BucketKey, wide: &BucketKey| {
        narrow != wide && narrow.repo == wide.repo && narrow.labels.is_subset(&wide.labels)
    };
    for claimed_key in keys {
        let (supply, _, _, claimed) = load(claimed_key);
        let mut withheld = claimed.saturating_sub(supply);
        for wide in keys {
            if wider(claimed_key, wide) {
                let spare = lendable.get_mut(wide).expect("every key is in");
                let take = withheld.min(*spare);
                *spare -= take;
                withheld -= take;
            }
        }
    }
    let mut covered = BTreeMap::new();
    for narrow in keys {
        let (supply, running, queued, _) = load(narrow);
        let mut short = (queued + running).saturating_sub(supply);
        for wide in keys {
            if wider(narrow, wide) {
                let spare = lendable.get_mut(wide).expect("every key is in");
                let take = short.min(*spare);
                *spare -= take;
                short -= take;
                *covered.entry(narrow.clone()).or_default() += take;
            }
        }
    }
    covered
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

/// The first listing gap among `parents`, as a message.
fn first_parent_gap<'a>(
    snapshot: &Snapshot,
    parents: impl IntoIterator<Item = &'a String>,
) -> Option<String> {
    parents
        .into_iter()
        .find_map(|parent| match snapshot.parents.get(parent) {
            Some(Ok(_)) => None,
            Some(Err(gap)) => Some(format!("list children of {parent}: {}", gap.message)),
            None => Some(format!("children of {parent} were not listed")),
        })
}

/// What every bucket's hold is decided from.
#[derive(Clone, Copy)]
struct HoldFacts<'a> {
    snapshot: &'a Snapshot,
    holds: &'a Holds,
    settings: PlanSettings,
    /// The first parent listing that failed, if any.
    global_gap: Option<&'a str>,
    /// The first failed listing of a parent no repo of the document names.
    lingering_gap: Option<&'a str>,
}

/// What stops a bucket from dispatching regardless of caps, in order of precedence.
fn hold_before_caps(
    bucket: &BucketPlan,
    repo: Option<&RepoConfig>,
    route: Option<&Result<Route, Unroutable>>,
    facts: &HoldFacts<'_>,
    repo_gap: Option<String>,
) -> Option<HoldReason> {
    let HoldFacts {
        snapshot,
        holds,
        settings,
        global_gap,
        lingering_gap,
    } = *facts;
    let Some(repo) = repo else {
        return Some(HoldReason::NotConfigured);
    };
    if let Some(Err(gap)) = snapshot.repos.get(&repo.repo) {
        return Some(HoldReason::QueueUnknown(gap.message.clone()));
    }
    let route = match route {
        Some(Ok(route)) => route,
        Some(Err(why)) => return Some(HoldReason::Unroutable(why.to_string())),
        None => return Some(HoldReason::NotConfigured),
    };
    if bucket.missing == 0 {
        return None;
    }
    // Never dispatch without a fresh in-flight count: every parent of the repo counts
    // against its cap, and every parent listed counts against the global cap.
    if let Some(gap) = repo_gap {
        return Some(HoldReason::InFlightUnknown(gap));
    }
    if let Some(gap) = lingering_gap {
        return Some(HoldReason::InFlightUnknown(gap.to_string()));
    }
    if settings.max_in_flight.is_some()
        && let Some(gap) = global_gap
    {
        return Some(HoldReason::InFlightUnknown(gap.to_string()));
    }
    if let Some(why) = &holds.paused {
        return Some(HoldReason::PausedByOperator(why.clone()));
    }
    if repo.max_concurrent == 0 {
        return Some(HoldReason::Paused);
    }
    if let Some(why) = holds.repos.get(&repo.repo) {
        return Some(HoldReason::Held(why.clone()));
    }
    if let Some(why) = holds
        .parents
        .get(&(route.parent.clone(), repo.repo.clone()))
    {
        return Some(HoldReason::Held(why.clone()));
    }
    None
}
