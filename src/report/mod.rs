//! Report: the one place that turns decisions into log lines and output.
//!
//! Nothing here ever receives a secret: outcomes carry runner names, child ids and classified
//! error messages, and the registration token stays inside the act step.

pub mod live;
pub mod record;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tracing::{debug, info, warn};

use crate::act::execute::{ActReport, DispatchOutcome, PurgeOutcome, ReapOutcome};
use crate::plan::reap::{Judgement, Outcome};
use crate::plan::{BucketPlan, Plan, UnroutableJob};

/// One bucket, as shown by `once --dry-run`, `status` and `--json`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct BucketView {
    pub repo: String,
    pub labels: String,
    pub parent: Option<String>,
    pub queued: u32,
    pub in_progress: u32,
    pub in_flight: u32,
    /// Missing runners that spare runners of a wider label set cover.
    pub covered_by_wider: u32,
    pub cap: Option<u32>,
    pub missing: u32,
    pub to_dispatch: u32,
    pub reason: Option<String>,
    pub oldest_wait_s: Option<u64>,
    /// When the daemon last dispatched a runner for the bucket (since it started).
    pub last_dispatch_at: Option<DateTime<Utc>>,
    /// The bucket's crash-loop backoff, while its runners keep failing to start.
    pub crash_backoff: Option<BackoffView>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct BackoffView {
    pub failed_starts: u32,
    pub next_dispatch_at: DateTime<Utc>,
}

impl From<&BucketPlan> for BucketView {
    fn from(b: &BucketPlan) -> BucketView {
        BucketView {
            repo: b.key.repo.to_string(),
            labels: b.key.labels.to_meta(),
            parent: b.parent.clone(),
            queued: b.queued,
            in_progress: b.in_progress,
            in_flight: b.in_flight,
            covered_by_wider: b.covered_by_wider,
            cap: b.cap,
            missing: b.missing,
            to_dispatch: b.to_dispatch,
            reason: b.reason.as_ref().map(ToString::to_string),
            oldest_wait_s: b.oldest_wait_s,
            last_dispatch_at: None,
            crash_backoff: None,
        }
    }
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct DispatchView {
    pub repo: String,
    pub parent: String,
    pub labels: String,
    pub runner_name: Option<String>,
    pub child: Option<String>,
    pub minted: Option<bool>,
    /// What was minted: "JIT config", "registration token", or none.
    pub credential: Option<&'static str>,
    pub outcome: &'static str,
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct PurgeView {
    pub child: String,
    pub outcome: String,
}

/// One nominated child: what the signals said, what was decided and (unless a dry run) done.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ReapView {
    pub child: String,
    pub repo: Option<String>,
    pub labels: Option<String>,
    pub runner_name: Option<String>,
    pub nomination: &'static str,
    pub verdict: &'static str,
    /// reaped, replaced, escaped, vetoed, held or kept: the decision, or what reality made
    /// of it at the moment of acting.
    pub outcome: &'static str,
    pub reason: String,
    pub age_s: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct UnroutableView {
    pub repo: String,
    pub job_id: u64,
    pub reason: String,
}

impl From<&UnroutableJob> for UnroutableView {
    fn from(u: &UnroutableJob) -> UnroutableView {
        UnroutableView {
            repo: u.repo.to_string(),
            job_id: u.job_id,
            reason: u.reason.to_string(),
        }
    }
}

/// Everything one tick decided and did: the `--json` output of `once`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq, Default)]
pub struct TickView {
    pub dry_run: bool,
    pub queued: u32,
    pub active: u32,
    pub started: u32,
    pub buckets: Vec<BucketView>,
    pub dispatches: Vec<DispatchView>,
    /// Children to purge (dry run) or what purging them did.
    pub purges: Vec<PurgeView>,
    pub unroutable: Vec<UnroutableView>,
    /// Children nominated for teardown and their fate.
    pub reaps: Vec<ReapView>,
    /// Decisions of this tick counted by `outcome/verdict`.
    pub reap_decisions: std::collections::BTreeMap<String, u32>,
    /// Children stopped this tick.
    pub stopped: u32,
    /// Sources that could not be read this tick.
    pub gaps: Vec<String>,
    /// Why nothing could be planned at all (no valid document).
    pub idle_reason: Option<String>,
    /// When the tick ran.
    pub at: Option<DateTime<Utc>>,
    /// Why every dispatch is paused by the operator's key, if it is.
    pub paused: Option<String>,
    /// Children of the parents we list that are not ours (dispatched by hand): shown, never
    /// counted or touched.
    pub foreign_children: u32,
    /// Repos whose runners get a weaker credential than one bound to a single runner, and why
    /// (a Forgejo before 15 hands every runner the repo's standing registration token).
    pub weaker_credentials: Vec<String>,
    /// Rate-limit budgets low enough that their repos are read less often, and how much.
    pub stretched_budgets: Vec<String>,
}

impl TickView {
    pub fn new(
        plan: &Plan,
        judgements: &[Judgement],
        act: Option<&ActReport>,
        gaps: Vec<String>,
    ) -> TickView {
        let dry_run = act.is_none();
        let reaps: Vec<ReapView> = judgements.iter().map(|j| reap_view(j, act)).collect();
        let mut reap_decisions = std::collections::BTreeMap::new();
        for r in &reaps {
            *reap_decisions
                .entry(format!("{}/{}", r.outcome, r.verdict))
                .or_insert(0) += 1;
        }
        let stopped = act.map_or(0, |a| {
            a.reaps
                .iter()
                .filter(|r| matches!(r, ReapOutcome::Stopped { .. }))
                .count() as u32
        });
        let dispatches = match act {
            Some(act) => act.dispatches.iter().map(dispatch_view).collect(),
            None => plan
                .dispatches
                .iter()
                .map(|d| DispatchView {
                    repo: d.bucket.repo.to_string(),
                    parent: d.parent.clone(),
                    labels: d.bucket.labels.to_meta(),
                    runner_name: None,
                    child: None,
                    minted: None,
                    credential: None,
                    outcome: "planned",
                    error: None,
                })
                .collect(),
        };
        let purges = match act {
            Some(act) => act.purges.iter().map(purge_view).collect(),
            None => plan
                .purges
                .iter()
                .map(|c| PurgeView {
                    child: c.to_string(),
                    outcome: "planned".into(),
                })
                .collect(),
        };
        TickView {
            dry_run,
            queued: plan.queued_total,
            active: plan.in_flight_total,
            started: act.map(ActReport::started).unwrap_or(0),
            buckets: plan.buckets.iter().map(BucketView::from).collect(),
            dispatches,
            purges,
            unroutable: plan.unroutable.iter().map(UnroutableView::from).collect(),
            reaps,
            reap_decisions,
            stopped,
            gaps,
            idle_reason: None,
            at: None,
            paused: None,
            foreign_children: 0,
            weaker_credentials: Vec::new(),
            stretched_budgets: Vec::new(),
        }
    }

    /// The plain-text form of a plan, for `once --dry-run` and `status`.
    pub fn render_text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        if let Some(why) = &self.idle_reason {
            let _ = writeln!(out, "nothing planned: {why}");
        }
        if let Some(why) = &self.paused {
            let _ = writeln!(out, "paused: {why}");
        }
        for budget in &self.stretched_budgets {
            let _ = writeln!(out, "budget low: {budget}");
        }
        for weaker in &self.weaker_credentials {
            let _ = writeln!(out, "weaker credential: {weaker}");
        }
        let _ = writeln!(
            out,
            "queued={} active={} {}={}",
            self.queued,
            self.active,
            if self.dry_run {
                "to_dispatch"
            } else {
                "started"
            },
            if self.dry_run {
                self.dispatches.len() as u32
            } else {
                self.started
            }
        );
        if !self.buckets.is_empty() {
            let _ = writeln!(
                out,
                "{:<32} {:<28} {:<20} {:>6} {:>8} {:>9} {:>4} {:>8}  reason",
                "REPO", "LABELS", "PARENT", "QUEUED", "PROGRESS", "IN_FLIGHT", "CAP", "DISPATCH"
            );
        }
        for b in &self.buckets {
            let _ = writeln!(
                out,
                "{:<32} {:<28} {:<20} {:>6} {:>8} {:>9} {:>4} {:>8}  {}",
                b.repo,
                b.labels,
                b.parent.as_deref().unwrap_or("-"),
                b.queued,
                b.in_progress,
                b.in_flight,
                b.cap.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
                b.to_dispatch,
                b.reason.as_deref().unwrap_or("")
            );
        }
        for b in &self.buckets {
            if let Some(backoff) = &b.crash_backoff {
                let _ = writeln!(
                    out,
                    "crash loop {} [{}]: {} failed start(s) in a row; next dispatch at {}",
                    b.repo,
                    b.labels,
                    backoff.failed_starts,
                    backoff.next_dispatch_at.to_rfc3339()
                );
            }
        }
        for r in &self.reaps {
            let _ = writeln!(
                out,
                "take back {} ({}, {}): {} - {}",
                r.child, r.nomination, r.verdict, r.outcome, r.reason
            );
        }
        for p in &self.purges {
            let _ = writeln!(out, "purge {} ({})", p.child, p.outcome);
        }
        for u in &self.unroutable {
            let _ = writeln!(
                out,
                "unroutable job {} in {}: {}",
                u.job_id, u.repo, u.reason
            );
        }
        for g in &self.gaps {
            let _ = writeln!(out, "unknown: {g}");
        }
        if self.foreign_children > 0 {
            let _ = writeln!(
                out,
                "{} foreign child(ren) (not dispatched by runner-scaler): shown, never touched",
                self.foreign_children
            );
        }
        out
    }
}

fn dispatch_view(d: &DispatchOutcome) -> DispatchView {
    match d {
        DispatchOutcome::Dispatched {
            bucket,
            parent,
            runner_name,
            child,
            credential,
            deduplicated,
            ..
        } => DispatchView {
            repo: bucket.repo.to_string(),
            parent: parent.clone(),
            labels: bucket.labels.to_meta(),
            runner_name: Some(runner_name.to_string()),
            child: Some(child.to_string()),
            minted: Some(credential.is_some()),
            credential: *credential,
            outcome: if *deduplicated {
                "deduplicated"
            } else {
                "dispatched"
            },
            error: None,
        },
        DispatchOutcome::MintFailed {
            bucket,
            parent,
            error,
        }
        | DispatchOutcome::DispatchFailed {
            bucket,
            parent,
            error,
        } => DispatchView {
            repo: bucket.repo.to_string(),
            parent: parent.clone(),
            labels: bucket.labels.to_meta(),
            runner_name: None,
            child: None,
            minted: None,
            credential: None,
            outcome: if matches!(d, DispatchOutcome::MintFailed { .. }) {
                "mint_failed"
            } else {
                "dispatch_failed"
            },
            error: Some(error.message.clone()),
        },
        DispatchOutcome::Skipped {
            bucket,
            parent,
            why,
        } => DispatchView {
            repo: bucket.repo.to_string(),
            parent: parent.clone(),
            labels: bucket.labels.to_meta(),
            runner_name: None,
            child: None,
            minted: None,
            credential: None,
            outcome: "skipped",
            error: Some(why.clone()),
        },
    }
}

/// What happens to a child whose runner's registration was deleted this tick.
const DEREGISTERED: &str = "registration deleted; the child is stopped once that has held for the idle confirmation and no job names its runner";

fn reap_view(j: &Judgement, act: Option<&ActReport>) -> ReapView {
    let n = &j.nominated;
    let acted = act.and_then(|a| {
        a.reaps.iter().find(|r| match r {
            ReapOutcome::Stopped { child, .. }
            | ReapOutcome::Deregistered { child, .. }
            | ReapOutcome::Kept { child, .. }
            | ReapOutcome::Failed { child, .. } => *child == n.child,
        })
    });
    let (outcome, reason) = match acted {
        Some(ReapOutcome::Kept { outcome, why, .. }) => (outcome.as_str(), why.clone()),
        Some(ReapOutcome::Deregistered { .. }) => ("deregistered", DEREGISTERED.to_string()),
        Some(ReapOutcome::Failed { error, .. }) => ("failed", error.message.clone()),
        _ => (j.decision.outcome.as_str(), j.decision.reason.to_string()),
    };
    ReapView {
        child: n.child.to_string(),
        repo: n.repo.as_ref().map(ToString::to_string),
        labels: n.labels.as_ref().map(|l| l.to_meta()),
        runner_name: n.runner.as_ref().map(ToString::to_string),
        nomination: n.nomination.as_str(),
        verdict: j.verdict.as_str(),
        outcome,
        reason,
        age_s: n.age.as_secs(),
    }
}

fn purge_view(p: &PurgeOutcome) -> PurgeView {
    let (child, outcome) = match p {
        PurgeOutcome::Purged(c) => (c, "purged".to_string()),
        PurgeOutcome::Vetoed(c, status) => (c, format!("vetoed: now {}", status.as_str())),
        PurgeOutcome::Gone(c) => (c, "gone".to_string()),
        PurgeOutcome::Failed(c, e) => (c, format!("failed: {}", e.message)),
    };
    PurgeView {
        child: child.to_string(),
        outcome,
    }
}

/// Logs what the act step did: one line per dispatch and per purge.
pub fn log_act(act: &ActReport) {
    for d in &act.dispatches {
        match d {
            DispatchOutcome::Dispatched {
                bucket,
                parent,
                runner_name,
                child,
                credential,
                deduplicated,
                ..
            } => {
                // A replayed idempotency token returns the existing child: not a new runner.
                let what = if *deduplicated {
                    "dispatch deduplicated: Nomad returned the existing child"
                } else {
                    "dispatched ephemeral runner"
                };
                info!(
                    repo = %bucket.repo,
                    job = %parent,
                    labels = %bucket.labels,
                    runner_name = %runner_name,
                    child = %child,
                    minted = credential.is_some(),
                    credential = credential.unwrap_or("none"),
                    "{what}"
                )
            }
            DispatchOutcome::MintFailed { error, .. }
            | DispatchOutcome::DispatchFailed { error, .. } => {
                warn!(class = error.class.as_str(), "{}", error.message)
            }
            DispatchOutcome::Skipped {
                bucket,
                parent,
                why,
            } => debug!(repo = %bucket.repo, job = %parent, "dispatch skipped: {why}"),
        }
    }
    for r in &act.reaps {
        match r {
            ReapOutcome::Stopped {
                child,
                outcome: Outcome::Escaped,
                reason,
                deregistered,
            } => warn!(
                child = %child,
                outcome = "escaped",
                deregistered = deregistered.is_some(),
                "runner escaped the veto and was stopped: {reason}"
            ),
            ReapOutcome::Stopped {
                child,
                outcome,
                reason,
                deregistered,
            } => info!(
                child = %child,
                outcome = outcome.as_str(),
                deregistered = deregistered.is_some(),
                "took a runner back: {reason}"
            ),
            ReapOutcome::Deregistered {
                child,
                outcome,
                runner_id,
            } => info!(
                child = %child,
                outcome = outcome.as_str(),
                runner_id,
                "took a runner's registration back: {DEREGISTERED}"
            ),
            ReapOutcome::Kept {
                child,
                outcome,
                why,
            } => info!(
                child = %child,
                outcome = outcome.as_str(),
                "reap vetoed at the moment of acting: {why}"
            ),
            ReapOutcome::Failed { error, .. } => {
                warn!(class = error.class.as_str(), "{}", error.message)
            }
        }
    }
    for (registration, answer) in &act.deregistrations {
        match answer {
            Ok(answer) => info!(
                repo = %registration.repo,
                runner_name = %registration.name,
                answer = ?answer,
                "deleted a stale registration of one of our runners"
            ),
            Err(error) => warn!(class = error.class.as_str(), "{}", error.message),
        }
    }
    for (registration, answer) in &act.retired {
        match answer {
            Ok(answer) => info!(
                repo = %registration.repo,
                runner_name = %registration.name,
                answer = ?answer,
                "deleted the runner registered for a purged child"
            ),
            Err(error) => warn!(class = error.class.as_str(), "{}", error.message),
        }
    }
    for p in &act.purges {
        match p {
            PurgeOutcome::Purged(child) => info!(child = %child, "purged finished runner"),
            PurgeOutcome::Vetoed(child, status) => info!(
                child = %child,
                status = status.as_str(),
                "purge vetoed: child is no longer dead"
            ),
            PurgeOutcome::Gone(child) => debug!(child = %child, "child already gone"),
            PurgeOutcome::Failed(_, error) => {
                warn!(class = error.class.as_str(), "{}", error.message)
            }
        }
    }
}

/// Logs the decisions that keep a nominated runner: a veto at INFO (a signal said it runs
/// a job), the rest at DEBUG (held for a confirmation, or not the daemon's to stop). What a
/// teardown did is logged by [`log_act`].
pub fn log_judgements(judgements: &[Judgement]) {
    for j in judgements {
        let (n, d) = (&j.nominated, &j.decision);
        if d.outcome == Outcome::Vetoed {
            info!(
                child = %n.child,
                nomination = n.nomination.as_str(),
                verdict = j.verdict.as_str(),
                outcome = d.outcome.as_str(),
                "reap nomination vetoed: {}",
                d.reason
            );
        } else if !d.outcome.tears_down() {
            debug!(
                child = %n.child,
                nomination = n.nomination.as_str(),
                verdict = j.verdict.as_str(),
                outcome = d.outcome.as_str(),
                "reap nomination kept: {}",
                d.reason
            );
        }
    }
}

/// The one line per tick.
/// Shadow mode (`run --dry-run`): what the tick would have done, a line each, then the tick.
pub fn log_shadow_tick(view: &TickView) {
    for d in &view.dispatches {
        info!(
            repo = %d.repo,
            labels = %d.labels,
            parent = %d.parent,
            "shadow mode: would dispatch a runner"
        );
    }
    for r in view.reaps.iter().filter(|r| r.outcome != "kept") {
        info!(
            child = %r.child,
            nomination = r.nomination,
            verdict = r.verdict,
            decision = r.outcome,
            "shadow mode: would take back: {}", r.reason
        );
    }
    for p in &view.purges {
        info!(child = %p.child, "shadow mode: would purge");
    }
    info!(
        "shadow poll complete queued={} active={} would_dispatch={}",
        view.queued,
        view.active,
        view.dispatches.len()
    );
}

pub fn log_tick(view: &TickView) {
    info!(
        "poll complete queued={} active={} started={}",
        view.queued, view.active, view.started
    );
}
