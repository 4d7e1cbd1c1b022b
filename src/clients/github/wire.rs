//! The parts of GitHub's JSON the daemon reads. Everything else in a body is ignored, so new
//! fields on GitHub's side change nothing here.

use secrecy::SecretString;
use serde::Deserialize;

/// `GET /repos/{owner}/{repo}/actions/runs` → 200.
#[derive(Deserialize)]
pub struct RunsPage {
    pub total_count: u64,
    pub workflow_runs: Vec<Run>,
}

#[derive(Deserialize)]
pub struct Run {
    pub id: u64,
    /// `completed` once the run is over; nullable in the schema.
    #[serde(default)]
    pub status: Option<String>,
}

/// `GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs` → 200.
#[derive(Deserialize)]
pub struct JobsPage {
    pub total_count: u64,
    pub jobs: Vec<Job>,
}

#[derive(Deserialize)]
pub struct Job {
    pub id: u64,
    pub status: String,
    /// The job's `runs-on` labels: untrusted input from a workflow file.
    #[serde(default)]
    pub labels: Vec<String>,
    pub runner_name: Option<String>,
    /// Required by the schema, absent from GitHub's own example.
    pub created_at: Option<String>,
    pub started_at: Option<String>,
}

/// `GET /repos/{owner}/{repo}/actions/runners` → 200.
#[derive(Deserialize)]
pub struct RunnersPage {
    pub total_count: u64,
    pub runners: Vec<Runner>,
}

#[derive(Deserialize)]
pub struct Runner {
    pub id: u64,
    pub name: String,
    /// `online` or `offline` in GitHub's examples; a free string in the schema.
    pub status: String,
    pub busy: bool,
}

/// `POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig` → 201.
#[derive(Deserialize)]
pub struct JitConfig {
    pub runner: Runner,
    pub encoded_jit_config: SecretString,
}

/// `GET /repos/{owner}/{repo}/installation` → 200 (the "Installation" object).
#[derive(Deserialize)]
pub struct Installation {
    pub id: u64,
}

/// `POST /app/installations/{id}/access_tokens` → 201, and
/// `POST /repos/{owner}/{repo}/actions/runners/registration-token` → 201.
#[derive(Deserialize)]
pub struct Token {
    pub token: SecretString,
    pub expires_at: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    fn fixture(name: &str) -> String {
        let path = format!(
            "{}/tests/fixtures/github/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn fixture_bodies_parse() {
        let runs: RunsPage =
            serde_json::from_str(&fixture("list-workflow-runs-for-repo.response.json")).unwrap();
        assert_eq!(runs.total_count, 1);
        assert_eq!(runs.workflow_runs[0].id, 30433642);

        let jobs: JobsPage =
            serde_json::from_str(&fixture("list-jobs-for-workflow-run.response.json")).unwrap();
        let job = &jobs.jobs[0];
        assert_eq!((job.id, job.status.as_str()), (399444496, "completed"));
        assert_eq!(job.labels, ["self-hosted", "foo", "bar"]);
        assert_eq!(job.runner_name.as_deref(), Some("my runner"));
        assert_eq!(job.created_at, None);

        let installation: Installation =
            serde_json::from_str(&fixture("get-installation.response.json")).unwrap();
        assert_eq!(installation.id, 1);

        let token: Token =
            serde_json::from_str(&fixture("create-installation-access-token.response.json"))
                .unwrap();
        assert_eq!(
            token.token.expose_secret(),
            "ghs_16C7e42F292c6912E7710c838347Ae178B4a"
        );
        let runners: RunnersPage =
            serde_json::from_str(&fixture("list-runners-for-repo.response.json")).unwrap();
        assert_eq!(runners.total_count, 2);
        let runner = &runners.runners[0];
        assert_eq!(
            (
                runner.id,
                runner.name.as_str(),
                runner.status.as_str(),
                runner.busy
            ),
            (23, "linux_runner", "online", true)
        );

        let registration: Token =
            serde_json::from_str(&fixture("create-registration-token.response.json")).unwrap();
        assert_eq!(registration.expires_at, "2020-01-22T12:13:35.123-08:00");
    }
}
