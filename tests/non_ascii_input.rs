//! Long non-ASCII text from a service or a workflow file is cut by characters, never
//! mid-character: a panic there would take the daemon down for as long as it is served.

mod support;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chrono::Utc;
use runner_scaler::sim::twins::TwinServer;
use support::twins::{Twins, config};

fn hostile_message() -> String {
    format!("a{}", "ü".repeat(150))
}

#[tokio::test]
async fn a_long_non_ascii_forgejo_error_message_is_a_gap_not_a_panic() {
    let twins = Twins::start().await;
    twins.provision_brief_world();
    let router = axum::Router::new().fallback(|| async {
        (StatusCode::INTERNAL_SERVER_ERROR, [("content-type", "application/json")],
         serde_json::json!({"message": hostile_message(), "url": "https://forgejo.example/api/swagger"}).to_string()).into_response()
    });
    let bad = TwinServer::start(router).await.unwrap();
    let doc = format!(
        r#"{{"alex/s3-orchestrator": {{"mode": "forgejo", "forgejoUrl": "{}", "maxConcurrent": 1, "vaultPath": "forgejo/scaler", "profiles": [{{"job": "forgejo-build-runner", "label": "build", "maxConcurrent": 1}}]}}}}"#,
        bad.base_url()
    );
    let config = config(&doc);
    let mut ctl = twins.controller();
    let view = ctl.tick(&config, 1, Utc::now(), false).await;
    assert_eq!(view.gaps.len(), 1, "{view:?}");
}

#[tokio::test]
async fn a_long_non_ascii_vault_error_is_a_gap_not_a_panic() {
    let twins = Twins::start().await;
    twins.provision_brief_world();
    let router = axum::Router::new().fallback(|| async {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "application/json")],
            serde_json::json!({"errors": [hostile_message()]}).to_string(),
        )
            .into_response()
    });
    let bad = TwinServer::start(router).await.unwrap();
    use runner_scaler::secrets::SecretSource;
    let vault =
        runner_scaler::clients::vault::VaultKv::new(runner_scaler::clients::vault::VaultSettings {
            addr: url::Url::parse(&bad.base_url()).unwrap(),
            token: secrecy::SecretString::from("t"),
            namespace: None,
            ca_cert: None,
            mount: "secret".into(),
        })
        .unwrap();
    let r = vault.read_field("forgejo/scaler", "token").await;
    assert!(r.is_err());
}

#[tokio::test]
async fn a_long_non_ascii_label_is_unroutable_not_a_panic() {
    let twins = Twins::start().await;
    let acme = twins.add_app_repo("acme/api");
    twins.register_token_parent("ci-runner");
    let config = config(r#"{ "acme/api": { "mode": "app", "maxConcurrent": 3 } }"#);
    let label = format!("a{}", "é".repeat(50));
    let hostile = twins
        .github
        .add_run(&acme, vec![vec!["self-hosted".to_string(), label]])
        .job_ids[0];
    let mut ctl = twins.controller();
    let view = ctl.tick(&config, 1, Utc::now(), false).await;
    assert!(
        view.unroutable.iter().any(|u| u.job_id == hostile),
        "{view:?}"
    );
}
