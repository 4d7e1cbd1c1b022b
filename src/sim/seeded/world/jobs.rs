//! How GitHub's and Forgejo's jobs move: queued (shown late on GitHub, in its job listings
//! and later still in its status-filtered run searches; at once on Forgejo), cancelled with
//! the jobs that need them, offered to an idle runner whose labels cover them, completed;
//! and the `workflow_job` webhook each change of a GitHub job sends. A runner's `busy` flag
//! lags its job apart from both.

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;

use super::entities::{Job, Phase, Truth, Visible, exit};
use super::{QUEUED_JOB_CANCEL_S, World};
use crate::model::{ChildId, LabelSet, RepoName};
use crate::sim::seeded::options::{ForgeKind, Options};
use crate::sim::seeded::trace::Trace;

impl World {
    fn lag(&self, forge: ForgeKind, o: &Options, rng: &mut StdRng) -> u64 {
        match forge {
            ForgeKind::GitHub => rng.random_range(0..=o.status_lag_max_s),
            // Forgejo answers from its database: a claim shows at once (as `waiting` with a
            // task id, which the port reports as claimed).
            ForgeKind::Forgejo => 0,
        }
    }

    fn show(&mut self, id: u64, t: u64, visible: Visible, o: &Options, rng: &mut StdRng) {
        let Some(forge) = self.jobs.get(&id).map(|j| j.forge) else {
            return;
        };
        let at = t + self.lag(forge, o, rng);
        // A status-filtered run search is an index of its own, behind the job listings.
        let searched_at = match forge {
            ForgeKind::GitHub => at + self.lag_rng.random_range(0..=o.search_lag_max_s),
            ForgeKind::Forgejo => at,
        };
        let job = self.jobs.get_mut(&id).expect("checked above");
        job.searched_catching_up = Some((searched_at, visible.clone()));
        job.catching_up = Some((at, visible));
    }

    /// Job `id` ended at `t` without completing (its runner lost it): GitHub sends its
    /// webhook and stops listing it, as late as any change.
    pub(super) fn show_hidden(&mut self, id: u64, t: u64, o: &Options) {
        self.send_webhook(id, t, o);
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let at = t + self.lag_rng.random_range(0..=o.status_lag_max_s);
        let searched_at = at + self.lag_rng.random_range(0..=o.search_lag_max_s);
        job.catching_up = Some((at, Visible::Hidden));
        job.searched_catching_up = Some((searched_at, Visible::Hidden));
    }

    pub(super) fn set_queued(&mut self, id: u64, t: u64, o: &Options, rng: &mut StdRng) {
        let job = self.jobs.get_mut(&id).expect("job exists");
        job.truth = Truth::Queued;
        job.queued_at_s = t as i64;
        self.counts.jobs += 1;
        let bucket = (job.repo.clone(), job.labels.clone());
        if let Some(delivered) = self.send_webhook(id, t, o) {
            self.latencies.webhook.insert(id, delivered);
        }
        self.latencies.queued(bucket, id);
        self.show(id, t, Visible::Queued, o, rng);
    }

    /// GitHub sends a `workflow_job` delivery for job `id` (queued, in progress or completed):
    /// lost, or due 0-1 s later. Whether it was delivered; `None` in a run without webhooks
    /// or for a Forgejo job.
    fn send_webhook(&mut self, id: u64, t: u64, o: &Options) -> Option<bool> {
        let webhooks = o.webhooks?;
        let job = self.jobs.get(&id)?;
        if job.forge != ForgeKind::GitHub {
            return None;
        }
        let delivered = !self.webhook_rng.random_bool(webhooks.lost);
        if delivered {
            let at = t + self
                .webhook_rng
                .random_range(webhooks.delay_s.0..=webhooks.delay_s.1);
            self.webhooks_due
                .entry(at)
                .or_default()
                .push(job.repo.clone());
        }
        Some(delivered)
    }

    /// The repos whose `workflow_job` webhooks arrive by `t`, once each delivery.
    pub fn webhooks_arriving(&mut self, t: u64) -> Vec<RepoName> {
        let later = self.webhooks_due.split_off(&(t + 1));
        std::mem::replace(&mut self.webhooks_due, later)
            .into_values()
            .flatten()
            .collect()
    }

    pub(super) fn cancel(
        &mut self,
        id: u64,
        t: u64,
        why: &str,
        o: &Options,
        rng: &mut StdRng,
        trace: &mut Trace,
    ) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let was_queued = job.truth == Truth::Queued;
        let was_listed = was_queued || matches!(job.truth, Truth::Running { .. });
        job.truth = Truth::Cancelled;
        if was_queued {
            self.counts.jobs_cancelled += 1;
            trace.record(t, format!("job {id} cancelled ({why})"));
        }
        if was_listed {
            self.send_webhook(id, t, o);
        }
        self.show(id, t, Visible::Hidden, o, rng);
        // Jobs that needed it never run.
        for g in self.gated_after(id) {
            self.cancel(g, t, why, o, rng, trace);
        }
    }

    /// Jobs whose `needs:` wait for job `id`.
    fn gated_after(&self, id: u64) -> Vec<u64> {
        self.jobs
            .iter()
            .filter(|(_, j)| j.truth == Truth::Gated { after: id })
            .map(|(i, _)| *i)
            .collect()
    }

    pub(super) fn cancel_queued(
        &mut self,
        t: u64,
        o: &Options,
        rng: &mut StdRng,
        trace: &mut Trace,
    ) {
        let queued: Vec<(u64, i64)> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.truth == Truth::Queued)
            .map(|(id, j)| (*id, j.queued_at_s))
            .collect();
        for (id, queued_at_s) in queued {
            if t as i64 - queued_at_s >= QUEUED_JOB_CANCEL_S {
                self.counts.jobs_expired += 1;
                self.cancel(id, t, "queued for 24 hours", o, rng, trace);
            } else if o.cancel_per_s > 0.0 && rng.random_bool(o.cancel_per_s) {
                self.cancel(id, t, "by a user", o, rng, trace);
                self.maybe_rerun(id, t, o, rng, trace);
            }
        }
    }

    pub(super) fn finish_jobs(&mut self, t: u64, o: &Options, rng: &mut StdRng, trace: &mut Trace) {
        let done: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(_, j)| matches!(j.truth, Truth::Running { done_at, .. } if done_at <= t))
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            let job = self.jobs.get_mut(&id).expect("listed above");
            let Truth::Running { runner, .. } = job.truth.clone() else {
                continue;
            };
            job.truth = Truth::Completed;
            self.counts.jobs_completed += 1;
            self.send_webhook(id, t, o);
            self.show(id, t, Visible::Hidden, o, rng);
            // The ephemeral runner deregisters and exits after its one job.
            if let Some(child) = self
                .children
                .values_mut()
                .find(|c| c.runner.as_ref() == Some(&runner))
            {
                exit(child);
                if let Some(registration) = child.registration.take() {
                    self.registrations.remove(&registration);
                }
                if let Some(repo) = &child.repo {
                    self.last_left_s
                        .insert((repo.clone(), child.labels.clone()), t);
                }
            }
            trace.record(t, format!("job {id} completed on {runner}"));
            for g in self.gated_after(id) {
                self.set_queued(g, t, o, rng);
                trace.record(t, format!("job {g} queued after {id}"));
            }
            let run = self.jobs[&id].run;
            let run_over = self
                .jobs
                .values()
                .filter(|j| j.run == run)
                .all(Job::is_terminal);
            if run_over {
                self.maybe_rerun(id, t, o, rng, trace);
            }
        }
    }

    /// Every idle registered runner is offered a random queued job of its repo whose labels
    /// are all among its own; one with none gives up after the idle timeout.
    pub(super) fn offer_jobs(&mut self, t: u64, o: &Options, rng: &mut StdRng, trace: &mut Trace) {
        let idle: Vec<ChildId> = self
            .children
            .iter()
            .filter(|(_, c)| matches!(c.phase, Phase::Idle { .. }))
            .map(|(id, _)| id.clone())
            .collect();
        for id in idle {
            let child = &self.children[&id];
            let (Some(repo), Some(runner)) = (child.repo.clone(), child.runner.clone()) else {
                continue;
            };
            // GitHub hands jobs only to a registered runner: one whose registration the daemon
            // deleted waits for nothing (and is stopped next).
            let github = child.on_github();
            if github && child.registration.is_none() {
                continue;
            }
            let offers: Vec<u64> = self
                .jobs
                .iter()
                .filter(|(_, j)| {
                    j.truth == Truth::Queued && j.repo == repo && j.labels.is_subset(&child.labels)
                })
                .map(|(id, _)| *id)
                .collect();
            let child_labels = child.labels.clone();
            let since = match child.phase {
                Phase::Idle { since } => since,
                _ => t,
            };
            match offers.choose(rng) {
                Some(&job_id) => {
                    let done_at = t + rng.random_range(o.job_s.0..=o.job_s.1);
                    let flag_at = t + self.lag_rng.random_range(0..=o.busy_flag_lag_max_s);
                    let job = self.jobs.get_mut(&job_id).expect("offered");
                    job.truth = Truth::Running {
                        runner: runner.clone(),
                        done_at,
                    };
                    job.flag_at = github.then_some(flag_at);
                    job.told_at = None;
                    let cross = job.labels != child_labels;
                    if cross {
                        self.counts.cross_bucket_takes += 1;
                    }
                    // A working runner ends its bucket's crash streak. Forgejo names no
                    // runner, so there the daemon can only tell that one of the placed
                    // runners whose labels cover the job's took it: each of their buckets'
                    // streaks ends.
                    let ended: Vec<(RepoName, LabelSet)> = if github {
                        vec![(repo.clone(), child_labels.clone())]
                    } else {
                        let job_labels = job.labels.clone();
                        self.children
                            .values()
                            .filter(|c| {
                                c.repo.as_ref() == Some(&repo)
                                    && matches!(
                                        c.phase,
                                        Phase::Booting { .. }
                                            | Phase::Idle { .. }
                                            | Phase::Busy { .. }
                                    )
                                    && job_labels.is_subset(&c.labels)
                            })
                            .map(|c| (repo.clone(), c.labels.clone()))
                            .chain([(repo.clone(), child_labels.clone())])
                            .collect()
                    };
                    for bucket in ended {
                        self.end_crash_streak(&bucket, t);
                    }
                    let child = self.children.get_mut(&id).expect("listed");
                    child.phase = Phase::Busy { job: job_id };
                    child.ran_job = true;
                    let submitted_s = child.submitted_s;
                    self.latencies
                        .started(&self.jobs[&job_id], job_id, t, submitted_s);
                    self.send_webhook(job_id, t, o);
                    self.show(job_id, t, Visible::Running(runner.clone()), o, rng);
                    trace.record(
                        t,
                        format!(
                            "{runner} took job {job_id}{}",
                            if cross { " (another bucket's)" } else { "" }
                        ),
                    );
                }
                None if t.saturating_sub(since) >= o.idle_timeout_s => {
                    // A runner that gives up idle booted and registered: a working image
                    // ends its bucket's crash streak, as the daemon sees from its clean exit.
                    self.end_crash_streak(&(repo.clone(), child_labels.clone()), t);
                    let child = self.children.get_mut(&id).expect("listed");
                    exit(child);
                    // An idle runner that gives up deregisters on its way out.
                    if let Some(registration) = child.registration.take() {
                        self.registrations.remove(&registration);
                    }
                    self.counts.idle_exits += 1;
                    trace.record(t, format!("{runner} gave up idle"));
                }
                None => {}
            }
        }
    }

    pub(super) fn catch_up(&mut self, t: u64) {
        for job in self.jobs.values_mut() {
            if let Some((at, _)) = &job.catching_up
                && *at <= t
            {
                job.visible = job.catching_up.take().expect("checked").1;
            }
            if let Some((at, _)) = &job.searched_catching_up
                && *at <= t
            {
                job.searched = job.searched_catching_up.take().expect("checked").1;
            }
        }
        self.jobs.retain(|_, j| {
            !(j.is_terminal()
                && j.visible == Visible::Hidden
                && j.catching_up.is_none()
                && j.searched == Visible::Hidden
                && j.searched_catching_up.is_none())
        });
    }
}
