//! The Nomad client against the Nomad twin over loopback HTTP.

use std::time::Duration;

use runner_scaler::act::{ChildControl, DispatchMeta, DispatchRequest};
use runner_scaler::clients::nomad::{NomadClient, NomadSettings};
use runner_scaler::model::{ChildId, ErrorClass, RunnerName};
use runner_scaler::observe::{ChildSource, ChildStatus, Placement};
use runner_scaler::secrets::SecretString;
use runner_scaler::sim::twins::TwinServer;
use runner_scaler::sim::twins::nomad::{NomadTwin, ParentSpec, PayloadRule};

mod support;

use support::fixtures::hand_dispatch;

const CANARY: &str = "CANARY-9f1e-runner-token";
const REQUIRED: &[&str] = &["repo_url", "runner_token", "runner_name"];
const OPTIONAL: &[&str] = &["labels", "managed_by"];

struct Cluster {
    twin: NomadTwin,
    server: TwinServer,
}

impl Cluster {
    /// A twin with the `ci-runner` parent of `nomad/ci-runner.nomad.hcl`.
    async fn start() -> Cluster {
        let twin = NomadTwin::new();
        twin.register_parent("ci-runner", REQUIRED, OPTIONAL, PayloadRule::Optional);
        let server = twin.serve().await.expect("twin serves");
        Cluster { twin, server }
    }

    fn settings(&self) -> NomadSettings {
        NomadSettings::new(self.server.base_url().parse().unwrap())
    }

    fn client(&self) -> NomadClient {
        client_with(self.settings())
    }
}

fn client_with(settings: NomadSettings) -> NomadClient {
    NomadClient::new(settings, Duration::from_secs(5)).expect("client builds")
}

fn request(parent: &str, token: Option<&str>, idempotency_token: &str) -> DispatchRequest {
    DispatchRequest {
        parent: parent.to_string(),
        namespace: None,
        meta: DispatchMeta {
            repo_url: "https://github.com/acme/api".to_string(),
            labels: "linux,self-hosted".to_string(),
            runner_name: RunnerName("ci-runner-3f9c2a1b7d04".to_string()),
            runner_token: token.map(|t| SecretString::from(t.to_string())),
        },
        idempotency_token: idempotency_token.to_string(),
    }
}

#[tokio::test]
async fn listing_asks_once_per_parent() {
    let cluster = Cluster::start().await;
    cluster
        .twin
        .register_parent("go-ci-runner", REQUIRED, OPTIONAL, PayloadRule::Optional);
    let client = cluster.client();
    for i in 0..3 {
        client
            .dispatch(&request("ci-runner", Some(CANARY), &format!("t{i}")))
            .await
            .unwrap();
    }
    client
        .dispatch(&request("go-ci-runner", Some(CANARY), "g"))
        .await
        .unwrap();
    cluster.twin.take_requests();

    let ci = client.list_children("ci-runner").await.unwrap();
    let go = client.list_children("go-ci-runner").await.unwrap();

    assert_eq!(ci.len(), 3);
    assert_eq!(go.len(), 1);
    let requests = cluster.twin.take_requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    for (request, parent) in requests.iter().zip(["ci-runner", "go-ci-runner"]) {
        assert_eq!(request.method, "GET");
        assert_eq!(request.path, "/v1/jobs");
        assert_eq!(
            request.query_param("prefix").as_deref(),
            Some(format!("{parent}/dispatch-").as_str())
        );
        assert_eq!(request.query_param("meta").as_deref(), Some("true"));
    }
}

#[tokio::test]
async fn a_parent_without_children_lists_empty() {
    let cluster = Cluster::start().await;
    assert_eq!(
        cluster.client().list_children("ci-runner").await.unwrap(),
        []
    );
    assert_eq!(
        cluster.client().list_children("nonexistent").await.unwrap(),
        []
    );
}

#[tokio::test]
async fn hand_dispatched_children_are_foreign() {
    let cluster = Cluster::start().await;
    let id = hand_dispatch(&cluster.twin, "ci-runner");

    let children = cluster.client().list_children("ci-runner").await.unwrap();

    assert_eq!(children.len(), 1);
    assert_eq!(children[0].id, ChildId::new(id, "default"));
    assert!(!children[0].ours);
}

#[tokio::test]
async fn runner_token_stored_in_nomad_never_reaches_a_child() {
    let cluster = Cluster::start().await;
    let client = cluster.client();
    let dispatched = client
        .dispatch(&request("ci-runner", Some(CANARY), "t"))
        .await
        .unwrap();
    let stored = cluster.twin.job(&dispatched.child.0).unwrap();
    assert_eq!(
        stored.meta.get("runner_token").map(String::as_str),
        Some(CANARY),
        "the twin, like Nomad, keeps the dispatch meta"
    );

    let children = client.list_children("ci-runner").await.unwrap();

    assert_eq!(children.len(), 1);
    assert!(children[0].ours);
    assert!(!format!("{children:?}").contains(CANARY));
    // Nor does the URL of any request carry it: it travels in the body only.
    for request in cluster.twin.requests() {
        assert!(!request.path.contains(CANARY) && !request.query.contains(CANARY));
    }
}

#[tokio::test]
async fn a_fresh_dispatch_is_a_pending_unplaced_child_with_our_meta() {
    let cluster = Cluster::start().await;
    cluster.twin.set_clock(1_700_000_000);
    let client = cluster.client();

    let dispatched = client
        .dispatch(&request("ci-runner", Some(CANARY), "t"))
        .await
        .unwrap();

    assert!(!dispatched.deduplicated);
    assert!(
        dispatched
            .child
            .0
            .starts_with("ci-runner/dispatch-acme-api-1700000000-"),
        "{}",
        dispatched.child
    );
    let children = client.list_children("ci-runner").await.unwrap();
    let child = &children[0];
    assert_eq!(child.id, dispatched.child);
    assert_eq!(child.parent, "ci-runner");
    assert_eq!(child.status, ChildStatus::Pending);
    assert_eq!(child.placement, Placement::Unplaced);
    assert!(child.ours);
    assert_eq!(
        child.repo_url.as_deref(),
        Some("https://github.com/acme/api")
    );
    assert_eq!(child.labels.as_deref(), Some("linux,self-hosted"));
    assert_eq!(
        child.runner_name,
        Some(RunnerName("ci-runner-3f9c2a1b7d04".into()))
    );
    assert_eq!(child.submitted_at.unwrap().timestamp(), 1_700_000_000);
    let stored = cluster.twin.job(&dispatched.child.0).unwrap();
    assert_eq!(
        stored.meta.get("managed_by").map(String::as_str),
        Some("runner-scaler")
    );
}

#[tokio::test]
async fn replaying_an_idempotency_token_returns_the_same_child_as_deduplicated() {
    let cluster = Cluster::start().await;
    let client = cluster.client();
    let first = client
        .dispatch(&request("ci-runner", Some(CANARY), "same-token"))
        .await
        .unwrap();
    let replay = client
        .dispatch(&request("ci-runner", Some(CANARY), "same-token"))
        .await
        .unwrap();
    assert!(!first.deduplicated);
    assert!(replay.deduplicated);
    assert_eq!(replay.child, first.child);

    // Still the same child after it moved on (its modify index changed).
    cluster.twin.place(&first.child.0).unwrap();
    let later = client
        .dispatch(&request("ci-runner", Some(CANARY), "same-token"))
        .await
        .unwrap();
    assert!(later.deduplicated);
    assert_eq!(later.child, first.child);
    assert_eq!(cluster.twin.children("ci-runner").len(), 1);

    // Once purged, the token dispatches anew.
    client.purge(&first.child).await.unwrap();
    let fresh = client
        .dispatch(&request("ci-runner", Some(CANARY), "same-token"))
        .await
        .unwrap();
    assert!(!fresh.deduplicated);
}

#[tokio::test]
async fn unpermitted_meta_is_a_configuration_error_naming_the_parent() {
    let cluster = Cluster::start().await;
    // A parent that does not allow `managed_by`.
    cluster
        .twin
        .register_parent("ci-runner", REQUIRED, &["labels"], PayloadRule::Optional);

    let error = cluster
        .client()
        .dispatch(&request("ci-runner", Some(CANARY), "t"))
        .await
        .unwrap_err();

    assert_eq!(error.class, ErrorClass::Configuration);
    assert_eq!(
        error.message,
        "dispatch ci-runner in namespace default for acme/api: 500 Dispatch request included unpermitted metadata keys: [managed_by]"
    );
    assert!(!error.message.contains(CANARY));
}

#[tokio::test]
async fn missing_required_meta_is_a_configuration_error() {
    let cluster = Cluster::start().await;

    let error = cluster
        .client()
        .dispatch(&request("ci-runner", None, "t"))
        .await
        .unwrap_err();

    assert_eq!(error.class, ErrorClass::Configuration);
    assert!(
        error
            .message
            .ends_with("Dispatch did not provide required meta keys: [runner_token]"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn unknown_stopped_or_plain_parents_are_configuration_errors() {
    let cluster = Cluster::start().await;
    cluster.twin.register_plain_job("plain");
    cluster
        .twin
        .register_parent("stopped", REQUIRED, OPTIONAL, PayloadRule::Optional);
    cluster.twin.stop_parent("stopped").unwrap();
    let client = cluster.client();

    for (parent, text) in [
        ("nonexistent", "parameterized job not found"),
        (
            "plain",
            "Specified job \"plain\" is not a parameterized job",
        ),
        ("stopped", "Specified job \"stopped\" is stopped"),
    ] {
        let error = client
            .dispatch(&request(parent, Some(CANARY), "t"))
            .await
            .unwrap_err();
        assert_eq!(error.class, ErrorClass::Configuration, "{parent}");
        assert!(error.message.contains(parent), "{}", error.message);
        assert!(error.message.contains(text), "{}", error.message);
    }
}

#[tokio::test]
async fn a_required_payload_is_a_configuration_error() {
    let cluster = Cluster::start().await;
    cluster.twin.register_parent_spec(
        "needs-payload",
        ParentSpec {
            meta_required: REQUIRED.iter().map(|s| s.to_string()).collect(),
            meta_optional: OPTIONAL.iter().map(|s| s.to_string()).collect(),
            payload: PayloadRule::Required,
            ..ParentSpec::default()
        },
    );
    let error = cluster
        .client()
        .dispatch(&request("needs-payload", Some(CANARY), "t"))
        .await
        .unwrap_err();
    assert_eq!(error.class, ErrorClass::Configuration);
}

#[tokio::test]
async fn acl_tokens_travel_in_the_header_and_a_wrong_one_is_forbidden() {
    let cluster = Cluster::start().await;
    cluster.twin.set_acl_token(Some("right-secret"));

    let anonymous = cluster
        .client()
        .list_children("ci-runner")
        .await
        .unwrap_err();
    assert_eq!(anonymous.class, ErrorClass::Forbidden);
    assert!(anonymous.message.contains("403 Permission denied"));

    let mut wrong = cluster.settings();
    wrong.token = Some(SecretString::from("wrong-secret".to_string()));
    let error = client_with(wrong)
        .dispatch(&request("ci-runner", Some(CANARY), "t"))
        .await
        .unwrap_err();
    assert_eq!(error.class, ErrorClass::Forbidden);
    assert!(error.message.contains("ACL token not found"));
    assert!(!error.message.contains("wrong-secret"));

    let mut right = cluster.settings();
    right.token = Some(SecretString::from("right-secret".to_string()));
    let client = client_with(right);
    client
        .dispatch(&request("ci-runner", Some(CANARY), "t"))
        .await
        .unwrap();
    assert_eq!(client.list_children("ci-runner").await.unwrap().len(), 1);
    for request in cluster.twin.requests() {
        assert!(!request.query.contains("secret"), "{request:?}");
    }
}

#[tokio::test]
async fn purge_escapes_the_child_id_and_the_child_is_gone() {
    let cluster = Cluster::start().await;
    let client = cluster.client();
    let child = client
        .dispatch(&request("ci-runner", Some(CANARY), "t"))
        .await
        .unwrap()
        .child;
    cluster.twin.finish(&child.0, true).unwrap();
    assert_eq!(
        client.child_status(&child).await.unwrap(),
        Some(ChildStatus::Dead)
    );
    cluster.twin.take_requests();

    client.purge(&child).await.unwrap();

    let requests = cluster.twin.take_requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].method, "DELETE");
    assert_eq!(
        requests[0].path,
        format!("/v1/job/{}", child.0.replace('/', "%2F"))
    );
    assert_eq!(requests[0].query_param("purge").as_deref(), Some("true"));
    assert!(cluster.twin.job(&child.0).is_none());
    assert_eq!(client.child_status(&child).await.unwrap(), None);
    assert_eq!(client.list_children("ci-runner").await.unwrap(), []);
    // Purging again is harmless: Nomad answers 200 for an unknown job.
    client.purge(&child).await.unwrap();
}

#[tokio::test]
async fn the_twin_reads_child_ids_escaped_or_not() {
    let cluster = Cluster::start().await;
    let id = hand_dispatch(&cluster.twin, "ci-runner");
    let http = reqwest::Client::new();
    for path in [id.clone(), id.replace('/', "%2F")] {
        let response = http
            .get(format!("{}/v1/job/{path}", cluster.server.base_url()))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let job: serde_json::Value = response.json().await.unwrap();
        assert_eq!(job["ID"], id.as_str());
        assert_eq!(job["ParentID"], "ci-runner");
        assert_eq!(job["Dispatched"], true);
    }
    let missing = http
        .get(format!(
            "{}/v1/job/nope%2Fdispatch-1-00000000",
            cluster.server.base_url()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    assert!(missing.headers().contains_key("x-nomad-index"));
    assert_eq!(missing.text().await.unwrap(), "job not found");
}

#[tokio::test]
async fn children_move_through_placement() {
    let cluster = Cluster::start().await;
    let client = cluster.client();
    let placed = client
        .dispatch(&request("ci-runner", Some(CANARY), "a"))
        .await
        .unwrap()
        .child;
    let done = client
        .dispatch(&request("ci-runner", Some(CANARY), "b"))
        .await
        .unwrap()
        .child;
    let unplaceable = client
        .dispatch(&request("ci-runner", Some(CANARY), "c"))
        .await
        .unwrap()
        .child;
    cluster.twin.place(&placed.0).unwrap();
    cluster.twin.place(&done.0).unwrap();
    cluster.twin.finish(&done.0, false).unwrap();
    cluster.twin.fail_evaluation(&unplaceable.0).unwrap();

    let children = client.list_children("ci-runner").await.unwrap();
    let state = |id: &ChildId| {
        let child = children.iter().find(|c| c.id == *id).unwrap();
        (child.status, child.placement)
    };

    assert_eq!(state(&placed), (ChildStatus::Running, Placement::Placed));
    // Its allocation failed: a failed start unless its runner was seen taking a job.
    assert_eq!(state(&done), (ChildStatus::Dead, Placement::Failed));
    assert_eq!(
        state(&unplaceable),
        (ChildStatus::Dead, Placement::Unplaced)
    );
    assert_eq!(
        client.child_status(&placed).await.unwrap(),
        Some(ChildStatus::Running)
    );
}

#[tokio::test]
async fn an_outage_is_transient() {
    let cluster = Cluster::start().await;
    let client = cluster.client();
    cluster.twin.set_unavailable(true);

    let listing = client.list_children("ci-runner").await.unwrap_err();
    let dispatch = client
        .dispatch(&request("ci-runner", Some(CANARY), "t"))
        .await
        .unwrap_err();
    let status = client
        .child_status(&ChildId::new("ci-runner/dispatch-1-00000000", "default"))
        .await
        .unwrap_err();

    for error in [&listing, &dispatch, &status] {
        assert_eq!(error.class, ErrorClass::Transient, "{error:?}");
    }
    assert_eq!(
        listing.message,
        "list children of ci-runner: 500 No cluster leader"
    );

    cluster.twin.set_unavailable(false);
    assert!(client.list_children("ci-runner").await.is_ok());
}

#[tokio::test]
async fn a_refused_connection_is_transient() {
    let cluster = Cluster::start().await;
    let client = cluster.client();
    drop(cluster.server);

    let error = client.list_children("ci-runner").await.unwrap_err();

    assert_eq!(error.class, ErrorClass::Transient);
    assert!(error.message.starts_with("list children of ci-runner: "));
}

#[tokio::test]
async fn namespace_and_region_go_on_every_call() {
    let cluster = Cluster::start().await;
    cluster.twin.register_parent_spec(
        "ci-runner",
        ParentSpec {
            namespace: Some("ci-runners".into()),
            meta_required: REQUIRED.iter().map(|s| s.to_string()).collect(),
            meta_optional: OPTIONAL.iter().map(|s| s.to_string()).collect(),
            ..ParentSpec::default()
        },
    );
    hand_dispatch(&cluster.twin, "ci-runner"); // in the default namespace
    let mut settings = cluster.settings();
    settings.namespace = Some("ci-runners".into());
    settings.region = Some("eu".into());
    let client = client_with(settings);

    let child = client
        .dispatch(&request("ci-runner", Some(CANARY), "t"))
        .await
        .unwrap()
        .child;
    let children = client.list_children("ci-runner").await.unwrap();
    let status = client.child_status(&child).await.unwrap();
    client.purge(&child).await.unwrap();

    // Listed across namespaces: ours in ci-runners and the hand-dispatched one in default.
    assert_eq!(children.len(), 2);
    let ours: Vec<_> = children.iter().filter(|c| c.ours).collect();
    assert_eq!(ours.len(), 1);
    assert_eq!(ours[0].id, child);
    assert_eq!(child.namespace(), "ci-runners");
    assert_eq!(status, Some(ChildStatus::Pending));
    assert_eq!(cluster.twin.job(&child.0), None);
    let requests = cluster.twin.requests();
    assert_eq!(requests.len(), 4);
    for request in requests {
        let expected = if request.path == "/v1/jobs" {
            "*"
        } else {
            "ci-runners"
        };
        assert_eq!(
            request.query_param("namespace").as_deref(),
            Some(expected),
            "{request:?}"
        );
        assert_eq!(request.query_param("region").as_deref(), Some("eu"));
    }
}
