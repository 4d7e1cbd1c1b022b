//! The Vault twin answers with the shapes of Vault's documented examples
//! (`tests/fixtures/vault/`), and the client reads those documented bodies.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::routing::get;
use runner_scaler::clients::vault::{VaultKv, VaultSettings};
use runner_scaler::secrets::{ExposeSecret, SecretSource, SecretString};
use runner_scaler::sim::twins::TwinServer;
use runner_scaler::sim::twins::vault::{VaultPolicy, VaultTwin};
use serde_json::{Value, json};

mod support;

use support::fixtures::json_type as kind;

fn fixture(name: &str) -> Value {
    support::fixtures::fixture("vault", name)
}

const ROOT: &str = "hvs.twin-root-token";

/// Same keys at every object level and the same JSON type for every value; arrays are compared
/// by their first elements.
fn assert_same_shape(expected: &Value, actual: &Value, at: &str) {
    assert_eq!(kind(expected), kind(actual), "type of {at}");
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            let ek: Vec<&String> = e.keys().collect();
            let ak: Vec<&String> = a.keys().collect();
            assert_eq!(ek, ak, "keys of {at}");
            for (key, value) in e {
                assert_same_shape(value, &a[key], &format!("{at}.{key}"));
            }
        }
        (Value::Array(e), Value::Array(a)) => {
            if let (Some(e0), Some(a0)) = (e.first(), a.first()) {
                assert_same_shape(e0, a0, &format!("{at}[0]"));
            }
        }
        _ => {}
    }
}

/// The envelope members that are never null: compared by type against the token-create
/// example, the docs' only full envelope.
const ENVELOPE_SCALARS: &[&str] = &["request_id", "lease_id", "renewable", "lease_duration"];

fn assert_envelope(body: &Value) {
    let reference = fixture("token-create.response.json");
    let mut expected: Vec<&String> = reference.as_object().unwrap().keys().collect();
    let mut actual: Vec<&String> = body.as_object().expect("an object").keys().collect();
    expected.sort();
    actual.sort();
    assert_eq!(expected, actual, "envelope keys");
    for key in ENVELOPE_SCALARS {
        assert_eq!(kind(&reference[*key]), kind(&body[*key]), "type of {key}");
    }
}

async fn twin() -> (VaultTwin, TwinServer) {
    let twin = VaultTwin::new();
    twin.add_token(ROOT, VaultPolicy::Root);
    let server = twin.serve().await.unwrap();
    (twin, server)
}

fn http() -> reqwest::Client {
    runner_scaler::clients::http::install_crypto_provider();
    reqwest::Client::new()
}

#[tokio::test]
async fn read_answers_the_documented_data_and_metadata_in_the_full_envelope() {
    let (twin, server) = twin().await;
    twin.put_secret("secret", "my-secret", json!({"foo": "bar"}));
    twin.put_secret("secret", "my-secret", json!({"foo": "bar"}));
    twin.set_custom_metadata(
        "secret",
        "my-secret",
        BTreeMap::from([
            ("owner".to_string(), "jdoe".to_string()),
            ("mission_critical".to_string(), "false".to_string()),
        ]),
    );
    let response = http()
        .get(format!("{}/v1/secret/data/my-secret", server.base_url()))
        .header("X-Vault-Token", ROOT)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    let documented = fixture("kv2-read.response.json");
    assert_same_shape(&documented["data"], &body["data"], "data");
    assert_eq!(body["data"]["data"], documented["data"]["data"]);
    assert_eq!(body["data"]["metadata"]["version"], 2);
    assert_eq!(body["data"]["metadata"]["deletion_time"], "");
    assert_envelope(&body);
}

#[tokio::test]
async fn write_takes_the_documented_request_and_answers_its_metadata() {
    let (twin, server) = twin().await;
    twin.set_custom_metadata(
        "secret",
        "my-secret",
        BTreeMap::from([
            ("owner".to_string(), "jdoe".to_string()),
            ("mission_critical".to_string(), "false".to_string()),
        ]),
    );
    let response = http()
        .post(format!("{}/v1/secret/data/my-secret", server.base_url()))
        .header("X-Vault-Token", ROOT)
        .json(&fixture("kv2-write.request.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_same_shape(
        &fixture("kv2-write.response.json")["data"],
        &body["data"],
        "data",
    );
    assert_eq!(body["data"]["version"], 1);
    assert_envelope(&body);

    // The documented request carries `cas: 0`: only valid while nothing is written yet.
    let again = http()
        .put(format!("{}/v1/secret/data/my-secret", server.base_url()))
        .header("Authorization", format!("Bearer {ROOT}"))
        .json(&fixture("kv2-write.request.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 400);
    let error: Value = again.json().await.unwrap();
    assert_same_shape(&fixture("error.response.json"), &error, "error");
}

#[tokio::test]
async fn errors_have_the_documented_shapes() {
    let (twin, server) = twin().await;
    twin.add_token("limited", VaultPolicy::read_only(["secret/data/allowed"]));
    let get = |path: &str, token: &str| {
        http()
            .get(format!("{}/v1/{path}", server.base_url()))
            .header("X-Vault-Token", token)
            .send()
    };

    let missing = get("secret/data/never-written", ROOT).await.unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(
        missing.json::<Value>().await.unwrap(),
        fixture("not-found-empty.response.json")
    );

    for (path, token) in [
        ("secret/data/other", "limited"),
        ("secret/data/allowed", "unknown-token"),
    ] {
        let denied = get(path, token).await.unwrap();
        assert_eq!(denied.status(), 403, "{path} with {token}");
        let body: Value = denied.json().await.unwrap();
        assert_same_shape(&fixture("error.response.json"), &body, "error");
        assert_eq!(body, json!({"errors": ["permission denied"]}));
    }

    twin.set_sealed(true);
    let sealed = get("secret/data/allowed", ROOT).await.unwrap();
    assert_eq!(sealed.status(), 503);
    assert_eq!(
        sealed.json::<Value>().await.unwrap(),
        json!({"errors": ["Vault is sealed"]})
    );
}

#[tokio::test]
async fn a_deleted_version_answers_404_with_null_data_and_its_metadata() {
    let (twin, server) = twin().await;
    twin.put_secret("secret", "gone", json!({"token": "old"}));
    twin.soft_delete("secret", "gone");
    let response = http()
        .get(format!("{}/v1/secret/data/gone", server.base_url()))
        .header("X-Vault-Token", ROOT)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert_envelope(&body);
    assert_eq!(body["data"]["data"], Value::Null);
    assert_eq!(body["data"]["metadata"]["version"], 1);
    assert_ne!(body["data"]["metadata"]["deletion_time"], "");
    assert!(!body.to_string().contains("old"));
}

#[tokio::test]
async fn the_client_reads_the_documented_read_body() {
    // The docs print only the `data` member; Vault always wraps it in the envelope, whose
    // documented form is the token-create example. Served here exactly so, by a bare server.
    let mut body = fixture("token-create.response.json");
    body["data"] = fixture("kv2-read.response.json")["data"].clone();
    body["auth"] = Value::Null;
    body["warnings"] = Value::Null;
    let router = axum::Router::new().route(
        "/v1/secret/data/my-secret",
        get(move || {
            let body = body.clone();
            async move { axum::Json(body) }
        }),
    );
    let server = TwinServer::start(router).await.unwrap();
    let vault = VaultKv::new(VaultSettings {
        addr: server.base_url().parse().unwrap(),
        token: SecretString::from(ROOT),
        namespace: None,
        ca_cert: None,
        mount: "secret".to_string(),
    })
    .unwrap();
    let vault: Arc<dyn SecretSource> = Arc::new(vault);
    let value = vault.read_field("my-secret", "foo").await.unwrap();
    assert_eq!(value.expose_secret(), "bar");
}

/// The fixture's request body wrapped for 300 s with the root token; the answer's body.
async fn wrap_the_fixture(server: &TwinServer) -> Value {
    http()
        .post(format!("{}/v1/sys/wrapping/wrap", server.base_url()))
        .header("X-Vault-Token", ROOT)
        .header("X-Vault-Wrap-TTL", "300")
        .json(&fixture("wrapping-wrap.request.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn wrapping_answers_the_documented_shape_and_unwraps_once() {
    let (twin, server) = twin().await;
    let wrapped = wrap_the_fixture(&server).await;
    assert_same_shape(&fixture("wrapping-wrap.response.json"), &wrapped, "wrap");
    assert_eq!(wrapped["data"], Value::Null);
    assert_eq!(wrapped["wrap_info"]["ttl"], 300);
    assert_eq!(wrapped["wrap_info"]["creation_path"], "sys/wrapping/wrap");
    let token = wrapped["wrap_info"]["token"].as_str().unwrap().to_string();
    assert_eq!(twin.wrapping_tokens(), std::slice::from_ref(&token));

    let unwrap = || {
        http()
            .post(format!("{}/v1/sys/wrapping/unwrap", server.base_url()))
            .header("X-Vault-Token", &token)
            .send()
    };
    let first = unwrap().await.unwrap();
    assert_eq!(first.status(), 200);
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["data"], fixture("wrapping-wrap.request.json"));
    let second = unwrap().await.unwrap();
    assert_eq!(second.status(), 400);
    let second: Value = second.json().await.unwrap();
    assert_same_shape(&fixture("error.response.json"), &second, "error");
    assert_eq!(
        second["errors"][0],
        runner_scaler::sim::twins::vault::WRAPPING_TOKEN_INVALID
    );

    // Without a TTL Vault has nothing to wrap for.
    let refused = http()
        .post(format!("{}/v1/sys/wrapping/wrap", server.base_url()))
        .header("X-Vault-Token", ROOT)
        .json(&fixture("wrapping-wrap.request.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
}

#[tokio::test]
async fn unwrapping_with_the_token_in_both_places_loses_the_value() {
    let (_twin, server) = twin().await;
    let wrapped = wrap_the_fixture(&server).await;
    let token = wrapped["wrap_info"]["token"].as_str().unwrap().to_string();
    let unwrap = |body: Option<Value>| {
        let request = http()
            .post(format!("{}/v1/sys/wrapping/unwrap", server.base_url()))
            .header("X-Vault-Token", &token);
        match body {
            Some(body) => request.json(&body).send(),
            None => request.send(),
        }
    };
    // Never both (API docs): the call fails and spends the token.
    let both = unwrap(Some(serde_json::json!({ "token": token })))
        .await
        .unwrap();
    assert_eq!(both.status(), 400);
    assert_eq!(unwrap(None).await.unwrap().status(), 400);
}
