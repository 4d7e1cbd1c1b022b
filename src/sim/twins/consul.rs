//! Twin of Consul's KV HTTP API: `GET`, `PUT` and `DELETE /v1/kv/{key}`, with blocking
//! queries, ACL tokens and an outage switch.
//!
//! Shapes follow Consul's docs and `agent/kvs_endpoint.go`: reads return a JSON array even for
//! one key with base64 `Value` (`null` when empty) and `Session` only while a lock is held;
//! a missing key is a 404 with an empty body that still carries `X-Consul-Index`, so that a
//! blocking read can wait for a key to appear; ACL refusals are 403 with a plain-text reason.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use rand::Rng;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

/// Consul's default and longest blocking wait (`agent/http.go`).
pub const BLOCKING_WAIT_DEFAULT: Duration = Duration::from_secs(5 * 60);
pub const BLOCKING_WAIT_MAX: Duration = Duration::from_secs(10 * 60);
/// Consul's default `kv_max_value_size`.
pub const VALUE_SIZE_MAX_BYTES: usize = 512 * 1024;

/// A handle on the twin's state; clones share it.
#[derive(Clone)]
pub struct ConsulTwin {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<KvState>,
    /// Bumped on every write so that blocked readers look again.
    writes: watch::Sender<u64>,
    /// How many reads are blocked right now, so tests can act once a read waits.
    blocked_reads: watch::Sender<usize>,
}

#[derive(Default)]
struct KvState {
    entries: BTreeMap<String, Entry>,
    /// The KV table's raft index: the index of the last write, deletes included.
    index: u64,
    /// With a token, ACLs are on with default policy `deny` and only this token may read
    /// and write.
    token: Option<String>,
    unavailable: bool,
}

#[derive(Clone)]
struct Entry {
    create_index: u64,
    modify_index: u64,
    lock_index: u64,
    flags: u64,
    value: Vec<u8>,
    session: Option<String>,
}

impl KvState {
    fn bump(&mut self) -> u64 {
        self.index += 1;
        self.index
    }

    fn put(&mut self, key: &str, value: Vec<u8>, flags: Option<u64>) -> u64 {
        let index = self.bump();
        let entry = self.entries.entry(key.to_string()).or_insert(Entry {
            create_index: index,
            modify_index: index,
            lock_index: 0,
            flags: 0,
            value: Vec::new(),
            session: None,
        });
        entry.modify_index = index;
        entry.value = value;
        if let Some(flags) = flags {
            entry.flags = flags;
        }
        index
    }

    /// The index a read of `key` reports: the entry's ModifyIndex, or for a missing key the
    /// table index (at least 1, as Consul never reports 0).
    fn read_index(&self, key: &str, recurse: bool) -> u64 {
        let index = if recurse {
            self.index
        } else {
            self.entries
                .get(key)
                .map(|e| e.modify_index)
                .unwrap_or(self.index)
        };
        index.max(1)
    }
}

impl Default for ConsulTwin {
    fn default() -> Self {
        ConsulTwin::new()
    }
}

impl ConsulTwin {
    /// A twin with ACLs off (default policy `allow`).
    pub fn new() -> ConsulTwin {
        ConsulTwin {
            shared: Arc::new(Shared {
                state: Mutex::new(KvState::default()),
                writes: watch::channel(0).0,
                blocked_reads: watch::channel(0).0,
            }),
        }
    }

    /// A twin with ACLs on: only requests carrying `token` are allowed.
    pub fn with_token(token: &str) -> ConsulTwin {
        let twin = ConsulTwin::new();
        twin.state().token = Some(token.to_string());
        twin
    }

    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/kv/{*key}", get(read).put(write).delete(remove))
            .with_state(self.clone())
    }

    fn state(&self) -> MutexGuard<'_, KvState> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify_write(&self, index: u64) {
        self.shared.writes.send_replace(index);
    }

    /// Writes `key` as a `PUT` would; returns its new ModifyIndex.
    pub fn set(&self, key: &str, value: impl Into<Vec<u8>>) -> u64 {
        let index = self.state().put(key, value.into(), None);
        self.notify_write(index);
        index
    }

    /// Deletes `key`; false when it did not exist (the index moves anyway, as in Consul).
    pub fn delete(&self, key: &str) -> bool {
        let (existed, index) = {
            let mut state = self.state();
            let existed = state.entries.remove(key).is_some();
            (existed, state.bump())
        };
        self.notify_write(index);
        existed
    }

    /// Marks `key` as locked by `session` (as a successful `?acquire=` does), or unlocks it.
    pub fn set_session(&self, key: &str, session: Option<&str>) {
        let index = {
            let mut state = self.state();
            let index = state.bump();
            if let Some(entry) = state.entries.get_mut(key) {
                entry.modify_index = index;
                if session.is_some() {
                    entry.lock_index += 1;
                }
                entry.session = session.map(str::to_string);
            }
            index
        };
        self.notify_write(index);
    }

    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.state().entries.get(key).map(|e| e.value.clone())
    }

    /// The KV table index (of the last write).
    pub fn index(&self) -> u64 {
        self.state().index
    }

    /// While set, every request fails with 500 `No cluster leader`.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.state().unavailable = unavailable;
    }

    /// Waits until at least `count` reads are blocked waiting for a change.
    pub async fn blocked_reads_at_least(&self, count: usize) {
        let mut rx = self.shared.blocked_reads.subscribe();
        let _ = rx.wait_for(|n| *n >= count).await;
    }
}

/// Counts a blocked read for as long as it waits, even when the client goes away.
struct BlockedRead<'a>(&'a watch::Sender<usize>);

impl<'a> BlockedRead<'a> {
    fn enter(counter: &'a watch::Sender<usize>) -> BlockedRead<'a> {
        counter.send_modify(|n| *n += 1);
        BlockedRead(counter)
    }
}

impl Drop for BlockedRead<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

fn query_pairs(raw: &Option<String>) -> BTreeMap<String, String> {
    url::form_urlencoded::parse(raw.as_deref().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

fn acl_policy(state: &KvState) -> &'static str {
    if state.token.is_some() {
        "deny"
    } else {
        "allow"
    }
}

fn text(status: StatusCode, policy: &'static str, body: impl Into<String>) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        "X-Consul-Default-ACL-Policy",
        HeaderValue::from_static(policy),
    );
    (status, headers, body.into()).into_response()
}

/// Refuses the request when the twin is down or the token does not match; Consul checks the
/// ACL before looking the key up, so a forbidden read of a missing key is a 403, not a 404.
fn refuse(state: &KvState, headers: &HeaderMap) -> Option<Response> {
    let policy = acl_policy(state);
    if state.unavailable {
        return Some(text(
            StatusCode::INTERNAL_SERVER_ERROR,
            policy,
            "No cluster leader",
        ));
    }
    let expected = state.token.as_deref()?;
    let presented = headers
        .get("X-Consul-Token")
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty());
    match presented {
        Some(token) if token == expected => None,
        // Consul resolves an unknown secret to "ACL not found"; no token means the anonymous
        // token, which the default-deny policy refuses.
        Some(_) => Some(text(StatusCode::FORBIDDEN, policy, "ACL not found")),
        None => Some(text(StatusCode::FORBIDDEN, policy, "Permission denied")),
    }
}

/// Parses a Go duration string (`time.ParseDuration`): `300ms`, `5s`, `1m30s`, `1.5h`.
pub fn parse_go_duration(raw: &str) -> Option<Duration> {
    if raw == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = raw;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * seconds_per_unit;
    }
    Duration::try_from_secs_f64(total).ok()
}

fn entry_json(key: &str, entry: &Entry) -> serde_json::Value {
    let mut object = json!({
        "CreateIndex": entry.create_index,
        "ModifyIndex": entry.modify_index,
        "LockIndex": entry.lock_index,
        "Key": key,
        "Flags": entry.flags,
        "Value": if entry.value.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::Value::String(BASE64.encode(&entry.value))
        },
    });
    if let Some(session) = &entry.session {
        object["Session"] = json!(session);
    }
    object
}

async fn read(
    State(twin): State<ConsulTwin>,
    Path(key): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let query = query_pairs(&query);
    let recurse = query.contains_key("recurse");
    let raw = query.contains_key("raw");
    if query.contains_key("keys") {
        return text(
            StatusCode::BAD_REQUEST,
            acl_policy(&twin.state()),
            "runner-scaler twin: ?keys is not implemented",
        );
    }
    let wanted_index = match query.get("index").map(|i| i.parse::<u64>()) {
        None => 0,
        Some(Ok(index)) => index,
        Some(Err(_)) => {
            return text(
                StatusCode::BAD_REQUEST,
                acl_policy(&twin.state()),
                "Invalid index",
            );
        }
    };
    let wait = match query.get("wait").map(|w| parse_go_duration(w)) {
        None => BLOCKING_WAIT_DEFAULT,
        Some(Some(wait)) if wait.is_zero() => BLOCKING_WAIT_DEFAULT,
        Some(Some(wait)) => wait.min(BLOCKING_WAIT_MAX),
        Some(None) => {
            return text(
                StatusCode::BAD_REQUEST,
                acl_policy(&twin.state()),
                "Invalid wait time",
            );
        }
    };
    if let Some(refusal) = refuse(&twin.state(), &headers) {
        return refusal;
    }

    // Consul adds up to wait/16 of jitter so that many blocked clients do not return at once.
    let jitter_ms = rand::rng().random_range(0..=(wait / 16).as_millis() as u64);
    let deadline = Instant::now() + wait + Duration::from_millis(jitter_ms);
    let mut writes = twin.shared.writes.subscribe();
    let mut blocked = None;
    loop {
        writes.mark_unchanged();
        let index = twin.state().read_index(&key, recurse);
        if wanted_index == 0 || index > wanted_index || Instant::now() >= deadline {
            break;
        }
        blocked.get_or_insert_with(|| BlockedRead::enter(&twin.shared.blocked_reads));
        tokio::select! {
            _ = writes.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
    drop(blocked);

    let state = twin.state();
    // An outage that began while the read was blocked fails it, as a real one would.
    if state.unavailable {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            acl_policy(&state),
            "No cluster leader",
        );
    }
    let index = state.read_index(&key, recurse);
    let mut headers = HeaderMap::new();
    headers.insert("X-Consul-Index", HeaderValue::from(index));
    headers.insert("X-Consul-KnownLeader", HeaderValue::from_static("true"));
    headers.insert("X-Consul-LastContact", HeaderValue::from_static("0"));
    headers.insert(
        "X-Consul-Effective-Consistency",
        HeaderValue::from_static("leader"),
    );
    headers.insert(
        "X-Consul-Default-ACL-Policy",
        HeaderValue::from_static(acl_policy(&state)),
    );
    let found: Vec<(&String, &Entry)> = if recurse {
        state
            .entries
            .range(key.clone()..)
            .take_while(|(k, _)| k.starts_with(&key))
            .collect()
    } else {
        state.entries.get_key_value(&key).into_iter().collect()
    };
    if found.is_empty() {
        return (StatusCode::NOT_FOUND, headers).into_response();
    }
    if raw {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        headers.insert(
            "X-Content-Type-Options",
            HeaderValue::from_static("nosniff"),
        );
        headers.insert(
            "Content-Security-Policy",
            HeaderValue::from_static("sandbox"),
        );
        return (StatusCode::OK, headers, found[0].1.value.clone()).into_response();
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let body: Vec<serde_json::Value> = found.iter().map(|(k, e)| entry_json(k, e)).collect();
    (
        StatusCode::OK,
        headers,
        serde_json::to_vec(&body).unwrap_or_default(),
    )
        .into_response()
}

fn json_bool(policy: &'static str, value: bool) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        "X-Consul-Default-ACL-Policy",
        HeaderValue::from_static(policy),
    );
    (StatusCode::OK, headers, value.to_string()).into_response()
}

async fn write(
    State(twin): State<ConsulTwin>,
    Path(key): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let query = query_pairs(&query);
    let (result, index) = {
        let mut state = twin.state();
        if let Some(refusal) = refuse(&state, &headers) {
            return refusal;
        }
        let policy = acl_policy(&state);
        if query.contains_key("acquire") || query.contains_key("release") {
            return text(
                StatusCode::BAD_REQUEST,
                policy,
                "runner-scaler twin: ?acquire and ?release are not implemented",
            );
        }
        if body.len() > VALUE_SIZE_MAX_BYTES {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                policy,
                format!(
                    "Request body({} bytes) too large, max size: {VALUE_SIZE_MAX_BYTES} bytes. See https://developer.hashicorp.com/docs/agent/config/config-files#kv_max_value_size.",
                    body.len()
                ),
            );
        }
        let flags = match query.get("flags").map(|f| f.parse::<u64>()) {
            None => None,
            Some(Ok(flags)) => Some(flags),
            Some(Err(_)) => return text(StatusCode::BAD_REQUEST, policy, "Invalid flags"),
        };
        if let Some(cas) = query.get("cas") {
            let Ok(cas) = cas.parse::<u64>() else {
                return text(StatusCode::BAD_REQUEST, policy, "Invalid cas index");
            };
            // cas=0 writes only a new key; otherwise only over that exact ModifyIndex.
            let current = state.entries.get(&key).map(|e| e.modify_index);
            let matches = match current {
                None => cas == 0,
                Some(modify_index) => cas == modify_index,
            };
            if !matches {
                return json_bool(policy, false);
            }
        }
        let index = state.put(&key, body.to_vec(), flags);
        (json_bool(policy, true), index)
    };
    twin.notify_write(index);
    result
}

async fn remove(
    State(twin): State<ConsulTwin>,
    Path(key): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let query = query_pairs(&query);
    let (result, index) = {
        let mut state = twin.state();
        if let Some(refusal) = refuse(&state, &headers) {
            return refusal;
        }
        let policy = acl_policy(&state);
        if query.contains_key("recurse") {
            state.entries.retain(|k, _| !k.starts_with(&key));
        } else {
            state.entries.remove(&key);
        }
        (json_bool(policy, true), state.bump())
    };
    twin.notify_write(index);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_like_go() {
        let cases = [
            ("5s", Some(Duration::from_secs(5))),
            ("5m", Some(Duration::from_secs(300))),
            ("1m30s", Some(Duration::from_secs(90))),
            ("250ms", Some(Duration::from_millis(250))),
            ("1.5h", Some(Duration::from_secs(5400))),
            ("0", Some(Duration::ZERO)),
            ("", None),
            ("5", None),
            ("5x", None),
            ("s", None),
        ];
        for (raw, want) in cases {
            assert_eq!(parse_go_duration(raw), want, "{raw:?}");
        }
    }
}
