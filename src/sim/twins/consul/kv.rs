//! The KV endpoints: `GET` (a blocking query when `?index=` is given, `?recurse`, `?raw`),
//! `PUT` (with `?cas=`, `?flags=`, and `?acquire=` or `?release=` for the leader lock) and
//! `DELETE /v1/kv/{key}`, with Consul's shapes, headers and limits.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use rand::Rng;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use super::ConsulTwin;
use super::go_duration::parse_go_duration;
use super::http::{acl_policy, json_bool, query_pairs, refuse, text};
use super::store::Entry;

/// Consul's default and longest blocking wait (`agent/http.go`).
pub const BLOCKING_WAIT_DEFAULT: Duration = Duration::from_secs(5 * 60);
pub const BLOCKING_WAIT_MAX: Duration = Duration::from_secs(10 * 60);
/// Consul's default `kv_max_value_size`.
pub const VALUE_SIZE_MAX_BYTES: usize = 512 * 1024;

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

pub(super) async fn read(
    State(twin): State<ConsulTwin>,
    Path(key): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    twin.partition_gate(&headers).await;
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

pub(super) async fn write(
    State(twin): State<ConsulTwin>,
    Path(key): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    twin.partition_gate(&headers).await;
    let query = query_pairs(&query);
    let (result, index) = {
        let mut state = twin.state();
        if let Some(refusal) = refuse(&state, &headers) {
            return refusal;
        }
        let policy = acl_policy(&state);
        let exclusive = ["cas", "acquire", "release"]
            .iter()
            .filter(|flag| query.contains_key(**flag))
            .count();
        if exclusive > 1 {
            return text(StatusCode::BAD_REQUEST, policy, "Conflicting flags");
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
        if let Some(session) = query.get("acquire") {
            return match state.acquire(&key, session, body.to_vec(), flags) {
                Err(message) => text(StatusCode::INTERNAL_SERVER_ERROR, policy, message),
                Ok(None) => json_bool(policy, false),
                Ok(Some(index)) => {
                    drop(state);
                    twin.notify_write(index);
                    json_bool(policy, true)
                }
            };
        }
        if let Some(session) = query.get("release") {
            return match state.release(&key, session, body.to_vec(), flags) {
                Err(message) => text(StatusCode::INTERNAL_SERVER_ERROR, policy, message),
                Ok(None) => json_bool(policy, false),
                Ok(Some(index)) => {
                    drop(state);
                    twin.notify_write(index);
                    json_bool(policy, true)
                }
            };
        }
        let index = state.put(&key, body.to_vec(), flags);
        (json_bool(policy, true), index)
    };
    twin.notify_write(index);
    result
}

pub(super) async fn remove(
    State(twin): State<ConsulTwin>,
    Path(key): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    twin.partition_gate(&headers).await;
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
