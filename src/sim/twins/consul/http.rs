//! What every endpoint of the twin shares: the outage and ACL checks in Consul's order, the
//! token a request presents, its query, and Consul's plain-text and JSON replies with the
//! `X-Consul-Default-ACL-Policy` header.

use std::collections::BTreeMap;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::store::KvState;

pub(super) fn query_pairs(raw: &Option<String>) -> BTreeMap<String, String> {
    url::form_urlencoded::parse(raw.as_deref().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

pub(super) fn acl_policy(state: &KvState) -> &'static str {
    if state.token.is_some() {
        "deny"
    } else {
        "allow"
    }
}

pub(super) fn text(status: StatusCode, policy: &'static str, body: impl Into<String>) -> Response {
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
pub(super) fn refuse(state: &KvState, headers: &HeaderMap) -> Option<Response> {
    let policy = acl_policy(state);
    if state.unavailable {
        return Some(text(
            StatusCode::INTERNAL_SERVER_ERROR,
            policy,
            "No cluster leader",
        ));
    }
    let expected = state.token.as_deref()?;
    match presented_token(headers) {
        Some(token) if token == expected || state.more_tokens.contains(token) => None,
        // Consul resolves an unknown secret to "ACL not found"; no token means the anonymous
        // token, which the default-deny policy refuses.
        Some(_) => Some(text(StatusCode::FORBIDDEN, policy, "ACL not found")),
        None => Some(text(StatusCode::FORBIDDEN, policy, "Permission denied")),
    }
}

/// `X-Consul-Token`, or a Bearer `Authorization`.
pub(super) fn presented_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("X-Consul-Token")
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

pub(super) fn json_bool(policy: &'static str, value: bool) -> Response {
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

pub(super) fn json_body(policy: &'static str, body: serde_json::Value) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        "X-Consul-Default-ACL-Policy",
        HeaderValue::from_static(policy),
    );
    (StatusCode::OK, headers, body.to_string()).into_response()
}
