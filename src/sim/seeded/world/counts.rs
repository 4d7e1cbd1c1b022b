//! The counts a run keeps of what happened in its world (jobs, dispatches, failed starts,
//! purges, and the ones that must stay zero), which the invariants judge and a sweep adds up.

/// Counts the invariants are judged by.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    /// Jobs that became queued at some point.
    pub jobs: u64,
    pub jobs_completed: u64,
    /// Jobs cancelled after being queued (by a user, or by GitHub after 24 hours).
    pub jobs_cancelled: u64,
    /// New children (deduplicated dispatches are not new).
    pub dispatches: u64,
    pub dispatches_deduplicated: u64,
    /// Runners that crashed at boot before registering.
    pub failed_starts: u64,
    /// A runner took a job of another bucket (its labels a superset of the job's).
    pub cross_bucket_takes: u64,
    /// Runners that exited on their idle timeout without a job.
    pub idle_exits: u64,
    pub purges: u64,
    /// Children purged while their runner was executing a job (I1).
    pub escaped_busy: u64,
    /// Children purged or stopped while their runner was alive but not busy.
    pub live_runners_purged: u64,
    /// In-flight children the daemon stopped (reaped, replaced or escaped).
    pub stops: u64,
    /// Runner registrations the daemon deleted.
    pub deregistrations: u64,
    /// Children stopped before they were placed (surplus, or past the placement timeout):
    /// each may be replaced by a dispatch for the same job.
    pub unplaced_stopped: u64,
    /// Foreign children purged (never allowed).
    pub foreign_purged: u64,
    /// Jobs GitHub cancelled after 24 hours in the queue: stranded for good.
    pub jobs_expired: u64,
    /// Jobs killed by a registration delete that landed inside the window no signal closes
    /// (the runner took the job after the daemon's last reading, or its flag still lagged):
    /// counted and reported, per 1,000 take-backs.
    pub kills_in_window: u64,
    /// Jobs killed by a delete sent after a daemon was told of the job, or on a stale
    /// reading (I1).
    pub kills_outside_window: u64,
    /// Stopped children purged while their task still wound down: Nomad forgets the job
    /// while its allocation holds the slot.
    pub purged_stopping: u64,
}

impl Counts {
    /// Adds another run's counts (for a sweep's totals).
    pub fn add(&mut self, other: &Counts) {
        self.jobs += other.jobs;
        self.jobs_completed += other.jobs_completed;
        self.jobs_cancelled += other.jobs_cancelled;
        self.dispatches += other.dispatches;
        self.dispatches_deduplicated += other.dispatches_deduplicated;
        self.failed_starts += other.failed_starts;
        self.cross_bucket_takes += other.cross_bucket_takes;
        self.idle_exits += other.idle_exits;
        self.purges += other.purges;
        self.escaped_busy += other.escaped_busy;
        self.live_runners_purged += other.live_runners_purged;
        self.stops += other.stops;
        self.deregistrations += other.deregistrations;
        self.unplaced_stopped += other.unplaced_stopped;
        self.foreign_purged += other.foreign_purged;
        self.jobs_expired += other.jobs_expired;
        self.kills_in_window += other.kills_in_window;
        self.purged_stopping += other.purged_stopping;
        self.kills_outside_window += other.kills_outside_window;
    }
}
