//! How long work waited, for the benchmark: each queued job matched to the dispatch that
//! served it, and the dispatch lag counted from the first second the caps left room for the
//! job (and from when the API also showed it). Measured only: nothing here moves the world.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::World;
use super::entities::{Job, Truth, Visible};
use crate::model::{LabelSet, RepoName};

/// How long work waited, as the benchmark measures it, in simulated seconds from when a job
/// was queued (or from the start of the run, for jobs queued before it).
#[derive(Clone, Debug, Default)]
pub struct Latencies {
    /// Queued → the dispatch that served it. Runners are fungible, so dispatches of a bucket
    /// are matched to its queued jobs oldest first; a job a runner took before any dispatch was
    /// matched to it is served by that runner's dispatch.
    pub queue_to_dispatch_s: Vec<u64>,
    /// Queued → a runner took it.
    pub queue_to_start_s: Vec<u64>,
    /// What the loop adds: from the first second at which a job was queued *and* the caps
    /// left room for it (see [`World::note_cap_room`]) to the dispatch matched to it, with
    /// whether its webhook was delivered (`None`: no webhooks in the run). A job a runner
    /// took before any dispatch was matched to it counts from then to that runner's
    /// dispatch (0 when the runner was there first).
    pub dispatch_lag_s: Vec<(u64, Option<bool>)>,
    /// The same lag counted from the first second the job was also *visible* queued in the
    /// API (which shows a new job 0–3 s late): what the loop adds once it could have seen
    /// the job. Only jobs a dispatch was matched to while they were visible.
    pub dispatch_lag_visible_s: Vec<(u64, Option<bool>)>,
    /// Queued jobs of each bucket not yet matched to a dispatch, oldest first.
    unmatched: BTreeMap<(RepoName, LabelSet), VecDeque<u64>>,
    matched: BTreeSet<u64>,
    /// When each unmatched job first had cap room.
    room_since: BTreeMap<u64, u64>,
    /// When each unmatched job first had cap room while the API showed it queued.
    visible_room_since: BTreeMap<u64, u64>,
    /// Whether each job's webhook was delivered (runs with webhooks only).
    pub(super) webhook: BTreeMap<u64, bool>,
}

impl Latencies {
    pub(super) fn queued(&mut self, bucket: (RepoName, LabelSet), job: u64) {
        self.unmatched.entry(bucket).or_default().push_back(job);
    }

    /// `job` was matched to a dispatch made at `dispatched_s`, at `t`.
    fn lag(&mut self, job: u64, dispatched_s: u64, t: u64) {
        let room = self.room_since.remove(&job).unwrap_or(t.min(dispatched_s));
        let webhook = self.webhook.get(&job).copied();
        self.dispatch_lag_s
            .push((dispatched_s.saturating_sub(room), webhook));
        if let Some(visible) = self.visible_room_since.remove(&job) {
            self.dispatch_lag_visible_s
                .push((dispatched_s.saturating_sub(visible), webhook));
        }
    }

    /// A dispatch for `bucket` at `t` serves its oldest queued job that has none yet.
    pub(super) fn dispatched(
        &mut self,
        bucket: &(RepoName, LabelSet),
        t: u64,
        jobs: &BTreeMap<u64, Job>,
    ) {
        let Some(waiting) = self.unmatched.get_mut(bucket) else {
            return;
        };
        while let Some(id) = waiting.pop_front() {
            let Some(job) = jobs.get(&id) else { continue };
            if job.truth != Truth::Queued || self.matched.contains(&id) {
                continue;
            }
            self.matched.insert(id);
            self.queue_to_dispatch_s
                .push(t.saturating_sub(job.queued_at_s.max(0) as u64));
            self.lag(id, t, t);
            return;
        }
    }

    pub(super) fn started(&mut self, job: &Job, id: u64, t: u64, runner_submitted_s: u64) {
        let queued = job.queued_at_s.max(0) as u64;
        if self.matched.insert(id) {
            self.queue_to_dispatch_s
                .push(runner_submitted_s.saturating_sub(queued));
            self.lag(id, runner_submitted_s, t);
        }
        self.queue_to_start_s.push(t.saturating_sub(queued));
    }
}

impl World {
    /// Stamps each queued job the caps leave room for with the first second they did, for
    /// the dispatch lag. Jobs not yet matched to a dispatch are taken oldest first, as the
    /// planner serves them, and each takes a unit of room under every cap it counts against
    /// (`has_room` says whether one is left, and takes it): so of three jobs under a cap with
    /// room for one, only the oldest is stamped, and buckets that share a cap share its room.
    pub fn note_cap_room(&mut self, t: u64, has_room: &mut dyn FnMut(&Job) -> bool) {
        let mut waiting: Vec<(i64, u64)> = self
            .latencies
            .unmatched
            .values()
            .flatten()
            .filter(|id| !self.latencies.matched.contains(id))
            .filter_map(|id| {
                let job = self.jobs.get(id)?;
                (job.truth == Truth::Queued).then_some((job.queued_at_s, *id))
            })
            .collect();
        waiting.sort_unstable();
        waiting.dedup();
        for (_, id) in waiting {
            if has_room(&self.jobs[&id]) {
                self.latencies.room_since.entry(id).or_insert(t);
                if self.jobs[&id].visible == Visible::Queued {
                    self.latencies.visible_room_since.entry(id).or_insert(t);
                }
            }
        }
    }
}
