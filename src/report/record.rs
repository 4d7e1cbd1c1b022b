//! Counts what one tick saw and did into [`Metrics`]: the metric side of the report step, fed
//! from the same plan, view and act report as the log lines.
//!
//! Label values come from repos, parent jobs, label sets and fixed outcome words only; the
//! runner names, child ids and job ids these structures also carry are never read here.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::TickView;
use crate::act::execute::{ActReport, DispatchOutcome, PurgeOutcome};
use crate::metrics::{
    BucketFacts, BucketLabels, CrashLabels, FailureLabels, Metrics, OutcomeLabels, ParentLabels,
    ReapLabels, RepoLabels, ResultLabels,
};
use crate::model::{BucketKey, RepoName};
use crate::observe::Snapshot;
use crate::plan::{CrashBackoff, HoldReason, Plan};

/// Whether a tick read Nomad and at least one forge: the discovery of our children's parents
/// has succeeded, some parent listing (if any parent is known) and some queue (if any repo is
/// configured) answered.
pub fn observed_nomad_and_forge(snapshot: &Snapshot) -> bool {
    let nomad = snapshot.undiscovered.is_none()
        && (snapshot.parents.is_empty() || snapshot.parents.values().any(Result::is_ok));
    let forge = snapshot.repos.is_empty() || snapshot.repos.values().any(Result::is_ok);
    nomad && forge
}

/// A bucket's cap, not a fault, holds its queued jobs back.
fn held_by_cap(reason: Option<&HoldReason>) -> bool {
    matches!(
        reason,
        Some(
            HoldReason::ProfileCap
                | HoldReason::RepoCap
                | HoldReason::GlobalCap
                | HoldReason::Paused
                | HoldReason::NotConfigured
        )
    )
}

/// Everything one acting tick recorded.
pub struct TickRecord<'a> {
    pub plan: &'a Plan,
    pub view: &'a TickView,
    pub act: &'a ActReport,
    pub crash_backoff: &'a BTreeMap<BucketKey, CrashBackoff>,
    /// Waits of jobs first seen in progress this tick (queued → started).
    pub started_waits: &'a [(RepoName, Duration)],
    pub observed_nomad_and_forge: bool,
    /// When the tick started, and how long it took.
    pub now: DateTime<Utc>,
    pub took: Duration,
}

/// Records one acting tick: gauges are set anew (a bucket that is gone leaves no series),
/// counters and histograms grow by what this tick did.
pub fn record_tick(metrics: &Metrics, tick: &TickRecord<'_>) {
    let TickRecord {
        plan, view, act, ..
    } = tick;
    metrics.queued.clear();
    metrics.in_progress.clear();
    metrics.in_flight.clear();
    metrics.oldest_queued_age.clear();
    let mut oldest_per_repo: BTreeMap<&str, u64> = BTreeMap::new();
    for b in &view.buckets {
        let labels = BucketLabels {
            repo: b.repo.clone(),
            parent: b.parent.clone().unwrap_or_default(),
            labels: b.labels.clone(),
        };
        metrics.queued.get_or_create(&labels).set(b.queued.into());
        metrics
            .in_progress
            .get_or_create(&labels)
            .set(b.in_progress.into());
        metrics
            .in_flight
            .get_or_create(&labels)
            .set(b.in_flight.into());
        let oldest = oldest_per_repo.entry(&b.repo).or_default();
        *oldest = (*oldest).max(b.oldest_wait_s.unwrap_or(0));
    }
    for (repo, age_s) in oldest_per_repo {
        metrics
            .oldest_queued_age
            .get_or_create(&RepoLabels { repo: repo.into() })
            .set(i64::try_from(age_s).unwrap_or(i64::MAX));
    }

    // The oldest wait of each bucket, for the runners dispatched for it.
    let oldest_wait: BTreeMap<(&str, &str), u64> = view
        .buckets
        .iter()
        .filter_map(|b| Some(((b.repo.as_str(), b.labels.as_str()), b.oldest_wait_s?)))
        .collect();
    for d in &act.dispatches {
        match d {
            DispatchOutcome::Dispatched {
                bucket,
                parent,
                credential,
                deduplicated,
                ..
            } => {
                let labels = ParentLabels {
                    repo: bucket.repo.to_string(),
                    parent: parent.clone(),
                };
                if *deduplicated {
                    metrics.dispatches_deduplicated.get_or_create(&labels).inc();
                    continue;
                }
                metrics.dispatches.get_or_create(&labels).inc();
                if credential.is_some() {
                    metrics
                        .credential_mints
                        .get_or_create(&ResultLabels {
                            repo: labels.repo.clone(),
                            result: "ok".into(),
                        })
                        .inc();
                }
                let key = (labels.repo.as_str(), bucket.labels.to_meta());
                if let Some(wait_s) = oldest_wait.get(&(key.0, key.1.as_str())) {
                    metrics
                        .wait_dispatched
                        .get_or_create(&RepoLabels {
                            repo: labels.repo.clone(),
                        })
                        .observe(*wait_s as f64);
                }
            }
            DispatchOutcome::MintFailed { bucket, parent, .. } => {
                metrics
                    .credential_mints
                    .get_or_create(&ResultLabels {
                        repo: bucket.repo.to_string(),
                        result: "failed".into(),
                    })
                    .inc();
                count_failure(metrics, &bucket.repo, parent, "mint");
            }
            DispatchOutcome::DispatchFailed { bucket, parent, .. } => {
                count_failure(metrics, &bucket.repo, parent, "dispatch")
            }
            DispatchOutcome::Skipped { .. } => {}
        }
    }
    for (repo, wait) in tick.started_waits {
        metrics
            .wait_started
            .get_or_create(&RepoLabels {
                repo: repo.to_string(),
            })
            .observe(wait.as_secs_f64());
    }
    for p in &act.purges {
        let outcome = match p {
            PurgeOutcome::Purged(_) => "purged",
            PurgeOutcome::Vetoed(..) => "vetoed",
            PurgeOutcome::Gone(_) => "gone",
            PurgeOutcome::Failed(..) => "failed",
        };
        metrics
            .purges
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .inc();
    }
    for r in &view.reaps {
        metrics
            .reap_decisions
            .get_or_create(&ReapLabels {
                outcome: r.outcome.into(),
                verdict: r.verdict.into(),
            })
            .inc();
    }

    metrics.failed_starts.clear();
    metrics.crash_backoff.clear();
    for (key, backoff) in tick.crash_backoff {
        let labels = CrashLabels {
            repo: key.repo.to_string(),
            labels: key.labels.to_meta(),
        };
        metrics
            .failed_starts
            .get_or_create(&labels)
            .set(backoff.failed_starts.into());
        metrics.crash_backoff.get_or_create(&labels).set(1);
    }

    let mut seen = BTreeSet::new();
    let buckets = plan
        .buckets
        .iter()
        .filter(|b| seen.insert(&b.key))
        .map(|b| BucketFacts {
            repo: b.key.repo.to_string(),
            labels: b.key.labels.to_meta(),
            oldest_queued_at: (b.queued > 0).then_some(b.oldest_queued_at).flatten(),
            held_by_cap: held_by_cap(b.reason.as_ref()),
        })
        .collect();
    metrics.observed(tick.now, tick.observed_nomad_and_forge, buckets);
    metrics.tick_ended(crate::clock::after(tick.now, tick.took), tick.took);
    // The `poll complete` line is written before the tick's length is known; this one
    // comes after it, for whoever times ticks from the log (`simulate --bench-process`).
    tracing::debug!(
        tick_ms = u64::try_from(tick.took.as_millis()).unwrap_or(u64::MAX),
        "tick recorded"
    );
}

fn count_failure(metrics: &Metrics, repo: &RepoName, parent: &str, stage: &str) {
    metrics
        .dispatch_failures
        .get_or_create(&FailureLabels {
            repo: repo.to_string(),
            parent: parent.to_string(),
            stage: stage.into(),
        })
        .inc();
}

/// Counts each rejected document the config watcher publishes, until the watcher stops. A
/// rejection is counted once however often the same state is published.
pub async fn count_config_rejections(
    metrics: std::sync::Arc<Metrics>,
    mut config: tokio::sync::watch::Receiver<crate::config::watch::ConfigState>,
) {
    let mut last = Vec::new();
    loop {
        {
            let state = config.borrow_and_update();
            if !state.errors.is_empty() && state.errors != last {
                metrics.count_config_reload_error();
            }
            last.clone_from(&state.errors);
        }
        if config.changed().await.is_err() {
            return;
        }
    }
}
