//! A service that refuses the connection gives one line: what was being done, the service
//! and its address, and the root cause once.

mod support;

use std::sync::Arc;
use std::time::Duration;

use runner_scaler::clients::forgejo::Forgejo;
use runner_scaler::clients::http::TlsFiles;
use runner_scaler::clients::vault::{VaultKv, VaultSettings};
use runner_scaler::config::watch::DocumentSource;
use runner_scaler::observe::{PortError, QueueSource};
use runner_scaler::secrets::{SecretSource, SecretString};
use runner_scaler::sim::daemon_clients::TwinAddresses;
use runner_scaler::sim::twins::vault::{VaultPolicy, VaultTwin};
use serde_json::json;
use support::twins::{CREDENTIALS, config};

/// An address on which nothing listens: bound once, then closed.
fn refusing_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

/// The claims of the issue, on one error.
fn assert_one_line(service: &str, address: &str, error: &PortError) {
    let text = error.to_string();
    let host_port = address.trim_start_matches("http://");
    assert!(!text.contains('\n'), "{service}: not one line: {text}");
    assert!(
        text.contains(service),
        "{service}: service not named: {text}"
    );
    assert!(
        text.contains(host_port),
        "{service}: address {host_port} not named: {text}"
    );
    let lower = text.to_lowercase();
    assert_eq!(
        lower.matches("connection refused").count(),
        1,
        "{service}: the root cause is not said exactly once: {text}"
    );
    assert_eq!(
        lower.matches(host_port).count(),
        1,
        "{service}: the address is repeated: {text}"
    );
}

#[tokio::test]
async fn a_refused_connection_is_one_line_naming_the_service_address_and_cause() {
    let addresses = TwinAddresses {
        github: refusing_address(),
        forgejo: refusing_address(),
        nomad: refusing_address(),
        consul: refusing_address(),
        vault: refusing_address(),
    };
    let clients = addresses
        .clients(&CREDENTIALS, Duration::from_secs(5))
        .unwrap();

    let consul = clients.consul.fetch(0, Duration::ZERO).await.unwrap_err();
    assert_one_line("Consul", &addresses.consul, &consul);

    let nomad = clients
        .services
        .children
        .list_children("ci-runner")
        .await
        .unwrap_err();
    assert_one_line("Nomad", &addresses.nomad, &nomad);

    let vault = VaultKv::new(VaultSettings {
        addr: addresses.vault.parse().unwrap(),
        token: SecretString::from("a-vault-token"),
        namespace: None,
        ca_cert: None,
        mount: "secret".into(),
    })
    .unwrap();
    let vault = vault.read_field("github/app", "token").await.unwrap_err();
    assert_one_line("Vault", &addresses.vault, &vault);

    let document = config(
        r#"{ "acme/api": { "maxConcurrent": 1, "mode": "app", "defaultJob": "ci-runner" } }"#,
    );
    let github = clients.services.github.as_ref().unwrap();
    let github = github
        .queue
        .list_jobs(&document.repos[&support::twins::repo("acme/api")])
        .await
        .unwrap_err();
    assert_one_line("GitHub", &addresses.github, &github);

    // Forgejo's API token comes from Vault, which answers here.
    let vault_twin = VaultTwin::new();
    vault_twin.add_token(
        "a-vault-token",
        VaultPolicy::read_only(["secret/data/forgejo/scaler".to_string()]),
    );
    vault_twin.put_secret(
        "secret",
        "forgejo/scaler",
        json!({ "token": "a-forgejo-token", "url": addresses.forgejo }),
    );
    let vault_server = vault_twin.serve().await.unwrap();
    let kv = VaultKv::new(VaultSettings {
        addr: vault_server.base_url().parse().unwrap(),
        token: SecretString::from("a-vault-token"),
        namespace: None,
        ca_cert: None,
        mount: "secret".into(),
    })
    .unwrap();
    let forgejo = Forgejo::new(Arc::new(kv), &TlsFiles::default(), Duration::from_secs(5)).unwrap();
    let document = config(&format!(
        r#"{{ "alex/s3": {{ "maxConcurrent": 1, "mode": "forgejo", "defaultJob": "ci-runner",
              "forgejoUrl": "{}", "vaultPath": "forgejo/scaler", "labels": ["build"] }} }}"#,
        addresses.forgejo
    ));
    let forgejo = forgejo
        .list_jobs(&document.repos[&support::twins::repo("alex/s3")])
        .await
        .unwrap_err();
    assert_one_line("Forgejo", &addresses.forgejo, &forgejo);
}
