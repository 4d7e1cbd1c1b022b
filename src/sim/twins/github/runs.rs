//! The run and job routes: the runs listing (newest first, filtered by status, a search
//! capped), a run's jobs (its latest attempt, or every attempt with `filter=all`) and one job,
//! each the documentation example with the twin's state filled in.

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::query::{Query, RUN_SEARCH_CAP, paginate, with_link};
use super::requests::Reply;
use super::state::{JobState, RepoState, RunState, Twin, TwinJobStatus};
use super::templates::{TEMPLATES, time};
use crate::model::RepoName;

impl Twin {
    /// `GET …/actions/runs`: newest first, under the `status` filter; a search is capped.
    pub(super) fn list_runs(&self, repo: &RepoName, query: &Query, base: &str) -> Reply {
        let state = self.repos.get(repo).expect("checked by the caller");
        let links = format!("{base}/repositories/{}", state.id);
        let mut runs: Vec<&RunState> = state
            .runs
            .values()
            .filter(|run| !(run.search_lagging && query.is_run_search()))
            .filter(|run| {
                let (status, conclusion) = state.run_status(run);
                query.run_status_matches(status, conclusion)
            })
            .collect();
        runs.sort_by_key(|run| std::cmp::Reverse(run.id));
        if query.is_run_search() {
            runs.truncate(RUN_SEARCH_CAP);
        }
        let total = runs.len();
        let (page, link) = paginate(&runs, query, &format!("{links}/actions/runs"));
        let runs: Vec<Value> = page
            .iter()
            .map(|run| run_json(repo, state, run, base))
            .collect();
        let reply = Reply::json(
            StatusCode::OK,
            json!({ "total_count": total, "workflow_runs": runs }),
        );
        with_link(reply, link)
    }

    /// `GET …/actions/runs/{run_id}/jobs`: the latest attempt's jobs, or all with `filter=all`.
    pub(super) fn list_jobs(
        &self,
        repo: &RepoName,
        run_id: u64,
        query: &Query,
        base: &str,
    ) -> Reply {
        let state = self.repos.get(repo).expect("checked by the caller");
        let links = format!("{base}/repositories/{}", state.id);
        let Some(run) = state.runs.get(&run_id) else {
            return Reply::not_found();
        };
        let all = query.get("filter") == Some("all");
        let jobs: Vec<&JobState> = state
            .jobs
            .values()
            .filter(|j| j.run_id == run_id && (all || j.attempt == run.attempt))
            .collect();
        let total = jobs.len();
        let (page, link) = paginate(&jobs, query, &format!("{links}/actions/runs/{run_id}/jobs"));
        let jobs: Vec<Value> = page.iter().map(|job| job_json(repo, job, base)).collect();
        with_link(
            Reply::json(
                StatusCode::OK,
                json!({ "total_count": total, "jobs": jobs }),
            ),
            link,
        )
    }

    /// `GET …/actions/jobs/{job_id}`.
    pub(super) fn get_job(&self, repo: &RepoName, job_id: u64, base: &str) -> Reply {
        let state = self.repos.get(repo).expect("checked by the caller");
        match state.jobs.get(&job_id) {
            Some(job) => Reply::json(StatusCode::OK, job_json(repo, job, base)),
            None => Reply::not_found(),
        }
    }
}

fn run_json(repo: &RepoName, state: &RepoState, run: &RunState, base: &str) -> Value {
    let (status, conclusion) = state.run_status(run);
    let api = format!("{base}/repos/{repo}/actions/runs/{}", run.id);
    let mut value = TEMPLATES.run.clone();
    value["id"] = json!(run.id);
    value["run_number"] = json!(run.run_number);
    value["run_attempt"] = json!(run.attempt);
    value["status"] = json!(status);
    value["conclusion"] = json!(conclusion);
    value["created_at"] = json!(time(run.created_at));
    value["updated_at"] = json!(time(run.updated_at));
    value["run_started_at"] = json!(time(run.created_at));
    value["url"] = json!(api);
    value["html_url"] = json!(format!("{base}/{repo}/actions/runs/{}", run.id));
    value["jobs_url"] = json!(format!("{api}/jobs"));
    value["logs_url"] = json!(format!("{api}/logs"));
    value["artifacts_url"] = json!(format!("{api}/artifacts"));
    value["cancel_url"] = json!(format!("{api}/cancel"));
    value["rerun_url"] = json!(format!("{api}/rerun"));
    value["repository"]["id"] = json!(state.id);
    value["repository"]["name"] = json!(repo.name());
    value["repository"]["full_name"] = json!(repo.to_string());
    value["repository"]["owner"]["login"] = json!(repo.owner());
    value
}

fn job_json(repo: &RepoName, job: &JobState, base: &str) -> Value {
    let mut value = TEMPLATES.job.clone();
    value["id"] = json!(job.id);
    value["run_id"] = json!(job.run_id);
    value["run_url"] = json!(format!("{base}/repos/{repo}/actions/runs/{}", job.run_id));
    value["url"] = json!(format!("{base}/repos/{repo}/actions/jobs/{}", job.id));
    value["html_url"] = json!(format!(
        "{base}/{repo}/actions/runs/{}/job/{}",
        job.run_id, job.id
    ));
    value["status"] = json!(job.status.as_str());
    value["conclusion"] = json!(job.conclusion);
    // GitHub fills `started_at` with the creation time while a job waits.
    value["started_at"] = json!(time(job.started_at.unwrap_or(job.created_at)));
    value["completed_at"] = json!(job.completed_at.map(time));
    value["labels"] = json!(job.labels);
    value["runner_id"] = json!(job.runner_id);
    value["runner_name"] = json!(job.runner_name);
    let assigned = job.runner_name.is_some();
    value["runner_group_id"] = if assigned { json!(1) } else { Value::Null };
    value["runner_group_name"] = if assigned {
        json!("Default")
    } else {
        Value::Null
    };
    if job.status == TwinJobStatus::Queued {
        value["steps"] = json!([]);
    }
    // Required by the schema although the documentation example lacks them.
    value["created_at"] = json!(time(job.created_at));
    value["run_attempt"] = json!(job.attempt);
    value
}
