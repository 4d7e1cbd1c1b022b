//! Nomad, Consul, Vault and Forgejo requests carry a token in a header, which reqwest would
//! forward on a redirect: none of the clients follows one. A service answering 307 to a second
//! server gets a configuration error back, and the second server hears nothing.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use runner_scaler::clients::consul::{ConsulKv, ConsulSettings};
use runner_scaler::clients::forgejo::Forgejo;
use runner_scaler::clients::http::TlsFiles;
use runner_scaler::clients::nomad::{NomadClient, NomadSettings};
use runner_scaler::clients::vault::{VaultKv, VaultSettings};
use runner_scaler::config::watch::DocumentSource;
use runner_scaler::config::{Mode, RepoConfig};
use runner_scaler::model::{ErrorClass, RepoName};
use runner_scaler::observe::{ChildSource, PortError, QueueSource};
use runner_scaler::secrets::{SecretSource, SecretString};
use support::recording::{Recorded, RecordingServer};

const TOKEN: &str = "redirect-test-token-5e1f";
const REFUSAL: [&str; 2] = [
    "answered a redirect to another location",
    "redirects are not followed because the request carries a token",
];

/// The origin a redirect points at, and the service that answers every request with a 307
/// to the same path there.
struct Redirecting {
    elsewhere: RecordingServer,
    service: RecordingServer,
}

impl Redirecting {
    async fn start() -> Redirecting {
        let elsewhere = RecordingServer::start(|_| StatusCode::OK.into_response()).await;
        let target = elsewhere.base_url();
        let service = RecordingServer::start(move |request: &Recorded| -> Response {
            let mut response = StatusCode::TEMPORARY_REDIRECT.into_response();
            let location = format!("{target}{}", request.uri);
            response
                .headers_mut()
                .insert(header::LOCATION, HeaderValue::from_str(&location).unwrap());
            response
        })
        .await;
        Redirecting { elsewhere, service }
    }

    /// The service was asked, with the token, and the other origin heard nothing.
    fn assert_not_followed(&self, token_header: &str, error: &PortError) {
        let asked = self.service.requests();
        assert!(!asked.is_empty(), "the service was never asked");
        assert!(
            asked[0]
                .headers
                .get(token_header)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains(TOKEN)),
            "the request did not carry {token_header}: the test proves nothing"
        );
        assert_eq!(
            self.elsewhere.requests().len(),
            0,
            "the redirect was followed: {:?}",
            self.elsewhere.requests()
        );
        assert_eq!(error.class, ErrorClass::Configuration, "{error:?}");
        for part in REFUSAL {
            assert!(error.message.contains(part), "{}", error.message);
        }
        assert!(error.message.contains("307"), "{}", error.message);
        assert!(!error.message.contains(TOKEN), "{}", error.message);
    }
}

#[tokio::test]
async fn nomad_does_not_follow_a_redirect() {
    let world = Redirecting::start().await;
    let nomad = NomadClient::new(
        NomadSettings {
            addr: world.service.base_url().parse().unwrap(),
            token: Some(SecretString::from(TOKEN)),
            namespace: None,
            region: None,
            tls: TlsFiles::default(),
        },
        Duration::from_secs(10),
    )
    .unwrap();
    let error = nomad.list_children("ci-runner").await.unwrap_err();
    world.assert_not_followed("x-nomad-token", &error);
    assert!(
        error.message.contains("Nomad answered"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn consul_does_not_follow_a_redirect() {
    let world = Redirecting::start().await;
    let consul = ConsulKv::new(
        &ConsulSettings {
            address: world.service.base_url(),
            token: Some(SecretString::from(TOKEN)),
            ca_cert: None,
            client_cert: None,
            client_key: None,
        },
        "runners/config",
    )
    .unwrap();
    let error = consul.fetch(0, Duration::ZERO).await.unwrap_err();
    world.assert_not_followed("x-consul-token", &error);
    assert!(
        error.message.contains("Consul answered"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn vault_does_not_follow_a_redirect() {
    let world = Redirecting::start().await;
    let vault = VaultKv::new(VaultSettings {
        addr: world.service.base_url().parse().unwrap(),
        token: SecretString::from(TOKEN),
        namespace: None,
        ca_cert: None,
        mount: "secret".into(),
    })
    .unwrap();
    let error = vault
        .read_field("github/acme-poll", "token")
        .await
        .unwrap_err();
    world.assert_not_followed("x-vault-token", &error);
    assert!(
        error.message.contains("Vault answered"),
        "{}",
        error.message
    );
}

/// The API token, for the Forgejo at the origin it holds.
struct ApiToken(String);

#[async_trait]
impl SecretSource for ApiToken {
    async fn read_field(&self, _path: &str, field: &str) -> Result<SecretString, PortError> {
        Ok(SecretString::from(match field {
            "url" => self.0.clone(),
            _ => TOKEN.to_string(),
        }))
    }
}

#[tokio::test]
async fn forgejo_does_not_follow_a_redirect() {
    let world = Redirecting::start().await;
    let forgejo = Forgejo::new(
        Arc::new(ApiToken(world.service.base_url())),
        &TlsFiles::default(),
        Duration::from_secs(10),
    )
    .unwrap();
    let repo = RepoConfig {
        repo: RepoName::parse("alex/api").unwrap(),
        mode: Mode::Forgejo {
            url: world.service.base_url().parse().unwrap(),
            vault_path: "forgejo/scaler".into(),
            allow_shared_token: false,
        },
        max_concurrent: 1,
        profiles: vec![],
        default_job: Some("forgejo-runner".into()),
        labels: Some(BTreeSet::from(["docker".to_string()])),
        search_labels_as_written: BTreeSet::from(["docker".to_string()]),
        credential: Default::default(),
        nomad_namespace: None,
    };
    let error = forgejo.list_jobs(&repo).await.unwrap_err();
    world.assert_not_followed("authorization", &error);
    assert!(
        error.message.contains("Forgejo answered"),
        "{}",
        error.message
    );
}
