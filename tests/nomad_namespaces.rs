//! The Nomad client across namespaces, against the twin: children are listed in all of them,
//! each carries its own, and reads, stops and purges go there; dispatches go to the repo's
//! namespace or `--runner-namespace`; a child's id carries its repo (`IdPrefixTemplate`).

use std::time::Duration;

use runner_scaler::act::{ChildControl, DispatchMeta, DispatchRequest};
use runner_scaler::clients::nomad::{NomadClient, NomadSettings};
use runner_scaler::model::{ChildId, ErrorClass, RunnerName};
use runner_scaler::observe::{ChildSource, ChildStatus};
use runner_scaler::secrets::SecretString;
use runner_scaler::sim::twins::TwinServer;
use runner_scaler::sim::twins::nomad::{NomadTwin, ParentSpec, PayloadRule};

const APP_NS: &str = "ci-runners";
const VAULT_NS: &str = "ci-runners-vault";

struct Cluster {
    twin: NomadTwin,
    server: TwinServer,
}

impl Cluster {
    /// `ci-runner` in `ci-runners` (app mode, a token in meta) and `vm-runner` in
    /// `ci-runners-vault` (vault mode, its prestart task mints); a token that may not
    /// deregister in the vault namespace.
    async fn start() -> Cluster {
        let twin = NomadTwin::new();
        for (parent, namespace, required) in [
            (
                "ci-runner",
                APP_NS,
                &["repo_url", "runner_token", "runner_name"][..],
            ),
            ("vm-runner", VAULT_NS, &["repo_url", "runner_name"][..]),
        ] {
            twin.register_parent_spec(
                parent,
                ParentSpec {
                    namespace: Some(namespace.into()),
                    meta_required: required.iter().map(|s| s.to_string()).collect(),
                    meta_optional: vec!["labels".into(), "managed_by".into()],
                    payload: PayloadRule::Forbidden,
                    ..ParentSpec::default()
                },
            );
        }
        twin.deny_deregister_in(VAULT_NS);
        let server = twin.serve().await.expect("twin serves");
        Cluster { twin, server }
    }

    fn client(&self) -> NomadClient {
        let mut settings = NomadSettings::new(self.server.base_url().parse().unwrap());
        settings.namespace = Some(APP_NS.into());
        NomadClient::new(settings, Duration::from_secs(5)).expect("client builds")
    }
}

fn request(parent: &str, namespace: Option<&str>, repo: &str, token: bool) -> DispatchRequest {
    DispatchRequest {
        parent: parent.into(),
        namespace: namespace.map(str::to_string),
        meta: DispatchMeta {
            repo_url: format!("https://github.com/{repo}"),
            labels: "self-hosted".into(),
            runner_name: RunnerName(format!("{parent}-0123456789ab")),
            runner_token: token.then(|| SecretString::from("s.wrapped".to_string())),
        },
        idempotency_token: format!("{parent:0>32}"),
    }
}

#[tokio::test]
async fn children_of_every_namespace_are_found_and_each_is_read_in_its_own() {
    let cluster = Cluster::start().await;
    let nomad = cluster.client();

    // No namespace on the request: `--runner-namespace`.
    let app = nomad
        .dispatch(&request("ci-runner", None, "acme/api", true))
        .await
        .expect("dispatch to the default runner namespace");
    let vault = nomad
        .dispatch(&request("vm-runner", Some(VAULT_NS), "acme/secure", false))
        .await
        .expect("dispatch to the repo's namespace");
    assert_eq!(app.child.namespace(), APP_NS);
    assert_eq!(vault.child.namespace(), VAULT_NS);
    assert_eq!(cluster.twin.job(app.child.id()).unwrap().namespace, APP_NS);
    assert_eq!(
        cluster.twin.job(vault.child.id()).unwrap().namespace,
        VAULT_NS
    );

    assert_eq!(
        nomad.parents_with_our_children().await.unwrap(),
        ["ci-runner".to_string(), "vm-runner".to_string()].into()
    );
    let listed = nomad.list_children("vm-runner").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].id, vault.child,
        "the listing carries the namespace"
    );
    assert!(listed[0].ours);

    for child in [&app.child, &vault.child] {
        assert_eq!(
            nomad.child_status(child).await.unwrap(),
            Some(ChildStatus::Pending),
            "{child}"
        );
        // The same id in another namespace is another job: Nomad answers 404, i.e. gone.
        let elsewhere = ChildId::new(child.id(), "default");
        assert_eq!(nomad.child_status(&elsewhere).await.unwrap(), None);
    }

    // Every request named a namespace: the listings all of them, the rest the child's.
    for r in cluster.twin.requests() {
        let namespace = r.query_param("namespace").unwrap_or_default();
        if r.path == "/v1/jobs" {
            assert_eq!(namespace, "*", "{r:?}");
        } else if r.path.contains("vm-runner") {
            assert!(namespace == VAULT_NS || namespace == "default", "{r:?}");
        } else {
            assert!(namespace == APP_NS || namespace == "default", "{r:?}");
        }
    }

    // Purges go to the child's namespace: allowed in ci-runners, refused in the vault one.
    cluster.twin.finish(app.child.id(), true).unwrap();
    nomad.purge(&app.child).await.expect("purge in ci-runners");
    assert!(cluster.twin.was_purged(app.child.id()));
    let refused = nomad.purge(&vault.child).await.unwrap_err();
    assert_eq!(refused.class, ErrorClass::Forbidden);
    assert!(
        refused.message.contains(VAULT_NS) && refused.message.contains("403"),
        "{}",
        refused.message
    );
    assert!(cluster.twin.job(vault.child.id()).is_some());
}

#[tokio::test]
async fn a_childs_id_carries_its_repo_and_is_still_recognised_as_ours() {
    let cluster = Cluster::start().await;
    let nomad = cluster.client();
    let dispatched = nomad
        .dispatch(&request("ci-runner", None, "Acme/API.rs", true))
        .await
        .unwrap();
    let id = dispatched.child.id();
    assert!(
        id.starts_with("ci-runner/dispatch-acme-api-rs-"),
        "Nomad puts the template between dispatch- and the time: {id}"
    );
    let listed = nomad.list_children("ci-runner").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].ours);
    assert_eq!(
        nomad.parents_with_our_children().await.unwrap(),
        ["ci-runner".to_string()].into()
    );
    let body_of_dispatch = cluster
        .twin
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/dispatch"))
        .count();
    assert_eq!(body_of_dispatch, 1);
}
