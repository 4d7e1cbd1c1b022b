//! What the Nomad client needs to take runners back, against the Nomad twin over loopback:
//! a child's allocations (`has_live_allocation`), stopping without purging (`stop`), and the
//! filtered listing that finds every parent with children of ours
//! (`parents_with_our_children`). Also the twin's own answers for these endpoints: the
//! allocation stub against the docs' fixtures, `[]` for unknown jobs, and 400 for a filter it
//! cannot evaluate.

use std::collections::BTreeSet;
use std::time::Duration;

use runner_scaler::act::{ChildControl, DispatchMeta, DispatchRequest};
use runner_scaler::clients::nomad::{NomadClient, NomadSettings};
use runner_scaler::model::{ChildId, ErrorClass, RunnerName};
use runner_scaler::observe::{ChildSource, ChildStatus, Placement};
use runner_scaler::secrets::SecretString;
use runner_scaler::sim::twins::TwinServer;
use runner_scaler::sim::twins::nomad::{DEFAULT_NAMESPACE, NomadTwin, PayloadRule};
use serde_json::Value;

mod support;

use support::fixtures::{hand_dispatch, json_type};

fn fixture(name: &str) -> Value {
    support::fixtures::fixture("nomad", name)
}

const REQUIRED: &[&str] = &["repo_url", "runner_token", "runner_name"];
const OPTIONAL: &[&str] = &["labels", "managed_by"];
const TOKEN: &str = "twin-nomad-token-reap";

struct Cluster {
    twin: NomadTwin,
    server: TwinServer,
}

impl Cluster {
    /// A twin with ACLs on and the `ci-runner` parent of `nomad/ci-runner.nomad.hcl`.
    async fn start() -> Cluster {
        let twin = NomadTwin::new();
        twin.set_acl_token(Some(TOKEN));
        twin.register_parent("ci-runner", REQUIRED, OPTIONAL, PayloadRule::Optional);
        let server = twin.serve().await.expect("twin serves");
        Cluster { twin, server }
    }

    fn client_with_token(&self, token: &str) -> NomadClient {
        let mut settings = NomadSettings::new(self.server.base_url().parse().unwrap());
        settings.token = Some(SecretString::from(token.to_string()));
        NomadClient::new(settings, Duration::from_secs(5)).expect("client builds")
    }

    fn client(&self) -> NomadClient {
        self.client_with_token(TOKEN)
    }

    async fn dispatch(&self, parent: &str, idempotency_token: &str) -> ChildId {
        self.client()
            .dispatch(&DispatchRequest {
                parent: parent.to_string(),
                namespace: None,
                meta: DispatchMeta {
                    repo_url: "https://github.com/acme/api".to_string(),
                    labels: "self-hosted".to_string(),
                    runner_name: RunnerName(format!("ci-runner-{idempotency_token:0>12}")),
                    runner_token: Some(SecretString::from("reg-token")),
                },
                idempotency_token: idempotency_token.to_string(),
            })
            .await
            .expect("dispatch accepted")
            .child
    }

    /// A raw `GET` with the ACL token: status, content type and body text.
    async fn get(&self, path_and_query: &str) -> (u16, String, String) {
        let response = reqwest::Client::new()
            .get(format!("{}{path_and_query}", self.server.base_url()))
            .header("X-Nomad-Token", TOKEN)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        (status, content_type, response.text().await.unwrap())
    }

    async fn allocations(&self, child: &ChildId) -> Vec<Value> {
        let (status, _, body) = self
            .get(&format!(
                "/v1/job/{}/allocations",
                child.0.replace('/', "%2F")
            ))
            .await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }
}

#[tokio::test]
async fn an_allocation_is_live_while_pending_running_or_disconnected_and_not_once_ended() {
    let cluster = Cluster::start().await;
    let client = cluster.client();
    let completes = cluster.dispatch("ci-runner", "a").await;
    let fails = cluster.dispatch("ci-runner", "b").await;

    // Dispatched, nothing placed yet: no allocation, no runner.
    assert!(!client.has_live_allocation(&completes).await.unwrap());
    assert!(cluster.allocations(&completes).await.is_empty());

    cluster.twin.place_starting(&completes.0).unwrap();
    assert!(client.has_live_allocation(&completes).await.unwrap());
    cluster.twin.place(&completes.0).unwrap();
    assert!(client.has_live_allocation(&completes).await.unwrap());
    cluster.twin.disconnect(&completes.0).unwrap();
    assert!(
        client.has_live_allocation(&completes).await.unwrap(),
        "a disconnected client may still run the runner"
    );
    cluster.twin.finish(&completes.0, true).unwrap();
    assert!(!client.has_live_allocation(&completes).await.unwrap());

    // A runner that failed at boot: its allocation ended `failed`.
    cluster.twin.place(&fails.0).unwrap();
    assert!(client.has_live_allocation(&fails).await.unwrap());
    cluster.twin.finish(&fails.0, false).unwrap();
    assert!(!client.has_live_allocation(&fails).await.unwrap());
    let children = client.list_children("ci-runner").await.unwrap();
    let failed = children.iter().find(|c| c.id == fails).unwrap();
    assert_eq!(
        (failed.status, failed.placement),
        (ChildStatus::Dead, Placement::Failed)
    );

    // Nomad answers `[]`, not 404, for a job it does not know.
    let unknown = ChildId::new("ci-runner/dispatch-1-00000000", "default");
    assert!(!client.has_live_allocation(&unknown).await.unwrap());

    let asked: Vec<String> = cluster
        .twin
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/allocations"))
        .map(|r| r.path)
        .collect();
    assert!(
        asked.contains(&format!(
            "/v1/job/{}/allocations",
            completes.0.replace('/', "%2F")
        )),
        "the child id travels escaped: {asked:?}"
    );
}

#[tokio::test]
async fn allocation_stubs_follow_the_child_and_have_the_fixture_fields() {
    let cluster = Cluster::start().await;
    let child = cluster.dispatch("ci-runner", "a").await;
    cluster.twin.place_starting(&child.0).unwrap();
    let starting = cluster.allocations(&child).await;
    cluster.twin.place(&child.0).unwrap();
    let running = cluster.allocations(&child).await;
    cluster.twin.finish(&child.0, false).unwrap();
    let failed = cluster.allocations(&child).await;

    for (stubs, client_status) in [
        (&starting, "pending"),
        (&running, "running"),
        (&failed, "failed"),
    ] {
        assert_eq!(stubs.len(), 1, "one allocation per placed child");
        let stub = &stubs[0];
        assert_eq!(stub["ClientStatus"], client_status);
        assert_eq!(stub["DesiredStatus"], "run");
        assert_eq!(stub["JobID"], child.0.as_str());
        assert_eq!(stub["Namespace"], DEFAULT_NAMESPACE);
        assert_eq!(stub["JobType"], "batch");
        for fixture_name in [
            "list-job-allocations.response.json",
            "list-allocations.response.json",
        ] {
            let fixture = fixture(fixture_name);
            assert_same_shape(&fixture[0], stub, fixture_name);
        }
    }
    // The same allocation throughout: placed once, moved through its life.
    assert_eq!(starting[0]["ID"], failed[0]["ID"]);
    assert!(failed[0]["ModifyIndex"].as_u64() > starting[0]["ModifyIndex"].as_u64());
}

#[tokio::test]
async fn stop_deregisters_the_child_without_purging_it_and_purge_removes_it() {
    let cluster = Cluster::start().await;
    let client = cluster.client();
    let child = cluster.dispatch("ci-runner", "a").await;
    cluster.twin.place(&child.0).unwrap();
    cluster.twin.take_requests();

    client.stop(&child).await.unwrap();

    let requests = cluster.twin.take_requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].method, "DELETE");
    assert_eq!(
        requests[0].path,
        format!("/v1/job/{}", child.0.replace('/', "%2F"))
    );
    assert_eq!(requests[0].query_param("purge"), None, "a stop is no purge");
    assert!(cluster.twin.was_stopped(&child.0));
    assert!(!cluster.twin.was_purged(&child.0));

    let job = cluster.twin.job(&child.0).expect("still registered");
    assert!(job.stop);
    assert_eq!(job.status, ChildStatus::Dead);
    assert_eq!(
        client.child_status(&child).await.unwrap(),
        Some(ChildStatus::Dead)
    );
    let listed = client.list_children("ci-runner").await.unwrap();
    assert_eq!(listed.len(), 1, "still listed until purged");
    assert_eq!(
        (listed[0].status, listed[0].placement),
        (ChildStatus::Dead, Placement::Finished)
    );
    assert!(!client.has_live_allocation(&child).await.unwrap());
    let stubs = cluster.allocations(&child).await;
    assert_eq!(stubs.len(), 1);
    assert_eq!(stubs[0]["DesiredStatus"], "stop");
    assert_eq!(stubs[0]["ClientStatus"], "complete");

    client.purge(&child).await.unwrap();

    assert!(cluster.twin.was_purged(&child.0));
    assert_eq!(cluster.twin.job(&child.0), None);
    assert_eq!(client.list_children("ci-runner").await.unwrap(), []);
    assert!(!client.has_live_allocation(&child).await.unwrap());
    let kinds: Vec<bool> = cluster
        .twin
        .deregistrations()
        .iter()
        .map(|d| d.purge)
        .collect();
    assert_eq!(kinds, [false, true], "a stop, then a purge");
}

#[tokio::test]
async fn stopping_an_unplaced_or_unknown_child_is_harmless() {
    let cluster = Cluster::start().await;
    let client = cluster.client();
    let unplaced = cluster.dispatch("ci-runner", "a").await;

    client.stop(&unplaced).await.unwrap();
    let listed = client.list_children("ci-runner").await.unwrap();
    assert_eq!(
        (listed[0].status, listed[0].placement),
        (ChildStatus::Dead, Placement::Unplaced),
        "its queued placement is dropped with the job"
    );
    assert!(cluster.allocations(&unplaced).await.is_empty());

    // Nomad answers 200 with zero-valued fields for a job it does not know.
    let unknown = ChildId::new("ci-runner/dispatch-1-00000000", "default");
    client.stop(&unknown).await.unwrap();
    assert!(!cluster.twin.was_stopped(&unknown.0));
    assert!(cluster.twin.deregistrations().iter().any(|d| !d.existed));
}

#[tokio::test]
async fn allocations_honour_the_acl_token_and_the_namespace() {
    let cluster = Cluster::start().await;
    let child = cluster.dispatch("ci-runner", "a").await;
    cluster.twin.place(&child.0).unwrap();

    let error = cluster
        .client_with_token("wrong-token")
        .has_live_allocation(&child)
        .await
        .unwrap_err();
    assert_eq!(error.class, ErrorClass::Forbidden, "{error:?}");
    let error = cluster
        .client_with_token("wrong-token")
        .stop(&child)
        .await
        .unwrap_err();
    assert_eq!(error.class, ErrorClass::Forbidden, "{error:?}");
    assert!(!cluster.twin.was_stopped(&child.0));

    // The child lives in `default`: asked in another namespace, it has no allocations.
    let (status, _, body) = cluster
        .get(&format!(
            "/v1/job/{}/allocations?namespace=elsewhere",
            child.0.replace('/', "%2F")
        ))
        .await;
    assert_eq!((status, body.as_str()), (200, "[]"));
}

#[tokio::test]
async fn parents_are_found_from_our_children_alone_and_foreign_children_do_not_count() {
    let cluster = Cluster::start().await;
    for parent in ["retired-runner", "hand-only-runner", "idle-runner"] {
        cluster
            .twin
            .register_parent(parent, REQUIRED, OPTIONAL, PayloadRule::Optional);
    }
    cluster.dispatch("ci-runner", "a").await;
    cluster.dispatch("ci-runner", "b").await;
    // A parent no document names any more, with one child of ours that already ended.
    let leftover = cluster.dispatch("retired-runner", "c").await;
    cluster.twin.finish(&leftover.0, true).unwrap();
    hand_dispatch(&cluster.twin, "hand-only-runner");
    hand_dispatch(&cluster.twin, "ci-runner");
    cluster.twin.take_requests();

    let parents = cluster.client().parents_with_our_children().await.unwrap();

    assert_eq!(
        parents,
        BTreeSet::from(["ci-runner".to_string(), "retired-runner".to_string()])
    );
    let requests = cluster.twin.take_requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].path, "/v1/jobs");
    assert_eq!(
        requests[0].query_param("filter").as_deref(),
        Some(r#"ParentID != "" and Meta["managed_by"] == "runner-scaler""#)
    );
}

#[tokio::test]
async fn the_twin_filters_on_the_full_job_before_paging() {
    let cluster = Cluster::start().await;
    let mut ours = Vec::new();
    for token in ["a", "b", "c"] {
        ours.push(cluster.dispatch("ci-runner", token).await.0);
        hand_dispatch(&cluster.twin, "ci-runner");
    }
    ours.sort();
    let filter = url::form_urlencoded::byte_serialize(
        br#"ParentID != "" and Meta["managed_by"] == "runner-scaler""#,
    )
    .collect::<String>();

    // No `meta=true`: the filter reads the job's meta, the stubs still omit it.
    let mut seen = Vec::new();
    let mut next_token = String::new();
    for _ in 0..10 {
        let response = reqwest::Client::new()
            .get(format!(
                "{}/v1/jobs?filter={filter}&per_page=2&next_token={next_token}",
                cluster.server.base_url()
            ))
            .header("X-Nomad-Token", TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let next = response
            .headers()
            .get("X-Nomad-NextToken")
            .map(|v| v.to_str().unwrap().to_string());
        let stubs: Vec<Value> = response.json().await.unwrap();
        assert!(stubs.len() <= 2);
        for stub in &stubs {
            assert!(stub.get("Meta").is_none(), "{stub}");
            seen.push(stub["ID"].as_str().unwrap().to_string());
        }
        match next {
            Some(token) => next_token = token,
            None => break,
        }
    }
    assert_eq!(seen, ours, "our three children, two pages, no foreign one");
}

#[tokio::test]
async fn the_twin_answers_400_in_plain_text_to_a_filter_it_cannot_evaluate() {
    let cluster = Cluster::start().await;
    cluster.dispatch("ci-runner", "a").await;
    let encode = |expression: &str| {
        url::form_urlencoded::byte_serialize(expression.as_bytes()).collect::<String>()
    };

    for (expression, prefix) in [
        (
            "ParentID is empty",
            "failed to create result paginator: failed to read filter expression: ",
        ),
        (
            r#"ParentID == "" or Meta["managed_by"] == "x""#,
            "failed to create result paginator: failed to read filter expression: ",
        ),
        (
            r#"ParentID != "" and Colour == "blue""#,
            "failed to read result page: error finding value in datum",
        ),
    ] {
        let (status, content_type, body) = cluster
            .get(&format!("/v1/jobs?filter={}", encode(expression)))
            .await;
        assert_eq!(status, 400, "{expression}: {body}");
        assert!(content_type.starts_with("text/plain"), "{content_type}");
        assert!(body.starts_with(prefix), "{expression}: {body}");
    }
}

/// Every field of `expected` is in `actual`, with the same JSON type where both are non-null
/// (the docs show a deployment and a reschedule tracker a batch runner never has, and
/// `FinishedAt` null in one example and a zero time in the other). `TaskStates` is keyed by
/// task name, so its entries are compared with the fixture's one task.
fn assert_same_shape(expected: &Value, actual: &Value, path: &str) {
    match (expected, actual) {
        (Value::Null, _) | (_, Value::Null) => {}
        (Value::Object(expected), Value::Object(actual)) if path.ends_with("TaskStates") => {
            let sample = expected.values().next().expect("a task in the fixture");
            assert!(!actual.is_empty(), "{path}: no task");
            for (task, state) in actual {
                assert_same_shape(sample, state, &format!("{path}.{task}"));
            }
        }
        (Value::Object(expected), Value::Object(actual)) => {
            for (key, value) in expected {
                let twin = actual
                    .get(key)
                    .unwrap_or_else(|| panic!("{path}.{key}: missing from the twin"));
                assert_same_shape(value, twin, &format!("{path}.{key}"));
            }
        }
        (Value::Array(expected), Value::Array(actual)) => {
            if let (Some(e), Some(a)) = (expected.first(), actual.first()) {
                assert_same_shape(e, a, &format!("{path}[0]"));
            }
        }
        _ => assert_eq!(
            json_type(expected),
            json_type(actual),
            "{path}: fixture has {expected}, twin has {actual}"
        ),
    }
}
