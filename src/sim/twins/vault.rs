//! Twin of Vault's KV v2 secrets engine: read and write of `/v1/{mount}/data/{path}`, tokens
//! with per-path read policies, namespaces recorded, and a sealed switch; and of response
//! wrapping (`sys/wrapping/wrap` and `sys/wrapping/unwrap`) and `sys/capabilities-self`,
//! which every token may use as Vault's built-in `default` policy allows.
//!
//! Shapes follow Vault's documentation and the KV v2 plugin source (`path_data.go`): a read
//! answers the full response envelope; a never-written path is 404 `{"errors":[]}`; a
//! soft-deleted or destroyed latest version is 404 *with* the envelope and `data.data: null`;
//! any error is `{"errors":[...]}`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, SecondsFormat, Utc};
use rand::Rng;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::TwinServer;

/// What a token may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VaultPolicy {
    /// Read and write everything (a root token; tests and world setup).
    Root,
    /// Read only these exact API paths, as a Vault policy names them
    /// (`secret/data/forgejo/scaler`); everything else is `permission denied`.
    ReadOnly(BTreeSet<String>),
}

impl VaultPolicy {
    pub fn read_only<S: Into<String>>(paths: impl IntoIterator<Item = S>) -> VaultPolicy {
        VaultPolicy::ReadOnly(paths.into_iter().map(Into::into).collect())
    }

    fn allows(&self, api_path: &str, write: bool) -> bool {
        match self {
            VaultPolicy::Root => true,
            VaultPolicy::ReadOnly(paths) => !write && paths.contains(api_path),
        }
    }
}

/// One request as the twin saw it. The token is not kept, only whether it was accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VaultRequest {
    pub method: String,
    /// The path without `/v1/`, e.g. `secret/data/forgejo/scaler`.
    pub path: String,
    pub namespace: Option<String>,
    pub status: u16,
    /// It carried `X-Vault-Request: true`, which a Vault Agent or Proxy listener with
    /// `require_request_header` demands of every request.
    pub request_header: bool,
}

struct Version {
    data: Map<String, Value>,
    created_time: DateTime<Utc>,
    deletion_time: Option<DateTime<Utc>>,
    destroyed: bool,
}

#[derive(Default)]
struct Secret {
    /// Version `n` is at index `n - 1`.
    versions: Vec<Version>,
    custom_metadata: Option<BTreeMap<String, String>>,
}

#[derive(Default)]
struct VaultState {
    tokens: HashMap<String, VaultPolicy>,
    /// Keyed by (mount, path).
    secrets: HashMap<(String, String), Secret>,
    sealed: bool,
    requests: Vec<VaultRequest>,
    /// Wrapping token → what it wraps, until unwrapped once or expired.
    wrapped: HashMap<String, Wrapped>,
    /// Every wrapping token ever issued.
    wrapping_tokens: Vec<String>,
}

struct Wrapped {
    data: Map<String, Value>,
    expires_at: DateTime<Utc>,
    /// The TTL it was wrapped for (`X-Vault-Wrap-TTL`), in seconds.
    ttl_s: u64,
}

/// Vault's answer to a wrapping token used twice, or expired.
pub const WRAPPING_TOKEN_INVALID: &str = "wrapping token is not valid or does not exist";

const WRAP_TEMPLATE: &str =
    include_str!("../../../tests/fixtures/vault/wrapping-wrap.response.json");

/// Shared handle on the twin's state: tests and the simulated world move it while the server
/// answers from it.
#[derive(Clone, Default)]
pub struct VaultTwin {
    state: Arc<Mutex<VaultState>>,
}

impl VaultTwin {
    pub fn new() -> VaultTwin {
        VaultTwin::default()
    }

    fn lock(&self) -> MutexGuard<'_, VaultState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Serves the twin on loopback.
    pub async fn serve(&self) -> std::io::Result<TwinServer> {
        TwinServer::start(self.router()).await
    }

    pub fn router(&self) -> Router {
        Router::new()
            .route(
                "/v1/{mount}/data/{*path}",
                get(read_secret).post(write_secret).put(write_secret),
            )
            .route("/v1/sys/wrapping/wrap", post(wrap).put(wrap))
            .route(
                "/v1/sys/capabilities-self",
                post(capabilities_self).put(capabilities_self),
            )
            .route("/v1/sys/wrapping/unwrap", post(unwrap).put(unwrap))
            .fallback(no_handler)
            .with_state(self.clone())
    }

    /// Accepts `token` with `policy`.
    pub fn add_token(&self, token: &str, policy: VaultPolicy) {
        self.lock().tokens.insert(token.to_string(), policy);
    }

    /// Writes a new version of the secret at `mount`/`path`; returns its version number.
    pub fn put_secret(&self, mount: &str, path: &str, data: Value) -> u64 {
        let data = match data {
            Value::Object(map) => map,
            _ => panic!("a KV v2 secret is a JSON object"),
        };
        let mut state = self.lock();
        let secret = state
            .secrets
            .entry((mount.to_string(), path.to_string()))
            .or_default();
        secret.versions.push(Version {
            data,
            created_time: Utc::now(),
            deletion_time: None,
            destroyed: false,
        });
        secret.versions.len() as u64
    }

    /// Sets the secret's `custom_metadata` (null until set, as in Vault).
    pub fn set_custom_metadata(&self, mount: &str, path: &str, metadata: BTreeMap<String, String>) {
        let mut state = self.lock();
        let secret = state
            .secrets
            .entry((mount.to_string(), path.to_string()))
            .or_default();
        secret.custom_metadata = Some(metadata);
    }

    /// Soft-deletes the latest version (`DELETE /v1/{mount}/data/{path}`).
    pub fn soft_delete(&self, mount: &str, path: &str) {
        self.latest_mut(mount, path, |v| v.deletion_time = Some(Utc::now()));
    }

    /// Destroys the latest version's data for good.
    pub fn destroy(&self, mount: &str, path: &str) {
        self.latest_mut(mount, path, |v| {
            v.destroyed = true;
            v.data.clear();
        });
    }

    fn latest_mut(&self, mount: &str, path: &str, change: impl FnOnce(&mut Version)) -> Option<()> {
        let mut state = self.lock();
        let secret = state
            .secrets
            .get_mut(&(mount.to_string(), path.to_string()))?;
        change(secret.versions.last_mut()?);
        Some(())
    }

    /// Sealed, Vault answers every request with 503 `Vault is sealed`.
    pub fn set_sealed(&self, sealed: bool) {
        self.lock().sealed = sealed;
    }

    pub fn requests(&self) -> Vec<VaultRequest> {
        self.lock().requests.clone()
    }

    /// Requests for one API path (`secret/data/forgejo/scaler`).
    /// Every wrapping token the twin issued, unwrapped or not.
    pub fn wrapping_tokens(&self) -> Vec<String> {
        self.lock().wrapping_tokens.clone()
    }

    /// The TTL, in seconds, `token` was wrapped for, while it can still be unwrapped.
    pub fn wrap_ttl_s(&self, token: &str) -> Option<u64> {
        self.lock().wrapped.get(token).map(|w| w.ttl_s)
    }

    pub fn requests_for(&self, api_path: &str) -> Vec<VaultRequest> {
        self.lock()
            .requests
            .iter()
            .filter(|r| r.path == api_path)
            .cloned()
            .collect()
    }
}

fn errors(status: StatusCode, messages: &[&str]) -> Response {
    (status, axum::Json(json!({ "errors": messages }))).into_response()
}

fn request_id() -> String {
    let mut rng = rand::rng();
    let hex: String = (0..32)
        .map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap_or('0'))
        .collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Vault's standard response envelope around `data`.
fn envelope(data: Value) -> Value {
    json!({
        "request_id": request_id(),
        "lease_id": "",
        "renewable": false,
        "lease_duration": 0,
        "data": data,
        "wrap_info": null,
        "warnings": null,
        "auth": null,
    })
}

fn timestamp(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Nanos, true)
}

fn version_metadata(secret: &Secret, number: usize) -> Value {
    let version = &secret.versions[number - 1];
    json!({
        "created_time": timestamp(&version.created_time),
        "custom_metadata": secret.custom_metadata,
        "deletion_time": version.deletion_time.as_ref().map(timestamp).unwrap_or_default(),
        "destroyed": version.destroyed,
        "version": number,
    })
}

/// The token from `X-Vault-Token`, else from `Authorization: Bearer`.
fn has_request_header(headers: &HeaderMap) -> bool {
    headers
        .get("x-vault-request")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
}

fn token_of(headers: &HeaderMap) -> Option<String> {
    if let Some(token) = headers.get("x-vault-token").and_then(|v| v.to_str().ok()) {
        return Some(token.to_string());
    }
    let auth = headers.get("authorization")?.to_str().ok()?;
    let (scheme, token) = auth.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}

impl VaultTwin {
    /// Seal and token checks common to every request; records the request. `Err` is the
    /// response to send.
    fn admit(
        &self,
        method: &Method,
        api_path: &str,
        headers: &HeaderMap,
        write: bool,
    ) -> Result<(), Box<Response>> {
        let mut state = self.lock();
        let namespace = headers
            .get("x-vault-namespace")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let refusal = if state.sealed {
            Some(errors(
                StatusCode::SERVICE_UNAVAILABLE,
                &["Vault is sealed"],
            ))
        } else {
            let allowed = token_of(headers)
                .and_then(|t| state.tokens.get(&t).cloned())
                .is_some_and(|policy| policy.allows(api_path, write));
            (!allowed).then(|| errors(StatusCode::FORBIDDEN, &["permission denied"]))
        };
        state.requests.push(VaultRequest {
            method: method.to_string(),
            path: api_path.to_string(),
            namespace,
            status: refusal.as_ref().map_or(200, |r| r.status().as_u16()),
            request_header: has_request_header(headers),
        });
        match refusal {
            Some(response) => Err(Box::new(response)),
            None => Ok(()),
        }
    }

    fn set_last_status(&self, status: StatusCode) {
        if let Some(last) = self.lock().requests.last_mut() {
            last.status = status.as_u16();
        }
    }
}

#[derive(Deserialize)]
struct ReadQuery {
    version: Option<usize>,
}

async fn read_secret(
    State(twin): State<VaultTwin>,
    method: Method,
    Path((mount, path)): Path<(String, String)>,
    Query(query): Query<ReadQuery>,
    headers: HeaderMap,
) -> Response {
    let api_path = format!("{mount}/data/{path}");
    if let Err(refusal) = twin.admit(&method, &api_path, &headers, false) {
        return *refusal;
    }
    let response = {
        let state = twin.lock();
        match state.secrets.get(&(mount, path)) {
            Some(secret) if !secret.versions.is_empty() => {
                let number = query
                    .version
                    .filter(|v| *v > 0)
                    .unwrap_or(secret.versions.len());
                match secret.versions.get(number.wrapping_sub(1)) {
                    None => errors(StatusCode::NOT_FOUND, &[]),
                    Some(version) => {
                        let metadata = version_metadata(secret, number);
                        if version.deletion_time.is_some() || version.destroyed {
                            let body = envelope(json!({ "data": null, "metadata": metadata }));
                            (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
                        } else {
                            let body = envelope(json!({
                                "data": version.data,
                                "metadata": metadata,
                            }));
                            (StatusCode::OK, axum::Json(body)).into_response()
                        }
                    }
                }
            }
            _ => errors(StatusCode::NOT_FOUND, &[]),
        }
    };
    twin.set_last_status(response.status());
    response
}

#[derive(Deserialize)]
struct WriteBody {
    data: Option<Map<String, Value>>,
    #[serde(default)]
    options: WriteOptions,
}

#[derive(Deserialize, Default)]
struct WriteOptions {
    cas: Option<usize>,
}

async fn write_secret(
    State(twin): State<VaultTwin>,
    method: Method,
    Path((mount, path)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let api_path = format!("{mount}/data/{path}");
    if let Err(refusal) = twin.admit(&method, &api_path, &headers, true) {
        return *refusal;
    }
    let response = match serde_json::from_slice::<WriteBody>(&body) {
        Err(_) => errors(StatusCode::BAD_REQUEST, &["error parsing JSON"]),
        Ok(WriteBody { data: None, .. }) => errors(StatusCode::BAD_REQUEST, &["no data provided"]),
        Ok(WriteBody {
            data: Some(data),
            options,
        }) => {
            let mut state = twin.lock();
            let secret = state.secrets.entry((mount, path)).or_default();
            match options.cas {
                Some(cas) if cas != secret.versions.len() => errors(
                    StatusCode::BAD_REQUEST,
                    &["check-and-set parameter did not match the current version"],
                ),
                _ => {
                    secret.versions.push(Version {
                        data,
                        created_time: Utc::now(),
                        deletion_time: None,
                        destroyed: false,
                    });
                    let metadata = version_metadata(secret, secret.versions.len());
                    (StatusCode::OK, axum::Json(envelope(metadata))).into_response()
                }
            }
        }
    };
    twin.set_last_status(response.status());
    response
}

/// `X-Vault-Wrap-TTL`: whole seconds, or a duration such as `90s`, `10m`, `1h`.
fn wrap_ttl_s(headers: &HeaderMap) -> Option<u64> {
    let raw = headers.get("x-vault-wrap-ttl")?.to_str().ok()?.trim();
    let (number, unit) = match raw.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => raw.split_at(i),
        None => (raw, "s"),
    };
    let n: u64 = number.parse().ok()?;
    let unit_s = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return None,
    };
    n.checked_mul(unit_s).filter(|ttl| *ttl > 0)
}

/// `POST /v1/sys/wrapping/wrap`: the body (a JSON object) is kept under a fresh single-use
/// token for the TTL the header asks; the answer carries `data: null` and the `wrap_info`.
async fn wrap(
    State(twin): State<VaultTwin>,
    method: Method,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let api_path = "sys/wrapping/wrap";
    let mut state = twin.lock();
    let known = token_of(&headers).is_some_and(|t| state.tokens.contains_key(&t));
    let response = if state.sealed {
        errors(StatusCode::SERVICE_UNAVAILABLE, &["Vault is sealed"])
    } else if !known {
        errors(StatusCode::FORBIDDEN, &["permission denied"])
    } else {
        match (
            wrap_ttl_s(&headers),
            serde_json::from_slice::<Map<String, Value>>(&body),
        ) {
            (None, _) => errors(
                StatusCode::BAD_REQUEST,
                &["wrapping requested but no valid X-Vault-Wrap-TTL given"],
            ),
            (_, Err(_)) => errors(StatusCode::BAD_REQUEST, &["error parsing JSON"]),
            (Some(ttl), Ok(data)) => {
                let token = format!("hvs.{}", request_id().replace('-', ""));
                let now = Utc::now();
                state.wrapped.insert(
                    token.clone(),
                    Wrapped {
                        data,
                        expires_at: now + chrono::Duration::seconds(ttl as i64),
                        ttl_s: ttl,
                    },
                );
                state.wrapping_tokens.push(token.clone());
                let mut answer: Value =
                    serde_json::from_str(WRAP_TEMPLATE).expect("the fixture is JSON");
                answer["request_id"] = json!(request_id());
                answer["wrap_info"]["token"] = json!(token);
                answer["wrap_info"]["ttl"] = json!(ttl);
                answer["wrap_info"]["creation_time"] = json!(timestamp(&now));
                (StatusCode::OK, axum::Json(answer)).into_response()
            }
        }
    };
    state.requests.push(VaultRequest {
        method: method.to_string(),
        path: api_path.to_string(),
        namespace: None,
        status: response.status().as_u16(),
        request_header: has_request_header(&headers),
    });
    response
}

/// `POST /v1/sys/capabilities-self` with `{"paths": [...]}`, which every token may ask as
/// Vault's `default` policy allows: per path `["root"]` for a root token, `["read"]` where a
/// read-only policy names the path, else `["deny"]`; at the top level and under `data`, as
/// Vault answers, plus `capabilities` when one path was asked.
async fn capabilities_self(
    State(twin): State<VaultTwin>,
    method: Method,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let mut state = twin.lock();
    let policy = token_of(&headers).and_then(|t| state.tokens.get(&t).cloned());
    let paths = serde_json::from_slice::<Value>(&body).ok().and_then(|v| {
        v["paths"].as_array().map(|paths| {
            paths
                .iter()
                .filter_map(|p| p.as_str().map(str::to_string))
                .collect::<Vec<_>>()
        })
    });
    let response = match (state.sealed, policy, paths) {
        (true, _, _) => errors(StatusCode::SERVICE_UNAVAILABLE, &["Vault is sealed"]),
        (_, None, _) => errors(StatusCode::FORBIDDEN, &["permission denied"]),
        (_, _, None) => errors(
            StatusCode::BAD_REQUEST,
            &["missing required 'paths' parameter"],
        ),
        (_, Some(policy), Some(paths)) => {
            let mut data = Map::new();
            for path in &paths {
                let capabilities = match &policy {
                    VaultPolicy::Root => json!(["root"]),
                    p if p.allows(path, false) => json!(["read"]),
                    _ => json!(["deny"]),
                };
                data.insert(path.clone(), capabilities);
            }
            if paths.len() == 1 {
                data.insert("capabilities".into(), data[&paths[0]].clone());
            }
            let mut answer = envelope(Value::Object(data.clone()));
            for (key, value) in data {
                answer[key] = value;
            }
            (StatusCode::OK, axum::Json(answer)).into_response()
        }
    };
    state.requests.push(VaultRequest {
        method: method.to_string(),
        path: "sys/capabilities-self".into(),
        namespace: None,
        status: response.status().as_u16(),
        request_header: has_request_header(&headers),
    });
    response
}

/// `POST /v1/sys/wrapping/unwrap`: with the wrapping token as `X-Vault-Token` and no body,
/// or another valid token and `{"token": …}`, never both. The first unwrap answers the
/// wrapped object as `data`; every later one, and an expired token, 400.
async fn unwrap(
    State(twin): State<VaultTwin>,
    method: Method,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let mut state = twin.lock();
    let header_token = token_of(&headers);
    let body_token = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|b| b["token"].as_str().map(str::to_string));
    let wrapping_token = match (&header_token, body_token) {
        // Another token authenticates the call; the body names the wrapping token.
        (Some(caller), Some(named)) if state.tokens.contains_key(caller) => Some(named),
        // The wrapping token itself as `X-Vault-Token`, and a body too: Vault spends the
        // token on the call and the wrapped value is lost.
        (Some(header), Some(_)) => {
            state.wrapped.remove(header);
            None
        }
        (header, None) => header.clone(),
        (None, Some(_)) => None,
    };
    let now = Utc::now();
    let response = match wrapping_token.and_then(|t| state.wrapped.remove(&t)) {
        Some(wrapped) if wrapped.expires_at > now => (
            StatusCode::OK,
            axum::Json(envelope(Value::Object(wrapped.data))),
        )
            .into_response(),
        _ => errors(StatusCode::BAD_REQUEST, &[WRAPPING_TOKEN_INVALID]),
    };
    state.requests.push(VaultRequest {
        method: method.to_string(),
        path: "sys/wrapping/unwrap".to_string(),
        namespace: None,
        status: response.status().as_u16(),
        request_header: has_request_header(&headers),
    });
    response
}

async fn no_handler(
    State(twin): State<VaultTwin>,
    method: Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let path = uri.path().trim_start_matches("/v1/").to_string();
    let mut state = twin.lock();
    state.requests.push(VaultRequest {
        method: method.to_string(),
        path: path.clone(),
        namespace: None,
        status: 404,
        request_header: has_request_header(&headers),
    });
    errors(
        StatusCode::NOT_FOUND,
        &[&format!(
            "no handler for route {path:?}. route entry not found."
        )],
    )
}
