//! How Nomad's children and the runners inside them move: dispatched pending without an
//! allocation, placed while the cluster has room, booting into a registered runner or
//! crashing (a failed start, counted in its bucket's crash streak), and stopped or purged by
//! the daemon, the runner dying with its allocation.

use rand::Rng;
use rand::rngs::StdRng;

use super::entities::{Phase, Registration, SimChild, Truth, Visible, exit};
use super::{EPOCH_UNIX, World};
use crate::model::{ChildId, LabelSet, NOMAD_DEFAULT_NAMESPACE, RepoName, RunnerName};
use crate::observe::{ChildStatus, Placement};
use crate::sim::seeded::options::Options;
use crate::sim::seeded::trace::Trace;

impl World {
    /// Slots held by our placed, live children and by foreign work.
    fn slots_used(&self, t: u64, o: &Options) -> u32 {
        let ours = self
            .children
            .values()
            .chain(self.lingering.values())
            .filter(|c| c.has_allocation())
            .count() as u32;
        ours + o.foreign_slots_at(t)
    }

    pub(super) fn place(&mut self, t: u64, o: &Options, rng: &mut StdRng, trace: &mut Trace) {
        let free = o.cluster_slots.saturating_sub(self.slots_used(t, o));
        if free == 0 {
            return;
        }
        // Child ids sort by submission (unix time, then a counter): first come, first placed.
        let ids: Vec<ChildId> = self
            .children
            .iter()
            .filter(|(_, c)| {
                matches!(c.phase, Phase::Unplaced { eligible_at } if eligible_at <= t)
                    && c.status == ChildStatus::Pending
            })
            .take(free as usize)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            let child = self.children.get_mut(&id).expect("listed above");
            child.phase = Phase::Booting {
                ready_at: t + rng.random_range(o.boot_s.0..=o.boot_s.1),
            };
            child.status = ChildStatus::Running;
            child.placement = Placement::Placed;
            trace.record(t, format!("placed {id}"));
        }
    }

    pub(super) fn boot(&mut self, t: u64, o: &Options, rng: &mut StdRng, trace: &mut Trace) {
        for (id, child) in &mut self.children {
            if let Phase::Booting { ready_at } = child.phase
                && ready_at <= t
            {
                // Boot crashes are a fault of the cluster: they stop with the other faults.
                if t < o.faults_end_s && rng.random_bool(o.crash_probability) {
                    exit(child);
                    child.placement = Placement::Failed;
                    self.counts.failed_starts += 1;
                    if let Some(repo) = &child.repo {
                        let streak = self
                            .crash_streaks
                            .entry((repo.clone(), child.labels.clone()))
                            .or_default();
                        streak.failed_starts += 1;
                        streak.last_failed_s = t;
                    }
                    trace.record(t, format!("runner of {id} crashed at boot"));
                } else {
                    child.phase = Phase::Idle { since: t };
                    if let (Some(repo), Some(runner)) = (&child.repo, &child.runner)
                        && child.on_github()
                    {
                        // A JIT runner connects under the registration its config names; a
                        // runner with a registration token registers now.
                        let jit = self
                            .registrations
                            .iter()
                            .find(|(_, r)| r.child.as_ref() == Some(id))
                            .map(|(reg, _)| *reg);
                        let registration = jit.unwrap_or_else(|| {
                            self.next_id += 1;
                            self.next_id
                        });
                        child.registration = Some(registration);
                        self.registrations.insert(
                            registration,
                            Registration {
                                repo: repo.clone(),
                                name: runner.clone(),
                                child: Some(id.clone()),
                                read_s: None,
                            },
                        );
                    }
                    trace.record(t, format!("runner of {id} registered"));
                }
            }
        }
    }

    /// Nomad's dispatch: a new pending child without an allocation.
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch(
        &mut self,
        t: u64,
        o: &Options,
        rng: &mut StdRng,
        parent: &str,
        repo_url: &str,
        labels: &str,
        runner: &RunnerName,
        token: Option<String>,
    ) -> ChildId {
        let id = ChildId(
            format!(
                "{parent}/dispatch-{}-{:08x}",
                EPOCH_UNIX + t as i64,
                self.next_id()
            ),
            NOMAD_DEFAULT_NAMESPACE.to_string(),
        );
        let eligible_at = t + rng.random_range(o.place_delay_s.0..=o.place_delay_s.1);
        self.children.insert(
            id.clone(),
            SimChild {
                parent: parent.to_string(),
                repo: self.repo_urls.get(repo_url.trim_end_matches('/')).cloned(),
                repo_url: Some(repo_url.to_string()),
                labels: LabelSet::from_meta(labels).unwrap_or_default(),
                runner: Some(runner.clone()),
                submitted_s: t,
                status: ChildStatus::Pending,
                placement: Placement::Unplaced,
                phase: Phase::Unplaced { eligible_at },
                token,
                ran_job: false,
                stopped: false,
                registration: None,
                deregistered_s: None,
            },
        );
        // A JIT runner's registration belongs to the child dispatched under its name.
        for registration in self.registrations.values_mut() {
            if registration.child.is_none() && registration.name == *runner {
                registration.child = Some(id.clone());
            }
        }
        self.counts.dispatches += 1;
        let child = &self.children[&id];
        if let Some(repo) = &child.repo
            && let Some(streak) = self
                .crash_streaks
                .get_mut(&(repo.clone(), child.labels.clone()))
            && streak.failed_starts > 0
        {
            streak.dispatches_s.push_back(t);
        }
        if let Some(repo) = child.repo.clone() {
            let bucket = (repo, child.labels.clone());
            self.latencies.dispatched(&bucket, t, &self.jobs);
        }
        id
    }

    /// Nomad's purge: the child disappears, its runner with it. A stopped child whose task
    /// still winds down is forgotten by Nomad, but its allocation runs on until it ends.
    pub fn purge(&mut self, t: u64, id: &ChildId, trace: &mut Trace) {
        let Some(mut child) = self.children.remove(id) else {
            return;
        };
        if matches!(child.phase, Phase::Stopping { .. }) {
            self.counts.purged_stopping += 1;
            trace.record(t, format!("purged {id} while its task still winds down"));
            self.lingering.insert(id.clone(), child);
            return;
        }
        self.counts.purges += 1;
        if child.repo.is_none() && child.repo_url.is_none() {
            self.counts.foreign_purged += 1;
        } else if !child.ran_job {
            self.wasted_purged += 1;
        }
        self.kill_runner(t, id, &mut child, "purged", trace);
    }

    /// Nomad's stop (a deregistration without purge): the allocation is stopped, the runner
    /// with it, and the child stays listed as dead until purged.
    pub fn stop(&mut self, t: u64, id: &ChildId, o: &Options, trace: &mut Trace) {
        let Some(mut child) = self.children.remove(id) else {
            return;
        };
        if child.status.is_in_flight() {
            self.counts.stops += 1;
            if child.repo.is_none() && child.repo_url.is_none() {
                self.counts.foreign_purged += 1;
            }
            if matches!(child.phase, Phase::Unplaced { .. }) {
                self.counts.unplaced_stopped += 1;
            }
            if let Some(repo) = &child.repo {
                self.last_stop_s.insert(repo.clone(), t);
            }
        }
        // The task is told to stop; an idle runner winds down in seconds, a busy one is
        // killed at its `kill_timeout`. Nomad reads the job dead at once, while the job
        // summary still counts the allocation running until it ends.
        let wind_down_s = match child.phase {
            Phase::Busy { .. } => Some(Options::KILL_TIMEOUT_S),
            Phase::Booting { .. } | Phase::Idle { .. } => Some(o.stop_wind_down_s),
            Phase::Stopping { until } => Some(until.saturating_sub(t)),
            Phase::Unplaced { .. } | Phase::Exited => None,
        };
        self.kill_runner(t, id, &mut child, "stopped", trace);
        child.status = ChildStatus::Dead;
        child.stopped = true;
        match wind_down_s {
            Some(s) if s > 0 => {
                child.phase = Phase::Stopping { until: t + s };
                child.placement = Placement::Placed;
            }
            _ if child.placement != Placement::Failed => child.placement = Placement::Finished,
            _ => {}
        }
        self.children.insert(id.clone(), child);
    }

    /// Stopped tasks that wound down end their allocation: the slot is free.
    pub(super) fn end_stopping(&mut self, t: u64, trace: &mut Trace) {
        let ended = |c: &SimChild| matches!(c.phase, Phase::Stopping { until } if until <= t);
        for (id, child) in &mut self.children {
            if ended(child) {
                child.phase = Phase::Exited;
                child.placement = Placement::Finished;
                trace.record(t, format!("allocation of {id} ended"));
            }
        }
        self.lingering.retain(|id, child| {
            let keep = !ended(child);
            if !keep {
                trace.record(t, format!("allocation of purged {id} ended"));
            }
            keep
        });
    }

    /// The runner of `child` dies with its allocation. A registration it held stays behind,
    /// offline, as GitHub keeps a runner whose process was killed.
    fn kill_runner(
        &mut self,
        t: u64,
        id: &ChildId,
        child: &mut SimChild,
        how: &str,
        trace: &mut Trace,
    ) {
        match child.phase {
            Phase::Busy { job } => {
                self.counts.escaped_busy += 1;
                trace.record(t, format!("{how} {id} while it ran job {job}"));
                // The job dies with its runner.
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.truth = Truth::Cancelled;
                    j.visible = Visible::Hidden;
                    j.catching_up = None;
                    j.searched = Visible::Hidden;
                    j.searched_catching_up = None;
                }
            }
            Phase::Booting { .. } | Phase::Idle { .. } => {
                self.counts.live_runners_purged += 1;
                trace.record(t, format!("{how} {id} with a live runner"));
            }
            Phase::Unplaced { .. } | Phase::Stopping { .. } | Phase::Exited => {
                trace.record(t, format!("{how} {id}"))
            }
        }
        child.phase = Phase::Exited;
    }

    /// A runner of `bucket` was seen at work at `t`: the bucket's run of failed starts ends.
    pub(super) fn end_crash_streak(&mut self, bucket: &(RepoName, LabelSet), t: u64) {
        if let Some(streak) = self.crash_streaks.get_mut(bucket)
            && streak.failed_starts > 0
        {
            streak.failed_starts = 0;
            streak.dispatches_s.clear();
            streak.ended_s = Some(t);
        }
    }
}
