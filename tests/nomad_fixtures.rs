//! Fixture fidelity: the client reads the bodies Nomad's docs publish, and the twin answers
//! with the same field names and JSON types.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::routing::{any, get};
use runner_scaler::act::{ChildControl, DispatchMeta, DispatchRequest};
use runner_scaler::clients::nomad::{NomadClient, NomadSettings};
use runner_scaler::model::{ChildId, RunnerName};
use runner_scaler::observe::{ChildSource, ChildStatus};
use runner_scaler::sim::twins::TwinServer;
use runner_scaler::sim::twins::nomad::{DispatchInput, NomadTwin, PayloadRule};
use serde_json::Value;

mod support;

use support::fixtures::json_type;

fn fixture(name: &str) -> Value {
    support::fixtures::fixture("nomad", name)
}

fn client(server: &TwinServer) -> NomadClient {
    NomadClient::new(
        NomadSettings::new(server.base_url().parse().unwrap()),
        Duration::from_secs(5),
    )
    .unwrap()
}

/// Every field of `expected` is in `actual` with the same JSON type, recursively. Objects
/// named in `maps` are keyed by names (task groups), so their values are compared instead.
fn assert_same_shape(expected: &Value, actual: &Value, path: &str, maps: &[&str]) {
    assert_eq!(
        json_type(expected),
        json_type(actual),
        "{path}: fixture has {expected}, twin has {actual}"
    );
    match (expected, actual) {
        (Value::Object(expected), Value::Object(actual)) => {
            let is_map = maps.iter().any(|m| path.ends_with(m));
            if is_map {
                let sample = expected.values().next().expect("fixture map has an entry");
                assert!(!actual.is_empty(), "{path}: twin map is empty");
                for (key, value) in actual {
                    assert_same_shape(sample, value, &format!("{path}.{key}"), maps);
                }
            } else {
                for (key, value) in expected {
                    let twin = actual
                        .get(key)
                        .unwrap_or_else(|| panic!("{path}.{key}: missing from the twin"));
                    assert_same_shape(value, twin, &format!("{path}.{key}"), maps);
                }
            }
        }
        (Value::Array(expected), Value::Array(actual)) => {
            if let (Some(e), Some(a)) = (expected.first(), actual.first()) {
                assert_same_shape(e, a, &format!("{path}[0]"), maps);
            }
        }
        _ => {}
    }
}

async fn twin_with_child() -> (NomadTwin, TwinServer, ChildId) {
    let twin = NomadTwin::new();
    twin.register_parent(
        "ci-runner",
        &["repo_url", "runner_token", "runner_name"],
        &["labels", "managed_by"],
        PayloadRule::Optional,
    );
    let server = twin.serve().await.unwrap();
    let reply = twin
        .dispatch(
            "default",
            "ci-runner",
            DispatchInput {
                meta: [
                    ("repo_url", "https://github.com/acme/api"),
                    ("runner_token", "x"),
                    ("runner_name", "n"),
                    ("managed_by", "runner-scaler"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
                ..DispatchInput::default()
            },
        )
        .unwrap();
    (
        twin,
        server,
        ChildId::new(reply.dispatched_job_id, "default"),
    )
}

#[tokio::test]
async fn twin_job_stubs_have_the_fixture_shape() {
    let (_twin, server, _child) = twin_with_child().await;
    let expected = &fixture("list-jobs-full-stub.response.json")[0];

    let response = reqwest::get(format!("{}/v1/jobs?meta=true", server.base_url()))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    for header in [
        "x-nomad-index",
        "x-nomad-knownleader",
        "x-nomad-lastcontact",
    ] {
        assert!(response.headers().contains_key(header), "{header}");
    }
    let stubs: Value = response.json().await.unwrap();

    let stubs = stubs.as_array().unwrap();
    assert_eq!(stubs.len(), 2, "parent and child");
    for stub in stubs {
        assert_same_shape(expected, stub, "stub", &["JobSummary.Summary"]);
    }
    let child = stubs.iter().find(|s| s["ParentID"] == "ci-runner").unwrap();
    assert_eq!(child["Meta"]["managed_by"], "runner-scaler");
    assert_eq!(child["ParameterizedJob"], false);
    let parent = stubs.iter().find(|s| s["ID"] == "ci-runner").unwrap();
    assert_eq!(parent["ParameterizedJob"], true);
    assert_eq!(parent["JobSummary"]["Children"]["Pending"], 1);
    // The parent has no meta: no `Meta` key at all (omitempty), even with meta=true.
    assert!(parent.get("Meta").is_none());
}

#[tokio::test]
async fn twin_omits_meta_unless_asked_and_lists_nothing_as_an_empty_array() {
    let (_twin, server, _child) = twin_with_child().await;
    let stubs: Value = reqwest::get(format!("{}/v1/jobs", server.base_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        stubs
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s.get("Meta").is_none())
    );

    let empty = reqwest::get(format!("{}/v1/jobs?prefix=nothing", server.base_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(empty, "[]");
}

#[tokio::test]
async fn twin_dispatch_response_has_the_fixture_shape() {
    let (_twin, server, _child) = twin_with_child().await;
    let expected = fixture("dispatch-job.response.json");
    let body = serde_json::json!({
        "Meta": {"repo_url": "u", "runner_token": "x", "runner_name": "n"}
    });

    let response = reqwest::Client::new()
        .post(format!("{}/v1/job/ci-runner/dispatch", server.base_url()))
        .json(&body)
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), 200);
    let index: u64 = response.headers()["x-nomad-index"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let reply: Value = response.json().await.unwrap();
    assert_same_shape(&expected, &reply, "dispatch", &[]);
    let keys = |v: &Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&reply), keys(&expected));
    assert_eq!(reply["Index"], index);
    // As in the fixture (Index 13, JobCreateIndex 12): the eval comes after the job.
    assert!(reply["Index"].as_u64() > reply["JobCreateIndex"].as_u64());
}

#[tokio::test]
async fn twin_dispatch_validation_errors_are_plain_text_500s() {
    let (_twin, server, _child) = twin_with_child().await;
    let response = reqwest::Client::new()
        .post(format!("{}/v1/job/ci-runner/dispatch", server.base_url()))
        .json(&serde_json::json!({"Meta": {"foo": "1", "bar": "2"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 500);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    assert_eq!(
        response.text().await.unwrap(),
        "Dispatch request included unpermitted metadata keys: [bar foo]"
    );
}

#[tokio::test]
async fn twin_delete_responses_have_the_fixture_shape() {
    let (twin, server, child) = twin_with_child().await;
    let expected = fixture("stop-job-purge.response.json");
    let http = reqwest::Client::new();
    let delete = |id: String| {
        let http = http.clone();
        let url = format!(
            "{}/v1/job/{}?purge=true",
            server.base_url(),
            id.replace('/', "%2F")
        );
        async move {
            let response = http.delete(url).send().await.unwrap();
            assert_eq!(response.status(), 200);
            response.json::<Value>().await.unwrap()
        }
    };

    let purged = delete(child.0.clone()).await;
    assert_same_shape(&expected, &purged, "delete", &[]);
    assert_ne!(purged["EvalID"], "");
    assert!(twin.job(&child.0).is_none());

    // An unknown job: 200 with zero-valued fields.
    let unknown = delete("ci-runner/dispatch-1-00000000".into()).await;
    assert_same_shape(&expected, &unknown, "delete unknown", &[]);
    assert_eq!(unknown["EvalID"], "");
    assert_eq!(unknown["EvalCreateIndex"], 0);
    assert_eq!(unknown["JobModifyIndex"], 0);
}

#[tokio::test]
async fn twin_job_read_has_the_fixture_fields() {
    let (_twin, server, child) = twin_with_child().await;
    let expected = fixture("read-job.response.json");
    let job: Value = reqwest::get(format!(
        "{}/v1/job/{}",
        server.base_url(),
        child.0.replace('/', "%2F")
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    // The docs' sample is a periodic service-like job with constraints; compare the top-level
    // field set, and types where the sample has a scalar.
    for (key, value) in expected.as_object().unwrap() {
        let twin = job
            .get(key)
            .unwrap_or_else(|| panic!("{key}: missing from the twin"));
        if !matches!(value, Value::Array(_) | Value::Object(_) | Value::Null) {
            assert_eq!(json_type(value), json_type(twin), "{key}");
        }
    }
    assert_same_shape(
        &expected["ParameterizedJob"],
        &job["ParameterizedJob"],
        "ParameterizedJob",
        &[],
    );
    assert_eq!(job["Dispatched"], true);
}

/// A stand-in Nomad that serves fixture bodies and remembers the requests' paths and queries.
async fn fixture_server(routes: Router) -> (TwinServer, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let router = routes.layer(axum::middleware::from_fn(
        move |request: Request, next: axum::middleware::Next| {
            let log = log.clone();
            async move {
                log.lock().unwrap().push(
                    request
                        .uri()
                        .path_and_query()
                        .map(|p| p.to_string())
                        .unwrap_or_default(),
                );
                next.run(request).await
            }
        },
    ));
    (TwinServer::start(router).await.unwrap(), seen)
}

#[tokio::test]
async fn client_reads_the_dispatch_read_and_purge_fixtures() {
    let routes = Router::new().route(
        "/v1/job/{*rest}",
        any(|method: axum::http::Method| async move {
            let name = match method {
                axum::http::Method::POST => "dispatch-job.response.json",
                axum::http::Method::GET => "read-job.response.json",
                _ => "stop-job-purge.response.json",
            };
            axum::Json(fixture(name))
        }),
    );
    let (server, _seen) = fixture_server(routes).await;
    let client = client(&server);

    let dispatched = client
        .dispatch(&DispatchRequest {
            parent: "example".into(),
            namespace: None,
            meta: DispatchMeta {
                repo_url: "https://github.com/acme/api".into(),
                labels: "self-hosted".into(),
                runner_name: RunnerName("example-000000000000".into()),
                runner_token: None,
            },
            idempotency_token: "t".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        dispatched.child,
        ChildId::new("example/dispatch-1485408778-81644024", "default")
    );
    assert!(!dispatched.deduplicated, "the fixture carries an EvalID");

    let status = client.child_status(&dispatched.child).await.unwrap();
    assert_eq!(status, Some(ChildStatus::Running));

    client.purge(&dispatched.child).await.unwrap();
}

#[tokio::test]
async fn client_recognises_a_replay_by_its_missing_evaluation() {
    // What Nomad's Dispatch returns for a known idempotency token: the existing child's
    // indexes, no EvalID, no EvalCreateIndex (nomad/job_endpoint.go).
    let routes = Router::new().route(
        "/v1/job/{*rest}",
        any(|| async {
            axum::Json(serde_json::json!({
                "Index": 20, "JobCreateIndex": 12, "EvalCreateIndex": 0, "EvalID": "",
                "DispatchedJobID": "example/dispatch-1485408778-81644024"
            }))
        }),
    );
    let (server, _seen) = fixture_server(routes).await;
    let dispatched = client(&server)
        .dispatch(&DispatchRequest {
            parent: "example".into(),
            namespace: None,
            meta: DispatchMeta {
                repo_url: "https://github.com/acme/api".into(),
                labels: "self-hosted".into(),
                runner_name: RunnerName("example-000000000000".into()),
                runner_token: None,
            },
            idempotency_token: "t".into(),
        })
        .await
        .unwrap();
    assert!(dispatched.deduplicated);
}

#[tokio::test]
async fn client_follows_list_pagination() {
    fn page(id: &str) -> Value {
        let mut stub = fixture("list-jobs-full-stub.response.json")[1].clone();
        stub["ID"] = id.into();
        stub["ParentID"] = "example".into();
        // Asked with `meta=true`, Nomad 1.4.3 and later include a child's meta (the docs'
        // example was listed without it).
        stub["Meta"] = serde_json::json!({ "labels": "self-hosted" });
        serde_json::json!([stub])
    }
    let routes = Router::new().route(
        "/v1/jobs",
        get(|request: Request| async move {
            let query = request.uri().query().unwrap_or("").to_string();
            let mut headers = HeaderMap::new();
            if query.contains("next_token=") {
                (headers, axum::Json(page("example/dispatch-2-bbbbbbbb")))
            } else {
                headers.insert(
                    "X-Nomad-NextToken",
                    "example/dispatch-2-bbbbbbbb".parse().unwrap(),
                );
                (headers, axum::Json(page("example/dispatch-1-aaaaaaaa")))
            }
        }),
    );
    let (server, seen) = fixture_server(routes).await;

    let children = client(&server).list_children("example").await.unwrap();

    let ids: Vec<&str> = children.iter().map(|c| c.id.0.as_str()).collect();
    assert_eq!(
        ids,
        ["example/dispatch-1-aaaaaaaa", "example/dispatch-2-bbbbbbbb"]
    );
    assert!(children.iter().all(|c| c.status == ChildStatus::Running));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(
        seen[1].contains("next_token=example%2Fdispatch-2-bbbbbbbb"),
        "{seen:?}"
    );
}

#[tokio::test]
async fn twin_pages_listings_with_per_page_and_next_token() {
    let (_twin, server, _child) = twin_with_child().await;
    let http = reqwest::Client::new();
    let first = http
        .get(format!("{}/v1/jobs?per_page=1", server.base_url()))
        .send()
        .await
        .unwrap();
    let token = first.headers()["x-nomad-nexttoken"]
        .to_str()
        .unwrap()
        .to_string();
    let first: Value = first.json().await.unwrap();
    assert_eq!(first.as_array().unwrap().len(), 1);
    let second = http
        .get(format!("{}/v1/jobs?per_page=1", server.base_url()))
        .query(&[("next_token", token.as_str())])
        .send()
        .await
        .unwrap();
    assert!(!second.headers().contains_key("x-nomad-nexttoken"));
    let second: Value = second.json().await.unwrap();
    // Nomad's page token is `<namespace>.<id>` of the next page's first job.
    assert_eq!(
        format!(
            "{}.{}",
            second[0]["Namespace"].as_str().unwrap(),
            second[0]["ID"].as_str().unwrap()
        ),
        token
    );
    assert_ne!(first[0]["ID"], second[0]["ID"]);
}
