//! Canary: with every log event of every crate captured at TRACE (the `log` crate's records
//! too), Vault reads, Forgejo job listings, registration-token mints and ephemeral runners
//! registered and deleted, successful and failing, leave no secret in the output or in an
//! error message.

mod support;

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runner_scaler::act::{Deregistration, RegisteredRunners, Registrar};
use runner_scaler::clients::forgejo::Forgejo;
use runner_scaler::clients::http::TlsFiles;
use runner_scaler::clients::vault::{VaultKv, VaultSettings};
use runner_scaler::config::{Mode, RepoConfig};
use runner_scaler::model::RepoName;
use runner_scaler::observe::QueueSource;
use runner_scaler::secrets::{ExposeSecret, SecretSource, SecretString};
use runner_scaler::sim::twins::forgejo::ForgejoTwin;
use runner_scaler::sim::twins::vault::{VaultPolicy, VaultTwin};
use serde_json::json;
use tracing_subscriber::util::SubscriberInitExt;

const VAULT_TOKEN: &str = "hvs.CANARY-vault-token-51c2";
const API_TOKEN: &str = "CANARY-forgejo-api-token-9e7d";
const ROTATED_API_TOKEN: &str = "CANARY-forgejo-api-token-rotated-03aa";
const VAULT_ONLY_VALUE: &str = "CANARY-vault-body-value-77b1";
const REPO: &str = "alex/s3-orchestrator";

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// Current-thread runtime: the twins' tasks and the clients' connection tasks all run on this
// thread, inside the capturing subscriber set below.
#[tokio::test]
async fn no_secret_reaches_the_logs_or_an_error_at_trace_level() {
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = subscriber.set_default();

    let vault = VaultTwin::new();
    vault.add_token(
        VAULT_TOKEN,
        VaultPolicy::read_only([
            "secret/data/forgejo/scaler",
            "secret/data/forgejo/scaler15",
            "secret/data/deleted",
            "secret/data/github/app",
        ]),
    );
    vault.put_secret("secret", "deleted", json!({"token": VAULT_ONLY_VALUE}));
    vault.soft_delete("secret", "deleted");
    vault.put_secret(
        "secret",
        "github/app",
        json!({"app_id": 1, "private_key": VAULT_ONLY_VALUE, "installation_id": "x"}),
    );
    let vault_server = vault.serve().await.unwrap();
    let forgejo = ForgejoTwin::new();
    forgejo.add_token(API_TOKEN);
    forgejo.add_repo(REPO);
    forgejo.add_job(REPO, "build", &["build"]);
    let forgejo_server = forgejo.serve().await.unwrap();
    vault.put_secret(
        "secret",
        "forgejo/scaler",
        json!({"token": API_TOKEN, "url": forgejo_server.base_url(), "note": VAULT_ONLY_VALUE}),
    );

    let kv = Arc::new(
        VaultKv::new(VaultSettings {
            addr: vault_server.base_url().parse().unwrap(),
            token: SecretString::from(VAULT_TOKEN),
            namespace: Some("ci".to_string()),
            ca_cert: None,
            mount: "secret".to_string(),
        })
        .unwrap(),
    );
    let client = Forgejo::new(kv.clone(), &TlsFiles::default(), Duration::from_secs(5)).unwrap();
    let repo = RepoConfig {
        repo: RepoName::parse(REPO).unwrap(),
        mode: Mode::Forgejo {
            url: forgejo_server.base_url().parse().unwrap(),
            vault_path: "forgejo/scaler".to_string(),
            allow_shared_token: true,
        },
        max_concurrent: 1,
        profiles: Vec::new(),
        default_job: None,
        labels: Some(BTreeSet::from(["build".to_string()])),
        search_labels_as_written: BTreeSet::from(["build".to_string()]),
        credential: Default::default(),
        nomad_namespace: None,
    };

    let mut errors: Vec<String> = Vec::new();
    let mut note = |result: Result<(), runner_scaler::observe::PortError>| {
        if let Err(e) = result {
            errors.push(format!("{e} {e:?}"));
        }
    };

    // Successes.
    let read = kv.read_field("forgejo/scaler", "token").await.unwrap();
    assert_eq!(read.expose_secret(), API_TOKEN);
    assert_eq!(client.list_jobs(&repo).await.unwrap().jobs.len(), 1);
    let minted = client
        .mint(&repo, support::TestRunner::any().identity())
        .await
        .unwrap()
        .unwrap();
    let registration = forgejo.registration_token(REPO).unwrap();
    assert_eq!(minted.plain().expose_secret(), registration);

    // Forgejo 15: an ephemeral runner registered per mint, its uuid and token the secret,
    // then deleted.
    let forgejo15 = ForgejoTwin::new();
    forgejo15.set_version("15.0.0");
    forgejo15.add_token(API_TOKEN);
    forgejo15.add_repo(REPO);
    let forgejo15_server = forgejo15.serve().await.unwrap();
    vault.put_secret(
        "secret",
        "forgejo/scaler15",
        json!({"token": API_TOKEN, "url": forgejo15_server.base_url()}),
    );
    let mut repo15 = repo.clone();
    repo15.mode = Mode::Forgejo {
        url: forgejo15_server.base_url().parse().unwrap(),
        vault_path: "forgejo/scaler15".to_string(),
        allow_shared_token: false,
    };
    let ephemeral = client
        .mint(&repo15, support::TestRunner::any().identity())
        .await
        .unwrap()
        .unwrap();
    let runner = forgejo15.registered_runners().remove(0);
    tracing::info!(credential = ?ephemeral, "minted");
    let deleted = client.delete_registered(&repo15, runner.id).await.unwrap();
    assert_eq!(deleted, Deregistration::Deleted);
    note(
        client
            .delete_registered(&repo15, runner.id)
            .await
            .map(|gone| assert_eq!(gone, Deregistration::NotFound)),
    );

    // Failures whose responses or requests are near a secret.
    note(kv.read_field("forgejo/scaler", "missing").await.map(drop));
    note(kv.read_field("deleted", "token").await.map(drop));
    note(kv.read_field("github/moat-runner", "token").await.map(drop));
    note(kv.read_app_credentials("github/app").await.map(drop));
    vault.put_secret(
        "secret",
        "forgejo/scaler",
        json!({"token": ROTATED_API_TOKEN, "url": forgejo_server.base_url()}),
    );
    forgejo.revoke_token(API_TOKEN);
    forgejo.add_token(ROTATED_API_TOKEN);
    assert_eq!(client.list_jobs(&repo).await.unwrap().jobs.len(), 1);
    forgejo.revoke_token(ROTATED_API_TOKEN);
    note(
        client
            .mint(&repo, support::TestRunner::any().identity())
            .await
            .map(drop),
    );
    forgejo.add_token_for(ROTATED_API_TOKEN, &["alex/other"]);
    note(client.list_jobs(&repo).await.map(drop));
    forgejo.set_outage(true);
    note(
        client
            .mint(&repo, support::TestRunner::any().identity())
            .await
            .map(drop),
    );
    vault.set_sealed(true);
    note(kv.read_field("forgejo/scaler", "token").await.map(drop));

    drop(_guard);
    let output = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    // The capture is live: it holds the HTTP clients' own TRACE/DEBUG events.
    assert!(output.contains("TRACE"), "nothing captured at TRACE");
    assert!(output.contains("rustify"), "no rustify events captured");
    assert!(
        output.contains("reqwest"),
        "no reqwest (log crate) events captured"
    );
    assert!(errors.len() >= 8, "{errors:#?}");

    for secret in [
        VAULT_TOKEN,
        API_TOKEN,
        ROTATED_API_TOKEN,
        VAULT_ONLY_VALUE,
        registration.as_str(),
        runner.uuid.as_str(),
        runner.token.as_str(),
    ] {
        assert!(!output.contains(secret), "{secret} in the log output");
        for error in &errors {
            assert!(!error.contains(secret), "{secret} in error {error}");
        }
    }
}
