//! The GitHub client's runner registry (`list_runners`, `delete_runner`) against the GitHub
//! twin over loopback HTTP, and the twin's runner endpoints themselves: Link pagination,
//! GitHub's 204 / 422 / 404 answers, and the Administration permission each route needs.

use std::time::Duration;

use async_trait::async_trait;
use runner_scaler::act::{Deregistration, RunnerRegistry};
use runner_scaler::clients::github::{AppCredentials, GitHub, GitHubSettings, PER_PAGE};
use runner_scaler::config::{Mode, RepoConfig};
use runner_scaler::model::{ErrorClass, RepoName, RunnerName};
use runner_scaler::observe::PortError;
use runner_scaler::secrets::{SecretSource, SecretString};
use runner_scaler::sim::twins::TwinServer;
use runner_scaler::sim::twins::github::{
    GitHubTwin, RunnerPresence, TEST_APP_ID, TEST_APP_PRIVATE_KEY_PEM,
};
use serde_json::{Value, json};
use url::Url;

mod support;

const LIST_RUNNERS: &str = "GET /repos/{owner}/{repo}/actions/runners";
const GET_RUNNER: &str = "GET /repos/{owner}/{repo}/actions/runners/{runner_id}";
const DELETE_RUNNER: &str = "DELETE /repos/{owner}/{repo}/actions/runners/{runner_id}";

/// App mode reads nothing from Vault.
struct NoVault;

#[async_trait]
impl SecretSource for NoVault {
    async fn read_field(&self, path: &str, _field: &str) -> Result<SecretString, PortError> {
        Err(PortError::new(
            ErrorClass::NotFound,
            format!("no secret at {path}"),
        ))
    }
}

struct World {
    twin: GitHubTwin,
    server: TwinServer,
    client: GitHub,
    repo: RepoName,
}

/// The twin with the App installed on `acme`, the repo `acme/api`, and the real client.
async fn world() -> World {
    let twin = GitHubTwin::new();
    let server = twin.start().await.unwrap();
    let repo = RepoName::parse("acme/api").unwrap();
    twin.install_app(repo.owner());
    twin.add_repo(&repo);
    let client = GitHub::new(
        GitHubSettings {
            api_url: Url::parse(&server.base_url()).unwrap(),
            app: Some(AppCredentials {
                app_id: TEST_APP_ID.to_string(),
                private_key: SecretString::from(TEST_APP_PRIVATE_KEY_PEM),
                installation_id: None,
            }),
            request_timeout: Duration::from_secs(10),
        },
        std::sync::Arc::new(NoVault),
    )
    .unwrap();
    World {
        twin,
        server,
        client,
        repo,
    }
}

fn app_repo(repo: &RepoName) -> RepoConfig {
    RepoConfig {
        repo: repo.clone(),
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

fn served(twin: &GitHubTwin, endpoint: &str) -> Vec<String> {
    twin.request_log()
        .into_iter()
        .filter(|entry| entry.endpoint == endpoint)
        .map(|entry| entry.path)
        .collect()
}

#[tokio::test]
async fn every_page_of_registrations_is_listed_with_status_and_busy_flag() {
    let w = world().await;
    // Two full pages and a part: the client must follow `Link: rel="next"` twice.
    let total = 2 * PER_PAGE + 30;
    for i in 0..total {
        let presence = match i % 3 {
            0 => RunnerPresence::IDLE,
            1 => RunnerPresence::BUSY,
            _ => RunnerPresence::OFFLINE,
        };
        w.twin.register_runner_as(
            &w.repo,
            &format!("ci-runner-{i:012x}"),
            &["self-hosted"],
            presence,
        );
    }

    let listed = w.client.list_runners(&app_repo(&w.repo)).await.unwrap();

    assert_eq!(listed.len(), total);
    for (i, registration) in listed.iter().enumerate() {
        assert_eq!(registration.name, RunnerName(format!("ci-runner-{i:012x}")));
        assert_eq!(
            (registration.online, registration.busy),
            match i % 3 {
                0 => (true, false),
                1 => (true, true),
                _ => (false, false),
            },
            "{registration:?}"
        );
    }
    let ids: std::collections::BTreeSet<u64> = listed.iter().map(|r| r.id).collect();
    assert_eq!(ids.len(), total, "every registration once");
    let pages = served(&w.twin, LIST_RUNNERS);
    assert_eq!(pages.len(), 3, "{pages:?}");
    for page in &pages {
        assert!(page.contains(&format!("per_page={PER_PAGE}")), "{page}");
    }
}

#[tokio::test]
async fn deleting_an_idle_registration_removes_it() {
    let w = world().await;
    let idle = w
        .twin
        .register_runner(&w.repo, "ci-runner-0123456789ab", &["self-hosted"]);
    let other = w
        .twin
        .register_runner(&w.repo, "ci-runner-ba9876543210", &["self-hosted"]);

    let answer = w
        .client
        .delete_runner(&app_repo(&w.repo), idle)
        .await
        .unwrap();

    assert_eq!(answer, Deregistration::Deleted);
    let left: Vec<u64> = w.twin.runners(&w.repo).iter().map(|r| r.id).collect();
    assert_eq!(left, [other]);
    let deleted = w.twin.deleted_runners();
    assert_eq!(deleted.len(), 1);
    assert_eq!(
        (deleted[0].id, deleted[0].name.as_str()),
        (idle, "ci-runner-0123456789ab")
    );
    assert_eq!(
        served(&w.twin, DELETE_RUNNER),
        [format!("/repos/acme/api/actions/runners/{idle}")]
    );
}

#[tokio::test]
async fn a_busy_runner_refused_with_422_is_still_busy_and_stays_registered() {
    let w = world().await;
    let busy = w.twin.register_runner_as(
        &w.repo,
        "ci-runner-0123456789ab",
        &["self-hosted"],
        RunnerPresence::BUSY,
    );

    let answer = w
        .client
        .delete_runner(&app_repo(&w.repo), busy)
        .await
        .unwrap();

    assert_eq!(answer, Deregistration::StillBusy);
    assert_eq!(w.twin.runners(&w.repo).len(), 1);
    assert!(w.twin.deleted_runners().is_empty());

    // Once its job is over, the same call deletes it.
    assert!(
        w.twin
            .set_runner_busy(&w.repo, "ci-runner-0123456789ab", false)
    );
    let answer = w
        .client
        .delete_runner(&app_repo(&w.repo), busy)
        .await
        .unwrap();
    assert_eq!(answer, Deregistration::Deleted);
    assert!(w.twin.runners(&w.repo).is_empty());
}

#[tokio::test]
async fn an_unknown_registration_is_not_found() {
    let w = world().await;
    w.twin
        .register_runner(&w.repo, "ci-runner-0123456789ab", &["self-hosted"]);

    let answer = w
        .client
        .delete_runner(&app_repo(&w.repo), 987_654_321)
        .await
        .unwrap();

    assert_eq!(answer, Deregistration::NotFound);
    assert_eq!(w.twin.runners(&w.repo).len(), 1);
}

/// One registration read by its id, as the take-back reads it just before a delete: its
/// flags as they are now, and `None` for an id GitHub does not know (404).
#[tokio::test]
async fn one_registration_is_read_by_its_id_with_its_busy_flag() {
    let w = world().await;
    let id = w.twin.register_runner_as(
        &w.repo,
        "ci-runner-0123456789ab",
        &["self-hosted"],
        RunnerPresence::IDLE,
    );
    let repo = app_repo(&w.repo);

    let idle = w.client.get_runner(&repo, id).await.unwrap().unwrap();
    assert_eq!(
        (idle.id, idle.online, idle.busy),
        (id, true, false),
        "{idle:?}"
    );
    assert_eq!(idle.name, RunnerName("ci-runner-0123456789ab".into()));
    assert!(
        w.twin
            .set_runner_busy(&w.repo, "ci-runner-0123456789ab", true)
    );
    let busy = w.client.get_runner(&repo, id).await.unwrap().unwrap();
    assert!(busy.busy, "{busy:?}");

    assert_eq!(w.client.get_runner(&repo, 987_654_321).await.unwrap(), None);
    assert_eq!(
        served(&w.twin, GET_RUNNER),
        [
            format!("/repos/acme/api/actions/runners/{id}"),
            format!("/repos/acme/api/actions/runners/{id}"),
            "/repos/acme/api/actions/runners/987654321".to_string(),
        ]
    );
}

/// Listing runners reads with the installation's shared read token (`administration: read`);
/// deleting one carries a token of exactly that repo with `administration: write`.
#[tokio::test]
async fn registry_reads_with_the_read_token_and_deletes_with_the_repos_write_token() {
    let w = world().await;
    let id = w
        .twin
        .register_runner(&w.repo, "ci-runner-0123456789ab", &["self-hosted"]);
    let repo = app_repo(&w.repo);
    w.client.list_runners(&repo).await.unwrap();
    w.client.delete_runner(&repo, id).await.unwrap();

    let calls: Vec<_> = w
        .twin
        .request_log()
        .into_iter()
        .filter(|e| e.endpoint == LIST_RUNNERS || e.endpoint == DELETE_RUNNER)
        .collect();
    assert_eq!(calls.len(), 2);
    for call in calls {
        let grant = call.grant.expect("an installation token");
        assert_eq!(grant.repositories, Some(vec!["api".to_string()]));
        let wanted = if call.endpoint == DELETE_RUNNER {
            "write"
        } else {
            "read"
        };
        assert_eq!(
            grant.permissions.get("administration").map(String::as_str),
            Some(wanted),
            "{} {:?}",
            call.endpoint,
            grant.permissions
        );
    }
}

/// A raw HTTP client for the twin's own checks.
async fn call(
    server: &TwinServer,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    runner_scaler::clients::http::install_crypto_provider();
    let client = reqwest::Client::builder()
        .user_agent("runner-registry-twin-test")
        .build()
        .unwrap();
    support::fixtures::github_call(&client, &server.base_url(), method, path, token, body).await
}

fn app_jwt() -> String {
    let now = chrono::Utc::now().timestamp();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
        &json!({"iss": TEST_APP_ID, "iat": now - 60, "exp": now + 540}),
        &jsonwebtoken::EncodingKey::from_rsa_pem(TEST_APP_PRIVATE_KEY_PEM.as_bytes()).unwrap(),
    )
    .unwrap()
}

async fn installation_token(w: &World, repos: &[&str], administration: &str) -> String {
    let installation = w.twin.install_app(w.repo.owner());
    let (status, _, body) = call(
        &w.server,
        reqwest::Method::POST,
        &format!("/app/installations/{installation}/access_tokens"),
        &app_jwt(),
        Some(json!({"repositories": repos, "permissions": {"administration": administration}})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    body["token"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn the_twin_lists_with_read_but_deletes_only_with_write_and_only_for_its_repo() {
    let w = world().await;
    let other = RepoName::parse("acme/web").unwrap();
    w.twin.add_repo(&other);
    let busy = w.twin.register_runner_as(
        &w.repo,
        "ci-runner-0123456789ab",
        &["self-hosted"],
        RunnerPresence::BUSY,
    );
    let runner_path = format!("/repos/acme/api/actions/runners/{busy}");
    let read = installation_token(&w, &["api"], "read").await;
    let write = installation_token(&w, &["api"], "write").await;
    let elsewhere = installation_token(&w, &["web"], "write").await;

    let (status, _, body) = call(
        &w.server,
        reqwest::Method::GET,
        "/repos/acme/api/actions/runners",
        &read,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["total_count"], 1);
    assert_eq!(body["runners"][0]["status"], "online");
    assert_eq!(body["runners"][0]["busy"], true);
    let (status, _, _) = call(&w.server, reqwest::Method::GET, &runner_path, &read, None).await;
    assert_eq!(status, 200);

    let (status, headers, body) = call(
        &w.server,
        reqwest::Method::DELETE,
        &runner_path,
        &read,
        None,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["message"], "Resource not accessible by integration");
    assert_eq!(
        headers["x-accepted-github-permissions"],
        "administration=write"
    );

    // A token for another repo does not see this one at all.
    let (status, _, _) = call(
        &w.server,
        reqwest::Method::DELETE,
        &runner_path,
        &elsewhere,
        None,
    )
    .await;
    assert_eq!(status, 404);

    // GitHub's refusal of a busy runner: 422 with a GitHub-shaped error body.
    let (status, _, body) = call(
        &w.server,
        reqwest::Method::DELETE,
        &runner_path,
        &write,
        None,
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["message"].as_str().is_some_and(
            |m| m.contains("ci-runner-0123456789ab") && m.contains("is still running a job")
        ),
        "{body}"
    );
    assert!(body["documentation_url"].is_string(), "{body}");

    assert!(
        w.twin
            .set_runner_busy(&w.repo, "ci-runner-0123456789ab", false)
    );
    assert!(
        w.twin
            .set_runner_online(&w.repo, "ci-runner-0123456789ab", false)
    );
    let (status, _, body) = call(&w.server, reqwest::Method::GET, &runner_path, &read, None).await;
    assert_eq!((status, &body["status"]), (200, &json!("offline")));
    let (status, _, body) = call(
        &w.server,
        reqwest::Method::DELETE,
        &runner_path,
        &write,
        None,
    )
    .await;
    assert_eq!((status, body), (204, Value::Null));
    let (status, _, _) = call(&w.server, reqwest::Method::GET, &runner_path, &read, None).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn the_twin_pages_runners_with_link_headers_and_caps_per_page_at_100() {
    let w = world().await;
    for i in 0..150 {
        w.twin
            .register_runner(&w.repo, &format!("r{i:03}"), &["self-hosted"]);
    }
    let token = installation_token(&w, &["api"], "read").await;

    let (status, headers, body) = call(
        &w.server,
        reqwest::Method::GET,
        "/repos/acme/api/actions/runners?per_page=500",
        &token,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["total_count"], 150);
    assert_eq!(body["runners"].as_array().unwrap().len(), 100);
    let link = headers["link"].to_str().unwrap();
    assert!(
        link.contains("per_page=100&page=2>; rel=\"next\""),
        "{link}"
    );
    assert!(link.contains("page=2>; rel=\"last\""), "{link}");

    let (_, headers, body) = call(
        &w.server,
        reqwest::Method::GET,
        "/repos/acme/api/actions/runners?per_page=100&page=2",
        &token,
        None,
    )
    .await;
    assert_eq!(body["runners"].as_array().unwrap().len(), 50);
    assert_eq!(body["runners"][0]["name"], "r100");
    let link = headers["link"].to_str().unwrap();
    assert!(
        !link.contains("rel=\"next\""),
        "the last page has no next: {link}"
    );
    assert!(link.contains("rel=\"prev\""), "{link}");

    // Everything on one page: no Link header at all.
    let (_, headers, _) = call(
        &w.server,
        reqwest::Method::GET,
        "/repos/acme/api/actions/runners?name=r007",
        &token,
        None,
    )
    .await;
    assert!(headers.get("link").is_none());
}
