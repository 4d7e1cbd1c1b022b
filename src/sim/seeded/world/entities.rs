//! What the world is made of: GitHub's and Forgejo's jobs (where each really stands, and what
//! the API shows of it), Nomad's children and the runners inside them, GitHub's runner
//! registrations, and a bucket's crash streak. Plain data; how each moves is in the files
//! beside this one, as methods of the [`World`](super::World).

use std::collections::VecDeque;

use crate::model::{ChildId, LabelSet, RepoName, RunnerName};
use crate::observe::{ChildStatus, Placement};
use crate::sim::seeded::options::ForgeKind;

/// Where a job really stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Truth {
    /// Waits (`needs:`) for the job with this id to complete; not listed by the forge yet.
    Gated {
        after: u64,
    },
    Queued,
    Running {
        runner: RunnerName,
        done_at: u64,
    },
    Completed,
    Cancelled,
}

/// What the forge's API shows of a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Visible {
    Hidden,
    Queued,
    Running(RunnerName),
}

#[derive(Clone, Debug)]
pub struct Job {
    pub repo: RepoName,
    pub forge: ForgeKind,
    pub labels: LabelSet,
    /// `runs-on` as the workflow spells it.
    pub raw_labels: Vec<String>,
    pub run: u64,
    pub truth: Truth,
    /// When it was (last) queued; negative for jobs queued before the run began.
    pub queued_at_s: i64,
    pub visible: Visible,
    /// The next visible state and when it shows.
    pub catching_up: Option<(u64, Visible)>,
    /// What a status-filtered run search shows of it: the job's own view, later still.
    pub searched: Visible,
    pub searched_catching_up: Option<(u64, Visible)>,
    /// When the `busy` flag of the runner running it shows (it lags apart from the job).
    pub flag_at: Option<u64>,
    /// When a daemon was first served a sign of it at work on its runner: the flag in a
    /// runner reading, or the job in progress naming the runner in a job listing.
    pub told_at: Option<u64>,
}

impl Job {
    pub(super) fn is_terminal(&self) -> bool {
        matches!(self.truth, Truth::Completed | Truth::Cancelled)
    }
}

/// The runner inside a child, as far as it got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No allocation: placed from `eligible_at` on, when the cluster has room.
    Unplaced {
        eligible_at: u64,
    },
    Booting {
        ready_at: u64,
    },
    Idle {
        since: u64,
    },
    Busy {
        job: u64,
    },
    /// Told to stop: the job reads `dead`, but the task winds down (inside its
    /// `kill_timeout`) and holds its allocation until `until`.
    Stopping {
        until: u64,
    },
    Exited,
}

#[derive(Clone, Debug)]
pub struct SimChild {
    pub parent: String,
    /// `None` for a child dispatched by hand (no `managed_by` marker).
    pub repo: Option<RepoName>,
    pub repo_url: Option<String>,
    pub labels: LabelSet,
    pub runner: Option<RunnerName>,
    pub submitted_s: u64,
    pub status: ChildStatus,
    pub placement: Placement,
    pub phase: Phase,
    /// The registration token as Nomad stores it in meta (a canary: it must never show).
    pub token: Option<String>,
    /// Its runner took a job at some point (a child that never did was a wasted dispatch).
    pub ran_job: bool,
    /// Stopped by the daemon (not a failed start, whatever its runner was doing).
    pub stopped: bool,
    /// The GitHub registration its runner holds, from boot until it leaves on its own (a
    /// runner killed with its allocation leaves it behind, offline).
    pub registration: Option<u64>,
    /// When the daemon deleted its runner's registration: from then on GitHub hands it no
    /// job.
    pub deregistered_s: Option<u64>,
}

impl SimChild {
    /// Whether its runner may still take a job: a runner on its way (unplaced, booting), or
    /// one at work or idle that a forge can still hand a job to. A GitHub runner whose
    /// registration was deleted cannot, though its allocation lives on.
    pub fn can_take_a_job(&self) -> bool {
        match self.phase {
            Phase::Exited | Phase::Stopping { .. } => false,
            Phase::Idle { .. } => !(self.on_github() && self.registration.is_none()),
            Phase::Unplaced { .. } | Phase::Booting { .. } | Phase::Busy { .. } => true,
        }
    }
}

impl SimChild {
    /// An allocation of it runs on a node, holding a slot there: booting, at work, idle, or
    /// stopped and still winding down.
    pub fn has_allocation(&self) -> bool {
        matches!(
            self.phase,
            Phase::Booting { .. }
                | Phase::Idle { .. }
                | Phase::Busy { .. }
                | Phase::Stopping { .. }
        )
    }

    /// Its runner registers with GitHub (not Forgejo): GitHub hands jobs only to registered
    /// runners, and lists them.
    pub(super) fn on_github(&self) -> bool {
        self.repo_url
            .as_deref()
            .is_some_and(|u| u.starts_with("https://github.com/"))
    }
}

/// A runner registration on GitHub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub repo: RepoName,
    pub name: RunnerName,
    /// The child whose runner holds it; `None` for a JIT registration whose child was never
    /// dispatched (GitHub registers a JIT runner when it makes its configuration).
    pub child: Option<ChildId>,
    /// When a daemon was last served a reading of it (the listing or the runner itself).
    pub read_s: Option<u64>,
}

/// A bucket's run of failed starts, as the world sees it (for the per-bucket half of I7).
#[derive(Clone, Debug, Default)]
pub struct CrashStreak {
    /// Failed starts since a runner of the bucket last took a job.
    pub failed_starts: u32,
    /// When the last of them happened.
    pub last_failed_s: u64,
    /// Dispatches made for the bucket while the streak ran.
    pub dispatches_s: VecDeque<u64>,
    /// When a runner last ended a streak by taking a job.
    pub ended_s: Option<u64>,
}

pub(super) fn exit(child: &mut SimChild) {
    child.phase = Phase::Exited;
    child.status = ChildStatus::Dead;
    child.placement = Placement::Finished;
}
