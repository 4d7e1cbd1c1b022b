//! What the twin holds, behind one lock: per repo its runs, their jobs and the runners
//! registered, and the App's installations, the tokens issued, the budgets and the records of
//! what was served. Also the views of it the world and tests read, and how a run's status
//! follows its jobs.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Duration, Utc};
use jsonwebtoken::DecodingKey;

use super::app_auth::{Grant, TokenRequest};
use super::rate_limits::{BUDGET_LIMIT_DEFAULT, BudgetState, RateLimitAnswer};
use super::requests::LoggedRequest;
use crate::model::RepoName;

/// A job's status as the twin keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwinJobStatus {
    Queued,
    InProgress,
    Completed,
}

impl TwinJobStatus {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            TwinJobStatus::Queued => "queued",
            TwinJobStatus::InProgress => "in_progress",
            TwinJobStatus::Completed => "completed",
        }
    }
}

/// What `add_run` created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunIds {
    pub run_id: u64,
    pub job_ids: Vec<u64>,
}

/// One job as the world sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobView {
    pub run_id: u64,
    pub status: TwinJobStatus,
    pub conclusion: Option<String>,
    pub runner_name: Option<String>,
    pub labels: Vec<String>,
}

/// One runner registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerView {
    pub id: u64,
    pub name: String,
    pub labels: Vec<String>,
    /// Listed as `status: "online"`: the runner's listener is connected.
    pub online: bool,
    pub busy: bool,
}

/// How a registered runner reads in GitHub's listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunnerPresence {
    pub online: bool,
    pub busy: bool,
}

impl RunnerPresence {
    /// Connected and waiting for a job.
    pub const IDLE: RunnerPresence = RunnerPresence {
        online: true,
        busy: false,
    };
    /// Connected and executing a job: GitHub refuses to delete it (422).
    pub const BUSY: RunnerPresence = RunnerPresence {
        online: true,
        busy: true,
    };
    /// Registered, its listener gone (a runner killed with its allocation).
    pub const OFFLINE: RunnerPresence = RunnerPresence {
        online: false,
        busy: false,
    };
}

/// A registration `DELETE …/actions/runners/{id}` removed (answered 204).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeletedRunner {
    pub repo: RepoName,
    pub id: u64,
    pub name: String,
    /// When the twin served the deletion, to order it against what other twins recorded.
    pub at: std::time::Instant,
}

pub(super) struct InstallationState {
    pub(super) id: u64,
    pub(super) permissions: BTreeMap<String, String>,
}

pub(super) struct RunState {
    pub(super) id: u64,
    pub(super) run_number: u64,
    pub(super) attempt: u32,
    pub(super) created_at: DateTime<Utc>,
    pub(super) updated_at: DateTime<Utc>,
    pub(super) gate: Option<RunGate>,
    /// Missing from status-filtered searches while GitHub's search index lags the run (the
    /// unfiltered listing shows it already).
    pub(super) search_lagging: bool,
}

/// A gate a run can wait at while some of its jobs are already queued. GitHub then shows the
/// gate as the run's status instead of `queued` or `in_progress`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunGate {
    /// A job waits for an environment's approval.
    Waiting,
    /// Behind another run of the same concurrency group.
    Pending,
    Requested,
}

impl RunGate {
    fn as_str(self) -> &'static str {
        match self {
            RunGate::Waiting => "waiting",
            RunGate::Pending => "pending",
            RunGate::Requested => "requested",
        }
    }
}

pub(super) struct JobState {
    pub(super) id: u64,
    pub(super) run_id: u64,
    pub(super) attempt: u32,
    pub(super) labels: Vec<String>,
    pub(super) status: TwinJobStatus,
    pub(super) conclusion: Option<String>,
    pub(super) created_at: DateTime<Utc>,
    pub(super) started_at: Option<DateTime<Utc>>,
    pub(super) completed_at: Option<DateTime<Utc>>,
    pub(super) runner_id: Option<u64>,
    pub(super) runner_name: Option<String>,
}

pub(super) struct RunnerState {
    pub(super) id: u64,
    pub(super) name: String,
    pub(super) labels: Vec<String>,
    pub(super) online: bool,
    pub(super) busy: bool,
}

pub(super) struct RepoState {
    pub(super) id: u64,
    pub(super) runs: BTreeMap<u64, RunState>,
    pub(super) jobs: BTreeMap<u64, JobState>,
    pub(super) runners: BTreeMap<u64, RunnerState>,
    pub(super) runs_created: u64,
}

pub(super) struct Twin {
    pub(super) app_id: String,
    pub(super) app_key: DecodingKey,
    pub(super) clock_offset: Duration,
    pub(super) next_id: u64,
    pub(super) installations: BTreeMap<String, InstallationState>,
    pub(super) repos: BTreeMap<RepoName, RepoState>,
    pub(super) tokens: HashMap<String, Grant>,
    pub(super) budgets: HashMap<String, BudgetState>,
    pub(super) budget_limit: u64,
    pub(super) forced_limit: Option<RateLimitAnswer>,
    pub(super) token_requests: Vec<TokenRequest>,
    pub(super) issued: Vec<String>,
    pub(super) log: Vec<LoggedRequest>,
    pub(super) deleted_runners: Vec<DeletedRunner>,
}

impl Twin {
    /// An empty world whose App is `app_id`, its JWTs checked with `app_key`.
    pub(super) fn new(app_id: &str, app_key: DecodingKey) -> Twin {
        Twin {
            app_id: app_id.to_string(),
            app_key,
            clock_offset: Duration::zero(),
            next_id: 1000,
            installations: BTreeMap::new(),
            repos: BTreeMap::new(),
            tokens: HashMap::new(),
            budgets: HashMap::new(),
            budget_limit: BUDGET_LIMIT_DEFAULT,
            forced_limit: None,
            token_requests: Vec::new(),
            issued: Vec::new(),
            log: Vec::new(),
            deleted_runners: Vec::new(),
        }
    }

    pub(super) fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.clock_offset
    }

    pub(super) fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub(super) fn repo_mut(&mut self, repo: &RepoName) -> &mut RepoState {
        if !self.repos.contains_key(repo) {
            let id = self.id();
            self.repos.insert(
                repo.clone(),
                RepoState {
                    id,
                    runs: BTreeMap::new(),
                    jobs: BTreeMap::new(),
                    runners: BTreeMap::new(),
                    runs_created: 0,
                },
            );
        }
        self.repos.get_mut(repo).expect("just inserted")
    }
}

impl RepoState {
    pub(super) fn touch(&mut self, run_id: u64, now: DateTime<Utc>) {
        if let Some(run) = self.runs.get_mut(&run_id) {
            run.updated_at = now;
        }
    }

    pub(super) fn finish(
        &mut self,
        job_id: u64,
        conclusion: &str,
        now: DateTime<Utc>,
    ) -> Result<(), String> {
        let job = self
            .jobs
            .get_mut(&job_id)
            .ok_or(format!("no job {job_id}"))?;
        if job.status == TwinJobStatus::Completed {
            return Err(format!("job {job_id} is completed"));
        }
        job.status = TwinJobStatus::Completed;
        job.conclusion = Some(conclusion.to_string());
        job.completed_at = Some(now);
        let (run_id, runner_id) = (job.run_id, job.runner_id);
        if let Some(runner) = runner_id.and_then(|id| self.runners.get_mut(&id)) {
            runner.busy = false;
        }
        self.touch(run_id, now);
        Ok(())
    }

    fn latest_jobs(&self, run: &RunState) -> impl Iterator<Item = &JobState> {
        self.jobs
            .values()
            .filter(move |j| j.run_id == run.id && j.attempt == run.attempt)
    }

    /// A run's status follows its latest attempt's jobs: queued while all are queued,
    /// completed when all are, in progress in between; at its gate while it has one and a
    /// job is unfinished.
    pub(super) fn run_status(&self, run: &RunState) -> (&'static str, Option<&'static str>) {
        let jobs: Vec<&JobState> = self.latest_jobs(run).collect();
        if let Some(gate) = run.gate
            && !jobs.iter().all(|j| j.status == TwinJobStatus::Completed)
        {
            return (gate.as_str(), None);
        }
        if jobs.iter().all(|j| j.status == TwinJobStatus::Queued) {
            return ("queued", None);
        }
        if !jobs.iter().all(|j| j.status == TwinJobStatus::Completed) {
            return ("in_progress", None);
        }
        let any = |c: &str| jobs.iter().any(|j| j.conclusion.as_deref() == Some(c));
        let conclusion = if any("failure") {
            "failure"
        } else if any("cancelled") {
            "cancelled"
        } else {
            "success"
        };
        ("completed", Some(conclusion))
    }
}

#[cfg(test)]
mod tests {
    use super::super::GitHubTwin;
    use crate::model::RepoName;

    #[test]
    fn run_status_follows_the_latest_attempt() {
        let twin = GitHubTwin::new();
        let repo = RepoName::parse("acme/api").unwrap();
        let ids = twin.add_run(&repo, vec![vec!["self-hosted"], vec!["self-hosted"]]);
        let status = |twin: &GitHubTwin| {
            let t = twin.lock();
            let state = t.repos.get(&repo).unwrap();
            let run = state.runs.get(&ids.run_id).unwrap();
            let (s, c) = state.run_status(run);
            (s, c)
        };
        assert_eq!(status(&twin), ("queued", None));
        twin.start_job(&repo, ids.job_ids[0], "r1").unwrap();
        assert_eq!(status(&twin), ("in_progress", None));
        twin.complete_job(&repo, ids.job_ids[0], "success").unwrap();
        assert_eq!(status(&twin), ("in_progress", None));
        twin.cancel_job(&repo, ids.job_ids[1]).unwrap();
        assert_eq!(status(&twin), ("completed", Some("cancelled")));
        twin.rerun(&repo, ids.run_id).unwrap();
        assert_eq!(status(&twin), ("queued", None));
    }
}
