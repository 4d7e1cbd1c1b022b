//! Canary: with every log line down to TRACE captured (ours, octocrab's, hyper's, the twin's),
//! no token, JWT or private-key line appears in the logs or in any error message.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use runner_scaler::act::Registrar;
use runner_scaler::clients::github::{AppCredentials, GitHub, GitHubSettings};
use runner_scaler::config::{Mode, RepoConfig};
use runner_scaler::model::{ErrorClass, RepoName};
use runner_scaler::observe::{PortError, QueueSource};
use runner_scaler::secrets::{ExposeSecret, SecretSource, SecretString};
use runner_scaler::sim::twins::github::{
    GitHubTwin, RateLimitAnswer, TEST_APP_ID, TEST_APP_PRIVATE_KEY_PEM,
};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::FmtSpan;
use url::Url;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

const PAT: &str = "ghp_canaryPollingToken0123456789abcdef";

struct OneSecret;

#[async_trait]
impl SecretSource for OneSecret {
    async fn read_field(&self, _: &str, _: &str) -> Result<SecretString, PortError> {
        Ok(SecretString::from(PAT))
    }
}

fn repo(name: &str, mode: Mode) -> RepoConfig {
    RepoConfig {
        repo: RepoName::parse(name).unwrap(),
        mode,
        max_concurrent: 1,
        profiles: Vec::new(),
        default_job: None,
        labels: None,
        search_labels_as_written: Default::default(),
        credential: Default::default(),
        nomad_namespace: None,
    }
}

// One thread, so that every task (hyper's connection tasks, the twin) logs through the
// subscriber set for this test.
#[tokio::test(flavor = "current_thread")]
async fn no_secret_reaches_a_log_line_or_an_error() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_span_events(FmtSpan::FULL)
        .with_ansi(false)
        .with_writer(captured.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let twin = GitHubTwin::new();
    let server = twin.start().await.unwrap();
    twin.install_app("acme");
    let app_repo = repo("acme/api", Mode::App);
    let vault_repo = repo(
        "acme/web",
        Mode::Vault {
            vault_path: "github/web-poll".into(),
            register_vault_path: "github/web-admin".into(),
        },
    );
    twin.add_run(&app_repo.repo, vec![vec!["self-hosted"]]);
    twin.add_run(&vault_repo.repo, vec![vec!["self-hosted"]]);
    twin.add_pat(
        PAT,
        "canary",
        Some(std::slice::from_ref(&vault_repo.repo)),
        &[("actions", "read")],
    );
    let settings = GitHubSettings {
        api_url: Url::parse(&server.base_url()).unwrap(),
        app: Some(AppCredentials {
            app_id: TEST_APP_ID.to_string(),
            private_key: SecretString::from(TEST_APP_PRIVATE_KEY_PEM),
            installation_id: None,
        }),
        request_timeout: Duration::from_secs(10),
    };
    let client = GitHub::new(settings, Arc::new(OneSecret)).unwrap();

    let mut errors = Vec::new();
    let mut minted = Vec::new();
    assert_eq!(client.list_jobs(&app_repo).await.unwrap().jobs.len(), 1);
    minted.push(
        client
            .mint(&app_repo, support::TestRunner::any().identity())
            .await
            .unwrap()
            .unwrap(),
    );
    assert_eq!(client.list_jobs(&vault_repo).await.unwrap().jobs.len(), 1);
    // A revoked token: 401, re-mint, success.
    twin.revoke_installation_tokens();
    client.list_jobs(&app_repo).await.unwrap();
    minted.push(
        client
            .mint(&app_repo, support::TestRunner::any().identity())
            .await
            .unwrap()
            .unwrap(),
    );
    // Failures of every kind, whose messages are checked too.
    errors.push(
        client
            .list_jobs(&repo("acme/nope", Mode::App))
            .await
            .unwrap_err(),
    );
    twin.force_rate_limit(Some(RateLimitAnswer::Primary { status: 403 }));
    errors.push(client.list_jobs(&vault_repo).await.unwrap_err());
    twin.force_rate_limit(None);
    errors.push(
        client
            .list_jobs(&repo("ghost/api", Mode::App))
            .await
            .unwrap_err(),
    );
    let debug_of_tokens = format!("{minted:?}");
    drop(_guard);

    let output = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        output.contains("requesting"),
        "octocrab's trace layer was not captured"
    );
    assert!(output.contains("minted installation token"));
    assert_eq!(errors[1].class, ErrorClass::RateLimited);

    let mut secrets: Vec<String> = twin.issued_secrets();
    assert!(secrets.iter().filter(|s| s.starts_with("ghs_")).count() >= 3);
    secrets.extend(minted.iter().map(|t| t.plain().expose_secret().to_string()));
    secrets.push(PAT.to_string());
    secrets.extend(
        TEST_APP_PRIVATE_KEY_PEM
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .map(str::to_string),
    );
    let messages: Vec<String> = errors.iter().map(|e| format!("{e} {e:?}")).collect();
    for haystack in std::iter::once(&output)
        .chain(messages.iter())
        .chain(std::iter::once(&debug_of_tokens))
    {
        for secret in &secrets {
            assert!(!haystack.contains(secret.as_str()), "a secret leaked");
        }
        // A JWT's header is base64 of `{"`: `eyJ`.
        assert!(!haystack.contains("eyJ"), "a JWT leaked");
        assert!(
            !haystack.to_ascii_lowercase().contains("bearer "),
            "an Authorization header leaked"
        );
    }
}
