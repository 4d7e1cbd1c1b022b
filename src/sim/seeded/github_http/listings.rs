//! The run and job listings: the world's runs and jobs as the API shows them, one page at a
//! time with an ETag digested from what the page is made of, and their bodies, rendered only
//! when sent, from the documentation examples with the world's fields spliced in.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use serde_json::{Value, json};

use super::serve::repo_id;
use super::{API_URL, timestamp};
use crate::model::RepoName;
use crate::sim::seeded::options::ForgeKind;
use crate::sim::seeded::ports::Sim;
use crate::sim::seeded::world::Visible;
use crate::sim::twins;
use crate::sim::twins::github::{Query, RUN_SEARCH_CAP};

/// The run and job examples, parsed once. A listed run or job is the example with the
/// world's fields spliced in: the rest is serialised once and reused, which keeps a run
/// listing cheap enough to answer hundreds of thousands of times per sweep.
struct Templates {
    /// The example run without the fields filled in per run, as `"k":v,…` (no braces).
    run_rest: String,
    job_rest: String,
}

const RUN_FIELDS: &[&str] = &[
    "id",
    "run_number",
    "run_attempt",
    "status",
    "conclusion",
    "created_at",
    "updated_at",
    "run_started_at",
    "url",
    "html_url",
    "jobs_url",
];

const JOB_FIELDS: &[&str] = &[
    "id",
    "run_id",
    "run_url",
    "url",
    "html_url",
    "status",
    "conclusion",
    "created_at",
    "started_at",
    "completed_at",
    "steps",
    "labels",
    "runner_id",
    "runner_name",
    "runner_group_id",
    "runner_group_name",
];

fn rest_of(mut object: Value, filled: &[&str]) -> String {
    let map = object.as_object_mut().expect("a fixture object");
    for key in filled {
        map.remove(*key);
    }
    let text = object.to_string();
    text[1..text.len() - 1].to_string()
}

/// The twin's documentation examples, with run and job cut to what is not filled per answer.
static TEMPLATES: LazyLock<Templates> = LazyLock::new(|| {
    let fixtures = &*twins::github::TEMPLATES;
    let mut run = fixtures.run.clone();
    for key in ["repository", "head_repository"] {
        run[key] = minimal_repository(&run[key]);
    }
    Templates {
        run_rest: rest_of(run, RUN_FIELDS),
        job_rest: rest_of(fixtures.job.clone(), JOB_FIELDS),
    }
});

/// The identifying fields of a run's `repository`/`head_repository`. The documented object
/// has some eighty fields, mostly URL templates, and makes up two thirds of a listed run;
/// every listing is parsed again by the client on each poll (a 304 reuses the cached body),
/// so the full objects tripled the cost of a sweep for fields nobody reads.
fn minimal_repository(full: &Value) -> Value {
    let mut kept = serde_json::Map::new();
    for key in [
        "id",
        "node_id",
        "name",
        "full_name",
        "private",
        "html_url",
        "description",
        "fork",
        "url",
    ] {
        kept.insert(key.to_string(), full[key].clone());
    }
    let owner = &full["owner"];
    kept.insert(
        "owner".into(),
        json!({ "login": owner["login"], "id": owner["id"], "type": owner["type"] }),
    );
    Value::Object(kept)
}

/// A run as the API shows it: in progress once one of its jobs is, queued while one waits.
pub(super) struct RunView {
    id: u64,
    status: &'static str,
    created_s: i64,
}

/// A job as the API shows it.
pub(super) struct JobView {
    id: u64,
    in_progress: bool,
    created_s: i64,
    runner: Option<String>,
    labels: Vec<String>,
}

/// One page of a listing: what it shows, and its ETag. The ETag is a digest of everything
/// the body is made from, so the body is only rendered when it is sent.
pub(super) struct Page<T> {
    repo: RepoName,
    total: usize,
    items: Vec<T>,
    pub(super) link: Option<String>,
    pub(super) etag: String,
}

/// The repo's runs as a listing shows them: a status-filtered search (`searched`) from its
/// own index, which lags the job listings.
fn runs_of(sim: &Sim, repo: &RepoName, searched: bool) -> Vec<RunView> {
    let mut runs: BTreeMap<u64, RunView> = BTreeMap::new();
    for job in sim
        .world
        .jobs
        .values()
        .filter(|j| j.repo == *repo && j.forge == ForgeKind::GitHub)
    {
        let shown = if searched {
            &job.searched
        } else {
            &job.visible
        };
        let status = match shown {
            Visible::Hidden => continue,
            Visible::Queued => "queued",
            Visible::Running(_) => "in_progress",
        };
        let run = runs.entry(job.run).or_insert(RunView {
            id: job.run,
            status,
            created_s: job.queued_at_s,
        });
        if status == "in_progress" {
            run.status = status;
        }
        run.created_s = run.created_s.min(job.queued_at_s);
    }
    // Newest first, as GitHub lists them.
    runs.into_values().rev().collect()
}

fn digest(parts: impl IntoIterator<Item = String>) -> String {
    let hash = parts.into_iter().fold(0, |hash, part| {
        crate::sim::seeded::trace::fnv1a(hash, part.as_bytes())
    });
    format!("W/\"{hash:016x}\"")
}

pub(super) fn runs_page(sim: &Sim, repo: &RepoName, query: &Query) -> Page<RunView> {
    // `status` takes a status or a conclusion, as the twin's does; the world lists only
    // unfinished runs, whose conclusion is null, so a conclusion matches none of them.
    let mut runs: Vec<RunView> = runs_of(sim, repo, query.is_run_search())
        .into_iter()
        .filter(|r| query.run_status_matches(r.status, None))
        .collect();
    // A filtered listing is a search, capped at 1,000 runs (newest first) like GitHub's.
    if query.is_run_search() {
        runs.truncate(RUN_SEARCH_CAP);
    }
    let total = runs.len();
    let base = format!("{API_URL}/repositories/{}/actions/runs", repo_id(sim, repo));
    let (range, link) = query.page(total, &base);
    let items: Vec<RunView> = runs.drain(range).collect();
    let etag = digest(
        [format!("runs {repo} {total} {link:?}")].into_iter().chain(
            items
                .iter()
                .map(|r| format!("{} {} {};", r.id, r.status, r.created_s)),
        ),
    );
    Page {
        repo: repo.clone(),
        total,
        items,
        link,
        etag,
    }
}

pub(super) fn render_runs(page: &Page<RunView>) -> String {
    let repo = &page.repo;
    let mut body = format!("{{\"total_count\":{},\"workflow_runs\":[", page.total);
    for (i, run) in page.items.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        let url = format!("{API_URL}/repos/{repo}/actions/runs/{}", run.id);
        let created = timestamp(run.created_s);
        body.push_str(&format!(
            "{{\"id\":{id},\"run_number\":{id},\"run_attempt\":1,\"status\":\"{status}\",\"conclusion\":null,\
             \"created_at\":\"{created}\",\"updated_at\":\"{created}\",\"run_started_at\":\"{created}\",\
             \"url\":\"{url}\",\"html_url\":\"https://github.com/{repo}/actions/runs/{id}\",\
             \"jobs_url\":\"{url}/jobs\",{rest}}}",
            id = run.id,
            status = run.status,
            rest = TEMPLATES.run_rest,
        ));
    }
    body.push_str("]}");
    body
}

/// The jobs of run `run`, or `None` when the run is gone.
pub(super) fn jobs_page(
    sim: &Sim,
    repo: &RepoName,
    run: u64,
    query: &Query,
) -> Option<(u64, Page<JobView>)> {
    let mut exists = false;
    let mut jobs = Vec::new();
    for (id, job) in sim
        .world
        .jobs
        .iter()
        .filter(|(_, j)| j.repo == *repo && j.forge == ForgeKind::GitHub && j.run == run)
    {
        exists = true;
        // Jobs still waiting on `needs:` (or not shown yet) are not listed.
        let (in_progress, runner) = match &job.visible {
            Visible::Hidden => continue,
            Visible::Queued => (false, None),
            Visible::Running(runner) => (true, Some(runner.0.clone())),
        };
        jobs.push(JobView {
            id: *id,
            in_progress,
            created_s: job.queued_at_s,
            runner,
            labels: job.raw_labels.clone(),
        });
    }
    if !exists {
        return None;
    }
    let total = jobs.len();
    let base = format!(
        "{API_URL}/repositories/{}/actions/runs/{run}/jobs",
        repo_id(sim, repo)
    );
    let (range, link) = query.page(total, &base);
    let items: Vec<JobView> = jobs.drain(range).collect();
    let etag = digest(
        [format!("jobs {repo} {run} {total} {link:?}")]
            .into_iter()
            .chain(items.iter().map(|j| {
                format!(
                    "{} {} {} {:?} {:?};",
                    j.id, j.in_progress, j.created_s, j.runner, j.labels
                )
            })),
    );
    Some((
        run,
        Page {
            repo: repo.clone(),
            total,
            items,
            link,
            etag,
        },
    ))
}

impl Page<JobView> {
    /// The jobs of this page in progress on a named runner.
    pub(super) fn running(&self) -> Vec<u64> {
        self.items
            .iter()
            .filter(|j| j.in_progress && j.runner.is_some())
            .map(|j| j.id)
            .collect()
    }
}

pub(super) fn render_jobs(run: u64, page: &Page<JobView>) -> String {
    let repo = &page.repo;
    let mut body = format!("{{\"total_count\":{},\"jobs\":[", page.total);
    for (i, job) in page.items.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        let created = timestamp(job.created_s);
        let (status, started, runner) = match &job.runner {
            Some(runner) if job.in_progress => (
                "in_progress",
                format!("\"{created}\""),
                serde_json::to_string(runner).expect("a string serialises"),
            ),
            _ => ("queued", "null".to_string(), "null".to_string()),
        };
        let labels = serde_json::to_string(&job.labels).expect("strings serialise");
        body.push_str(&format!(
            "{{\"id\":{id},\"run_id\":{run},\"run_url\":\"{API_URL}/repos/{repo}/actions/runs/{run}\",\
             \"url\":\"{API_URL}/repos/{repo}/actions/jobs/{id}\",\
             \"html_url\":\"https://github.com/{repo}/actions/runs/{run}/job/{id}\",\
             \"status\":\"{status}\",\"conclusion\":null,\"created_at\":\"{created}\",\
             \"started_at\":{started},\"completed_at\":null,\"steps\":[],\"labels\":{labels},\
             \"runner_id\":null,\"runner_name\":{runner},\"runner_group_id\":null,\
             \"runner_group_name\":null,{rest}}}",
            id = job.id,
            rest = TEMPLATES.job_rest,
        ));
    }
    body.push_str("]}");
    body
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    const APP_REPO: &str = "afreidah/munchbox";

    #[test]
    fn listed_runs_and_jobs_have_the_documented_fields() {
        let keys = |value: &Value| -> BTreeSet<String> {
            value
                .as_object()
                .expect("an object")
                .keys()
                .cloned()
                .collect()
        };
        let fixture_runs: Value = serde_json::from_str(include_str!(
            "../../../../tests/fixtures/github/list-workflow-runs-for-repo.response.json"
        ))
        .expect("JSON");
        let fixture_jobs: Value = serde_json::from_str(include_str!(
            "../../../../tests/fixtures/github/list-jobs-for-workflow-run.response.json"
        ))
        .expect("JSON");
        let repo = RepoName::parse(APP_REPO).expect("a name");
        let runs = Page {
            repo: repo.clone(),
            total: 1,
            items: vec![RunView {
                id: 5,
                status: "queued",
                created_s: -30,
            }],
            link: None,
            etag: String::new(),
        };
        let rendered: Value = serde_json::from_str(&render_runs(&runs)).expect("JSON");
        assert_eq!(keys(&rendered), keys(&fixture_runs));
        assert_eq!(
            keys(&rendered["workflow_runs"][0]),
            keys(&fixture_runs["workflow_runs"][0])
        );
        let jobs = Page {
            repo,
            total: 1,
            items: vec![JobView {
                id: 6,
                in_progress: true,
                created_s: 10,
                runner: Some("ci-runner-1".into()),
                labels: vec!["self-hosted".into()],
            }],
            link: None,
            etag: String::new(),
        };
        let rendered: Value = serde_json::from_str(&render_jobs(5, &jobs)).expect("JSON");
        let mut documented = keys(&fixture_jobs["jobs"][0]);
        // Required by the schema, absent from the documentation's example.
        documented.insert("created_at".into());
        assert_eq!(keys(&rendered["jobs"][0]), documented);
        assert_eq!(rendered["jobs"][0]["runner_name"], "ci-runner-1");
    }
}
