//! The real Forgejo client over an in-memory tower service, with no socket and on tokio's
//! paused clock: the seam the seeded world drives it through. What the network client
//! guarantees holds here too, because everything above the sending of a request is its code:
//! the token goes in `Authorization` only and to its own origin only, a body over the cap is
//! not read, and a redirect is refused, not followed.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use http::{Method, StatusCode};
use http_body_util::StreamBody;
use hyper::body::Frame;
use runner_scaler::act::{
    Credential, Deregistration, RegisteredRunners, Registrar, RunnerIdentity,
};
use runner_scaler::clients::forgejo::{Bytes, Forgejo, RESPONSE_BODY_MAX_BYTES};
use runner_scaler::config::{Mode, RepoConfig};
use runner_scaler::model::{ErrorClass, LabelSet, RepoName, RunnerName};
use runner_scaler::observe::{JobState, PortError, QueueSource};
use runner_scaler::secrets::{ExposeSecret, SecretSource, SecretString};
use serde_json::{Value, json};

const INSTANCE: &str = "https://forgejo.example";
const API_TOKEN: &str = "forgejo-api-token-in-memory";
const REPO: &str = "alex/api";
const JOBS_PATH: &str = "/api/v1/repos/alex/api/actions/runners/jobs";
const RUNNERS_PATH: &str = "/api/v1/repos/alex/api/actions/runners";
const TIMEOUT: Duration = Duration::from_secs(10);

/// Forgejo 11's answer to the runner-job search (the twin's shape: a bare array, no paging):
/// one job waiting for a runner, one a runner just claimed, one running.
const JOBS: &str = r#"[
  {"id":101,"repo_id":7,"owner_id":3,"name":"build","needs":[],"runs_on":["build"],"task_id":0,"status":"waiting"},
  {"id":102,"repo_id":7,"owner_id":3,"name":"test","needs":["build"],"runs_on":["build","Large"],"task_id":55,"status":"waiting"},
  {"id":103,"repo_id":7,"owner_id":3,"name":"lint","needs":[],"runs_on":["Large"],"task_id":54,"status":"running"}
]"#;

/// The API token, for the Forgejo at [`INSTANCE`].
struct ApiToken;

#[async_trait]
impl SecretSource for ApiToken {
    async fn read_field(&self, _path: &str, field: &str) -> Result<SecretString, PortError> {
        Ok(SecretString::from(match field {
            "url" => INSTANCE,
            _ => API_TOKEN,
        }))
    }
}

/// One request as the in-memory Forgejo was handed it.
struct Seen {
    method: Method,
    uri: http::Uri,
    headers: http::HeaderMap,
    body: Bytes,
}

/// How the in-memory Forgejo answers one request.
enum Reply {
    Answer(http::Response<reqwest::Body>),
    Hang,
    Fail(std::io::Error),
}

type Route = Arc<dyn Fn(&Method, &str) -> Reply + Send + Sync>;

/// The real client over a service that records every request and answers it by `route`.
fn client_over(route: Route) -> (Forgejo, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = seen.clone();
    let service = tower::service_fn(move |request: http::Request<Bytes>| {
        let seen = seen.clone();
        let route = route.clone();
        async move {
            let (parts, body) = request.into_parts();
            let reply = route(&parts.method, parts.uri.path());
            seen.lock().unwrap().push(Seen {
                method: parts.method,
                uri: parts.uri,
                headers: parts.headers,
                body,
            });
            match reply {
                Reply::Answer(response) => Ok(response),
                Reply::Hang => std::future::pending().await,
                Reply::Fail(e) => Err(e),
            }
        }
    });
    let client = Forgejo::with_service(Arc::new(ApiToken), service, TIMEOUT);
    (client, recorded)
}

fn answer(status: StatusCode, body: impl Into<reqwest::Body>) -> Reply {
    let mut response = http::Response::new(body.into());
    *response.status_mut() = status;
    Reply::Answer(response)
}

fn json_answer(status: StatusCode, body: Value) -> Reply {
    answer(status, body.to_string())
}

fn redirect(status: StatusCode) -> Reply {
    let mut response = http::Response::new(reqwest::Body::from(""));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::LOCATION,
        http::HeaderValue::from_static("https://elsewhere.example/collect"),
    );
    Reply::Answer(response)
}

/// A Forgejo at `version` with [`JOBS`] queued, registering runner 42 and deleting it.
fn forgejo_api(version: &'static str) -> Route {
    Arc::new(move |method, path| match (method.as_str(), path) {
        ("GET", "/api/v1/version") => json_answer(StatusCode::OK, json!({ "version": version })),
        ("GET", JOBS_PATH) => answer(StatusCode::OK, JOBS),
        ("POST", RUNNERS_PATH) => json_answer(
            StatusCode::CREATED,
            json!({ "id": 42, "uuid": "5f0c2d4e-runner-uuid", "token": "runner-secret-token" }),
        ),
        ("DELETE", p) if p == format!("{RUNNERS_PATH}/42") => answer(StatusCode::NO_CONTENT, ""),
        _ => json_answer(StatusCode::NOT_FOUND, json!({ "message": "not found" })),
    })
}

/// The repo, on the Forgejo at `url`, asking for `build` and `Large` as written.
fn repo_at(url: &str) -> RepoConfig {
    let labels: BTreeSet<String> = ["build", "Large"].map(String::from).into();
    RepoConfig {
        repo: RepoName::parse(REPO).unwrap(),
        mode: Mode::Forgejo {
            url: url.parse().unwrap(),
            vault_path: "forgejo/scaler".into(),
            allow_shared_token: false,
        },
        max_concurrent: 2,
        profiles: vec![],
        default_job: Some("forgejo-runner".into()),
        labels: Some(labels.iter().map(|l| l.to_lowercase()).collect()),
        search_labels_as_written: labels,
        credential: Default::default(),
        nomad_namespace: None,
    }
}

fn runner() -> (RunnerName, LabelSet) {
    (
        RunnerName("forgejo-runner-0001".to_string()),
        LabelSet::parse(&["build"]).unwrap(),
    )
}

#[tokio::test(start_paused = true)]
async fn waiting_jobs_are_listed_from_the_in_memory_forgejo() {
    let (client, seen) = client_over(forgejo_api("11.0.0+gitea-1.22.0"));

    let listed = client.list_jobs(&repo_at(INSTANCE)).await.unwrap();

    let jobs: Vec<_> = listed
        .jobs
        .iter()
        .map(|job| (job.id, job.state.clone(), job.labels.clone()))
        .collect();
    assert_eq!(
        jobs,
        [
            (101, JobState::Queued, vec!["build".to_string()]),
            (102, JobState::Claimed, vec!["build".into(), "Large".into()]),
            (103, JobState::Claimed, vec!["Large".into()]),
        ]
    );
    assert!(!listed.truncated);
    let seen = seen.lock().unwrap();
    let asked: Vec<_> = seen
        .iter()
        .map(|r| (r.method.as_str(), r.uri.to_string()))
        .collect();
    // Absolute URIs, so that one service can serve several instances; the labels as the
    // document writes them, in one comma-joined parameter.
    assert_eq!(
        asked,
        [
            ("GET", format!("{INSTANCE}/api/v1/version")),
            ("GET", format!("{INSTANCE}{JOBS_PATH}?labels=Large%2Cbuild")),
        ]
    );
    for request in seen.iter() {
        assert_eq!(request.headers["accept"], "application/json");
        assert!(request.body.is_empty(), "a GET with a body");
    }
}

#[tokio::test(start_paused = true)]
async fn on_forgejo_15_mint_registers_an_ephemeral_runner_and_delete_removes_it() {
    let (client, seen) = client_over(forgejo_api("15.0.1+gitea-1.22.0"));
    let repo = repo_at(INSTANCE);
    let (name, labels) = runner();

    let minted = client
        .mint(
            &repo,
            RunnerIdentity {
                name: &name,
                labels: &labels,
            },
        )
        .await
        .unwrap();

    let Some(Credential::EphemeralRunner {
        uuid,
        token,
        runner_id,
    }) = minted
    else {
        panic!("not an ephemeral runner: {minted:?}");
    };
    assert_eq!(runner_id, 42);
    assert_eq!(uuid.expose_secret(), "5f0c2d4e-runner-uuid");
    assert_eq!(token.expose_secret(), "runner-secret-token");
    {
        let seen = seen.lock().unwrap();
        let registering = seen
            .iter()
            .find(|r| r.method == Method::POST)
            .expect("no registration request");
        assert_eq!(registering.uri.path(), RUNNERS_PATH);
        assert_eq!(registering.headers["content-type"], "application/json");
        let options: Value = serde_json::from_slice(&registering.body).unwrap();
        assert_eq!(options["name"], "forgejo-runner-0001");
        assert_eq!(options["ephemeral"], true);
        assert!(
            seen.iter()
                .all(|r| !r.uri.path().ends_with("/registration-token")),
            "the shared registration token was asked for on Forgejo 15"
        );
    }

    let deleted = client.delete_registered(&repo, 42).await.unwrap();
    assert_eq!(deleted, Deregistration::Deleted);
    let gone = client.delete_registered(&repo, 43).await.unwrap();
    assert_eq!(gone, Deregistration::NotFound);
}

#[tokio::test(start_paused = true)]
async fn the_token_goes_in_the_authorization_header_only_and_to_its_own_origin_only() {
    let (client, seen) = client_over(forgejo_api("15.0.0"));
    let repo = repo_at(INSTANCE);
    let (name, labels) = runner();
    client.list_jobs(&repo).await.unwrap();
    let identity = RunnerIdentity {
        name: &name,
        labels: &labels,
    };
    client.mint(&repo, identity).await.unwrap();
    client.delete_registered(&repo, 42).await.unwrap();

    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 4, "version, jobs, register, delete");
        for request in seen.iter() {
            let authorization = &request.headers["authorization"];
            assert_eq!(authorization, &format!("token {API_TOKEN}"));
            assert!(authorization.is_sensitive(), "printable in a header dump");
            let uri = request.uri.to_string();
            assert!(!uri.contains(API_TOKEN) && !uri.contains("token="), "{uri}");
            for (header, value) in &request.headers {
                let value = String::from_utf8_lossy(value.as_bytes());
                assert!(
                    header == "authorization" || !value.contains(API_TOKEN),
                    "the token in {header}"
                );
            }
            let body = String::from_utf8_lossy(&request.body);
            assert!(!body.contains(API_TOKEN), "{body}");
        }
    }

    // A document aiming the repo at another host gets nothing sent there, in memory as over
    // the network: the token's secret names the instance it is for.
    let elsewhere = repo_at("https://elsewhere.example");
    let refused = client.list_jobs(&elsewhere).await.unwrap_err();
    assert_eq!(
        refused.class,
        ErrorClass::Configuration,
        "{}",
        refused.message
    );
    assert!(!refused.message.contains(API_TOKEN), "{}", refused.message);
    assert_eq!(seen.lock().unwrap().len(), 4, "a request to another origin");
}

/// A search answer of `size` bytes: one whose length is known up front, or a stream of
/// chunks that says nothing until it ends.
fn body_of(size: usize, declared: bool) -> reqwest::Body {
    if declared {
        return reqwest::Body::from(vec![b' '; size]);
    }
    let chunk = Bytes::from(vec![b' '; 64 * 1024]);
    let chunks = (0..size.div_ceil(chunk.len())).map(move |i| {
        let end = (size - i * chunk.len()).min(chunk.len());
        Ok::<_, Infallible>(Frame::data(chunk.slice(..end)))
    });
    reqwest::Body::wrap(StreamBody::new(futures::stream::iter(chunks)))
}

fn searching_answers(size: usize, declared: bool) -> Route {
    Arc::new(move |_, path| match path {
        "/api/v1/version" => json_answer(StatusCode::OK, json!({ "version": "11.0.0" })),
        _ => answer(StatusCode::OK, body_of(size, declared)),
    })
}

#[tokio::test(start_paused = true)]
async fn a_body_over_the_cap_is_refused_not_read() {
    for declared in [true, false] {
        let (client, _) = client_over(searching_answers(RESPONSE_BODY_MAX_BYTES + 1, declared));
        let refused = client.list_jobs(&repo_at(INSTANCE)).await.unwrap_err();
        assert_eq!(refused.class, ErrorClass::Malformed, "{}", refused.message);
        assert!(
            refused.message.contains(&format!(
                "Forgejo answered a body over {RESPONSE_BODY_MAX_BYTES} bytes"
            )) && refused.message.contains(REPO),
            "declared {declared}: {}",
            refused.message
        );
    }
    // At the cap exactly the body is read, and is not JSON: malformed for another reason.
    for declared in [true, false] {
        let (client, _) = client_over(searching_answers(RESPONSE_BODY_MAX_BYTES, declared));
        let refused = client.list_jobs(&repo_at(INSTANCE)).await.unwrap_err();
        assert_eq!(refused.class, ErrorClass::Malformed, "{}", refused.message);
        assert!(
            !refused.message.contains("body over"),
            "declared {declared}: {}",
            refused.message
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_redirect_is_refused_not_followed() {
    let route: Route = Arc::new(|method, path| match (method.as_str(), path) {
        ("GET", "/api/v1/version") => json_answer(StatusCode::OK, json!({ "version": "15.0.0" })),
        ("GET", _) => redirect(StatusCode::FOUND),
        ("POST", _) => redirect(StatusCode::TEMPORARY_REDIRECT),
        _ => redirect(StatusCode::PERMANENT_REDIRECT),
    });
    let (client, seen) = client_over(route);
    let repo = repo_at(INSTANCE);
    let (name, labels) = runner();
    let identity = RunnerIdentity {
        name: &name,
        labels: &labels,
    };

    let refusals = [
        client.list_jobs(&repo).await.map(|_| ()).unwrap_err(),
        client.mint(&repo, identity).await.map(|_| ()).unwrap_err(),
        client
            .delete_registered(&repo, 42)
            .await
            .map(|_| ())
            .unwrap_err(),
    ];

    for refused in &refusals {
        assert_eq!(
            refused.class,
            ErrorClass::Configuration,
            "{}",
            refused.message
        );
        assert!(
            refused
                .message
                .contains("Forgejo answered a redirect to another location")
                && !refused.message.contains("elsewhere"),
            "{}",
            refused.message
        );
    }
    let seen = seen.lock().unwrap();
    let asked: Vec<_> = seen
        .iter()
        .map(|r| (r.method.as_str(), r.uri.host(), r.uri.path()))
        .collect();
    let host = Some("forgejo.example");
    let delete_path = format!("{RUNNERS_PATH}/42");
    assert_eq!(
        asked,
        [
            ("GET", host, "/api/v1/version"),
            ("GET", host, JOBS_PATH),
            ("POST", host, RUNNERS_PATH),
            ("DELETE", host, delete_path.as_str()),
        ],
        "a redirect was followed"
    );
}

#[tokio::test(start_paused = true)]
async fn a_forgejo_that_never_answers_times_out_on_tokio_s_clock() {
    let route: Route = Arc::new(|_, path| match path {
        "/api/v1/version" => json_answer(StatusCode::OK, json!({ "version": "11.0.0" })),
        _ => Reply::Hang,
    });
    let (client, _) = client_over(route);
    let started = tokio::time::Instant::now();

    let refused = client.list_jobs(&repo_at(INSTANCE)).await.unwrap_err();

    // Virtual time: the paused clock jumps to the client's deadline, and no further.
    let waited = started.elapsed();
    assert!(
        waited >= TIMEOUT && waited < TIMEOUT + Duration::from_secs(1),
        "{waited:?}"
    );
    assert_eq!(refused.class, ErrorClass::Transient, "{}", refused.message);
    assert_eq!(
        refused.message,
        format!("list runner jobs for {REPO} at {INSTANCE}: timed out: operation timed out")
    );
}

#[tokio::test(start_paused = true)]
async fn a_service_failure_is_transient_and_says_what_failed() {
    let route: Route = Arc::new(|_, _| {
        Reply::Fail(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ))
    });
    let (client, _) = client_over(route);

    let refused = client.list_jobs(&repo_at(INSTANCE)).await.unwrap_err();

    assert_eq!(refused.class, ErrorClass::Transient, "{}", refused.message);
    assert_eq!(
        refused.message,
        format!(
            "read the Forgejo version for {REPO} at {INSTANCE}: cannot connect: connection refused"
        )
    );
}
