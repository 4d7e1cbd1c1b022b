//! The GitHub client against the GitHub twin over loopback HTTP.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use runner_scaler::act::Registrar;
use runner_scaler::clients::github::{AppCredentials, GitHub, GitHubSettings};
use runner_scaler::config::{Mode, RepoConfig};
use runner_scaler::model::{ErrorClass, RepoName, RunnerName};
use runner_scaler::observe::{JobState, PortError, QueueSource, ReadPoints};
use runner_scaler::secrets::{ExposeSecret, SecretSource, SecretString};
use runner_scaler::sim::twins::TwinServer;
use runner_scaler::sim::twins::github::{
    GitHubTwin, RateLimitAnswer, RunGate, TEST_APP_ID, TEST_APP_PRIVATE_KEY_PEM,
};
use serde_json::json;
use url::Url;

/// Vault as the client sees it: fields by (path, field), with a read counter.
#[derive(Default)]
struct FakeVault {
    fields: Mutex<HashMap<(String, String), String>>,
    reads: Mutex<usize>,
}

impl FakeVault {
    fn put(&self, path: &str, field: &str, value: &str) {
        self.fields
            .lock()
            .unwrap()
            .insert((path.to_string(), field.to_string()), value.to_string());
    }

    fn reads(&self) -> usize {
        *self.reads.lock().unwrap()
    }
}

#[async_trait]
impl SecretSource for FakeVault {
    async fn read_field(&self, path: &str, field: &str) -> Result<SecretString, PortError> {
        *self.reads.lock().unwrap() += 1;
        self.fields
            .lock()
            .unwrap()
            .get(&(path.to_string(), field.to_string()))
            .map(|v| SecretString::from(v.clone()))
            .ok_or_else(|| PortError::new(ErrorClass::NotFound, format!("no secret at {path}")))
    }
}

struct World {
    twin: GitHubTwin,
    _server: TwinServer,
    client: GitHub,
    vault: Arc<FakeVault>,
}

async fn world() -> World {
    let twin = GitHubTwin::new();
    let server = twin.start().await.unwrap();
    let vault = Arc::new(FakeVault::default());
    let settings = GitHubSettings {
        api_url: Url::parse(&server.base_url()).unwrap(),
        app: Some(AppCredentials {
            app_id: TEST_APP_ID.to_string(),
            private_key: SecretString::from(TEST_APP_PRIVATE_KEY_PEM),
            installation_id: None,
        }),
        request_timeout: Duration::from_secs(10),
    };
    let client = GitHub::new(settings, vault.clone()).unwrap();
    World {
        twin,
        _server: server,
        client,
        vault,
    }
}

/// A world whose client reads the twin's clock, so that moving it moves both.
async fn world_on_the_twins_clock() -> (GitHubTwin, TwinServer, GitHub) {
    let World {
        twin,
        _server,
        client,
        ..
    } = world().await;
    let clock = twin.clone();
    let client = client.with_clock(Arc::new(move || clock.now()));
    (twin, _server, client)
}

fn repo_name(name: &str) -> RepoName {
    RepoName::parse(name).unwrap()
}

fn app_repo(name: &str) -> RepoConfig {
    RepoConfig {
        repo: repo_name(name),
        mode: Mode::App,
        max_concurrent: 2,
        profiles: Vec::new(),
        default_job: Some("ci-runner".to_string()),
        labels: None,
        search_labels_as_written: Default::default(),
        credential: Default::default(),
        nomad_namespace: None,
    }
}

fn vault_repo(name: &str, vault_path: &str) -> RepoConfig {
    RepoConfig {
        mode: Mode::Vault {
            vault_path: vault_path.to_string(),
            register_vault_path: format!("{vault_path}-admin"),
        },
        ..app_repo(name)
    }
}

fn count(twin: &GitHubTwin, endpoint: &str) -> usize {
    twin.request_counts().get(endpoint).copied().unwrap_or(0)
}

const LIST_RUNS: &str = "GET /repos/{owner}/{repo}/actions/runs";
const LIST_JOBS: &str = "GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs";
const ACCESS_TOKENS: &str = "POST /app/installations/{installation_id}/access_tokens";
const REPO_INSTALLATION: &str = "GET /repos/{owner}/{repo}/installation";

/// Reads share one token per installation, naming the configured repos of its owner with
/// `actions: read` and `administration: read`; whatever writes (registration tokens, JIT
/// configs, runner deletions) carries a token of exactly its one repo with `administration:
/// write`.
#[tokio::test]
async fn reads_share_one_token_per_installation_and_writes_name_one_repo() {
    let w = world().await;
    w.twin.install_app("acme");
    let (api, web) = (app_repo("acme/api"), app_repo("acme/web"));
    w.client.serving(&[&api, &web]);
    for repo in [&api, &web] {
        w.twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
    }
    for repo in [&api, &web] {
        assert_eq!(w.client.list_jobs(repo).await.unwrap().jobs.len(), 1);
        let token = w
            .client
            .mint(repo, support::TestRunner::any().identity())
            .await
            .unwrap()
            .expect("app mode mints");
        assert!(!token.plain().expose_secret().is_empty());
    }

    let requests = w.twin.token_requests();
    let asked: Vec<String> = requests
        .iter()
        .map(|r| {
            assert_eq!(r.status, 201);
            assert_eq!(r.body.as_object().unwrap().len(), 2, "{}", r.body);
            r.body.to_string()
        })
        .collect();
    let expected: Vec<String> = [
        json!({"repositories": ["api", "web"], "permissions": {"actions": "read", "administration": "read"}}),
        json!({"repositories": ["api"], "permissions": {"administration": "write"}}),
        json!({"repositories": ["web"], "permissions": {"administration": "write"}}),
    ]
    .iter()
    .map(|v| v.to_string())
    .collect();
    assert_eq!(
        asked, expected,
        "one read token for both repos, then one write token each"
    );

    for entry in w.twin.request_log() {
        let Some(grant) = &entry.grant else { continue };
        let repo = entry.path.split('/').nth(3).unwrap().to_string();
        let writes = entry.endpoint.contains("registration-token")
            || entry.endpoint.contains("generate-jitconfig");
        let (repositories, permissions): (Vec<String>, &[(&str, &str)]) = if writes {
            (vec![repo], &[("administration", "write")])
        } else {
            (
                vec!["api".into(), "web".into()],
                &[("actions", "read"), ("administration", "read")],
            )
        };
        assert_eq!(grant.repositories, Some(repositories), "{entry:?}");
        let permissions: BTreeMap<String, String> = permissions
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(grant.permissions, permissions, "{entry:?}");
        assert_eq!(entry.status / 100, 2, "{entry:?}");
    }
}

/// A repo the App is not installed on must not stop the reads of its owner's other repos:
/// GitHub refuses a shared token naming it (422), and each repo is then read with a token of
/// its own.
#[tokio::test]
async fn a_refused_shared_read_token_falls_back_to_one_token_per_repo() {
    let w = world().await;
    w.twin.install_app("acme");
    let (api, gone) = (app_repo("acme/api"), app_repo("acme/gone"));
    w.twin.add_run(&api.repo, vec![vec!["self-hosted"]]);
    // acme/gone is in the document but not a repo the installation can reach.
    w.client.serving(&[&api, &gone]);
    assert_eq!(w.client.list_jobs(&api).await.unwrap().jobs.len(), 1);
    let asked: Vec<(u16, serde_json::Value)> = w
        .twin
        .token_requests()
        .into_iter()
        .map(|r| (r.status, r.body["repositories"].clone()))
        .collect();
    assert_eq!(
        asked,
        [(422, json!(["api", "gone"])), (201, json!(["api"]))],
        "{asked:?}"
    );
    // The group is not asked for again while it is the same.
    assert_eq!(w.client.list_jobs(&api).await.unwrap().jobs.len(), 1);
    assert_eq!(w.twin.token_requests().len(), 2);
}

#[tokio::test]
async fn a_queued_job_inside_a_run_held_at_a_gate_is_found() {
    let w = world().await;
    w.twin.install_app("acme");
    let repo = app_repo("acme/api");
    for gate in [RunGate::Waiting, RunGate::Pending, RunGate::Requested] {
        // One job waits for an environment's approval (never started); its sibling is queued
        // for a runner, and the run shows the gate's status.
        let run = w.twin.add_run(
            &repo.repo,
            vec![vec!["self-hosted", "deploy"], vec!["self-hosted", "linux"]],
        );
        w.twin.hold_run(&repo.repo, run.run_id, Some(gate));
        let jobs = w.client.list_jobs(&repo).await.unwrap();
        assert!(
            jobs.jobs.iter().any(|j| j.id == run.job_ids[1]),
            "{gate:?}: {:?}",
            jobs.jobs
        );
        w.twin.cancel_job(&repo.repo, run.job_ids[0]).unwrap();
        w.twin.cancel_job(&repo.repo, run.job_ids[1]).unwrap();
    }
    let listed: BTreeSet<String> = w
        .twin
        .request_log()
        .iter()
        .filter(|r| r.endpoint == LIST_RUNS)
        .filter_map(|r| {
            let query = r.path.split_once('?')?.1;
            query
                .split('&')
                .find_map(|kv| kv.strip_prefix("status=").map(str::to_string))
        })
        .collect();
    assert_eq!(
        listed,
        ["in_progress", "pending", "queued", "requested", "waiting"]
            .map(String::from)
            .into()
    );
}

#[tokio::test]
async fn the_twin_refuses_a_token_without_the_permission_as_forbidden() {
    let w = world().await;
    let repo = vault_repo("acme/api", "github/api-poll");
    w.twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
    w.vault.put("github/api-poll", "token", "ghp_adminonly");
    w.twin.add_pat(
        "ghp_adminonly",
        "poller",
        Some(std::slice::from_ref(&repo.repo)),
        &[("administration", "write")],
    );
    let e = w.client.list_jobs(&repo).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Forbidden, "{e}");
    assert!(
        e.message
            .starts_with("list the newest runs of acme/api: 403 Forbidden"),
        "{e}"
    );
    assert!(e.message.contains("actions=read"), "{e}");
    assert_eq!(e.retry_after_s, None);
}

#[tokio::test]
async fn listing_follows_every_page_of_runs_and_jobs() {
    let w = world().await;
    w.twin.install_app("acme");
    let repo = app_repo("acme/api");
    for _ in 0..130 {
        w.twin
            .add_run(&repo.repo, vec![vec!["self-hosted", "linux"]]);
    }
    let big = w
        .twin
        .add_run(&repo.repo, (0..150).map(|_| vec!["self-hosted"]).collect());
    // One job started: the big run is in progress while 149 of its jobs still wait.
    w.twin
        .start_job(&repo.repo, big.job_ids[0], "ci-runner-aaaaaaaaaaaa")
        .unwrap();

    let jobs = w.client.list_jobs(&repo).await.unwrap();
    assert!(!jobs.truncated);
    assert_eq!(jobs.jobs.len(), 280);
    let ids: BTreeSet<u64> = jobs.jobs.iter().map(|j| j.id).collect();
    assert_eq!(ids.len(), 280);
    assert!(big.job_ids.iter().all(|id| ids.contains(id)));
    assert_eq!(
        count(&w.twin, LIST_RUNS),
        7,
        "1 page of the newest runs (the first read, quick, found them active), then 2 pages \
         of queued runs, 1 of in-progress, 1 each of waiting, pending, requested"
    );
    assert_eq!(count(&w.twin, LIST_JOBS), 130 + 2);
    let followed: Vec<String> = w
        .twin
        .request_log()
        .into_iter()
        .filter(|e| e.path.starts_with("/repositories/"))
        .map(|e| e.path)
        .collect();
    assert_eq!(followed.len(), 2, "{followed:?}");
    assert!(
        followed
            .iter()
            .all(|p| p.contains("per_page=100") && p.contains("page=2"))
    );
}

#[tokio::test]
async fn a_queued_job_of_an_in_progress_run_is_demand() {
    let w = world().await;
    w.twin.install_app("acme");
    let repo = app_repo("acme/api");
    let run = w.twin.add_run(
        &repo.repo,
        vec![vec!["self-hosted"], vec!["self-hosted", "go"]],
    );
    w.twin
        .start_job(&repo.repo, run.job_ids[0], "ci-runner-3f9c2a1b7d04")
        .unwrap();
    let jobs = w.client.list_jobs(&repo).await.unwrap().jobs;
    let state = |id: u64| jobs.iter().find(|j| j.id == id).map(|j| j.state.clone());
    assert_eq!(
        state(run.job_ids[0]),
        Some(JobState::InProgress {
            runner: Some(RunnerName("ci-runner-3f9c2a1b7d04".into()))
        })
    );
    assert_eq!(state(run.job_ids[1]), Some(JobState::Queued));
    let queued = jobs.iter().find(|j| j.id == run.job_ids[1]).unwrap();
    assert_eq!(queued.labels, ["self-hosted", "go"]);
    assert!(queued.queued_at.is_some());
}

#[tokio::test]
async fn only_self_hosted_jobs_count_whatever_the_case() {
    let w = world().await;
    w.twin.install_app("acme");
    let repo = app_repo("acme/api");
    let run = w.twin.add_run(
        &repo.repo,
        vec![
            vec!["ubuntu-latest"],
            vec!["Self-Hosted", "Linux"],
            vec!["linux"],
        ],
    );
    let finished = w.twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
    w.twin
        .complete_job(&repo.repo, finished.job_ids[0], "success")
        .unwrap();
    let jobs = w.client.list_jobs(&repo).await.unwrap().jobs;
    let ids: Vec<u64> = jobs.iter().map(|j| j.id).collect();
    assert_eq!(ids, [run.job_ids[1]]);
}

#[tokio::test]
async fn an_exhausted_primary_limit_is_rate_limited_and_pauses_the_installation() {
    for status in [403, 429] {
        let w = world().await;
        w.twin.install_app("acme");
        let repo = app_repo("acme/api");
        w.twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
        w.twin
            .force_rate_limit(Some(RateLimitAnswer::Primary { status }));
        let e = w.client.list_jobs(&repo).await.unwrap_err();
        assert_eq!(e.class, ErrorClass::RateLimited, "{e}");
        let wait = e.retry_after_s.unwrap();
        assert!((3500..=3600).contains(&wait), "{wait}");
        assert!(w.client.paused_until(&repo).is_some());

        // While paused, the client does not spend requests on refusals; other owners go on.
        w.twin.force_rate_limit(None);
        let before = count(&w.twin, LIST_RUNS);
        let e = w.client.list_jobs(&repo).await.unwrap_err();
        assert_eq!(e.class, ErrorClass::RateLimited);
        assert_eq!(count(&w.twin, LIST_RUNS), before);
        w.twin.install_app("other");
        let other = app_repo("other/site");
        w.twin.add_repo(&other.repo);
        w.client.list_jobs(&other).await.unwrap();
    }
}

#[tokio::test]
async fn a_secondary_limit_waits_as_asked() {
    let w = world().await;
    w.twin.install_app("acme");
    let repo = app_repo("acme/api");
    w.twin.add_repo(&repo.repo);
    w.twin.force_rate_limit(Some(RateLimitAnswer::Secondary {
        status: 403,
        retry_after_s: Some(120),
    }));
    let e = w.client.list_jobs(&repo).await.unwrap_err();
    assert_eq!(
        (e.class, e.retry_after_s),
        (ErrorClass::RateLimited, Some(120))
    );
    w.twin.force_rate_limit(Some(RateLimitAnswer::Secondary {
        status: 429,
        retry_after_s: None,
    }));
    let other = app_repo("acme/web");
    w.twin.add_repo(&other.repo);
    // acme's installation is paused by the first refusal: no request at all.
    let e = w.client.list_jobs(&other).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::RateLimited);
}

#[tokio::test]
async fn a_revoked_token_is_reminted_once() {
    let w = world().await;
    w.twin.install_app("acme");
    let repo = app_repo("acme/api");
    w.twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
    w.client.list_jobs(&repo).await.unwrap();
    assert_eq!(w.twin.token_requests().len(), 1);

    w.twin.revoke_installation_tokens();
    let jobs = w.client.list_jobs(&repo).await.unwrap();
    assert_eq!(jobs.jobs.len(), 1);
    assert_eq!(w.twin.token_requests().len(), 2);
    let refused = w
        .twin
        .request_log()
        .iter()
        .filter(|e| e.status == 401)
        .count();
    assert_eq!(refused, 1);
}

#[tokio::test]
async fn tokens_and_installations_are_reused_across_ticks() {
    let w = world().await;
    w.twin.install_app("acme");
    let repo = app_repo("acme/api");
    w.twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
    for _ in 0..2 {
        w.client.list_jobs(&repo).await.unwrap();
        w.client
            .mint(&repo, support::TestRunner::any().identity())
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(count(&w.twin, ACCESS_TOKENS), 2, "one per permission");
    assert_eq!(count(&w.twin, REPO_INSTALLATION), 1);
}

#[tokio::test]
async fn an_expired_token_is_replaced_before_use() {
    let w = world().await;
    w.twin.install_app("acme");
    let repo = app_repo("acme/api");
    w.twin.add_repo(&repo.repo);
    let offset = Arc::new(Mutex::new(chrono::Duration::zero()));
    let clock_offset = offset.clone();
    let client = {
        let settings = GitHubSettings {
            api_url: Url::parse(&format!("http://{}", w._server.addr)).unwrap(),
            app: Some(AppCredentials {
                app_id: TEST_APP_ID.to_string(),
                private_key: SecretString::from(TEST_APP_PRIVATE_KEY_PEM),
                installation_id: None,
            }),
            request_timeout: Duration::from_secs(10),
        };
        GitHub::new(settings, w.vault.clone())
            .unwrap()
            .with_clock(Arc::new(move || {
                chrono::Utc::now() + *clock_offset.lock().unwrap()
            }))
    };
    client.list_jobs(&repo).await.unwrap();
    // 56 minutes on, the one-hour token has less than the five minutes left it needs.
    *offset.lock().unwrap() = chrono::Duration::minutes(56);
    w.twin.advance_clock(chrono::Duration::minutes(56));
    client.list_jobs(&repo).await.unwrap();
    assert_eq!(count(&w.twin, ACCESS_TOKENS), 2);
    assert!(w.twin.request_log().iter().all(|e| e.status != 401));
}

#[tokio::test]
async fn an_unknown_owner_falls_back_to_the_configured_installation() {
    let twin = GitHubTwin::new();
    let server = twin.start().await.unwrap();
    let installation = twin.install_app("acme");
    let repo = app_repo("acme/api");
    twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
    // The lookup is made for a repo the twin does not know under that owner name: 404.
    let settings = |fallback| GitHubSettings {
        api_url: Url::parse(&server.base_url()).unwrap(),
        app: Some(AppCredentials {
            app_id: TEST_APP_ID.to_string(),
            private_key: SecretString::from(TEST_APP_PRIVATE_KEY_PEM),
            installation_id: fallback,
        }),
        request_timeout: Duration::from_secs(10),
    };
    let ghost = app_repo("ghost/site");
    let client = GitHub::new(settings(None), Arc::new(FakeVault::default())).unwrap();
    let e = client.list_jobs(&ghost).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::NotFound, "{e}");
    assert!(e.message.contains("GITHUB_APP_INSTALLATION_ID"), "{e}");

    let client = GitHub::new(settings(Some(installation)), Arc::new(FakeVault::default())).unwrap();
    let e = client.list_jobs(&ghost).await.unwrap_err();
    // The fallback installation was used; it has no repo named `site`, so GitHub says 422.
    assert_eq!(e.class, ErrorClass::Configuration, "{e}");
    assert_eq!(
        twin.token_requests().last().unwrap().installation_id,
        installation
    );
    client.list_jobs(&repo).await.unwrap();
}

#[tokio::test]
async fn repo_urls_follow_the_api_host() {
    let vault: Arc<dyn SecretSource> = Arc::new(FakeVault::default());
    let repo = app_repo("acme/api");
    for (api, web) in [
        ("https://api.github.com", "https://github.com/acme/api"),
        (
            "https://ghe.example.com/api/v3",
            "https://ghe.example.com/acme/api",
        ),
        (
            "https://api.octocorp.ghe.com",
            "https://octocorp.ghe.com/acme/api",
        ),
    ] {
        let settings = GitHubSettings {
            api_url: Url::parse(api).unwrap(),
            app: None,
            request_timeout: Duration::from_secs(1),
        };
        let client = GitHub::new(settings, vault.clone()).unwrap();
        assert_eq!(client.repo_url(&repo), web);
    }
}

#[tokio::test]
async fn vault_mode_polls_with_the_vault_token_and_never_mints() {
    let w = world().await;
    let repo = vault_repo("ev-the-dev/moat", "github/moat-poll");
    w.twin.add_run(&repo.repo, vec![vec!["self-hosted", "vm"]]);
    w.vault.put("github/moat-poll", "token", "ghp_poll1");
    w.twin.add_pat(
        "ghp_poll1",
        "moat",
        Some(std::slice::from_ref(&repo.repo)),
        &[("actions", "read")],
    );
    for _ in 0..2 {
        assert_eq!(w.client.list_jobs(&repo).await.unwrap().jobs.len(), 1);
        assert!(
            w.client
                .mint(&repo, support::TestRunner::any().identity())
                .await
                .unwrap()
                .is_none()
        );
    }
    assert_eq!(w.vault.reads(), 1, "the polling token is cached");
    assert!(w.twin.token_requests().is_empty());
    assert_eq!(
        count(&w.twin, ACCESS_TOKENS) + count(&w.twin, REPO_INSTALLATION),
        0
    );
    assert!(
        w.twin
            .request_log()
            .iter()
            .all(|e| !e.endpoint.contains("registration-token"))
    );

    // The token is rotated in Vault and the old one revoked: one 401, one re-read.
    w.vault.put("github/moat-poll", "token", "ghp_poll2");
    w.twin.add_pat(
        "ghp_poll2",
        "moat",
        Some(std::slice::from_ref(&repo.repo)),
        &[("actions", "read")],
    );
    w.twin.revoke_token("ghp_poll1");
    w.client.list_jobs(&repo).await.unwrap();
    assert_eq!(w.vault.reads(), 2);
}

#[tokio::test]
async fn a_polling_token_vault_cannot_serve_is_reported_with_its_path() {
    let w = world().await;
    let repo = vault_repo("acme/api", "github/missing");
    let e = w.client.list_jobs(&repo).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::NotFound);
    assert!(e.message.contains("github/missing"), "{e}");
}

#[tokio::test]
async fn requests_carry_githubs_headers() {
    let w = world().await;
    w.twin.install_app("acme");
    let repo = app_repo("acme/api");
    w.twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
    w.client.list_jobs(&repo).await.unwrap();
    w.client
        .mint(&repo, support::TestRunner::any().identity())
        .await
        .unwrap();
    let log = w.twin.request_log();
    assert!(log.len() >= 5);
    for entry in log {
        assert_eq!(
            entry.accept.as_deref(),
            Some("application/vnd.github+json"),
            "{entry:?}"
        );
        assert_eq!(entry.api_versions, ["2022-11-28"], "{entry:?}");
        assert!(entry.user_agent.is_some_and(|ua| !ua.is_empty()));
    }
}

#[tokio::test]
async fn unchanged_listings_are_answered_304_and_not_charged() {
    let w = world().await;
    w.twin.install_app("acme");
    let repo = app_repo("acme/api");
    let run = w
        .twin
        .add_run(&repo.repo, vec![vec!["self-hosted"], vec!["self-hosted"]]);
    let first = w.client.list_jobs(&repo).await.unwrap();
    w.twin.clear_log();
    let second = w.client.list_jobs(&repo).await.unwrap();
    assert_eq!(first, second);
    let log = w.twin.request_log();
    assert!(!log.is_empty());
    assert!(log.iter().all(|e| e.status == 304 && !e.counted), "{log:?}");

    // A change shows through at once.
    w.twin
        .start_job(&repo.repo, run.job_ids[0], "ci-runner-3f9c2a1b7d04")
        .unwrap();
    let third = w.client.list_jobs(&repo).await.unwrap();
    assert!(
        third
            .jobs
            .iter()
            .any(|j| matches!(j.state, JobState::InProgress { .. }))
    );
}

/// The runs listings GitHub answered so far: (with a `status` filter, without one).
fn run_listings(twin: &GitHubTwin) -> (Vec<String>, Vec<u16>) {
    let mut by_status = Vec::new();
    let mut quick = Vec::new();
    for entry in twin.request_log() {
        if entry.endpoint != LIST_RUNS {
            continue;
        }
        let query = entry.path.split_once('?').map_or("", |(_, q)| q);
        match query.split('&').find_map(|kv| kv.strip_prefix("status=")) {
            Some(status) => by_status.push(status.to_string()),
            None => quick.push(entry.status),
        }
    }
    (by_status, quick)
}

/// A repo with no active run is read with one conditional request (its newest runs) until
/// one of them is active; then in full, by status, while it is busy. A webhook hint reads it
/// in full at once, and once an hour its `queued` and `in_progress` runs are listed anyway
/// (a run re-run from further back than the newest page).
#[tokio::test]
async fn an_idle_repo_is_read_with_one_request_until_a_run_appears() {
    let (twin, _server, client) = world_on_the_twins_clock().await;
    twin.install_app("acme");
    let repo = app_repo("acme/api");
    // An old run, completed.
    let old = twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
    twin.start_job(&repo.repo, old.job_ids[0], "ci-runner-aaaaaaaaaaaa")
        .unwrap();
    twin.complete_job(&repo.repo, old.job_ids[0], "success")
        .unwrap();

    // Quiet: one listing of the newest runs, then the same answered 304.
    for _ in 0..2 {
        assert!(client.list_jobs(&repo).await.unwrap().jobs.is_empty());
    }
    assert_eq!(run_listings(&twin), (vec![], vec![200, 304]));

    // A push: the newest page changes, shows an active run, and the repo is read in full.
    let run = twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
    assert_eq!(client.list_jobs(&repo).await.unwrap().jobs.len(), 1);
    let (by_status, quick) = run_listings(&twin);
    assert_eq!(quick, [200, 304, 200]);
    assert_eq!(
        by_status,
        ["queued", "in_progress", "waiting", "pending", "requested"]
    );
    // Busy: in full again, without the quick listing first.
    assert_eq!(client.list_jobs(&repo).await.unwrap().jobs.len(), 1);
    assert_eq!(run_listings(&twin).0.len(), 10);
    assert_eq!(run_listings(&twin).1.len(), 3);

    // Done: the full read finds nothing and the repo is quiet again.
    twin.start_job(&repo.repo, run.job_ids[0], "ci-runner-bbbbbbbbbbbb")
        .unwrap();
    twin.complete_job(&repo.repo, run.job_ids[0], "success")
        .unwrap();
    assert!(client.list_jobs(&repo).await.unwrap().jobs.is_empty());
    assert!(client.list_jobs(&repo).await.unwrap().jobs.is_empty());
    let (by_status, quick) = run_listings(&twin);
    assert_eq!((by_status.len(), quick.len()), (15, 4));

    // An hour on: the deep read lists queued and in-progress runs only.
    twin.advance_clock(chrono::Duration::minutes(61));
    assert!(client.list_jobs(&repo).await.unwrap().jobs.is_empty());
    let (by_status, quick) = run_listings(&twin);
    assert_eq!(by_status[15..], ["queued", "in_progress"]);
    assert_eq!(quick.len(), 4);

    // A hint: in full at once, whatever the schedule of quick reads says.
    client.hinted(&repo.repo);
    assert!(client.list_jobs(&repo).await.unwrap().jobs.is_empty());
    let (by_status, quick) = run_listings(&twin);
    assert_eq!(by_status.len(), 22);
    assert_eq!(quick.len(), 4);
}

/// A run the newest page shows active while the status searches do not list it yet (GitHub's
/// search index lags the run by seconds) is looked for again on the next read, though the
/// page answers 304; only after a couple of minutes of the same is the repo quiet again (a
/// run in a status that holds no queued job, `action_required`).
#[tokio::test]
async fn a_run_the_searches_lag_is_looked_for_again_until_they_list_it() {
    let (twin, _server, client) = world_on_the_twins_clock().await;
    twin.install_app("acme");
    let repo = app_repo("acme/api");
    twin.add_repo(&repo.repo);
    assert!(client.list_jobs(&repo).await.unwrap().jobs.is_empty());

    let run = twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
    twin.lag_run_search(&repo.repo, run.run_id, true);
    twin.advance_clock(chrono::Duration::seconds(15));
    assert!(client.list_jobs(&repo).await.unwrap().jobs.is_empty());
    assert_eq!(run_listings(&twin).1, [200, 200], "the page moved");

    // The page is unchanged, yet the run it shows active is looked for in the searches again.
    twin.lag_run_search(&repo.repo, run.run_id, false);
    twin.advance_clock(chrono::Duration::seconds(15));
    assert_eq!(client.list_jobs(&repo).await.unwrap().jobs.len(), 1);
    let (by_status, quick) = run_listings(&twin);
    assert_eq!(quick, [200, 200, 304]);
    assert_eq!(by_status.len(), 10, "two full reads");

    // A second run the searches never list: read in full for the allowance, then quiet.
    let hidden = twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
    twin.lag_run_search(&repo.repo, hidden.run_id, true);
    twin.start_job(&repo.repo, run.job_ids[0], "ci-runner-aaaaaaaaaaaa")
        .unwrap();
    twin.complete_job(&repo.repo, run.job_ids[0], "success")
        .unwrap();
    let full_reads = || run_listings(&twin).0.len() / 5;
    let mut reads_in_full = Vec::new();
    for _ in 0..12 {
        twin.advance_clock(chrono::Duration::seconds(15));
        assert!(client.list_jobs(&repo).await.unwrap().jobs.is_empty());
        reads_in_full.push(full_reads());
    }
    // The first read finds nothing (busy before: full; then quick, 200, active, full) and
    // each later one within two minutes reads in full; past them, quick 304s only.
    let settled = *reads_in_full.last().unwrap();
    assert_eq!(
        reads_in_full[reads_in_full.len() - 2],
        settled,
        "{reads_in_full:?}"
    );
    assert!(
        settled >= 2 + 8,
        "read in full for about two minutes: {reads_in_full:?}"
    );
    assert!(run_listings(&twin).1.ends_with(&[304, 304]));
}

/// Reads stop short of GitHub's secondary limit: once a holder's reads spent the minute's
/// points, the next read is refused without a request, as a rate limit with the wait, until
/// the oldest points are a minute old.
#[tokio::test]
async fn reads_stop_at_the_minutes_secondary_points() {
    let (twin, _server, client) = world_on_the_twins_clock().await;
    let client = client.with_read_points_per_minute(8);
    twin.install_app("acme");
    let repo = app_repo("acme/api");
    twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
    let listings = |twin: &GitHubTwin| {
        twin.request_log()
            .iter()
            .filter(|e| e.endpoint == LIST_RUNS || e.endpoint == LIST_JOBS)
            .count()
    };

    // A quick read, then five run listings and one job listing: 7 points.
    assert_eq!(client.list_jobs(&repo).await.unwrap().jobs.len(), 1);
    assert_eq!(listings(&twin), 7);
    // The next full read gets one listing out (8 points), then stops.
    let e = client.list_jobs(&repo).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::RateLimited, "{e}");
    assert!(e.message.contains("secondary limit"), "{e}");
    assert!(e.retry_after_s.is_some_and(|s| s <= 60), "{e:?}");
    assert_eq!(listings(&twin), 8);
    // A minute on, the points are free again.
    twin.advance_clock(chrono::Duration::seconds(61));
    assert_eq!(client.list_jobs(&repo).await.unwrap().jobs.len(), 1);
    assert_eq!(listings(&twin), 14);
}

#[tokio::test]
async fn reaching_githubs_content_limit_is_said_once_and_holds_nothing_back() {
    let logs = support::LogCapture::default();
    let _guard = tracing::subscriber::set_default(logs.subscriber(tracing::Level::INFO));
    let (twin, _server, client) = world_on_the_twins_clock().await;
    let installation = twin.install_app("acme");
    let repo = app_repo("acme/api");
    twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
    let limit = runner_scaler::clients::github::CONTENT_REQUESTS_PER_MINUTE;
    // One write token (a POST of the App), then a JIT config (a POST of the installation)
    // per runner: the installation's 80th in the minute reaches the limit.
    for n in 1..=limit + 5 {
        client
            .mint(&repo, support::TestRunner::any().identity())
            .await
            .unwrap_or_else(|e| panic!("mint {n}: {e}"));
        let said = logs
            .text()
            .matches("reached GitHub's content-creation limit")
            .count();
        assert_eq!(said, usize::from(n >= limit), "after mint {n}");
    }
    let line = logs
        .text()
        .lines()
        .find(|l| l.contains("content-creation limit"))
        .unwrap()
        .to_string();
    assert!(
        line.contains(&format!("installation {installation}")),
        "{line}"
    );
    // A minute later the count starts again; the hour still holds them all.
    logs.clear();
    twin.advance_clock(chrono::Duration::seconds(61));
    client
        .mint(&repo, support::TestRunner::any().identity())
        .await
        .unwrap();
    assert!(!logs.text().contains("content-creation limit"));
}

#[tokio::test]
async fn busy_reads_go_past_the_idle_ceiling_up_to_the_headroom() {
    use runner_scaler::clients::github::URGENT_READ_POINTS_HEADROOM;
    let (twin, _server, client) = world_on_the_twins_clock().await;
    // Idle reads wait at 8 points in the minute; any read is refused at 8 + the headroom.
    let client = client.with_read_points_per_minute(8 + URGENT_READ_POINTS_HEADROOM);
    let installation = twin.install_app("acme");
    let repo = app_repo("acme/api");
    twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
    let owner = format!("installation-{installation}");

    let points = |left: u32, next_read: u32| {
        Some(ReadPoints {
            owner: owner.clone(),
            left,
            next_read,
        })
    };
    // A quick read, five run listings and a job listing: 7 points, 1 left for idle reads;
    // the repo is busy now, and its next read lists the same five statuses and one run.
    assert_eq!(client.list_jobs(&repo).await.unwrap().jobs.len(), 1);
    assert_eq!(client.read_points(&repo), points(1, 6));
    // The loop would hold an idle read now; a busy repo's read still goes.
    assert_eq!(client.list_jobs(&repo).await.unwrap().jobs.len(), 1);
    assert_eq!(client.read_points(&repo), points(0, 6));
}

#[tokio::test]
async fn a_busy_repos_next_read_is_counted_at_what_its_last_one_took() {
    let (twin, _server, client) = world_on_the_twins_clock().await;
    let installation = twin.install_app("acme");
    let repo = app_repo("acme/api");
    for _ in 0..4 {
        twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
    }
    let owner = format!("installation-{installation}");
    assert_eq!(client.list_jobs(&repo).await.unwrap().jobs.len(), 4);
    // Five run listings and four runs' jobs.
    let next = client.read_points(&repo).unwrap();
    assert_eq!((next.owner.as_str(), next.next_read), (owner.as_str(), 9));
    // A hint on a repo never read in full: a full read, at least one run's jobs.
    let quiet = app_repo("acme/web");
    client.hinted(&quiet.repo);
    assert_eq!(client.read_points(&quiet).unwrap().next_read, 6);
}

#[tokio::test]
async fn a_second_read_of_a_listing_of_many_pages_is_answered_304_throughout() {
    let w = world().await;
    w.twin.install_app("acme");
    let repo = app_repo("acme/api");
    // Two pages of queued runs: the second is reached through `Link`, which GitHub points at
    // `/repositories/{id}/…`, and which the twin leaves off a 304.
    for _ in 0..150 {
        w.twin.add_run(&repo.repo, vec![vec!["self-hosted"]]);
    }
    assert_eq!(w.client.list_jobs(&repo).await.unwrap().jobs.len(), 150);
    let before = w.twin.request_log().len();
    assert_eq!(w.client.list_jobs(&repo).await.unwrap().jobs.len(), 150);
    let second = w.twin.request_log().split_off(before);
    let queued_pages: Vec<&str> = second
        .iter()
        .filter(|r| r.path.contains("status=queued"))
        .map(|r| r.path.as_str())
        .collect();
    assert_eq!(queued_pages.len(), 2, "{queued_pages:?}");
    let charged: Vec<(&str, u16)> = second
        .iter()
        .filter(|r| r.counted)
        .map(|r| (r.path.as_str(), r.status))
        .collect();
    assert!(charged.is_empty(), "charged: {charged:?}");
}

#[tokio::test]
async fn an_answer_over_the_body_cap_is_refused_not_read() {
    use runner_scaler::clients::github::RESPONSE_BODY_MAX_BYTES;
    // Not GitHub: a server that answers every listing with spaces and no end in sight.
    let endless = axum::Router::new().fallback(|| async {
        let chunk = axum::body::Bytes::from(vec![b' '; 64 * 1024]);
        let chunks = (RESPONSE_BODY_MAX_BYTES / chunk.len()) + 2;
        let stream =
            futures::stream::iter((0..chunks).map(move |_| Ok::<_, std::io::Error>(chunk.clone())));
        axum::response::Response::new(axum::body::Body::from_stream(stream))
    });
    let server = TwinServer::start(endless).await.unwrap();
    let vault = Arc::new(FakeVault::default());
    vault.put("github/poll", "token", "ghp_poll");
    let settings = GitHubSettings {
        api_url: Url::parse(&server.base_url()).unwrap(),
        app: None,
        request_timeout: Duration::from_secs(30),
    };
    let client = GitHub::new(settings, vault).unwrap();
    let e = client
        .list_jobs(&vault_repo("acme/api", "github/poll"))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Malformed, "{e}");
    assert!(e.message.contains("body over"), "{e}");
}
