//! Queue → start waits: a job seen queued on one tick and in progress (or claimed) on a
//! later one started in between. Its wait is taken at the tick that first sees it started,
//! so it is late by up to one poll interval; its queued time is the forge's (GitHub's
//! `created_at`) or, on Forgejo, whose jobs carry none, the loop's first sighting.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::model::RepoName;
use crate::observe::{JobState, Snapshot};

#[derive(Debug, Default)]
pub struct StartWaits {
    /// Jobs last seen queued, with when they were queued.
    queued: BTreeMap<(RepoName, u64), DateTime<Utc>>,
}

impl StartWaits {
    /// The waits of jobs seen queued before and started now. Jobs that vanish from a repo
    /// that was read (cancelled, or run between two ticks) are forgotten unmeasured; a repo
    /// that could not be read keeps its jobs until it can.
    pub fn observe(
        &mut self,
        snapshot: &Snapshot,
        now: DateTime<Utc>,
    ) -> Vec<(RepoName, Duration)> {
        let mut waits = Vec::new();
        let mut queued_now = BTreeMap::new();
        for (repo, listing) in &snapshot.repos {
            let Ok(listing) = listing else {
                continue;
            };
            for job in &listing.jobs {
                let key = (repo.clone(), job.id);
                match job.state {
                    JobState::Queued => {
                        queued_now.insert(key, job.queued_at.unwrap_or(now));
                    }
                    JobState::InProgress { .. } | JobState::Claimed => {
                        if let Some(queued_at) = self.queued.get(&key) {
                            waits.push((
                                repo.clone(),
                                (now - *queued_at).to_std().unwrap_or_default(),
                            ));
                        }
                    }
                }
            }
        }
        self.queued
            .retain(|(repo, _), _| matches!(snapshot.repos.get(repo), Some(Err(_))));
        self.queued.extend(queued_now);
        waits
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::{ForgeJob, Gap, RepoJobs};

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + s, 0).unwrap()
    }

    fn snapshot(jobs: &[(u64, JobState, Option<i64>)]) -> Snapshot {
        let mut snapshot = Snapshot::default();
        snapshot.repos.insert(
            RepoName::parse("acme/api").unwrap(),
            Ok(RepoJobs {
                jobs: jobs
                    .iter()
                    .map(|(id, state, queued)| ForgeJob {
                        id: *id,
                        labels: vec!["self-hosted".into()],
                        state: state.clone(),
                        queued_at: queued.map(t),
                    })
                    .collect(),
                truncated: false,
            }),
        );
        snapshot
    }

    #[test]
    fn a_job_seen_queued_then_in_progress_yields_its_wait_once() {
        let mut waits = StartWaits::default();
        let running = JobState::InProgress { runner: None };
        assert!(
            waits
                .observe(&snapshot(&[(1, JobState::Queued, Some(0))]), t(15))
                .is_empty()
        );
        let seen = waits.observe(&snapshot(&[(1, running.clone(), Some(0))]), t(30));
        assert_eq!(
            seen,
            vec![(
                RepoName::parse("acme/api").unwrap(),
                Duration::from_secs(30)
            )]
        );
        assert!(
            waits
                .observe(&snapshot(&[(1, running, Some(0))]), t(45))
                .is_empty()
        );
    }

    #[test]
    fn a_job_first_seen_in_progress_is_not_measured() {
        let mut waits = StartWaits::default();
        let seen = waits.observe(&snapshot(&[(1, JobState::Claimed, None)]), t(30));
        assert!(seen.is_empty());
    }

    #[test]
    fn an_unreadable_repo_keeps_its_queued_jobs() {
        let mut waits = StartWaits::default();
        waits.observe(&snapshot(&[(1, JobState::Queued, None)]), t(0));
        let mut gap = Snapshot::default();
        gap.repos.insert(
            RepoName::parse("acme/api").unwrap(),
            Err(Gap {
                class: crate::model::ErrorClass::Transient,
                message: "down".into(),
            }),
        );
        waits.observe(&gap, t(15));
        let seen = waits.observe(&snapshot(&[(1, JobState::Claimed, None)]), t(30));
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].1, Duration::from_secs(30));
    }
}
