//! Taking runners back: the rules nominate, reality vetoes (BRIEF lesson 2).
//!
//! The planner nominates children (see [`Nomination`]); the loop then asks what it can see of
//! each nominated runner and [`decide`] turns the nomination and those readings into keep or
//! tear down. `decide` is the only place that says a runner may be destroyed, and it is pure:
//! mode, age, allocation, verdict and policy in, a decision with its reason out.
//!
//! What it never does: tear down a runner that any signal says is executing a job (unless it
//! is past the hard bound, where no job can still be legitimately running), act on one idle
//! reading, read "could not ask" as idle, or stop a runner it cannot see (`vault` and
//! `forgejo` mode) while its allocation runs.

use std::fmt;
use std::time::Duration;

/// How long things may take before the daemon takes a runner back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReapPolicy {
    /// `--orphan-grace`: a surplus child younger than this is left alone, and a runner whose
    /// state cannot be read is held this long before it escapes.
    pub orphan_grace: Duration,
    /// `--idle-confirm`: an idle or absent reading counts only when it held on two
    /// observations at least this far apart (GitHub's `busy` flag has read false for up to a
    /// minute after a job started).
    pub idle_confirm: Duration,
    /// `--job-listing-lag` ([`JOB_LISTING_LAG`] unless set): how long after a delete the
    /// queue reading a deregistered runner is stopped on must have been taken.
    pub job_listing_lag: Duration,
    /// `--hard-bound`, or the profile's `hardBoundMinutes`: a runner still busy past this age
    /// is wedged. GitHub cancels a self-hosted job after 5 days; the default adds 30 minutes.
    pub hard_bound: Duration,
    /// `--placement-timeout`: a child still unplaced this long is stopped and replaced, inside
    /// the one-hour life of a registration token.
    pub placement_timeout: Duration,
}

/// The default of `--job-listing-lag`: how long after a runner took a job that job may still
/// be missing from GitHub's job listings (a run's jobs show `in_progress` with the runner's name a few seconds after it
/// started, more under load): a child whose registration was deleted is stopped only on a
/// queue reading taken this long after the delete, in which such a job would show.
pub const JOB_LISTING_LAG: Duration = Duration::from_secs(30);

/// GitHub's limit for a job on a self-hosted runner.
pub const SELF_HOSTED_JOB_LIMIT: Duration = Duration::from_secs(5 * 24 * 3600);

impl Default for ReapPolicy {
    fn default() -> Self {
        ReapPolicy {
            orphan_grace: Duration::from_secs(10 * 60),
            idle_confirm: Duration::from_secs(2 * 60),
            job_listing_lag: JOB_LISTING_LAG,
            hard_bound: SELF_HOSTED_JOB_LIMIT + Duration::from_secs(30 * 60),
            // Ten minutes short of a registration token's hour: time to place the
            // replacement and boot it before the old token would have expired.
            placement_timeout: Duration::from_secs(50 * 60),
        }
    }
}

/// Why the rules put a child up for teardown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Nomination {
    /// Its bucket has no queued job and more in-flight children than jobs they run.
    Surplus,
    /// `app` mode: placed past the grace window, its runner named by no job in progress, in a
    /// bucket that needs it. Torn down only if its runner never registered.
    Unregistered,
    /// `app` mode: the daemon deleted its runner's registration (taking it back), so no job
    /// comes to it, and a queue reading taken [`JOB_LISTING_LAG`] after the delete names it
    /// in no job: it runs none, and only holds its slot.
    Deregistered,
    /// Still unplaced after the placement timeout: replaced before its credential expires.
    PlacementTimeout,
    /// Older than its hard bound.
    Wedged,
}

impl Nomination {
    pub fn as_str(self) -> &'static str {
        match self {
            Nomination::Surplus => "surplus",
            Nomination::Unregistered => "unregistered",
            Nomination::Deregistered => "deregistered",
            Nomination::PlacementTimeout => "placement_timeout",
            Nomination::Wedged => "wedged",
        }
    }
}

/// What the daemon can ask about a repo's runners.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RunnerApi {
    /// `app` mode: it reads and deletes the repo's runner registrations.
    Registrations,
    /// `vault` and `forgejo` mode: it has no runner API (or a repo that left the document).
    None,
}

/// The child's allocation, as last read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Allocation {
    /// Never placed, or its allocation is gone: no runner exists. The act step re-reads the
    /// allocations before stopping and vetoes if one appeared.
    None,
    /// Pending, running or on a disconnected client: a runner may exist.
    Live,
}

/// What the signals say of a nominated runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// A job in progress names the runner, or its registration reads busy.
    Busy,
    /// Registered and not busy; `confirmed` once that held on two readings `idle_confirm` apart.
    Idle { confirmed: bool },
    /// Not among the registrations of a successful listing; `confirmed` likewise.
    Absent { confirmed: bool },
    /// The signals could not be read; `held_for` since the first such reading.
    Unknown { held_for: Duration },
    /// Nothing was asked: the mode has no runner API, or the child has no allocation.
    NotAsked,
}

impl Verdict {
    /// The label a metric or a log line carries.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Busy => "busy",
            Verdict::Idle { .. } => "idle",
            Verdict::Absent { .. } => "absent",
            Verdict::Unknown { .. } => "unknown",
            Verdict::NotAsked => "not_asked",
        }
    }
}

/// Everything one decision is made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReapInput {
    pub nomination: Nomination,
    pub api: RunnerApi,
    pub allocation: Allocation,
    pub verdict: Verdict,
    /// Since the child was submitted to Nomad.
    pub age: Duration,
    /// Since it was placed (since it was submitted when that is not known): the hard bound's
    /// measure.
    pub running_for: Duration,
    pub policy: ReapPolicy,
}

/// How a decision ends, for logs and counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Torn down: verified idle, never registered, or without an allocation.
    Reaped,
    /// Torn down because it stayed unplaced past the placement timeout; replaced.
    Replaced,
    /// Torn down without the verdict a reap needs: unknown for the whole grace window, or
    /// wedged past the hard bound. Counted apart and logged at WARN.
    Escaped,
    /// Kept because a signal says it runs a job (or its allocation appeared).
    Vetoed,
    /// Kept for now: too young, or a reading still to confirm.
    Held,
    /// Kept: nothing to take back (needed, or not the daemon's to stop).
    Kept,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Reaped => "reaped",
            Outcome::Replaced => "replaced",
            Outcome::Escaped => "escaped",
            Outcome::Vetoed => "vetoed",
            Outcome::Held => "held",
            Outcome::Kept => "kept",
        }
    }

    /// Whether this outcome stops the child.
    pub fn tears_down(self) -> bool {
        matches!(self, Outcome::Reaped | Outcome::Replaced | Outcome::Escaped)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How to take a runner back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TearDown {
    /// Delete the runner's registration first and stop the child only once it is gone; a 422
    /// ("still running a job") vetoes.
    pub deregister_first: bool,
    /// An escape: stop the child even if deleting the registration is refused or fails.
    pub force: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub outcome: Outcome,
    /// `Some` exactly when the outcome tears the child down.
    pub tear_down: Option<TearDown>,
    pub reason: &'static str,
}

fn keep(outcome: Outcome, reason: &'static str) -> Decision {
    Decision {
        outcome,
        tear_down: None,
        reason,
    }
}

fn tear(outcome: Outcome, deregister_first: bool, force: bool, reason: &'static str) -> Decision {
    Decision {
        outcome,
        tear_down: Some(TearDown {
            deregister_first,
            force,
        }),
        reason,
    }
}

/// The decision for one nominated child. Pure; the table test in `reap_table.rs` lists it
/// cell by cell.
pub fn decide(input: &ReapInput) -> Decision {
    let ReapInput {
        nomination,
        api,
        allocation,
        verdict,
        age,
        running_for,
        policy,
    } = *input;
    // An unplaced child past the placement timeout is about its credential, not surplus: no
    // runner exists, so it goes at once; if an allocation appeared, its runner may exist.
    if nomination == Nomination::PlacementTimeout {
        return match allocation {
            Allocation::None => tear(
                Outcome::Replaced,
                false,
                false,
                "unplaced past the placement timeout: no runner exists, replaced before its credential expires",
            ),
            Allocation::Live => keep(
                Outcome::Vetoed,
                "an allocation appeared: its runner may exist",
            ),
        };
    }
    // Its registration is gone and a reading the lag could not hide a job from names it in
    // no job: nothing is running on it. A signal that still says busy keeps it.
    if nomination == Nomination::Deregistered {
        return match (allocation, verdict) {
            (Allocation::Live, Verdict::Busy) => {
                keep(Outcome::Vetoed, "the runner is executing a job")
            }
            (Allocation::Live, Verdict::Idle { .. }) => keep(
                Outcome::Held,
                "a registration deleted by the daemon is listed again: held",
            ),
            _ => tear(
                Outcome::Reaped,
                false,
                false,
                "its registration was deleted and no job names it in a reading taken after the job listing lag",
            ),
        };
    }
    if age < policy.orphan_grace {
        return keep(Outcome::Held, "younger than the grace window");
    }
    if allocation == Allocation::None {
        return tear(
            Outcome::Reaped,
            false,
            false,
            "no allocation: no runner exists",
        );
    }
    if api == RunnerApi::None {
        return keep(
            Outcome::Kept,
            "no runner API in this mode: a runner whose allocation runs is never stopped; it leaves at its idle timeout",
        );
    }
    let wedged = nomination == Nomination::Wedged || running_for >= policy.hard_bound;
    match verdict {
        Verdict::Busy if wedged => tear(
            Outcome::Escaped,
            true,
            true,
            "wedged: still busy past the hard bound",
        ),
        Verdict::Busy => keep(Outcome::Vetoed, "the runner is executing a job"),
        Verdict::Idle { confirmed: true } if nomination == Nomination::Unregistered => keep(
            Outcome::Kept,
            "registered and idle in a bucket that needs it: waiting for a job",
        ),
        Verdict::Idle { confirmed: true } => tear(
            Outcome::Reaped,
            true,
            false,
            "idle on two readings idle-confirm apart",
        ),
        Verdict::Absent { confirmed: true } if nomination == Nomination::Unregistered => tear(
            Outcome::Reaped,
            false,
            false,
            "its runner never registered within the grace window",
        ),
        Verdict::Absent { confirmed: true } => tear(
            Outcome::Reaped,
            false,
            false,
            "no registration on two readings idle-confirm apart: no runner can take a job",
        ),
        Verdict::Idle { confirmed: false } | Verdict::Absent { confirmed: false } => {
            keep(Outcome::Held, "idle on one reading: confirming")
        }
        Verdict::Unknown { .. } if wedged => tear(
            Outcome::Escaped,
            false,
            true,
            "wedged: state unknown past the hard bound",
        ),
        Verdict::Unknown { held_for }
            if held_for >= policy.orphan_grace && nomination == Nomination::Surplus =>
        {
            tear(
                Outcome::Escaped,
                false,
                true,
                "busy state undeterminable for the whole grace window",
            )
        }
        Verdict::Unknown { .. } => keep(Outcome::Held, "busy state unknown: held, not idle"),
        Verdict::NotAsked => keep(Outcome::Held, "no reading yet"),
    }
}

/// One nominated child as the loop judged it: the nomination, what the signals said, and the
/// decision. Plain data, for the act step and the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judgement {
    pub nominated: super::Nominated,
    pub verdict: Verdict,
    /// The registration the verdict was read from, to delete before stopping the child.
    pub runner_id: Option<u64>,
    pub decision: Decision,
}

/// An offline registration named like one of our runners that no child of ours runs any
/// more (its runner was killed with its allocation): deleted so it does not linger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleRegistration {
    pub repo: crate::model::RepoName,
    pub runner_id: u64,
    pub name: crate::model::RunnerName,
}
