//! `NOMAD_ADDR=unix:///…/api.sock`: the daemon's real Nomad client lists, dispatches and
//! reads over a Unix socket, as a task reaches Nomad's task API with its workload identity.

use std::path::PathBuf;
use std::time::Duration;

use runner_scaler::act::{ChildControl, DispatchMeta, DispatchRequest};
use runner_scaler::clients::nomad::{NomadClient, NomadSettings};
use runner_scaler::model::{ErrorClass, RunnerName};
use runner_scaler::observe::{ChildSource, ChildStatus};
use runner_scaler::secrets::SecretString;
use runner_scaler::sim::twins::nomad::{NomadTwin, ParentSpec, PayloadRule};

const TOKEN: &str = "workload-identity-token-5e1d";

/// A socket path under the temp directory, unique to this process and test (a socket path
/// must stay under ~100 bytes, so no deep directories).
fn socket_path(tag: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("rs-nomad-{}-{tag}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

fn client(addr: &str, token: Option<&str>) -> NomadClient {
    let mut settings = NomadSettings::new(addr.parse().expect("a URL"));
    settings.token = token.map(|t| SecretString::from(t.to_string()));
    settings.namespace = Some("ci-runners".into());
    NomadClient::new(settings, Duration::from_secs(5)).expect("client builds")
}

fn request() -> DispatchRequest {
    DispatchRequest {
        parent: "ci-runner".into(),
        namespace: None,
        meta: DispatchMeta {
            repo_url: "https://github.com/acme/api".into(),
            labels: "self-hosted".into(),
            runner_name: RunnerName("ci-runner-0123456789ab".into()),
            runner_token: Some(SecretString::from("s.wrapped".to_string())),
        },
        idempotency_token: "0".repeat(32),
    }
}

#[tokio::test]
async fn the_client_lists_dispatches_and_reads_over_the_task_api_socket() {
    let twin = NomadTwin::new();
    twin.set_acl_token(Some(TOKEN));
    twin.register_parent_spec(
        "ci-runner",
        ParentSpec {
            namespace: Some("ci-runners".into()),
            meta_required: vec![
                "repo_url".into(),
                "runner_token".into(),
                "runner_name".into(),
            ],
            meta_optional: vec!["labels".into(), "managed_by".into()],
            payload: PayloadRule::Forbidden,
            ..ParentSpec::default()
        },
    );
    let path = socket_path("api");
    let server = twin.serve_unix(&path).await.expect("serve on a socket");
    let nomad = client(&server.address(), Some(TOKEN));

    let dispatched = nomad.dispatch(&request()).await.expect("dispatch");
    assert_eq!(dispatched.child.namespace(), "ci-runners");
    let children = nomad.list_children("ci-runner").await.expect("list");
    assert_eq!(children.len(), 1);
    assert!(children[0].ours);
    assert_eq!(children[0].id, dispatched.child);
    assert_eq!(
        nomad
            .parents_with_our_children()
            .await
            .expect("list parents"),
        ["ci-runner".to_string()].into()
    );
    assert_eq!(
        nomad.child_status(&dispatched.child).await.expect("read"),
        Some(ChildStatus::Pending)
    );
    twin.place(dispatched.child.id()).unwrap();
    assert!(nomad.has_live_allocation(&dispatched.child).await.unwrap());

    // Everything went over the socket, with the token, to the child's namespace.
    let requests = twin.requests();
    assert_eq!(requests.len(), 5, "{requests:?}");
    assert!(
        requests
            .iter()
            .any(|r| r.path == "/v1/job/ci-runner/dispatch")
    );
    for r in &requests {
        let namespace = r.query_param("namespace").unwrap_or_default();
        let expected = if r.path == "/v1/jobs" {
            "*"
        } else {
            "ci-runners"
        };
        assert_eq!(namespace, expected, "{r:?}");
    }

    // A client without the token is refused over the socket as over TCP.
    let refused = client(&server.address(), None)
        .list_children("ci-runner")
        .await
        .unwrap_err();
    assert_eq!(refused.class, ErrorClass::Forbidden, "{}", refused.message);
}

#[tokio::test]
async fn a_missing_socket_is_an_error_naming_its_path() {
    let path = socket_path("absent");
    let nomad = client(&format!("unix://{}", path.display()), Some(TOKEN));
    let error = nomad.list_children("ci-runner").await.unwrap_err();
    assert_eq!(error.class, ErrorClass::Transient);
    assert!(
        error.message.contains(&path.display().to_string()),
        "{}",
        error.message
    );
    assert!(!error.message.contains("localhost"), "{}", error.message);
}
