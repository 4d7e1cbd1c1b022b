//! The levers that move the twin's world as GitHub's users and runners would: repos, runs
//! and their jobs (queued, taken, finished, cancelled, re-run) and runner registrations
//! (registered, busy, offline, removed). The API's answers follow from the state alone.

use super::GitHubTwin;
use super::state::{
    DeletedRunner, JobState, JobView, RunGate, RunIds, RunState, RunnerPresence, RunnerState,
    RunnerView, TwinJobStatus,
};
use crate::model::RepoName;

impl GitHubTwin {
    /// Creates `repo` if it is new; returns its id.
    pub fn add_repo(&self, repo: &RepoName) -> u64 {
        self.lock().repo_mut(repo).id
    }

    /// A new run on `repo` with one queued job per label list; ids in the order given.
    pub fn add_run<L: AsRef<str>>(&self, repo: &RepoName, jobs: Vec<Vec<L>>) -> RunIds {
        let mut twin = self.lock();
        let now = twin.now();
        let run_id = twin.id();
        let job_ids: Vec<u64> = jobs.iter().map(|_| twin.id()).collect();
        let state = twin.repo_mut(repo);
        state.runs_created += 1;
        state.runs.insert(
            run_id,
            RunState {
                id: run_id,
                run_number: state.runs_created,
                attempt: 1,
                created_at: now,
                updated_at: now,
                gate: None,
                search_lagging: false,
            },
        );
        for (id, labels) in job_ids.iter().zip(jobs) {
            state.jobs.insert(
                *id,
                JobState {
                    id: *id,
                    run_id,
                    attempt: 1,
                    labels: labels.iter().map(|l| l.as_ref().to_string()).collect(),
                    status: TwinJobStatus::Queued,
                    conclusion: None,
                    created_at: now,
                    started_at: None,
                    completed_at: None,
                    runner_id: None,
                    runner_name: None,
                },
            );
        }
        RunIds { run_id, job_ids }
    }

    /// Holds a run at `gate` (`None` lifts it): until all its jobs finish, it is listed with
    /// the gate's status, whatever its jobs do.
    pub fn hold_run(&self, repo: &RepoName, run_id: u64, gate: Option<RunGate>) {
        let mut twin = self.lock();
        if let Some(run) = twin.repo_mut(repo).runs.get_mut(&run_id) {
            run.gate = gate;
        }
    }

    /// Keeps a run out of status-filtered searches (`?status=…`) while `lagging`, as GitHub's
    /// search index does for a few seconds after a run is created or moves; the unfiltered
    /// listing of the newest runs shows it all along.
    pub fn lag_run_search(&self, repo: &RepoName, run_id: u64, lagging: bool) {
        let mut twin = self.lock();
        if let Some(run) = twin.repo_mut(repo).runs.get_mut(&run_id) {
            run.search_lagging = lagging;
        }
    }

    pub fn job_status(&self, repo: &RepoName, job_id: u64) -> Option<JobView> {
        let twin = self.lock();
        let job = twin.repos.get(repo)?.jobs.get(&job_id)?;
        Some(JobView {
            run_id: job.run_id,
            status: job.status,
            conclusion: job.conclusion.clone(),
            runner_name: job.runner_name.clone(),
            labels: job.labels.clone(),
        })
    }

    /// Every job of `repo` with its id, oldest first.
    pub fn jobs(&self, repo: &RepoName) -> Vec<(u64, JobView)> {
        let twin = self.lock();
        let Some(state) = twin.repos.get(repo) else {
            return Vec::new();
        };
        state
            .jobs
            .values()
            .map(|job| {
                (
                    job.id,
                    JobView {
                        run_id: job.run_id,
                        status: job.status,
                        conclusion: job.conclusion.clone(),
                        runner_name: job.runner_name.clone(),
                        labels: job.labels.clone(),
                    },
                )
            })
            .collect()
    }

    /// A runner takes a queued job: the job goes `in_progress` naming the runner (and its id
    /// when such a runner is registered, which then reads busy).
    pub fn start_job(&self, repo: &RepoName, job_id: u64, runner_name: &str) -> Result<(), String> {
        let mut twin = self.lock();
        let now = twin.now();
        let state = twin.repos.get_mut(repo).ok_or(format!("no repo {repo}"))?;
        let runner = state.runners.values_mut().find(|r| r.name == runner_name);
        let runner_id = runner.map(|r| {
            r.busy = true;
            r.id
        });
        let job = state
            .jobs
            .get_mut(&job_id)
            .ok_or(format!("no job {job_id}"))?;
        if job.status != TwinJobStatus::Queued {
            return Err(format!("job {job_id} is {}", job.status.as_str()));
        }
        job.status = TwinJobStatus::InProgress;
        job.started_at = Some(now);
        job.runner_name = Some(runner_name.to_string());
        job.runner_id = runner_id;
        let run_id = job.run_id;
        state.touch(run_id, now);
        Ok(())
    }

    /// A job finishes with `conclusion` (`success`, `failure`, …); its runner is idle again.
    pub fn complete_job(
        &self,
        repo: &RepoName,
        job_id: u64,
        conclusion: &str,
    ) -> Result<(), String> {
        let mut twin = self.lock();
        let now = twin.now();
        let state = twin.repos.get_mut(repo).ok_or(format!("no repo {repo}"))?;
        state.finish(job_id, conclusion, now)
    }

    /// Cancels a queued or running job.
    pub fn cancel_job(&self, repo: &RepoName, job_id: u64) -> Result<(), String> {
        self.complete_job(repo, job_id, "cancelled")
    }

    /// Re-runs every job of a run as a new attempt; returns the new job ids.
    pub fn rerun(&self, repo: &RepoName, run_id: u64) -> Result<Vec<u64>, String> {
        let mut twin = self.lock();
        let now = twin.now();
        let (labels, attempt) = {
            let state = twin.repos.get(repo).ok_or(format!("no repo {repo}"))?;
            let run = state.runs.get(&run_id).ok_or(format!("no run {run_id}"))?;
            let labels: Vec<Vec<String>> = state
                .jobs
                .values()
                .filter(|j| j.run_id == run_id && j.attempt == run.attempt)
                .map(|j| j.labels.clone())
                .collect();
            (labels, run.attempt + 1)
        };
        let ids: Vec<u64> = labels.iter().map(|_| twin.id()).collect();
        let state = twin.repo_mut(repo);
        for (id, labels) in ids.iter().zip(labels) {
            state.jobs.insert(
                *id,
                JobState {
                    id: *id,
                    run_id,
                    attempt,
                    labels,
                    status: TwinJobStatus::Queued,
                    conclusion: None,
                    created_at: now,
                    started_at: None,
                    completed_at: None,
                    runner_id: None,
                    runner_name: None,
                },
            );
        }
        if let Some(run) = state.runs.get_mut(&run_id) {
            run.attempt = attempt;
            run.updated_at = now;
        }
        Ok(ids)
    }

    /// Registers a runner (what `config.sh` does) that connects and waits for a job; returns
    /// its id.
    pub fn register_runner<L: AsRef<str>>(&self, repo: &RepoName, name: &str, labels: &[L]) -> u64 {
        self.register_runner_as(repo, name, labels, RunnerPresence::IDLE)
    }

    /// Registers a runner that reads as `presence` says; returns its id.
    pub fn register_runner_as<L: AsRef<str>>(
        &self,
        repo: &RepoName,
        name: &str,
        labels: &[L],
        presence: RunnerPresence,
    ) -> u64 {
        let mut twin = self.lock();
        let id = twin.id();
        twin.repo_mut(repo).runners.insert(
            id,
            RunnerState {
                id,
                name: name.to_string(),
                labels: labels.iter().map(|l| l.as_ref().to_string()).collect(),
                online: presence.online,
                busy: presence.busy,
            },
        );
        id
    }

    /// Sets the `busy` flag of the runner named `name` (GitHub's flag lags the job it runs);
    /// false when no such runner is registered.
    pub fn set_runner_busy(&self, repo: &RepoName, name: &str, busy: bool) -> bool {
        self.with_runner(repo, name, |runner| runner.busy = busy)
    }

    /// Connects or disconnects the runner named `name`; false when no such runner is registered.
    pub fn set_runner_online(&self, repo: &RepoName, name: &str, online: bool) -> bool {
        self.with_runner(repo, name, |runner| runner.online = online)
    }

    fn with_runner(
        &self,
        repo: &RepoName,
        name: &str,
        change: impl FnOnce(&mut RunnerState),
    ) -> bool {
        let mut twin = self.lock();
        let runner = twin
            .repos
            .get_mut(repo)
            .and_then(|state| state.runners.values_mut().find(|r| r.name == name));
        match runner {
            Some(runner) => {
                change(runner);
                true
            }
            None => false,
        }
    }

    /// A run with one job already taken by `runner_name` (GitHub assigned it to the runner
    /// before anyone could list it queued), all under one lock so no listing sees it queued.
    /// The runner, if registered, reads busy. Returns the ids.
    pub fn add_run_in_progress<L: AsRef<str>>(
        &self,
        repo: &RepoName,
        labels: Vec<L>,
        runner_name: &str,
    ) -> RunIds {
        let mut twin = self.lock();
        let now = twin.now();
        let run_id = twin.id();
        let job_id = twin.id();
        let state = twin.repo_mut(repo);
        state.runs_created += 1;
        state.runs.insert(
            run_id,
            RunState {
                id: run_id,
                run_number: state.runs_created,
                attempt: 1,
                created_at: now,
                updated_at: now,
                gate: None,
                search_lagging: false,
            },
        );
        let runner_id = state
            .runners
            .values_mut()
            .find(|r| r.name == runner_name)
            .map(|r| {
                r.busy = true;
                r.id
            });
        state.jobs.insert(
            job_id,
            JobState {
                id: job_id,
                run_id,
                attempt: 1,
                labels: labels.iter().map(|l| l.as_ref().to_string()).collect(),
                status: TwinJobStatus::InProgress,
                conclusion: None,
                created_at: now,
                started_at: Some(now),
                completed_at: None,
                runner_id,
                runner_name: Some(runner_name.to_string()),
            },
        );
        RunIds {
            run_id,
            job_ids: vec![job_id],
        }
    }

    /// Every registration the API deleted (204), in order.
    pub fn deleted_runners(&self) -> Vec<DeletedRunner> {
        self.lock().deleted_runners.clone()
    }

    /// Removes a runner registration by name (an ephemeral runner leaving); true if it existed.
    pub fn remove_runner(&self, repo: &RepoName, name: &str) -> bool {
        let mut twin = self.lock();
        let Some(state) = twin.repos.get_mut(repo) else {
            return false;
        };
        let before = state.runners.len();
        state.runners.retain(|_, r| r.name != name);
        state.runners.len() != before
    }

    pub fn runners(&self, repo: &RepoName) -> Vec<RunnerView> {
        let twin = self.lock();
        twin.repos
            .get(repo)
            .map(|state| {
                state
                    .runners
                    .values()
                    .map(|r| RunnerView {
                        id: r.id,
                        name: r.name.clone(),
                        labels: r.labels.clone(),
                        online: r.online,
                        busy: r.busy,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}
