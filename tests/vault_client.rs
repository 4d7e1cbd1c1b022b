//! The Vault KV v2 client against the Vault twin over loopback HTTP.

use runner_scaler::clients::vault::{VaultKv, VaultSettings};
use runner_scaler::model::ErrorClass;
use runner_scaler::secrets::{ExposeSecret, SecretSource, SecretString};
use runner_scaler::sim::twins::TwinServer;
use runner_scaler::sim::twins::vault::{VaultPolicy, VaultTwin};
use serde_json::json;

const DAEMON_TOKEN: &str = "hvs.daemon-token-7f3a";
const ROOT: &str = "hvs.root";

struct World {
    twin: VaultTwin,
    server: TwinServer,
}

impl World {
    async fn new() -> World {
        let twin = VaultTwin::new();
        twin.add_token(ROOT, VaultPolicy::Root);
        twin.add_token(
            DAEMON_TOKEN,
            VaultPolicy::read_only([
                "secret/data/forgejo/scaler",
                "secret/data/github/moat-poll",
                "secret/data/github/app",
                "secret/data/deleted",
                "secret/data/never-written",
            ]),
        );
        let server = twin.serve().await.unwrap();
        World { twin, server }
    }

    fn client(&self, namespace: Option<&str>) -> VaultKv {
        VaultKv::new(VaultSettings {
            addr: self.server.base_url().parse().unwrap(),
            token: SecretString::from(DAEMON_TOKEN),
            namespace: namespace.map(str::to_string),
            ca_cert: None,
            mount: "secret".to_string(),
        })
        .unwrap()
    }
}

#[tokio::test]
async fn reads_one_string_field_and_sends_the_namespace() {
    let world = World::new().await;
    world.twin.put_secret(
        "secret",
        "forgejo/scaler",
        json!({"token": "forgejo-api-token-1", "other": "x"}),
    );
    let vault = world.client(Some("team-ci"));
    let token = vault.read_field("forgejo/scaler", "token").await.unwrap();
    assert_eq!(token.expose_secret(), "forgejo-api-token-1");

    let requests = world.twin.requests_for("secret/data/forgejo/scaler");
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].method, "GET");
    assert_eq!(requests[0].namespace.as_deref(), Some("team-ci"));
}

#[tokio::test]
async fn a_missing_or_non_string_field_is_a_configuration_error_without_the_value() {
    let world = World::new().await;
    world.twin.put_secret(
        "secret",
        "forgejo/scaler",
        json!({"tokn": "sekret-value-1", "count": 7, "blank": " "}),
    );
    let vault = world.client(None);
    for (field, problem) in [
        ("token", "has no such field"),
        ("count", "is a number"),
        ("blank", "is empty"),
    ] {
        let err = vault.read_field("forgejo/scaler", field).await.unwrap_err();
        assert_eq!(err.class, ErrorClass::Configuration, "{field}");
        assert!(err.message.contains("forgejo/scaler"), "{}", err.message);
        assert!(
            err.message.contains(&format!("{field:?}")),
            "{}",
            err.message
        );
        assert!(err.message.contains(problem), "{}", err.message);
        assert!(!err.message.contains("sekret-value-1"), "{}", err.message);
        assert!(!err.message.contains('7'), "{}", err.message);
    }
}

#[tokio::test]
async fn a_never_written_path_is_not_found_naming_mount_and_path() {
    let world = World::new().await;
    let err = world
        .client(None)
        .read_field("never-written", "token")
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::NotFound);
    assert!(err.message.contains("never-written"), "{}", err.message);
    assert!(err.message.contains("mount secret"), "{}", err.message);
    assert!(err.message.contains("404"), "{}", err.message);
}

#[tokio::test]
async fn a_soft_deleted_or_destroyed_version_is_not_found() {
    let world = World::new().await;
    let vault = world.client(None);
    world
        .twin
        .put_secret("secret", "deleted", json!({"token": "deleted-secret-v1"}));
    world.twin.soft_delete("secret", "deleted");
    let err = vault.read_field("deleted", "token").await.unwrap_err();
    assert_eq!(err.class, ErrorClass::NotFound);
    assert!(
        err.message.contains("version 1 was deleted"),
        "{}",
        err.message
    );

    world
        .twin
        .put_secret("secret", "deleted", json!({"token": "deleted-secret-v2"}));
    assert_eq!(
        vault
            .read_field("deleted", "token")
            .await
            .unwrap()
            .expose_secret(),
        "deleted-secret-v2"
    );
    world.twin.destroy("secret", "deleted");
    let err = vault.read_field("deleted", "token").await.unwrap_err();
    assert_eq!(err.class, ErrorClass::NotFound);
    assert!(
        err.message.contains("version 2 was destroyed"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn the_daemon_cannot_read_the_register_path() {
    let world = World::new().await;
    world.twin.put_secret(
        "secret",
        "github/moat-runner",
        json!({"token": "admin-token-never-read"}),
    );
    let err = world
        .client(None)
        .read_field("github/moat-runner", "token")
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Forbidden);
    assert!(
        err.message.contains("github/moat-runner"),
        "{}",
        err.message
    );
    assert!(err.message.contains("permission denied"), "{}", err.message);
    assert!(!err.message.contains("admin-token-never-read"));
}

#[tokio::test]
async fn a_sealed_vault_or_no_vault_is_transient() {
    let world = World::new().await;
    world
        .twin
        .put_secret("secret", "forgejo/scaler", json!({"token": "t"}));
    world.twin.set_sealed(true);
    let err = world
        .client(None)
        .read_field("forgejo/scaler", "token")
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient);
    assert!(err.message.contains("503"), "{}", err.message);

    // A port nobody listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nowhere = VaultKv::new(VaultSettings {
        addr: format!("http://127.0.0.1:{port}").parse().unwrap(),
        token: SecretString::from(DAEMON_TOKEN),
        namespace: None,
        ca_cert: None,
        mount: "secret".to_string(),
    })
    .unwrap();
    let err = nowhere
        .read_field("forgejo/scaler", "token")
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient);
    assert!(err.message.contains("forgejo/scaler"), "{}", err.message);
}

#[tokio::test]
async fn reads_github_app_credentials_with_either_form_of_installation_id() {
    let world = World::new().await;
    let vault = world.client(None);
    for (installation_id, expected) in [
        (json!("4242"), Some(4242)),
        (json!(4242), Some(4242)),
        (serde_json::Value::Null, None),
    ] {
        let mut data = json!({
            "app_id": 123456,
            "private_key": "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n",
        });
        if !installation_id.is_null() {
            data["installation_id"] = installation_id;
        }
        world.twin.put_secret("secret", "github/app", data);
        let app = vault.read_app_credentials("github/app").await.unwrap();
        assert_eq!(app.app_id, "123456");
        assert!(app.private_key.expose_secret().starts_with("-----BEGIN"));
        assert_eq!(app.installation_id, expected);
        assert!(!format!("{app:?}").contains("BEGIN"));
    }

    world.twin.put_secret(
        "secret",
        "github/app",
        json!({"app_id": "Iv1.abc", "private_key": 5, "installation_id": "x"}),
    );
    let err = vault.read_app_credentials("github/app").await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Configuration);
    assert!(err.message.contains("\"private_key\""), "{}", err.message);
}

/// The App's webhook secret may sit beside its key: read as a secret, never shown; a field
/// of the wrong kind is a configuration error that does not show it either.
#[tokio::test]
async fn reads_the_apps_webhook_secret_beside_its_key() {
    let world = World::new().await;
    let vault = world.client(None);
    let key = "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n";
    world.twin.put_secret(
        "secret",
        "github/app",
        json!({"app_id": 1, "private_key": key, "webhook_secret": "canary-webhook-vault-52ab"}),
    );
    let app = vault.read_app_credentials("github/app").await.unwrap();
    assert_eq!(
        app.webhook_secret.as_ref().map(|s| s.expose_secret()),
        Some("canary-webhook-vault-52ab")
    );
    assert!(!format!("{app:?}").contains("canary-webhook"), "{app:?}");

    world.twin.put_secret(
        "secret",
        "github/app",
        json!({"app_id": 1, "private_key": key}),
    );
    let app = vault.read_app_credentials("github/app").await.unwrap();
    assert!(app.webhook_secret.is_none());

    world.twin.put_secret(
        "secret",
        "github/app",
        json!({"app_id": 1, "private_key": key, "webhook_secret": ["canary-webhook-vault-52ab"]}),
    );
    let err = vault.read_app_credentials("github/app").await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Configuration);
    assert!(
        err.message.contains("\"webhook_secret\""),
        "{}",
        err.message
    );
    assert!(!err.message.contains("canary-webhook"), "{}", err.message);
}

#[tokio::test]
async fn paths_that_could_escape_the_mount_are_refused_before_any_request() {
    let world = World::new().await;
    let vault = world.client(None);
    for path in ["", "a/../b", "a//b", "./a"] {
        let err = vault.read_field(path, "token").await.unwrap_err();
        assert_eq!(err.class, ErrorClass::Configuration, "{path:?}");
    }
    assert!(world.twin.requests().is_empty());
}

#[test]
fn settings_come_from_the_standard_variables_and_name_no_value() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |key: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.to_string())
        }
    };
    let settings = VaultSettings::from_lookup(
        env(&[
            ("VAULT_ADDR", "https://vault.service.consul:8200"),
            ("VAULT_TOKEN", "hvs.from-env\n"),
            ("VAULT_NAMESPACE", "team"),
            ("VAULT_CACERT", "/etc/ca.pem"),
        ]),
        "kv".to_string(),
    )
    .unwrap();
    assert_eq!(settings.addr.as_str(), "https://vault.service.consul:8200/");
    assert_eq!(settings.token.expose_secret(), "hvs.from-env");
    assert_eq!(settings.namespace.as_deref(), Some("team"));
    assert_eq!(settings.mount, "kv");

    let err = VaultSettings::from_lookup(env(&[]), "secret".to_string())
        .err()
        .unwrap();
    assert!(err.contains("VAULT_TOKEN"), "{err}");

    let bad_token = VaultKv::new(VaultSettings {
        addr: "http://127.0.0.1:8200".parse().unwrap(),
        token: SecretString::from("line\nbreak-secret"),
        namespace: None,
        ca_cert: None,
        mount: "secret".to_string(),
    })
    .err()
    .unwrap();
    assert!(!bad_token.contains("break-secret"), "{bad_token}");
}

#[tokio::test]
async fn every_request_says_it_is_a_vault_request() {
    use runner_scaler::act::CredentialWrapper;
    let world = World::new().await;
    world.twin.add_token(
        DAEMON_TOKEN,
        VaultPolicy::read_only(["secret/data/forgejo/scaler"]),
    );
    world
        .twin
        .put_secret("secret", "forgejo/scaler", json!({"token": "t"}));
    let vault = world.client(None);
    vault.read_field("forgejo/scaler", "token").await.unwrap();
    vault
        .wrap(
            &[("jitconfig", SecretString::from("encoded"))],
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap();
    vault
        .capabilities_self(&["forgejo/scaler".to_string()])
        .await
        .unwrap();
    // A Vault Agent or Proxy listener with `require_request_header` refuses any without it.
    let requests = world.twin.requests();
    let paths: Vec<&str> = requests.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "secret/data/forgejo/scaler",
            "sys/wrapping/wrap",
            "sys/capabilities-self"
        ]
    );
    for request in &requests {
        assert!(request.request_header, "{request:?}");
    }
}
