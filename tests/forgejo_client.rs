//! The Forgejo client against the Forgejo twin, with its API token read from the Vault twin by
//! the real Vault client, all over loopback HTTP.

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use runner_scaler::act::Registrar;
use runner_scaler::clients::forgejo::Forgejo;
use runner_scaler::clients::http::TlsFiles;
use runner_scaler::clients::vault::{VaultKv, VaultSettings};
use runner_scaler::config::{Mode, Profile, RepoConfig};
use runner_scaler::model::{ErrorClass, RepoName};
use runner_scaler::observe::{JobState, QueueSource};
use runner_scaler::secrets::{ExposeSecret, SecretString};
use runner_scaler::sim::twins::TwinServer;
use runner_scaler::sim::twins::forgejo::ForgejoTwin;
use runner_scaler::sim::twins::vault::{VaultPolicy, VaultTwin};
use serde_json::{Value, json};

const VAULT_TOKEN: &str = "hvs.daemon";
const API_TOKEN: &str = "forgejo-api-token-one";
const REPO: &str = "alex/s3-orchestrator";
const VAULT_PATH: &str = "forgejo/scaler";

struct World {
    vault: VaultTwin,
    forgejo: ForgejoTwin,
    _vault_server: TwinServer,
    forgejo_server: TwinServer,
    client: Forgejo,
}

impl World {
    async fn new() -> World {
        let vault = VaultTwin::new();
        vault.add_token(
            VAULT_TOKEN,
            VaultPolicy::read_only([format!("secret/data/{VAULT_PATH}")]),
        );
        let vault_server = vault.serve().await.unwrap();
        let forgejo = ForgejoTwin::new();
        forgejo.add_token(API_TOKEN);
        forgejo.add_repo(REPO);
        let forgejo_server = forgejo.serve().await.unwrap();
        vault.put_secret(
            "secret",
            VAULT_PATH,
            json!({ "token": API_TOKEN, "url": forgejo_server.base_url() }),
        );
        let kv = VaultKv::new(VaultSettings {
            addr: vault_server.base_url().parse().unwrap(),
            token: SecretString::from(VAULT_TOKEN),
            namespace: None,
            ca_cert: None,
            mount: "secret".to_string(),
        })
        .unwrap();
        let client =
            Forgejo::new(Arc::new(kv), &TlsFiles::default(), Duration::from_secs(5)).unwrap();
        World {
            vault,
            forgejo,
            _vault_server: vault_server,
            forgejo_server,
            client,
        }
    }

    /// Rewrites the API token's secret to say it is for the Forgejo at `url`.
    fn bind_token_to(&self, url: &str) {
        self.vault.put_secret(
            "secret",
            VAULT_PATH,
            json!({ "token": API_TOKEN, "url": url }),
        );
    }

    /// A forgejo repo whose job search asks for `labels`.
    fn repo(&self, labels: &[&str]) -> RepoConfig {
        forgejo_repo(&self.forgejo_server.base_url(), labels)
    }
}

fn forgejo_repo(base_url: &str, labels: &[&str]) -> RepoConfig {
    RepoConfig {
        repo: RepoName::parse(REPO).unwrap(),
        mode: Mode::Forgejo {
            url: format!("{base_url}/").parse().unwrap(),
            vault_path: VAULT_PATH.to_string(),
            // The twin is a Forgejo 11 unless a test says otherwise.
            allow_shared_token: true,
        },
        max_concurrent: 2,
        profiles: vec![Profile {
            job: "forgejo-build-runner".to_string(),
            label: "build".to_string(),
            max_concurrent: Some(1),
            hard_bound: None,
        }],
        default_job: None,
        labels: Some(labels.iter().map(|l| l.to_lowercase()).collect()),
        search_labels_as_written: labels.iter().map(|l| l.to_string()).collect(),
        credential: Default::default(),
        nomad_namespace: None,
    }
}

#[tokio::test]
async fn a_null_answer_means_no_jobs() {
    let world = World::new().await;
    let raw = reqwest::Client::new()
        .get(format!(
            "{}/api/v1/repos/{REPO}/actions/runners/jobs?labels=build",
            world.forgejo_server.base_url()
        ))
        .header("Authorization", format!("token {API_TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.text().await.unwrap(), "null");

    let jobs = world
        .client
        .list_jobs(&world.repo(&["build"]))
        .await
        .unwrap();
    assert!(jobs.jobs.is_empty());
    assert!(!jobs.truncated);
}

#[tokio::test]
async fn only_a_waiting_job_without_a_task_is_queued() {
    let world = World::new().await;
    let queued = world.forgejo.add_job(REPO, "build", &["build"]);
    let claimed = world.forgejo.add_job(REPO, "test", &["build"]);
    world.forgejo.claim(claimed);
    let running = world.forgejo.add_job(REPO, "lint", &["build"]);
    world.forgejo.start(running);
    let done = world.forgejo.add_job(REPO, "docs", &["build"]);
    world.forgejo.finish(done);
    let cancelled = world.forgejo.add_job(REPO, "deploy", &["build"]);
    world.forgejo.cancel(cancelled);
    assert_eq!(
        world.forgejo.job(claimed).unwrap().status.as_str(),
        "waiting"
    );

    let jobs = world
        .client
        .list_jobs(&world.repo(&["build"]))
        .await
        .unwrap();
    let states: Vec<(u64, JobState)> = jobs.jobs.iter().map(|j| (j.id, j.state.clone())).collect();
    assert_eq!(
        states,
        vec![
            (queued, JobState::Queued),
            (claimed, JobState::Claimed),
            (running, JobState::Claimed),
        ]
    );
    for job in &jobs.jobs {
        assert_eq!(job.labels, vec!["build".to_string()]);
        assert_eq!(job.queued_at, None);
    }
}

#[tokio::test]
async fn the_search_returns_jobs_whose_every_label_was_asked_for() {
    let world = World::new().await;
    let build = world.forgejo.add_job(REPO, "a", &["build"]);
    let both = world.forgejo.add_job(REPO, "b", &["build", "docker"]);
    world.forgejo.add_job(REPO, "c", &["build", "gpu"]);
    world.forgejo.add_job(REPO, "d", &["Build"]);
    world.forgejo.add_job("alex/other", "e", &["build"]);

    let jobs = world
        .client
        .list_jobs(&world.repo(&["build", "docker"]))
        .await
        .unwrap();
    let ids: Vec<u64> = jobs.jobs.iter().map(|j| j.id).collect();
    assert_eq!(ids, vec![build, both]);
    assert_eq!(
        jobs.jobs[1].labels,
        vec!["build".to_string(), "docker".to_string()]
    );

    let search = world
        .forgejo
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/actions/runners/jobs"))
        .unwrap();
    assert_eq!(search.query.as_deref(), Some("labels=build%2Cdocker"));
}

#[tokio::test]
async fn with_no_labels_to_ask_for_nothing_is_asked_and_the_repo_is_misconfigured() {
    let world = World::new().await;
    world.forgejo.add_job(REPO, "a", &["build"]);
    let mut repo = world.repo(&[]);
    repo.profiles.clear();
    let error = world.client.list_jobs(&repo).await.unwrap_err();
    assert_eq!(error.class, ErrorClass::Configuration, "{error:?}");
    assert!(error.message.contains(REPO), "{}", error.message);
    assert!(world.forgejo.requests().is_empty());
    assert!(world.vault.requests().is_empty());
}

#[tokio::test]
async fn labels_are_asked_for_as_the_document_writes_them() {
    let world = World::new().await;
    let upper = world.forgejo.add_job(REPO, "a", &["Linux"]);
    let lower = world.forgejo.add_job(REPO, "b", &["linux"]);
    let document = format!(
        r#"{{"{REPO}": {{"mode": "forgejo", "forgejoUrl": "{}", "vaultPath": "{VAULT_PATH}", "labels": ["Linux"]}}}}"#,
        world.forgejo_server.base_url()
    );
    let config = runner_scaler::config::parse_document(
        document.as_bytes(),
        &runner_scaler::config::ConfigDefaults::default(),
    )
    .unwrap();
    let repo = &config.repos[&RepoName::parse(REPO).unwrap()];

    let jobs = world.client.list_jobs(repo).await.unwrap();
    let ids: Vec<u64> = jobs.jobs.iter().map(|j| j.id).collect();
    assert_eq!(
        ids,
        vec![upper],
        "the lower-case job {lower} is not asked for"
    );
    let search = world
        .forgejo
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/actions/runners/jobs"))
        .unwrap();
    assert_eq!(search.query.as_deref(), Some("labels=Linux"));
}

#[tokio::test]
async fn a_forgejo_older_than_11_is_a_configuration_error_naming_repo_and_version() {
    let world = World::new().await;
    world.forgejo.set_version("10.0.3+gitea-1.22.0");
    world.forgejo.add_job(REPO, "a", &["build"]);
    let err = world
        .client
        .list_jobs(&world.repo(&["build"]))
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Configuration);
    assert!(err.message.contains(REPO), "{}", err.message);
    assert!(err.message.contains("10.0.3"), "{}", err.message);
    assert!(
        world
            .forgejo
            .requests()
            .iter()
            .all(|r| r.path == "/api/v1/version"),
        "the job search was called on an old Forgejo"
    );

    // The route itself is absent there.
    let raw = reqwest::Client::new()
        .get(format!(
            "{}/api/v1/repos/{REPO}/actions/runners/jobs?labels=build",
            world.forgejo_server.base_url()
        ))
        .header("Authorization", format!("token {API_TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 404);

    // An upgrade is noticed at the next try.
    world.forgejo.set_version("11.0.1+gitea-1.22.0");
    let jobs = world
        .client
        .list_jobs(&world.repo(&["build"]))
        .await
        .unwrap();
    assert_eq!(jobs.jobs.len(), 1);
}

#[tokio::test]
async fn the_version_is_checked_once_per_instance() {
    let world = World::new().await;
    let repo = world.repo(&["build"]);
    for _ in 0..3 {
        world.client.list_jobs(&repo).await.unwrap();
    }
    let versions = world
        .forgejo
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/version")
        .count();
    assert_eq!(versions, 1);
}

#[tokio::test]
async fn mint_returns_the_registration_token_sent_with_a_lower_case_token_header() {
    let world = World::new().await;
    let repo = world.repo(&["build"]);
    let minted = world
        .client
        .mint(&repo, support::TestRunner::any().identity())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        Some(minted.plain().expose_secret().to_string()),
        world.forgejo.registration_token(REPO)
    );
    assert!(!format!("{minted:?}").contains(minted.plain().expose_secret()));
    world.client.list_jobs(&repo).await.unwrap();

    let requests = world.forgejo.requests();
    assert!(!requests.is_empty());
    for request in &requests {
        assert_eq!(request.method, "GET");
        assert_eq!(request.auth_scheme.as_deref(), Some("token"), "{request:?}");
        let query = request.query.clone().unwrap_or_default();
        assert!(!query.contains("token"), "{request:?}");
        assert!(!query.contains(API_TOKEN), "{request:?}");
    }
    assert_eq!(
        world.client.repo_url(&repo),
        format!("{}/alex/s3-orchestrator", world.forgejo_server.base_url())
    );
}

#[tokio::test]
async fn on_forgejo_15_mint_registers_one_ephemeral_runner_per_runner_and_shows_none_of_it() {
    let world = World::new().await;
    world.forgejo.set_version("15.0.0+gitea-1.22.0");
    let repo = world.repo(&["build"]);
    let first = support::TestRunner::new("forgejo-build-runner-0123456789ab", &["build"]);
    let second = support::TestRunner::new("forgejo-build-runner-ba9876543210", &["build"]);
    let a = world
        .client
        .mint(&repo, first.identity())
        .await
        .unwrap()
        .unwrap();
    let b = world
        .client
        .mint(&repo, second.identity())
        .await
        .unwrap()
        .unwrap();

    let registered = world.forgejo.registered_runners();
    assert_eq!(registered.len(), 2, "one runner per mint");
    for (minted, runner, name) in [
        (&a, &registered[0], &first.name),
        (&b, &registered[1], &second.name),
    ] {
        assert_eq!(runner.name, name.to_string());
        assert!(runner.ephemeral);
        assert_eq!(minted.runner_id(), Some(runner.id));
        assert_eq!(
            minted.plain().expose_secret(),
            format!("{}:{}", runner.uuid, runner.token)
        );
        let shown = format!("{minted:?}");
        assert!(
            !shown.contains(&runner.uuid) && !shown.contains(&runner.token),
            "{shown}"
        );
    }
    let posts: Vec<_> = world
        .forgejo
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(posts.len(), 2);
    assert!(
        posts
            .iter()
            .all(|r| r.auth_scheme.as_deref() == Some("token") && r.status == 201)
    );
    assert!(
        world.forgejo.registration_token(REPO).is_none(),
        "the shared token was created"
    );
}

#[tokio::test]
async fn the_twin_takes_token_or_bearer_but_not_capital_token() {
    let world = World::new().await;
    let url = format!(
        "{}/api/v1/repos/{REPO}/actions/runners/registration-token",
        world.forgejo_server.base_url()
    );
    for (header, status) in [
        (format!("token {API_TOKEN}"), 200),
        (format!("Bearer {API_TOKEN}"), 200),
        (format!("bearer {API_TOKEN}"), 200),
        (format!("Token {API_TOKEN}"), 401),
        ("token wrong".to_string(), 401),
    ] {
        let response = reqwest::Client::new()
            .get(&url)
            .header("Authorization", &header)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status, "{}", &header[..6]);
        let body: Value = response.json().await.unwrap();
        if status == 401 {
            let mut keys: Vec<&String> = body.as_object().unwrap().keys().collect();
            keys.sort();
            assert_eq!(keys, ["message", "url"]);
        } else {
            assert!(body["token"].is_string());
        }
    }
}

#[tokio::test]
async fn a_401_on_a_cached_token_reads_the_token_from_vault_again_once() {
    let world = World::new().await;
    let repo = world.repo(&["build"]);
    world.forgejo.add_job(REPO, "a", &["build"]);
    world.client.list_jobs(&repo).await.unwrap();
    let vault_path = format!("secret/data/{VAULT_PATH}");
    assert_eq!(world.vault.requests_for(&vault_path).len(), 1);

    // The token is rotated: Vault has the new one, Forgejo refuses the old.
    world.vault.put_secret(
        "secret",
        VAULT_PATH,
        json!({ "token": "forgejo-api-token-two", "url": world.forgejo_server.base_url() }),
    );
    world.forgejo.add_token("forgejo-api-token-two");
    world.forgejo.revoke_token(API_TOKEN);

    let jobs = world.client.list_jobs(&repo).await.unwrap();
    assert_eq!(jobs.jobs.len(), 1);
    assert_eq!(world.vault.requests_for(&vault_path).len(), 2);
    let statuses: Vec<u16> = world
        .forgejo
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/jobs"))
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, vec![200, 401, 200]);

    // A token fresh from Vault that is refused is neither retried nor kept.
    world.forgejo.revoke_token("forgejo-api-token-two");
    world
        .client
        .mint(&repo, support::TestRunner::any().identity())
        .await
        .unwrap_err();
    let reads_before = world.vault.requests_for(&vault_path).len();
    let mints_before = world.forgejo.requests().len();
    let err = world
        .client
        .mint(&repo, support::TestRunner::any().identity())
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Unauthorized);
    assert_eq!(
        world.vault.requests_for(&vault_path).len(),
        reads_before + 1
    );
    assert_eq!(world.forgejo.requests().len(), mints_before + 1);
}

#[tokio::test]
async fn refusals_and_outages_are_classified_and_name_repo_and_instance() {
    let world = World::new().await;
    let base = world.forgejo_server.base_url();
    let repo = world.repo(&["build"]);

    world.forgejo.set_outage(true);
    let err = world.client.list_jobs(&repo).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient);
    assert_eq!(
        err.message,
        format!("read the Forgejo version for {REPO} at {base}: 502 Bad Gateway")
    );
    world.forgejo.set_outage(false);
    world.client.list_jobs(&repo).await.unwrap();
    world.forgejo.set_outage(true);
    let err = world.client.list_jobs(&repo).await.unwrap_err();
    assert_eq!(
        err.message,
        format!("list runner jobs for {REPO} at {base}: 502 Bad Gateway")
    );
    world.forgejo.set_outage(false);

    world.forgejo.revoke_token(API_TOKEN);
    world.forgejo.add_token_for(API_TOKEN, &["alex/other"]);
    let err = world
        .client
        .mint(&repo, support::TestRunner::any().identity())
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Forbidden);
    assert!(err.message.starts_with(&format!(
        "get a runner registration token for {REPO} at {base}: 403 Forbidden"
    )));

    world.forgejo.add_token(API_TOKEN);
    let mut missing = repo.clone();
    missing.repo = RepoName::parse("alex/missing").unwrap();
    let err = world.client.list_jobs(&missing).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::NotFound);
    assert!(err.message.contains("alex/missing"), "{}", err.message);
}

#[tokio::test]
async fn a_vault_failure_names_the_repo_whose_token_it_is() {
    let world = World::new().await;
    let mut repo = world.repo(&["build"]);
    repo.mode = Mode::Forgejo {
        url: world.forgejo_server.base_url().parse().unwrap(),
        vault_path: "forgejo/elsewhere".to_string(),
        allow_shared_token: true,
    };
    let err = world.client.list_jobs(&repo).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Forbidden);
    assert!(
        err.message
            .contains("Forgejo API token of alex/s3-orchestrator"),
        "{}",
        err.message
    );
    assert!(err.message.contains("forgejo/elsewhere"), "{}", err.message);
}

/// A Forgejo that answers with its own bodies: later versions' extra fields, and bodies that
/// are not what the API documents.
async fn scripted_forgejo(jobs_body: &'static str, token_body: &'static str) -> TwinServer {
    let router = axum::Router::new()
        .route(
            "/api/v1/version",
            get(|| async { axum::Json(json!({"version": "15.0.0-dev-123+gitea-1.22.0"})) }),
        )
        .route(
            "/api/v1/repos/{owner}/{repo}/actions/runners/jobs",
            get(move || async move { ([("content-type", "application/json")], jobs_body) }),
        )
        .route(
            "/api/v1/repos/{owner}/{repo}/actions/runners/registration-token",
            get(move || async move { ([("content-type", "application/json")], token_body) }),
        )
        // Forgejo 15 registers a runner per dispatch: the same body, as its 201.
        .route(
            "/api/v1/repos/{owner}/{repo}/actions/runners",
            axum::routing::post(move || async move {
                (
                    axum::http::StatusCode::CREATED,
                    [("content-type", "application/json")],
                    token_body,
                )
            }),
        );
    TwinServer::start(router).await.unwrap()
}

#[tokio::test]
async fn later_fields_are_tolerated_and_malformed_bodies_are_malformed() {
    let world = World::new().await;
    let newer = scripted_forgejo(
        r#"[{"id":7,"repo_id":1,"owner_id":1,"name":"job_2","needs":null,"runs_on":["build"],
            "task_id":0,"status":"waiting","attempt":1,"handle":"h-1","html_url":"http://x/1",
            "run_id":3}]"#,
        r#"{"token":"reg-token-secret-value"#,
    )
    .await;
    world.bind_token_to(&newer.base_url());
    let repo = forgejo_repo(&newer.base_url(), &["build"]);
    let jobs = world.client.list_jobs(&repo).await.unwrap();
    assert_eq!(jobs.jobs.len(), 1);
    assert_eq!(jobs.jobs[0].id, 7);
    assert_eq!(jobs.jobs[0].state, JobState::Queued);

    let err = world
        .client
        .mint(&repo, support::TestRunner::any().identity())
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Malformed);
    assert!(
        !err.message.contains("reg-token-secret-value"),
        "{}",
        err.message
    );

    let wrapped = scripted_forgejo(r#"{"jobs":[]}"#, r#"{"token":7}"#).await;
    world.bind_token_to(&wrapped.base_url());
    let repo = forgejo_repo(&wrapped.base_url(), &["build"]);
    let err = world.client.list_jobs(&repo).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Malformed);
    assert!(
        err.message
            .starts_with("list runner jobs for alex/s3-orchestrator")
    );
    let err = world
        .client
        .mint(&repo, support::TestRunner::any().identity())
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Malformed);
}

/// Everything a document can aim a Forgejo repo at, and what the Forgejo client sends there.
async fn aim_and_call(world: &World, forgejo_url: &str) -> Vec<runner_scaler::observe::PortError> {
    let repo = forgejo_repo(forgejo_url, &["build"]);
    let mut refused = vec![world.client.list_jobs(&repo).await.unwrap_err()];
    refused.push(
        world
            .client
            .mint(&repo, support::TestRunner::any().identity())
            .await
            .unwrap_err(),
    );
    refused.push(world.client.instance_version(&repo).await.unwrap_err());
    refused
}

#[tokio::test]
async fn a_document_aiming_a_repo_at_another_host_sends_that_host_nothing() {
    let world = World::new().await;
    let elsewhere = support::bystander::Bystander::start().await;
    for refused in aim_and_call(&world, &elsewhere.base_url()).await {
        assert_eq!(
            refused.class,
            ErrorClass::Configuration,
            "{}",
            refused.message
        );
        for named in [REPO, VAULT_PATH, "nothing is sent to", "correct forgejoUrl"] {
            assert!(
                refused.message.contains(named),
                "{named}: {}",
                refused.message
            );
        }
        assert!(!refused.message.contains(API_TOKEN), "{}", refused.message);
    }
    // Checked on the other host's side: not even a connection.
    assert_eq!(elsewhere.connections(), 0);
    assert!(!elsewhere.received(API_TOKEN));
    // The instance the token is for was not asked either: the document is wrong, not Forgejo.
    assert!(world.forgejo.requests().is_empty());
}

#[tokio::test]
async fn a_token_whose_secret_names_no_forgejo_is_sent_nowhere() {
    let world = World::new().await;
    world
        .vault
        .put_secret("secret", VAULT_PATH, json!({ "token": API_TOKEN }));
    for refused in aim_and_call(&world, &world.forgejo_server.base_url()).await {
        assert_eq!(
            refused.class,
            ErrorClass::Configuration,
            "{}",
            refused.message
        );
        for named in [REPO, VAULT_PATH, "url=https://"] {
            assert!(
                refused.message.contains(named),
                "{named}: {}",
                refused.message
            );
        }
    }
    assert!(world.forgejo.requests().is_empty());

    // The operator adds the url: served at the next call, not after the token cache expires.
    world.bind_token_to(&world.forgejo_server.base_url());
    world
        .client
        .list_jobs(&world.repo(&["build"]))
        .await
        .unwrap();
}

#[tokio::test]
async fn plain_http_goes_only_where_the_secret_says_http() {
    let world = World::new().await;
    // The secret says https at the same host and port: a document's http:// would send the
    // token in clear text.
    let https = world
        .forgejo_server
        .base_url()
        .replace("http://", "https://");
    world.bind_token_to(&https);
    for refused in aim_and_call(&world, &world.forgejo_server.base_url()).await {
        assert_eq!(
            refused.class,
            ErrorClass::Configuration,
            "{}",
            refused.message
        );
        assert!(refused.message.contains(&https), "{}", refused.message);
    }
    assert!(world.forgejo.requests().is_empty());
}

#[tokio::test]
async fn a_cached_token_is_not_sent_to_another_origin_either() {
    let world = World::new().await;
    let repo = world.repo(&["build"]);
    world.client.list_jobs(&repo).await.unwrap();
    // The document changes after the token was cached for the right instance.
    let elsewhere = support::bystander::Bystander::start().await;
    let refused = aim_and_call(&world, &elsewhere.base_url()).await;
    assert!(
        refused.iter().all(|e| e.class == ErrorClass::Configuration),
        "{refused:?}"
    );
    assert_eq!(elsewhere.connections(), 0);
    // The right instance is still served from the cache.
    world.client.list_jobs(&repo).await.unwrap();
}

/// A Forgejo whose job search answers `size` bytes, declared or streamed.
async fn oversized_forgejo(size: usize, declared: bool) -> TwinServer {
    let router = axum::Router::new()
        .route(
            "/api/v1/version",
            get(|| async { axum::Json(json!({"version": "15.0.0+gitea-1.22.0"})) }),
        )
        .route(
            "/api/v1/repos/{owner}/{repo}/actions/runners/jobs",
            get(move || async move {
                let chunk = axum::body::Bytes::from(vec![b' '; 64 * 1024]);
                let chunks = size.div_ceil(chunk.len());
                if declared {
                    let body = vec![b' '; size];
                    return axum::response::Response::new(axum::body::Body::from(body));
                }
                let stream = futures::stream::iter(
                    (0..chunks).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
                );
                axum::response::Response::new(axum::body::Body::from_stream(stream))
            }),
        );
    TwinServer::start(router).await.unwrap()
}

#[tokio::test]
async fn an_answer_over_the_body_cap_is_refused_not_read() {
    use runner_scaler::clients::forgejo::RESPONSE_BODY_MAX_BYTES;
    let world = World::new().await;
    for declared in [true, false] {
        let server = oversized_forgejo(RESPONSE_BODY_MAX_BYTES + 1, declared).await;
        world.bind_token_to(&server.base_url());
        let repo = forgejo_repo(&server.base_url(), &["build"]);
        let refused = world.client.list_jobs(&repo).await.unwrap_err();
        assert_eq!(refused.class, ErrorClass::Malformed, "{}", refused.message);
        assert!(
            refused.message.contains("body over") && refused.message.contains(REPO),
            "{}",
            refused.message
        );
    }
    // At the cap exactly, the body is read (and is not JSON: malformed for another reason).
    let server = oversized_forgejo(RESPONSE_BODY_MAX_BYTES, false).await;
    world.bind_token_to(&server.base_url());
    let refused = world
        .client
        .list_jobs(&forgejo_repo(&server.base_url(), &["build"]))
        .await
        .unwrap_err();
    assert!(
        !refused.message.contains("body over"),
        "{}",
        refused.message
    );
}

#[tokio::test]
async fn before_15_no_shared_token_is_asked_for_unless_the_repo_opts_in() {
    let world = World::new().await;
    let mut repo = world.repo(&["build"]);
    repo.mode = Mode::Forgejo {
        url: world.forgejo_server.base_url().parse().unwrap(),
        vault_path: VAULT_PATH.to_string(),
        allow_shared_token: false,
    };
    let refused = world
        .client
        .mint(&repo, support::TestRunner::any().identity())
        .await
        .unwrap_err();
    assert_eq!(refused.class, ErrorClass::Configuration);
    assert!(
        refused.message.contains(REPO) && refused.message.contains("allowSharedRegistrationToken"),
        "{}",
        refused.message
    );
    assert!(
        world
            .forgejo
            .requests()
            .iter()
            .all(|r| !r.path.ends_with("/registration-token")),
        "{:?}",
        world.forgejo.requests()
    );
    // Nothing weaker is reported for a repo that mints nothing.
    assert!(world.client.weaker_credential(&repo).is_none());

    // Opted in: the shared token, said to be weaker.
    let minted = world
        .client
        .mint(
            &world.repo(&["build"]),
            support::TestRunner::any().identity(),
        )
        .await
        .unwrap();
    assert!(minted.is_some());
    assert!(
        world
            .client
            .weaker_credential(&world.repo(&["build"]))
            .is_some()
    );
}
