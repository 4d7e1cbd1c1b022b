//! The GitHub twin against GitHub's documentation: response shapes compared with the
//! fixtures, the client parsing the fixture bodies served verbatim, and the twin's own checks
//! (JWTs, headers, pagination, conditional requests, error bodies).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use runner_scaler::act::Registrar;
use runner_scaler::clients::github::{AppCredentials, GitHub, GitHubSettings};
use runner_scaler::config::{CredentialKind, Mode, RepoConfig};
use runner_scaler::model::{ErrorClass, RepoName};
use runner_scaler::observe::{JobState, PortError, QueueSource};
use runner_scaler::secrets::{ExposeSecret, SecretSource, SecretString};
use runner_scaler::sim::twins::TwinServer;
use runner_scaler::sim::twins::github::{GitHubTwin, TEST_APP_ID, TEST_APP_PRIVATE_KEY_PEM};
use serde_json::{Value, json};
use url::Url;

mod support;

/// `null` matches any kind: nullable fields are null in one of the two bodies depending on
/// state.
use support::fixtures::json_type as kind;

fn fixture(name: &str) -> Value {
    support::fixtures::fixture("github", name)
}

fn fixture_text(name: &str) -> String {
    support::fixtures::fixture_text("github", name)
}

/// Asserts that `twin` has every key of `doc` (and only those plus `extra`), with the same
/// kinds, recursively through objects and the first element of arrays.
fn assert_same_shape(doc: &Value, twin: &Value, extra: &[&str], at: &str) {
    match (doc, twin) {
        (Value::Object(d), Value::Object(t)) => {
            let dk: BTreeSet<&str> = d.keys().map(String::as_str).collect();
            let tk: BTreeSet<&str> = t.keys().map(String::as_str).collect();
            let allowed: BTreeSet<&str> = dk.iter().copied().chain(extra.iter().copied()).collect();
            assert!(
                dk.is_subset(&tk),
                "{at}: twin lacks {:?}",
                dk.difference(&tk).collect::<Vec<_>>()
            );
            assert!(
                tk.is_subset(&allowed),
                "{at}: twin adds {:?}",
                tk.difference(&allowed).collect::<Vec<_>>()
            );
            for key in dk {
                // `permissions` is a map of permission names: its keys are data, not schema.
                if key == "permissions" {
                    assert_eq!(kind(&d[key]), kind(&t[key]), "{at}.{key}");
                    continue;
                }
                assert_same_shape(&d[key], &t[key], &[], &format!("{at}.{key}"));
            }
        }
        (Value::Array(d), Value::Array(t)) => {
            if let (Some(d), Some(t)) = (d.first(), t.first()) {
                assert_same_shape(d, t, &[], &format!("{at}[0]"));
            }
        }
        (Value::Null, _) | (_, Value::Null) => {}
        (d, t) => assert_eq!(kind(d), kind(t), "{at}: {d} vs {t}"),
    }
}

/// A runner's labels as `(name, type)`: the label ids are the twin's own, the types are not.
fn label_types(runner: &Value) -> Vec<(String, String)> {
    runner["labels"]
        .as_array()
        .expect("labels")
        .iter()
        .map(|l| {
            let text = |key: &str| l[key].as_str().expect("a string").to_string();
            (text("name"), text("type"))
        })
        .collect()
}

fn jwt(claims: Value) -> String {
    jsonwebtoken::encode(
        &Header::new(Algorithm::RS256),
        &claims,
        &EncodingKey::from_rsa_pem(TEST_APP_PRIVATE_KEY_PEM.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn good_jwt() -> String {
    let now = chrono::Utc::now().timestamp();
    jwt(json!({"iss": 12345, "iat": now - 60, "exp": now + 540}))
}

struct Raw {
    client: reqwest::Client,
    base: String,
}

impl Raw {
    fn new(server: &TwinServer) -> Raw {
        runner_scaler::clients::http::install_crypto_provider();
        Raw {
            client: reqwest::Client::builder()
                .user_agent("twin-test")
                .build()
                .unwrap(),
            base: server.base_url(),
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        support::fixtures::github_call(&self.client, &self.base, method, path, token, body).await
    }
}

async fn token(raw: &Raw, installation: u64, body: Value) -> String {
    let (status, _, body) = raw
        .call(
            reqwest::Method::POST,
            &format!("/app/installations/{installation}/access_tokens"),
            &good_jwt(),
            Some(body),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    body["token"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn twin_responses_have_the_fixture_shapes() {
    let twin = GitHubTwin::new();
    let server = twin.start().await.unwrap();
    let raw = Raw::new(&server);
    let repo = RepoName::parse("octo-org/octo-repo").unwrap();
    let installation = twin.install_app("octo-org");
    let run = twin.add_run(&repo, vec![vec!["self-hosted", "foo"], vec!["self-hosted"]]);
    twin.register_runner(&repo, "linux_runner", &["self-hosted", "X64", "Linux"]);
    twin.start_job(&repo, run.job_ids[0], "linux_runner")
        .unwrap();

    let (status, _, body) = raw
        .call(
            reqwest::Method::GET,
            "/repos/octo-org/octo-repo/installation",
            &good_jwt(),
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_same_shape(
        &fixture("get-installation.response.json"),
        &body,
        &[],
        "installation",
    );
    let (status, _, body) = raw
        .call(
            reqwest::Method::GET,
            &format!("/app/installations/{installation}"),
            &good_jwt(),
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_same_shape(
        &fixture("get-installation.response.json"),
        &body,
        &[],
        "installation",
    );

    let (status, _, body) = raw
        .call(
            reqwest::Method::POST,
            &format!("/app/installations/{installation}/access_tokens"),
            &good_jwt(),
            Some(json!({"repositories": ["octo-repo"], "permissions": {"actions": "read", "administration": "write"}})),
        )
        .await;
    assert_eq!(status, 201);
    assert_same_shape(
        &fixture("create-installation-access-token.response.json"),
        &body,
        &[],
        "access token",
    );
    let token = body["token"].as_str().unwrap().to_string();
    // GitHub's stateless format since 2026-04: `ghs_<APPID>_<JWT>`, about 520 characters.
    assert!(token.starts_with(&format!("ghs_{TEST_APP_ID}_")), "{token}");
    assert!((480..=600).contains(&token.len()), "{}", token.len());
    assert_eq!(token.matches('.').count(), 2, "{token}");

    let (status, _, body) = raw
        .call(
            reqwest::Method::GET,
            "/repos/octo-org/octo-repo/actions/runs",
            &token,
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_same_shape(
        &fixture("list-workflow-runs-for-repo.response.json"),
        &body,
        &[],
        "runs",
    );
    assert_eq!(body["workflow_runs"][0]["status"], "in_progress");

    let path = format!("/repos/octo-org/octo-repo/actions/runs/{}/jobs", run.run_id);
    let (status, _, body) = raw.call(reqwest::Method::GET, &path, &token, None).await;
    assert_eq!(status, 200);
    let extra = ["created_at", "run_attempt"];
    let doc = fixture("list-jobs-for-workflow-run.response.json");
    assert_same_shape(&doc["jobs"][0], &body["jobs"][0], &extra, "jobs[0]");
    assert_same_shape(&doc["jobs"][0], &body["jobs"][1], &extra, "jobs[1]");
    assert_eq!(body["jobs"][0]["runner_name"], "linux_runner");
    assert_eq!(body["jobs"][1]["runner_name"], Value::Null);
    assert_eq!(body["jobs"][1]["labels"], json!(["self-hosted"]));

    let path = format!("/repos/octo-org/octo-repo/actions/jobs/{}", run.job_ids[0]);
    let (status, _, body) = raw.call(reqwest::Method::GET, &path, &token, None).await;
    assert_eq!(status, 200);
    assert_same_shape(&fixture("get-job.response.json"), &body, &extra, "job");

    let (status, _, body) = raw
        .call(
            reqwest::Method::POST,
            "/repos/octo-org/octo-repo/actions/runners/registration-token",
            &token,
            None,
        )
        .await;
    assert_eq!(status, 201);
    assert_same_shape(
        &fixture("create-registration-token.response.json"),
        &body,
        &[],
        "reg",
    );

    // The documentation's own JIT request: the answer is its example but for the runner id
    // and the secret, down to the keys (no `ephemeral`, which only get-runner's example has)
    // and the label types (`macOS` is one of GitHub's read-only default labels).
    let (status, _, jit) = raw
        .call(
            reqwest::Method::POST,
            "/repos/octo-org/octo-repo/actions/runners/generate-jitconfig",
            &token,
            Some(fixture("generate-jitconfig.request.json")),
        )
        .await;
    assert_eq!(status, 201, "{jit}");
    let doc = fixture("generate-jitconfig.response.json");
    assert_same_shape(&doc, &jit, &[], "jit");
    let without_ids = |runner: &Value| {
        let mut runner = runner.clone();
        runner.as_object_mut().unwrap().remove("id");
        for label in runner["labels"].as_array_mut().unwrap() {
            label.as_object_mut().unwrap().remove("id");
        }
        runner
    };
    assert_eq!(without_ids(&jit["runner"]), without_ids(&doc["runner"]));
    assert!(
        jit["encoded_jit_config"]
            .as_str()
            .is_some_and(|c| !c.is_empty())
    );
    let jit_runner = jit["runner"]["id"].as_u64().unwrap();

    let (status, _, body) = raw
        .call(
            reqwest::Method::GET,
            "/repos/octo-org/octo-repo/actions/runners",
            &token,
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_same_shape(
        &fixture("list-runners-for-repo.response.json"),
        &body,
        &[],
        "runners",
    );
    let listed = fixture("list-runners-for-repo.response.json");
    assert_eq!(
        label_types(&body["runners"][0]),
        label_types(&listed["runners"][0]),
        "linux_runner has the example's labels"
    );
    // Listed, the JIT runner is the get-runner shape (with `ephemeral`), offline until its
    // runner binary connects.
    let listed_jit = body["runners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == jit_runner)
        .expect("the JIT runner is listed");
    assert_eq!(listed_jit["status"], "offline");
    assert_eq!(label_types(listed_jit), label_types(&listed["runners"][1]));
    let runner_id = body["runners"][0]["id"].as_u64().unwrap();
    assert_eq!(body["runners"][0]["busy"], true);
    let path = format!("/repos/octo-org/octo-repo/actions/runners/{runner_id}");
    let (status, _, body) = raw.call(reqwest::Method::GET, &path, &token, None).await;
    assert_eq!(status, 200);
    assert_same_shape(
        &fixture("get-runner-for-repo.response.json"),
        &body,
        &[],
        "runner",
    );

    // GitHub refuses to delete a runner that is executing a job.
    let (status, _, body) = raw.call(reqwest::Method::DELETE, &path, &token, None).await;
    assert_eq!(status, 422, "{body}");
    twin.complete_job(&repo, run.job_ids[0], "success").unwrap();
    let (status, _, body) = raw.call(reqwest::Method::DELETE, &path, &token, None).await;
    assert_eq!((status, body), (204, Value::Null));
    let (status, _, _) = raw.call(reqwest::Method::GET, &path, &token, None).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn twin_errors_are_github_shaped_and_name_the_missing_permission() {
    let twin = GitHubTwin::new();
    let server = twin.start().await.unwrap();
    let raw = Raw::new(&server);
    let repo = RepoName::parse("acme/api").unwrap();
    let other = RepoName::parse("acme/web").unwrap();
    let installation = twin.install_app("acme");
    twin.add_repo(&repo);
    twin.add_repo(&other);
    let admin = token(
        &raw,
        installation,
        json!({"repositories": ["api"], "permissions": {"administration": "write"}}),
    )
    .await;

    let (status, headers, body) = raw
        .call(
            reqwest::Method::GET,
            "/repos/acme/api/actions/runs",
            &admin,
            None,
        )
        .await;
    assert_eq!(status, 403);
    assert_eq!(body["message"], "Resource not accessible by integration");
    assert!(body["documentation_url"].is_string());
    assert_eq!(body.as_object().unwrap().len(), 2);
    assert_eq!(headers["x-accepted-github-permissions"], "actions=read");

    let (status, _, body) = raw
        .call(
            reqwest::Method::POST,
            "/repos/acme/web/actions/runners/registration-token",
            &admin,
            None,
        )
        .await;
    assert_eq!((status, body["message"].as_str()), (404, Some("Not Found")));

    let (status, _, body) = raw
        .call(
            reqwest::Method::GET,
            "/repos/acme/api/actions/runs",
            "ghs_unknown",
            None,
        )
        .await;
    assert_eq!(
        (status, body["message"].as_str()),
        (401, Some("Bad credentials"))
    );

    // A trailing slash is a different path on GitHub.
    let (status, _, _) = raw
        .call(
            reqwest::Method::GET,
            "/repos/acme/api/actions/runs/",
            &admin,
            None,
        )
        .await;
    assert_eq!(status, 404);

    let (status, _, body) = raw
        .call(
            reqwest::Method::POST,
            &format!("/app/installations/{installation}/access_tokens"),
            &good_jwt(),
            Some(json!({"repositories": ["nope"], "permissions": {"actions": "read"}})),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let (status, _, body) = raw
        .call(
            reqwest::Method::POST,
            &format!("/app/installations/{installation}/access_tokens"),
            &good_jwt(),
            Some(json!({"repositories": ["api"], "permissions": {"secrets": "write"}})),
        )
        .await;
    assert_eq!(status, 422, "{body}");

    twin.advance_clock(chrono::Duration::minutes(61));
    let (status, _, _) = raw
        .call(
            reqwest::Method::POST,
            "/repos/acme/api/actions/runners/registration-token",
            &admin,
            None,
        )
        .await;
    assert_eq!(status, 401, "an installation token lives one hour");
}

#[tokio::test]
async fn twin_checks_app_jwts_like_github() {
    let twin = GitHubTwin::new();
    let server = twin.start().await.unwrap();
    let raw = Raw::new(&server);
    let installation = twin.install_app("acme");
    let path = format!("/app/installations/{installation}");
    let now = chrono::Utc::now().timestamp();
    let cases = [
        (
            jwt(json!({"iss": 12345, "iat": now - 60, "exp": now + 540})),
            200,
        ),
        (
            jwt(json!({"iss": "12345", "iat": now - 60, "exp": now + 540})),
            200,
        ),
        (
            jwt(json!({"iss": 12345, "iat": now - 60, "exp": now + 660})),
            401,
        ),
        (
            jwt(json!({"iss": 12345, "iat": now - 600, "exp": now - 10})),
            401,
        ),
        (
            jwt(json!({"iss": 12345, "iat": now + 300, "exp": now + 540})),
            401,
        ),
        (
            jwt(json!({"iss": 999, "iat": now - 60, "exp": now + 540})),
            401,
        ),
        ("not-a-jwt".to_string(), 401),
    ];
    for (i, (jwt, expected)) in cases.iter().enumerate() {
        let (status, _, body) = raw.call(reqwest::Method::GET, &path, jwt, None).await;
        assert_eq!(status, *expected, "case {i}: {body}");
    }
    // An installation token is no JWT.
    let token = token(&raw, installation, json!({})).await;
    let (status, _, _) = raw.call(reqwest::Method::GET, &path, &token, None).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn twin_paginates_with_link_headers_and_answers_304_for_free() {
    let twin = GitHubTwin::new();
    let server = twin.start().await.unwrap();
    let raw = Raw::new(&server);
    let repo = RepoName::parse("acme/api").unwrap();
    let installation = twin.install_app("acme");
    for _ in 0..5 {
        twin.add_run(&repo, vec![vec!["self-hosted"]]);
    }
    let token = token(
        &raw,
        installation,
        json!({"repositories": ["api"], "permissions": {"actions": "read"}}),
    )
    .await;
    let (status, headers, body) = raw
        .call(
            reqwest::Method::GET,
            "/repos/acme/api/actions/runs?status=queued&per_page=2",
            &token,
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["total_count"], 5);
    assert_eq!(body["workflow_runs"].as_array().unwrap().len(), 2);
    let link = headers["link"].to_str().unwrap();
    assert!(
        link.contains("status=queued&per_page=2&page=2>; rel=\"next\""),
        "{link}"
    );
    assert!(link.contains("page=3>; rel=\"last\""), "{link}");
    assert!(link.contains("/repositories/"), "{link}");
    let remaining: u64 = headers["x-ratelimit-remaining"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    for name in [
        "x-ratelimit-limit",
        "x-ratelimit-used",
        "x-ratelimit-reset",
        "x-ratelimit-resource",
        "etag",
    ] {
        assert!(headers.contains_key(name), "{name}");
    }

    let etag = headers["etag"].to_str().unwrap().to_string();
    let response = raw
        .client
        .get(format!(
            "{}/repos/acme/api/actions/runs?status=queued&per_page=2",
            raw.base
        ))
        .bearer_auth(&token)
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
    let after: u64 = response.headers()["x-ratelimit-remaining"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(after, remaining, "a 304 is not charged");

    let (status, _, body) = raw
        .call(
            reqwest::Method::GET,
            "/repos/acme/api/actions/runs?status=completed",
            &token,
            None,
        )
        .await;
    assert_eq!((status, body["total_count"].as_u64()), (200, Some(0)));
}

#[tokio::test]
async fn twin_refuses_requests_github_would_refuse() {
    let twin = GitHubTwin::new();
    let server = twin.start().await.unwrap();
    let installation = twin.install_app("acme");
    twin.add_repo(&RepoName::parse("acme/api").unwrap());
    let raw = Raw::new(&server);
    let token = token(&raw, installation, json!({})).await;
    let bare = reqwest::Client::new();
    let response = bare
        .get(format!("{}/repos/acme/api/actions/runs", raw.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN, "no User-Agent");
    let response = raw
        .client
        .get(format!("{}/repos/acme/api/actions/runs", raw.base))
        .bearer_auth(&token)
        .header("x-github-api-version", "2099-01-01")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn twin_refuses_a_jit_request_without_a_runner_group() {
    let twin = GitHubTwin::new();
    let server = twin.start().await.unwrap();
    let repo = RepoName::parse("acme/api").unwrap();
    let installation = twin.install_app("acme");
    twin.add_repo(&repo);
    let raw = Raw::new(&server);
    let token = token(&raw, installation, json!({})).await;
    let mut request = fixture("generate-jitconfig.request.json");
    request.as_object_mut().unwrap().remove("runner_group_id");
    let (status, _, body) = raw
        .call(
            reqwest::Method::POST,
            "/repos/acme/api/actions/runners/generate-jitconfig",
            &token,
            Some(request),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        body["message"],
        "Invalid request.\n\n\"runner_group_id\" wasn't supplied."
    );
    assert!(twin.runners(&repo).is_empty(), "nothing registered");
}

#[tokio::test]
async fn twin_run_status_filter_takes_conclusions_and_caps_a_search_at_1000() {
    let twin = GitHubTwin::new();
    let server = twin.start().await.unwrap();
    let repo = RepoName::parse("acme/api").unwrap();
    let installation = twin.install_app("acme");
    let cancelled = twin.add_run(&repo, vec![vec!["self-hosted"]]);
    twin.cancel_job(&repo, cancelled.job_ids[0]).unwrap();
    for _ in 0..1001 {
        twin.add_run(&repo, vec![vec!["self-hosted"]]);
    }
    let raw = Raw::new(&server);
    let token = token(&raw, installation, json!({})).await;
    let total = |query: &'static str| {
        let (raw, token) = (&raw, &token);
        async move {
            let path = format!("/repos/acme/api/actions/runs?{query}");
            let (status, _, body) = raw.call(reqwest::Method::GET, &path, token, None).await;
            assert_eq!(status, 200, "{query}: {body}");
            body["total_count"].as_u64().unwrap()
        }
    };
    assert_eq!(
        total("status=cancelled&per_page=1").await,
        1,
        "a conclusion"
    );
    assert_eq!(total("status=completed&per_page=1").await, 1, "a status");
    assert_eq!(total("status=success&per_page=1").await, 0);
    assert_eq!(total("status=queued&per_page=1").await, 1000, "a search");
    assert_eq!(total("per_page=1").await, 1002, "no filter: no search");
}

#[tokio::test]
async fn injected_faults_answer_as_github_would() {
    let twins = support::twins::Twins::start().await;
    let repo = twins.add_app_repo("acme/api");
    let raw = Raw::new(&twins.github_server);
    let installation = twins.github.install_app("acme");
    let token = token(&raw, installation, json!({})).await;
    let (_, healthy, _) = raw
        .call(
            reqwest::Method::GET,
            "/repos/acme/api/actions/runs",
            &token,
            None,
        )
        .await;
    let remaining = |headers: &reqwest::header::HeaderMap| -> u64 {
        headers["x-ratelimit-remaining"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };

    let cases = [
        (
            reqwest::Method::GET,
            "/repos/acme/api/actions/runs",
            403,
            "Resource not accessible by integration",
            Some("actions=read"),
        ),
        (
            reqwest::Method::GET,
            "/repos/acme/api/actions/runners",
            403,
            "Resource not accessible by integration",
            Some("administration=read"),
        ),
        (
            reqwest::Method::POST,
            "/repos/acme/api/actions/runners/registration-token",
            403,
            "Resource not accessible by integration",
            Some("administration=write"),
        ),
        (
            reqwest::Method::GET,
            "/repos/acme/api/actions/runs",
            404,
            "Not Found",
            None,
        ),
        (
            reqwest::Method::GET,
            "/repos/acme/api/actions/runs",
            500,
            "Server Error",
            None,
        ),
        (
            reqwest::Method::GET,
            "/repos/acme/api/actions/runs",
            502,
            "Server Error",
            None,
        ),
        (
            reqwest::Method::GET,
            "/repos/acme/api/actions/runs",
            401,
            "Bad credentials",
            None,
        ),
    ];
    for (method, path, status, message, accepted) in cases {
        twins
            .github_faults
            .fail_repo(&repo, StatusCode::from_u16(status).unwrap());
        let (answered, headers, body) = raw.call(method, path, &token, None).await;
        assert_eq!(
            (answered, body["message"].as_str()),
            (status, Some(message)),
            "{path}"
        );
        assert_eq!(
            headers
                .get("x-accepted-github-permissions")
                .map(|v| v.to_str().unwrap()),
            accepted,
            "{status} {path}"
        );
        for name in [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-used",
            "x-ratelimit-reset",
            "x-ratelimit-resource",
        ] {
            assert!(headers.contains_key(name), "{status} {path}: {name}");
        }
        if status == 401 {
            // GitHub ignored the credential: the unauthenticated budget.
            assert_eq!(headers["x-ratelimit-limit"], "60");
        } else {
            // The installation's budget as the twin keeps it, the fault not charged.
            assert_eq!(remaining(&headers), remaining(&healthy), "{status} {path}");
            assert_eq!(headers["x-ratelimit-reset"], healthy["x-ratelimit-reset"]);
        }
    }
    twins.github_faults.heal(&repo);
}

/// Vault is not used by these tests.
struct NoSecrets;

#[async_trait]
impl SecretSource for NoSecrets {
    async fn read_field(&self, path: &str, _: &str) -> Result<SecretString, PortError> {
        Err(PortError::new(
            ErrorClass::NotFound,
            format!("no secret at {path}"),
        ))
    }
}

/// Serves the documentation examples verbatim, except for a jobs body built from the example
/// job: the same queued self-hosted job twice (a job seen under both run listings).
fn verbatim_router(job_listings: Arc<Mutex<Vec<String>>>) -> Router {
    let json_reply = |status: StatusCode, body: String| {
        (
            status,
            [("content-type", "application/json; charset=utf-8")],
            body,
        )
            .into_response()
    };
    let mut job = fixture("list-jobs-for-workflow-run.response.json")["jobs"][0].clone();
    job["status"] = json!("queued");
    job["conclusion"] = Value::Null;
    job["labels"] = json!(["Self-Hosted", "foo"]);
    let jobs_body = json!({"total_count": 2, "jobs": [job.clone(), job]}).to_string();
    Router::new()
        .route(
            "/repos/octo-org/octo-repo/installation",
            get(move || async move {
                json_reply(
                    StatusCode::OK,
                    fixture_text("get-installation.response.json"),
                )
            }),
        )
        .route(
            "/app/installations/1/access_tokens",
            post(move || async move {
                json_reply(
                    StatusCode::CREATED,
                    fixture_text("create-installation-access-token.response.json"),
                )
            }),
        )
        .route(
            "/repos/octo-org/octo-repo/actions/runs",
            get(move || async move {
                json_reply(
                    StatusCode::OK,
                    fixture_text("list-workflow-runs-for-repo.response.json"),
                )
            }),
        )
        .route(
            "/repos/octo-org/octo-repo/actions/runs/30433642/jobs",
            get(move |uri: Uri, _: HeaderMap| {
                let body = jobs_body.clone();
                let listings = job_listings.clone();
                async move {
                    listings.lock().unwrap().push(uri.to_string());
                    json_reply(StatusCode::OK, body)
                }
            }),
        )
        .route(
            "/repos/octo-org/octo-repo/actions/runners/registration-token",
            post(move || async move {
                json_reply(
                    StatusCode::CREATED,
                    fixture_text("create-registration-token.response.json"),
                )
            }),
        )
        .route(
            "/repos/octo-org/octo-repo/actions/runners/generate-jitconfig",
            post(move || async move {
                json_reply(
                    StatusCode::CREATED,
                    fixture_text("generate-jitconfig.response.json"),
                )
            }),
        )
}

#[tokio::test]
async fn the_client_reads_the_documentation_examples() {
    let job_listings = Arc::new(Mutex::new(Vec::new()));
    let server = TwinServer::start(verbatim_router(job_listings.clone()))
        .await
        .unwrap();
    let settings = GitHubSettings {
        api_url: Url::parse(&server.base_url()).unwrap(),
        app: Some(AppCredentials {
            app_id: TEST_APP_ID.to_string(),
            private_key: SecretString::from(TEST_APP_PRIVATE_KEY_PEM),
            installation_id: None,
        }),
        request_timeout: Duration::from_secs(10),
    };
    let client = GitHub::new(settings, Arc::new(NoSecrets)).unwrap();
    let repo = RepoConfig {
        repo: RepoName::parse("octo-org/octo-repo").unwrap(),
        mode: Mode::App,
        max_concurrent: 1,
        profiles: Vec::new(),
        default_job: None,
        labels: None,
        search_labels_as_written: Default::default(),
        credential: Default::default(),
        nomad_namespace: None,
    };
    let jobs = client.list_jobs(&repo).await.unwrap();
    assert_eq!(
        jobs.jobs.len(),
        1,
        "the same job under both run listings counts once"
    );
    assert_eq!(jobs.jobs[0].id, 399444496);
    assert_eq!(jobs.jobs[0].state, JobState::Queued);
    // The example job has no created_at; started_at stands in.
    assert_eq!(
        jobs.jobs[0].queued_at.map(|t| t.to_rfc3339()),
        Some("2020-01-20T17:42:40+00:00".to_string())
    );
    assert_eq!(
        job_listings.lock().unwrap().as_slice(),
        ["/repos/octo-org/octo-repo/actions/runs/30433642/jobs?filter=latest&per_page=100"],
        "a run listed as queued and in progress is walked once"
    );
    // The documentation's JIT example registers "New runner" with four labels.
    let runner = support::TestRunner::new("New runner", &["self-hosted", "X64", "macOS", "no-gpu"]);
    let jit = client
        .mint(&repo, runner.identity())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(jit.plain().expose_secret(), "abc123");
    assert_eq!(jit.runner_id(), Some(23));
    let registration_repo = RepoConfig {
        credential: CredentialKind::Registration,
        ..repo.clone()
    };
    let token = client
        .mint(&registration_repo, runner.identity())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        token.plain().expose_secret(),
        "LLBF3JGZDX3P5PMEXLND6TS6FCWO6"
    );
    assert_eq!(token.runner_id(), None);
    assert_eq!(
        client.repo_url(&repo),
        format!("{}/octo-org/octo-repo", server.base_url())
    );
}
