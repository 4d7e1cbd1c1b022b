//! GitHub's runner registrations as its API serves them: listed and read one by one with a
//! `busy` flag that lags the job (apart from the job's own lag), registered ahead of any
//! runner for a JIT configuration, and deleted unless that flag already shows the runner at
//! work. A delete that slips into the flag's lag kills the job or leaves it running, per
//! seed; a kill is judged by what the daemon had been told when it sent the delete. (A
//! runner registers itself when it boots: see `cluster.rs`.)

use super::World;
use super::entities::{Phase, Registration, Truth, exit};
use crate::model::{RepoName, RunnerName};
use crate::sim::seeded::options::{Options, Service};
use crate::sim::seeded::trace::Trace;

impl World {
    /// GitHub's view of a repo's registrations at `t`: (id, name, online, busy). A runner
    /// shows busy once its job's flag lag has passed.
    pub fn registrations_of(&self, repo: &RepoName, t: u64) -> Vec<(u64, RunnerName, bool, bool)> {
        self.registrations
            .iter()
            .filter(|(_, r)| r.repo == *repo)
            .map(|(id, r)| self.registration_view(*id, r, t))
            .collect()
    }

    /// GitHub's view of registration `id` of `repo` at `t`, or `None` (404).
    pub fn registration_of(
        &self,
        repo: &RepoName,
        id: u64,
        t: u64,
    ) -> Option<(u64, RunnerName, bool, bool)> {
        let registration = self.registrations.get(&id).filter(|r| r.repo == *repo)?;
        Some(self.registration_view(id, registration, t))
    }

    fn registration_view(
        &self,
        id: u64,
        registration: &Registration,
        t: u64,
    ) -> (u64, RunnerName, bool, bool) {
        let child = registration
            .child
            .as_ref()
            .and_then(|c| self.children.get(c));
        let online =
            child.is_some_and(|c| matches!(c.phase, Phase::Idle { .. } | Phase::Busy { .. }));
        let busy = child
            .and_then(|c| self.running_job(c))
            .is_some_and(|job| self.flag_shows(job, t));
        (id, registration.name.clone(), online, busy)
    }

    fn running_job(&self, child: &super::entities::SimChild) -> Option<u64> {
        match child.phase {
            Phase::Busy { job } => Some(job),
            _ => None,
        }
    }

    fn flag_shows(&self, job: u64, t: u64) -> bool {
        self.jobs
            .get(&job)
            .and_then(|j| j.flag_at)
            .is_some_and(|at| at <= t)
    }

    /// A daemon was served these registrations of `repo` at `t` (`busy` as served): each was
    /// read then, and a flag that showed told it of the job.
    pub fn registrations_served(&mut self, ids: &[(u64, bool)], t: u64) {
        for (id, busy) in ids {
            let Some(registration) = self.registrations.get_mut(id) else {
                continue;
            };
            registration.read_s = Some(t);
            if !busy {
                continue;
            }
            let job = registration
                .child
                .as_ref()
                .and_then(|c| self.children.get(c))
                .and_then(|c| self.running_job(c));
            if let Some(job) = job.and_then(|job| self.jobs.get_mut(&job)) {
                job.told_at.get_or_insert(t);
            }
        }
    }

    /// A daemon was served job `id` in progress on its runner at `t`.
    pub fn job_served_running(&mut self, id: u64, t: u64) {
        if let Some(job) = self.jobs.get_mut(&id) {
            job.told_at.get_or_insert(t);
        }
    }

    /// A daemon sent the delete of registration `id` at `t` (it lands later).
    pub fn delete_sent(&mut self, id: u64, t: u64) {
        self.deletes_sent.insert(id, t);
    }

    /// GitHub's `POST …/generate-jitconfig`: registers `name` offline before any runner
    /// exists; `None` when a runner of that name is registered already (409).
    pub fn register_jit(
        &mut self,
        t: u64,
        repo: &RepoName,
        name: &RunnerName,
        trace: &mut Trace,
    ) -> Option<u64> {
        if self
            .registrations
            .values()
            .any(|r| r.repo == *repo && r.name == *name)
        {
            return None;
        }
        self.next_id += 1;
        let id = self.next_id;
        self.registrations.insert(
            id,
            Registration {
                repo: repo.clone(),
                name: name.clone(),
                child: None,
                read_s: None,
            },
        );
        trace.record(t, format!("JIT runner {name} registered as {id}"));
        Some(id)
    }

    /// GitHub's `DELETE …/runners/{id}`: refused once the runner's busy flag shows its job;
    /// let through while the flag lags (BRIEF lesson 2), when the job dies with it or goes on
    /// as the seed says; `None` when unknown.
    pub fn delete_registration(
        &mut self,
        t: u64,
        repo: &RepoName,
        id: u64,
        o: &Options,
        trace: &mut Trace,
    ) -> Option<bool> {
        let registration = self
            .registrations
            .get(&id)
            .filter(|r| r.repo == *repo)?
            .clone();
        if let Some(child) = registration
            .child
            .as_ref()
            .and_then(|c| self.children.get(c))
            && let Phase::Busy { job } = child.phase
        {
            // BRIEF lesson 2: a delete has been seen to succeed on a busy runner. Here it does
            // while the runner's `busy` flag still lags its job.
            if self.flag_shows(job, t) {
                trace.record(
                    t,
                    format!(
                        "deleting registration of {} refused: runs job {job}",
                        registration.name
                    ),
                );
                return Some(false);
            }
            trace.record(
                t,
                format!(
                    "registration of {} deleted while it runs job {job} (its busy flag lags)",
                    registration.name
                ),
            );
            if o.delete_kills_job {
                self.kill_by_delete(t, id, &registration, job, o, trace);
            }
        }
        self.registrations.remove(&id);
        if let Some(child) = registration
            .child
            .as_ref()
            .and_then(|c| self.children.get_mut(c))
        {
            child.registration = None;
            child.deregistered_s = Some(t);
        }
        self.counts.deregistrations += 1;
        trace.record(t, format!("registration of {} deleted", registration.name));
        Some(true)
    }

    /// The runner whose registration was deleted under its job loses it (GitHub has been
    /// seen to fail the job): judged by what the daemon knew when it sent the delete. No
    /// signal closes the window between its last reading of the runner and the delete
    /// landing, so a kill there is counted; a kill after a daemon was told of the job, or on
    /// a reading older than one round trip, is outside it (I1).
    fn kill_by_delete(
        &mut self,
        t: u64,
        id: u64,
        registration: &Registration,
        job: u64,
        o: &Options,
        trace: &mut Trace,
    ) {
        let sent = self.deletes_sent.get(&id).copied().unwrap_or(t);
        let told = self.jobs.get(&job).and_then(|j| j.told_at);
        let fresh_s = o.latency(Service::GitHub).max().as_secs() + 1;
        let outside = match (told, registration.read_s) {
            (Some(told), _) if told <= sent => Some(format!(
                "a daemon was told at t={told}s that {} runs job {job}, and sent the delete at t={sent}s",
                registration.name
            )),
            (_, Some(read)) if sent > read + fresh_s => Some(format!(
                "the delete of {}'s registration went out at t={sent}s on a reading from t={read}s, older than one round trip ({fresh_s} s)",
                registration.name
            )),
            (_, None) => Some(format!(
                "the delete of {}'s registration went out without a reading of it",
                registration.name
            )),
            _ => None,
        };
        match outside {
            Some(why) => {
                self.counts.kills_outside_window += 1;
                self.kill_outside
                    .get_or_insert(format!("job {job} killed by a registration delete: {why}"));
            }
            None => self.counts.kills_in_window += 1,
        }
        trace.record(
            t,
            format!(
                "job {job} killed: {}'s registration was deleted under it",
                registration.name
            ),
        );
        if let Some(j) = self.jobs.get_mut(&job) {
            j.truth = Truth::Cancelled;
        }
        self.show_hidden(job, t, o);
        if let Some(child) = registration
            .child
            .as_ref()
            .and_then(|c| self.children.get_mut(c))
        {
            exit(child);
        }
    }
}
