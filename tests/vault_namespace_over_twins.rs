//! The loop with the real clients against the twins, with a `vault` mode repo whose parents
//! live in `ci-runners-vault`, where the daemon's token may list, read and dispatch but not
//! deregister (the twin answers 403 there, as Nomad does without `submit-job`): its dead
//! children are left to Nomad's garbage collection, and the daemon never even tries.

mod support;

use chrono::{Duration, Utc};
use runner_scaler::sim::twins::nomad::{ParentSpec, PayloadRule};
use serde_json::json;
use support::twins::{POLL_TOKEN, Twins, config, repo};

const VAULT_NS: &str = "ci-runners-vault";

#[tokio::test]
async fn dead_children_of_a_vault_repo_are_left_to_nomad_and_never_deregistered() {
    let twins = Twins::start().await;
    let api = twins.add_app_repo("acme/api");
    twins.register_token_parent("ci-runner");
    let secure = repo("acme/secure");
    twins.github.add_repo(&secure);
    twins.github.add_pat(
        POLL_TOKEN,
        "secure-poller",
        Some(std::slice::from_ref(&secure)),
        &[("actions", "read")],
    );
    twins
        .vault
        .put_secret("secret", "github/moat-poll", json!({ "token": POLL_TOKEN }));
    twins.nomad.register_parent_spec(
        "vm-runner",
        ParentSpec {
            namespace: Some(VAULT_NS.into()),
            meta_required: vec!["repo_url".into(), "runner_name".into()],
            meta_optional: vec!["labels".into(), "managed_by".into()],
            payload: PayloadRule::Forbidden,
            ..ParentSpec::default()
        },
    );
    twins.nomad.deny_deregister_in(VAULT_NS);
    let config = config(
        r#"{
          "acme/api": { "mode": "app", "maxConcurrent": 3 },
          "acme/secure": {
            "mode": "vault", "vaultPath": "github/moat-poll", "registerVaultPath": "github/moat-runner",
            "defaultJob": "vm-runner", "nomadNamespace": "ci-runners-vault", "maxConcurrent": 3
          }
        }"#,
    );
    twins.github.add_run(&api, vec![vec!["self-hosted"]]);
    twins.github.add_run(&secure, vec![vec!["self-hosted"]]);
    let mut ctl = twins.controller();
    let t0 = Utc::now();

    let view = ctl.tick(&config, 1, t0, false).await;
    assert!(view.gaps.is_empty(), "{:?}", view.gaps);
    assert_eq!(view.started, 2, "{view:?}");
    let app_child = twins.our_children("ci-runner").remove(0);
    let vault_child = twins.our_children("vm-runner").remove(0);
    assert_eq!(app_child.namespace, "default");
    assert_eq!(vault_child.namespace, VAULT_NS);
    assert!(
        vault_child
            .id
            .starts_with("vm-runner/dispatch-acme-secure-"),
        "{}",
        vault_child.id
    );

    // Both runners ran and ended: their children are dead.
    for child in [&app_child, &vault_child] {
        twins.nomad.place(&child.id).unwrap();
        twins.nomad.finish(&child.id, true).unwrap();
    }
    for tick in 1..4 {
        let view = ctl
            .tick(&config, 1, t0 + Duration::seconds(15 * tick), false)
            .await;
        assert!(view.gaps.is_empty(), "tick {tick}: {:?}", view.gaps);
    }

    assert!(
        twins.nomad.was_purged(&app_child.id),
        "the app child is purged"
    );
    assert!(
        twins.nomad.job(&vault_child.id).is_some(),
        "the vault child is left to Nomad's garbage collection"
    );
    let tried: Vec<_> = twins
        .nomad
        .requests()
        .into_iter()
        .filter(|r| r.method == "DELETE" && r.query_param("namespace").as_deref() == Some(VAULT_NS))
        .collect();
    assert!(
        tried.is_empty(),
        "deregistrations tried in {VAULT_NS}: {tried:?}"
    );
    // It was still read there: the listing found it, and the loop counted it as ours.
    assert!(
        twins
            .nomad
            .requests()
            .iter()
            .any(|r| r.path == "/v1/jobs" && r.query_param("namespace").as_deref() == Some("*"))
    );
}
