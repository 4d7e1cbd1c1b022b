//! The session endpoints the leader lock uses: `PUT /v1/session/create`, `renew/{id}` and
//! `destroy/{id}`, and `GET /v1/session/info/{id}`. Each create and renew schedules the
//! session's expiry on tokio's clock.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::json;

use super::ConsulTwin;
use super::http::{acl_policy, json_body, json_bool, presented_token, refuse, text};
use super::store::{LockEvent, session_json};

pub(super) async fn session_create(
    State(twin): State<ConsulTwin>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    twin.partition_gate(&headers).await;
    let (response, expires_at) = {
        let mut state = twin.state();
        if let Some(refusal) = refuse(&state, &headers) {
            return refusal;
        }
        let policy = acl_policy(&state);
        let request: serde_json::Value = if body.iter().all(u8::is_ascii_whitespace) {
            json!({})
        } else {
            match serde_json::from_slice(&body) {
                Ok(value) => value,
                Err(e) => {
                    return text(
                        StatusCode::BAD_REQUEST,
                        policy,
                        format!("Request decode failed: {e}"),
                    );
                }
            }
        };
        let token = presented_token(&headers).map(str::to_string);
        match state.create_session(&request, token) {
            Ok((id, expires_at)) => (json_body(policy, json!({ "ID": id })), expires_at),
            Err((status, message)) => return text(status, policy, message),
        }
    };
    twin.schedule_expiry(expires_at);
    response
}

pub(super) async fn session_renew(
    State(twin): State<ConsulTwin>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    twin.partition_gate(&headers).await;
    let (response, expires_at) = {
        let mut state = twin.state();
        if let Some(refusal) = refuse(&state, &headers) {
            return refusal;
        }
        let policy = acl_policy(&state);
        match state.renew_session(&id) {
            Ok((body, expires_at)) => (json_body(policy, body), expires_at),
            Err(message) => return text(StatusCode::NOT_FOUND, policy, message),
        }
    };
    twin.schedule_expiry(expires_at);
    response
}

pub(super) async fn session_destroy(
    State(twin): State<ConsulTwin>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    twin.partition_gate(&headers).await;
    let (policy, index) = {
        let mut state = twin.state();
        if let Some(refusal) = refuse(&state, &headers) {
            return refusal;
        }
        let event = LockEvent::Destroyed {
            session: id.clone(),
        };
        (acl_policy(&state), state.invalidate(&id, event))
    };
    if let Some(index) = index {
        twin.notify_write(index);
    }
    // Idempotent: an unknown session is destroyed too.
    json_bool(policy, true)
}

pub(super) async fn session_info(
    State(twin): State<ConsulTwin>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    twin.partition_gate(&headers).await;
    let state = twin.state();
    if let Some(refusal) = refuse(&state, &headers) {
        return refusal;
    }
    let body: Vec<serde_json::Value> = state
        .sessions
        .get(&id)
        .map(|s| session_json(&id, s))
        .into_iter()
        .collect();
    let mut response = json_body(acl_policy(&state), json!(body));
    response
        .headers_mut()
        .insert("X-Consul-Index", HeaderValue::from(state.index.max(1)));
    response
}
