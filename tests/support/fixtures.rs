//! The services' documented example bodies (`tests/fixtures/`), and the raw calls and hand
//! dispatches the twin tests check them with.

use runner_scaler::sim::twins::nomad::{DEFAULT_NAMESPACE, DispatchInput, NomadTwin};
use serde_json::Value;

/// `tests/fixtures/<service>/<name>` as text.
pub fn fixture_text(service: &str, name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/{service}/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// `tests/fixtures/<service>/<name>` as JSON.
pub fn fixture(service: &str, name: &str) -> Value {
    let text = fixture_text(service, name);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {service}/{name}: {e}"))
}

/// The JSON kind of a value, for comparing a twin's bodies with the documented ones.
pub fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// One request to the GitHub twin as GitHub's documentation shows it (media type, API
/// version, bearer token): status, headers and the JSON body (`null` when empty).
pub async fn github_call(
    client: &reqwest::Client,
    base: &str,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut request = client
        .request(method, format!("{base}{path}"))
        .header("accept", "application/vnd.github+json")
        .header("x-github-api-version", "2022-11-28")
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap()
    };
    (status, headers, body)
}

/// A child of `parent` started by hand: the marker `managed_by` is absent.
pub fn hand_dispatch(twin: &NomadTwin, parent: &str) -> String {
    let input = DispatchInput {
        meta: [
            ("repo_url", "https://github.com/acme/api"),
            ("runner_token", "by-hand"),
            ("runner_name", "someone-elses"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..DispatchInput::default()
    };
    twin.dispatch(DEFAULT_NAMESPACE, parent, input)
        .expect("hand dispatch accepted")
        .dispatched_job_id
}
