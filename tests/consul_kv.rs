//! The Consul KV client against the twin (and against the documented fixture bodies), over
//! real HTTP on loopback.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, HeaderValue};
use axum::routing::get;
use runner_scaler::clients::consul::{ConsulKv, ConsulSettings};
use runner_scaler::config::watch::{DocumentSource, Fetched};
use runner_scaler::model::ErrorClass;
use runner_scaler::secrets::SecretString;
use runner_scaler::sim::twins::TwinServer;
use runner_scaler::sim::twins::consul::ConsulTwin;
use serde_json::Value;

const KEY: &str = "runners/config";
const TOKEN: &str = "7d4c2e51-consul-test-token";
const LONG_WAIT: Duration = Duration::from_secs(300);
/// Guards every await on the network so a broken test fails instead of hanging.
const TEST_DEADLINE: Duration = Duration::from_secs(20);

fn fixture(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/consul/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

fn settings(address: String, token: Option<&str>) -> ConsulSettings {
    ConsulSettings {
        address,
        token: token.map(SecretString::from),
        ca_cert: None,
        client_cert: None,
        client_key: None,
    }
}

/// A bare reqwest client for requests the daemon's client does not make (PUT, raw reads).
fn plain_http() -> reqwest::Client {
    runner_scaler::clients::http::install_crypto_provider();
    reqwest::Client::new()
}

async fn start(twin: &ConsulTwin) -> TwinServer {
    TwinServer::start(twin.router()).await.unwrap()
}

fn client(server: &TwinServer, token: Option<&str>) -> ConsulKv {
    ConsulKv::new(&settings(server.base_url(), token), KEY).unwrap()
}

async fn fetch(kv: &ConsulKv, index: u64, wait: Duration) -> Result<Fetched, String> {
    tokio::time::timeout(TEST_DEADLINE, kv.fetch(index, wait))
        .await
        .expect("fetch hung")
        .map_err(|e| format!("{:?}: {}", e.class, e.message))
}

/// JSON type names of each key, to compare shapes rather than values.
fn shape(object: &Value) -> BTreeMap<String, &'static str> {
    object
        .as_object()
        .expect("an object")
        .iter()
        .map(|(k, v)| {
            let kind = match v {
                Value::Null => "null",
                Value::Bool(_) => "bool",
                Value::Number(_) => "number",
                Value::String(_) => "string",
                Value::Array(_) => "array",
                Value::Object(_) => "object",
            };
            (k.clone(), kind)
        })
        .collect()
}

#[tokio::test]
async fn the_twin_answers_reads_in_the_documented_shape() {
    let twin = ConsulTwin::new();
    twin.set("zip", "test");
    twin.set_session("zip", Some("adf4238a-882b-9ddc-4a9d-5b6758e4159e"));
    let server = start(&twin).await;
    let http = plain_http();

    let response = http
        .get(format!("{}/v1/kv/zip", server.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    for name in [
        "X-Consul-Index",
        "X-Consul-KnownLeader",
        "X-Consul-LastContact",
        "X-Consul-Default-ACL-Policy",
    ] {
        assert!(headers.contains_key(name), "missing header {name}");
    }
    let twin_body: Value = response.json().await.unwrap();
    let fixture_body: Value = serde_json::from_str(&fixture("kv-get.response.json")).unwrap();
    assert_eq!(shape(&twin_body[0]), shape(&fixture_body[0]));
    assert_eq!(
        twin_body.as_array().unwrap().len(),
        1,
        "an array even for one key"
    );
    assert_eq!(
        twin_body[0]["Value"], fixture_body[0]["Value"],
        "base64 of `test`"
    );
    assert_eq!(
        headers["X-Consul-Index"].to_str().unwrap(),
        twin_body[0]["ModifyIndex"].to_string(),
        "X-Consul-Index is the key's ModifyIndex"
    );

    // Without a lock, Consul omits Session; everything else keeps its type.
    twin.set_session("zip", None);
    let unlocked: Value = http
        .get(format!("{}/v1/kv/zip", server.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut expected = shape(&fixture_body[0]);
    expected.remove("Session");
    assert_eq!(shape(&unlocked[0]), expected);

    let put = http
        .put(format!("{}/v1/kv/zip", server.base_url()))
        .body("new")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    assert_eq!(
        put.text().await.unwrap().trim(),
        fixture("kv-put.response.json").trim()
    );

    let raw = http
        .get(format!("{}/v1/kv/zip?raw", server.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.headers()["content-type"], "text/plain");
    assert_eq!(raw.text().await.unwrap(), "new");
}

#[tokio::test]
async fn a_missing_key_is_a_404_with_an_empty_body_and_an_index() {
    let twin = ConsulTwin::new();
    twin.set("other", "x");
    let server = start(&twin).await;
    let response = plain_http()
        .get(format!("{}/v1/kv/{KEY}", server.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert!(response.headers().contains_key("X-Consul-Index"));
    assert!(response.bytes().await.unwrap().is_empty());

    let kv = client(&server, None);
    assert_eq!(
        fetch(&kv, 0, LONG_WAIT).await,
        Ok(Fetched::Missing { index: 0 }),
        "consulrs drops the 404's headers: the index is unknown"
    );
}

#[tokio::test]
async fn the_client_parses_the_documented_body() {
    // The fixture served verbatim, with the headers a real Consul sends.
    let body = fixture("kv-get.response.json");
    let router = Router::new().route(
        "/v1/kv/zip",
        get(move || {
            let body = body.clone();
            async move {
                let mut headers = HeaderMap::new();
                headers.insert("X-Consul-Index", HeaderValue::from_static("200"));
                headers.insert("Content-Type", HeaderValue::from_static("application/json"));
                (headers, body)
            }
        }),
    );
    let server = TwinServer::start(router).await.unwrap();
    let kv = ConsulKv::new(&settings(server.base_url(), None), "zip").unwrap();
    assert_eq!(
        fetch(&kv, 0, LONG_WAIT).await,
        Ok(Fetched::Found {
            bytes: b"test".to_vec(),
            index: 200
        })
    );
}

#[tokio::test]
async fn the_client_reads_the_document_and_an_empty_value() {
    let twin = ConsulTwin::new();
    let index = twin.set(KEY, r#"{"acme/api": {"mode": "app"}}"#);
    let server = start(&twin).await;
    let kv = client(&server, None);
    assert_eq!(
        fetch(&kv, 0, LONG_WAIT).await,
        Ok(Fetched::Found {
            bytes: br#"{"acme/api": {"mode": "app"}}"#.to_vec(),
            index
        })
    );

    // Consul sends `"Value": null` for an empty value.
    let index = twin.set(KEY, "");
    assert_eq!(
        fetch(&kv, 0, LONG_WAIT).await,
        Ok(Fetched::Found {
            bytes: Vec::new(),
            index
        })
    );
}

#[tokio::test]
async fn a_blocking_read_returns_when_another_task_writes_the_key() {
    let twin = ConsulTwin::new();
    let first = twin.set(KEY, "one");
    let server = start(&twin).await;
    let kv = client(&server, None);

    let reader = tokio::spawn(async move { fetch(&kv, first, LONG_WAIT).await });
    // Write only once the read is known to be blocked in the twin.
    tokio::time::timeout(TEST_DEADLINE, twin.blocked_reads_at_least(1))
        .await
        .expect("the read never blocked");
    let url = format!("{}/v1/kv/{KEY}", server.base_url());
    let writer = tokio::spawn(async move {
        plain_http()
            .put(url)
            .body("two")
            .send()
            .await
            .unwrap()
            .status()
    });
    assert_eq!(writer.await.unwrap(), 200);

    let answer = tokio::time::timeout(TEST_DEADLINE, reader)
        .await
        .expect("the blocked read did not return after the write")
        .unwrap();
    match answer {
        Ok(Fetched::Found { bytes, index }) => {
            assert_eq!(bytes, b"two");
            assert!(index > first, "index {index} should move past {first}");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn a_blocking_read_that_times_out_returns_the_same_index() {
    let twin = ConsulTwin::new();
    let index = twin.set(KEY, "same");
    let server = start(&twin).await;
    let kv = client(&server, None);
    // The behaviour under test is the timeout itself: keep it short.
    assert_eq!(
        fetch(&kv, index, Duration::from_millis(100)).await,
        Ok(Fetched::Found {
            bytes: b"same".to_vec(),
            index
        })
    );
}

#[tokio::test]
async fn acl_refusals_are_forbidden_and_never_echo_the_token() {
    let twin = ConsulTwin::with_token(TOKEN);
    twin.set(KEY, "{}");
    let server = start(&twin).await;

    let right = client(&server, Some(TOKEN));
    assert!(matches!(
        fetch(&right, 0, LONG_WAIT).await,
        Ok(Fetched::Found { .. })
    ));

    for token in [Some("wrong-token-value"), None] {
        let kv = client(&server, token);
        let error = tokio::time::timeout(TEST_DEADLINE, kv.fetch(0, LONG_WAIT))
            .await
            .unwrap()
            .expect_err("refused");
        assert_eq!(error.class, ErrorClass::Forbidden, "{}", error.message);
        assert!(error.message.contains("403"), "{}", error.message);
        assert!(error.message.contains(KEY), "{}", error.message);
        assert!(!error.message.contains("wrong-token-value"));
    }

    // The twin accepts the token as a bearer token too, and says why it refuses.
    let http = plain_http();
    let url = format!("{}/v1/kv/{KEY}", server.base_url());
    let bearer = http.get(&url).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(bearer.status(), 200);
    let anonymous = http.get(&url).send().await.unwrap();
    assert_eq!(anonymous.status(), 403);
    assert_eq!(
        anonymous.headers()["X-Consul-Default-ACL-Policy"],
        "deny",
        "ACLs on"
    );
    assert!(
        anonymous.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    assert_eq!(anonymous.text().await.unwrap(), "Permission denied");
}

#[tokio::test]
async fn an_outage_and_a_closed_port_are_transient() {
    let twin = ConsulTwin::new();
    twin.set(KEY, "{}");
    let server = start(&twin).await;
    let kv = client(&server, None);
    twin.set_unavailable(true);
    let error = kv.fetch(0, LONG_WAIT).await.expect_err("outage");
    assert_eq!(error.class, ErrorClass::Transient);
    assert!(error.message.contains("500"), "{}", error.message);
    twin.set_unavailable(false);
    assert!(kv.fetch(0, LONG_WAIT).await.is_ok());

    let address = server.base_url();
    drop(server);
    let closed = ConsulKv::new(&settings(address, None), KEY).unwrap();
    let error = tokio::time::timeout(TEST_DEADLINE, closed.fetch(0, LONG_WAIT))
        .await
        .unwrap()
        .expect_err("nothing listens");
    assert_eq!(error.class, ErrorClass::Transient, "{}", error.message);
}

#[tokio::test]
async fn check_and_set_writes_only_over_the_expected_index() {
    let twin = ConsulTwin::new();
    let server = start(&twin).await;
    let http = plain_http();
    let url = format!("{}/v1/kv/{KEY}", server.base_url());
    let put = |query: String, body: &'static str| {
        let request = http.put(format!("{url}?{query}")).body(body);
        async move { request.send().await.unwrap().text().await.unwrap() }
    };
    assert_eq!(put("cas=0".into(), "created").await, "true");
    assert_eq!(
        put("cas=0".into(), "again").await,
        "false",
        "cas=0 only creates"
    );
    let created = twin.index();
    let current = twin.set(KEY, "changed meanwhile");
    assert_eq!(
        put(format!("cas={created}"), "stale").await,
        "false",
        "a stale index loses"
    );
    assert_eq!(put(format!("cas={current}"), "updated").await, "true");
    assert_eq!(twin.get(KEY).unwrap(), b"updated");
}

/// Collects everything logged on this thread.
#[derive(Clone, Default)]
struct CapturedLogs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// A current-thread runtime keeps consulrs, rustify, hyper and the twin on this thread, where
// the capturing subscriber is installed.
#[tokio::test(flavor = "current_thread")]
async fn the_token_never_reaches_the_logs_even_at_trace_level() {
    let logs = CapturedLogs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let twin = ConsulTwin::with_token(TOKEN);
    let index = twin.set(KEY, "{}");
    let server = start(&twin).await;
    let kv = client(&server, Some(TOKEN));
    assert!(fetch(&kv, 0, LONG_WAIT).await.is_ok());
    assert!(fetch(&kv, index, Duration::from_millis(20)).await.is_ok());
    let wrong = client(&server, Some("wrong-token-value"));
    assert!(fetch(&wrong, 0, LONG_WAIT).await.is_err());

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("runners/config"),
        "the subscriber captured nothing: {text}"
    );
    assert!(!text.contains(TOKEN), "token logged:\n{text}");
    assert!(!text.contains("wrong-token-value"), "token logged:\n{text}");
}

/// The state key (`--state-key`) over the real client: missing reads as nothing, a write is
/// a plain PUT of the value as given and reads back the same, and a write Consul cannot take
/// is an error naming the key.
#[tokio::test]
async fn the_state_key_is_written_with_a_plain_put_and_read_back() {
    use runner_scaler::act::services::CarriedStore;
    let twin = ConsulTwin::with_token(TOKEN);
    let server = start(&twin).await;
    let state = ConsulKv::new(&settings(server.base_url(), Some(TOKEN)), "runners/state").unwrap();
    let load = || tokio::time::timeout(TEST_DEADLINE, state.load());
    assert_eq!(load().await.unwrap().unwrap(), None);

    let value = br#"{"version":1,"crashBackoff":[],"deregistered":[]}"#.to_vec();
    tokio::time::timeout(TEST_DEADLINE, state.save(value.clone()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(twin.get("runners/state"), Some(value.clone()));
    assert_eq!(load().await.unwrap().unwrap(), Some(value.clone()));
    assert!(twin.get(KEY).is_none(), "only the state key is written");

    twin.set_unavailable(true);
    let refused = tokio::time::timeout(TEST_DEADLINE, state.save(value))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        refused
            .message
            .starts_with("write Consul key runners/state at "),
        "{}",
        refused.message
    );
    assert!(!refused.message.contains(TOKEN));
}
