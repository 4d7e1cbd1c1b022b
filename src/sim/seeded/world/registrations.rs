//! GitHub's runner registrations as its API serves them: listed with a `busy` flag that lags
//! the job, registered ahead of any runner for a JIT configuration, and deleted unless that
//! flag already shows the runner at work. (A runner registers itself when it boots: see
//! `cluster.rs`.)

use super::World;
use super::entities::{Phase, Registration, Visible};
use crate::model::{RepoName, RunnerName};
use crate::sim::seeded::trace::Trace;

impl World {
    /// GitHub's view of a repo's registrations: (id, name, online, busy). A runner shows
    /// busy once its job shows in progress (the flag lags the truth as job statuses do).
    pub fn registrations_of(&self, repo: &RepoName) -> Vec<(u64, RunnerName, bool, bool)> {
        self.registrations
            .iter()
            .filter(|(_, r)| r.repo == *repo)
            .map(|(id, r)| {
                let child = r.child.as_ref().and_then(|c| self.children.get(c));
                let online = child
                    .is_some_and(|c| matches!(c.phase, Phase::Idle { .. } | Phase::Busy { .. }));
                let busy = child.is_some_and(|c| match c.phase {
                    Phase::Busy { job } => self
                        .jobs
                        .get(&job)
                        .is_some_and(|j| j.visible == Visible::Running(r.name.clone())),
                    _ => false,
                });
                (*id, r.name.clone(), online, busy)
            })
            .collect()
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
            },
        );
        trace.record(t, format!("JIT runner {name} registered as {id}"));
        Some(id)
    }

    /// GitHub's `DELETE …/runners/{id}`: refused while the runner executes a job (GitHub
    /// knows whom it handed a job, whatever the listing's flag says); `None` when unknown.
    pub fn delete_registration(
        &mut self,
        t: u64,
        repo: &RepoName,
        id: u64,
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
            // while the runner's `busy` flag still lags its job (the job not yet shown running
            // on it); the runner keeps its job, and only stopping its child would end it.
            let flag_shows = self
                .jobs
                .get(&job)
                .is_some_and(|j| j.visible == Visible::Running(registration.name.clone()));
            if flag_shows {
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
}
