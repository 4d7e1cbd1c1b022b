//! The HTTP side of the twin: the gatekeeper every request passes first (recorded, then the
//! outage and ACL checks), query parameters read as Nomad's agent reads them, and the
//! endpoints: list jobs (with `filter` and paging), read a job, its allocations, dispatch,
//! stop and purge.

use std::collections::BTreeMap;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{Value, json};

use super::NomadTwin;
use super::dispatch::DispatchInput;
use super::filter::Filter;
use super::jobs::{DEFAULT_NAMESPACE, TwinJob};
use super::responses::{
    TwinRefusal, allocation_stub_json, deregister_reply_json, job_json, json_response,
    query_meta_headers, stub_json, text_response,
};
use super::state::{Deregistration, RecordedRequest};

/// Records every request, then plays outage and ACL checks before any endpoint runs.
pub(super) async fn gatekeeper(
    State(twin): State<NomadTwin>,
    request: Request,
    next: Next,
) -> Response {
    let refusal = {
        let mut state = twin.lock();
        state.requests.push(RecordedRequest {
            method: request.method().to_string(),
            path: request.uri().path().to_string(),
            query: request.uri().query().unwrap_or("").to_string(),
        });
        if state.unavailable {
            Some(TwinRefusal::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "No cluster leader",
            ))
        } else if let Some(expected) = &state.acl_token {
            match presented_token(request.headers()) {
                None => Some(TwinRefusal::new(StatusCode::FORBIDDEN, "Permission denied")),
                Some(token) if token != *expected => Some(TwinRefusal::new(
                    StatusCode::FORBIDDEN,
                    "ACL token not found",
                )),
                Some(_) => None,
            }
        } else {
            None
        }
    };
    match refusal {
        Some(refusal) => refusal.into_response(),
        None => next.run(request).await,
    }
}

/// The token of a request: `X-Nomad-Token` wins over `Authorization: Bearer`.
fn presented_token(headers: &HeaderMap) -> Option<String> {
    if let Some(token) = headers.get("X-Nomad-Token").and_then(|v| v.to_str().ok()) {
        return Some(token.to_string());
    }
    let authorization = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = authorization.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}

/// Go's `strconv.ParseBool`, which Nomad uses for boolean query parameters.
fn parse_go_bool(raw: &str) -> Option<bool> {
    match raw {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

fn param<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn namespace_of(pairs: &[(String, String)]) -> String {
    param(pairs, "namespace")
        .filter(|ns| !ns.is_empty())
        .unwrap_or(DEFAULT_NAMESPACE)
        .to_string()
}

/// `GET /v1/jobs`: `prefix`, `namespace` (`*` for all), `meta`, `filter` (the subset of
/// go-bexpr in [`filter`](super::filter)), `per_page`, `next_token`.
pub(super) async fn list_jobs(State(twin): State<NomadTwin>, request: Request) -> Response {
    let pairs = query_pairs(request.uri().query());
    let namespace = namespace_of(&pairs);
    let prefix = param(&pairs, "prefix").unwrap_or("");
    let with_meta = match param(&pairs, "meta") {
        None | Some("") => false,
        Some(raw) => match parse_go_bool(raw) {
            Some(value) => value,
            None => {
                return text_response(
                    StatusCode::BAD_REQUEST,
                    format!("Failed to parse value of \"meta\" ({raw})"),
                );
            }
        },
    };
    let per_page = match param(&pairs, "per_page").map(str::parse::<usize>) {
        None => None,
        Some(Ok(n)) if n > 0 => Some(n),
        Some(_) => {
            return text_response(StatusCode::BAD_REQUEST, "Failed to parse per_page");
        }
    };
    let next_token = param(&pairs, "next_token").unwrap_or("");
    // Nomad builds the evaluator before reading anything: a bad expression is a 400.
    let filter = match param(&pairs, "filter").filter(|f| !f.is_empty()) {
        None => None,
        Some(expression) => match Filter::parse(expression) {
            Ok(filter) => Some(filter),
            Err(reason) => {
                return text_response(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "failed to create result paginator: failed to read filter expression: {reason}"
                    ),
                );
            }
        },
    };

    let state = twin.lock();
    // Nomad iterates its job table in (namespace, id) order and filters before paging (on the
    // full job, not the stub: `Meta` is there without `meta=true`); the page token is
    // `<namespace>.<id>` of the first matching job of the next page (`NamespaceIDTokenizer`
    // in nomad/state/paginator: `.` is not allowed in a namespace name), whichever namespace
    // was asked for.
    let mut matching: Vec<&TwinJob> = Vec::new();
    for job in state
        .jobs
        .values()
        .filter(|job| namespace == "*" || job.namespace == namespace)
        .filter(|job| job.id.starts_with(prefix))
        .filter(|job| next_token.is_empty() || page_token(job).as_str() >= next_token)
    {
        match filter.as_ref().map_or(Ok(true), |f| f.matches(job)) {
            Ok(true) => matching.push(job),
            Ok(false) => {}
            Err(error) => {
                return text_response(
                    StatusCode::BAD_REQUEST,
                    format!("failed to read result page: {error}"),
                );
            }
        }
    }
    let (page, next) = match per_page {
        Some(n) if matching.len() > n => (&matching[..n], Some(page_token(matching[n]))),
        _ => (&matching[..], None),
    };
    let stubs: Vec<Value> = page
        .iter()
        .map(|job| stub_json(job, &state.jobs, with_meta))
        .collect();
    let mut headers = query_meta_headers(state.index);
    if let Some(next) = next
        && let Ok(value) = HeaderValue::from_str(&next)
    {
        headers.insert("X-Nomad-NextToken", value);
    }
    json_response(headers, Value::Array(stubs))
}

fn page_token(job: &TwinJob) -> String {
    format!("{}.{}", job.namespace, job.id)
}

/// Everything under `/v1/job/`: the job id may contain `/` (children do), arrive escaped as
/// `%2F` (axum decodes the captured path), and be followed by `/dispatch`.
pub(super) async fn job_path(
    State(twin): State<NomadTwin>,
    method: Method,
    Path(rest): Path<String>,
    request: Request,
) -> Response {
    let pairs = query_pairs(request.uri().query());
    let body = match axum::body::to_bytes(request.into_body(), 1 << 20).await {
        Ok(body) => body,
        Err(_) => return text_response(StatusCode::BAD_REQUEST, "Request body too large"),
    };
    // Nomad's agent routes on the suffix the same way, so a job literally named
    // `x/dispatch` cannot be read through this endpoint there either.
    if let Some(parent) = rest.strip_suffix("/dispatch") {
        return match method {
            Method::POST | Method::PUT => dispatch_endpoint(&twin, parent, &pairs, &body),
            _ => text_response(StatusCode::METHOD_NOT_ALLOWED, "Invalid method"),
        };
    }
    if let Some(job) = rest.strip_suffix("/allocations") {
        return match method {
            Method::GET => job_allocations(&twin, job, &pairs),
            _ => text_response(StatusCode::METHOD_NOT_ALLOWED, "Invalid method"),
        };
    }
    match method {
        Method::GET => read_job(&twin, &rest, &pairs),
        Method::DELETE => deregister_job(&twin, &rest, &pairs),
        _ => text_response(StatusCode::METHOD_NOT_ALLOWED, "Invalid method"),
    }
}

fn dispatch_endpoint(
    twin: &NomadTwin,
    parent: &str,
    pairs: &[(String, String)],
    body: &Bytes,
) -> Response {
    let namespace = namespace_of(pairs);
    let request: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(body) {
            Ok(value) => value,
            Err(e) => return text_response(StatusCode::BAD_REQUEST, e.to_string()),
        }
    };
    if let Some(job_id) = request.get("JobID").and_then(Value::as_str)
        && !job_id.is_empty()
        && job_id != parent
    {
        return text_response(StatusCode::BAD_REQUEST, "Job ID does not match");
    }
    let meta: BTreeMap<String, String> = match request.get("Meta") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(meta) => match serde_json::from_value(meta.clone()) {
            Ok(meta) => meta,
            Err(e) => return text_response(StatusCode::BAD_REQUEST, e.to_string()),
        },
    };
    let payload = match request.get("Payload").and_then(Value::as_str) {
        None => Vec::new(),
        Some(encoded) => match base64::engine::general_purpose::STANDARD.decode(encoded) {
            Ok(bytes) => bytes,
            Err(e) => return text_response(StatusCode::BAD_REQUEST, e.to_string()),
        },
    };
    let input = DispatchInput {
        meta,
        payload,
        idempotency_token: param(pairs, "idempotency_token").unwrap_or("").to_string(),
        id_prefix_template: request
            .get("IdPrefixTemplate")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
    };
    match twin.dispatch(&namespace, parent, input) {
        Ok(reply) => {
            let mut headers = HeaderMap::new();
            headers.insert("X-Nomad-Index", HeaderValue::from(reply.index));
            json_response(
                headers,
                json!({
                    "Index": reply.index,
                    "JobCreateIndex": reply.job_create_index,
                    "EvalCreateIndex": reply.eval_create_index,
                    "EvalID": reply.eval_id,
                    "DispatchedJobID": reply.dispatched_job_id,
                }),
            )
        }
        Err(refusal) => refusal.into_response(),
    }
}

fn read_job(twin: &NomadTwin, id: &str, pairs: &[(String, String)]) -> Response {
    let namespace = namespace_of(pairs);
    let state = twin.lock();
    match state.jobs.get(&(namespace, id.to_string())) {
        Some(job) => json_response(query_meta_headers(job.modify_index), job_json(job)),
        None => {
            let mut response = text_response(StatusCode::NOT_FOUND, "job not found");
            response
                .headers_mut()
                .extend(query_meta_headers(state.index));
            response
        }
    }
}

/// `GET /v1/job/{id}/allocations`: the job's allocation stubs; `[]` for an unknown job or
/// one never placed (Nomad answers no 404 here).
fn job_allocations(twin: &NomadTwin, id: &str, pairs: &[(String, String)]) -> Response {
    let namespace = namespace_of(pairs);
    let state = twin.lock();
    let stubs: Vec<Value> = state
        .jobs
        .get(&(namespace, id.to_string()))
        .and_then(|job| {
            job.allocation
                .as_ref()
                .map(|a| allocation_stub_json(job, a))
        })
        .into_iter()
        .collect();
    json_response(query_meta_headers(state.index), Value::Array(stubs))
}

fn deregister_job(twin: &NomadTwin, id: &str, pairs: &[(String, String)]) -> Response {
    let namespace = namespace_of(pairs);
    let purge = match param(pairs, "purge") {
        None | Some("") => false,
        Some(raw) => match parse_go_bool(raw) {
            Some(value) => value,
            None => {
                return text_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!(
                        "Failed to parse value of \"purge\" ({raw}) as a bool: strconv.ParseBool: parsing {raw:?}: invalid syntax"
                    ),
                );
            }
        },
    };
    let mut state = twin.lock();
    // Nomad checks the token's capability in the request's namespace before looking the job
    // up (`Job.Deregister`), so a refusal says nothing about whether the job exists.
    if state.deregister_denied.contains(&namespace) {
        return TwinRefusal::new(StatusCode::FORBIDDEN, "Permission denied").into_response();
    }
    let key = (namespace, id.to_string());
    let existing = state.jobs.get(&key).cloned();
    state.deregistrations.push(Deregistration {
        namespace: key.0.clone(),
        job_id: key.1.clone(),
        purge,
        existed: existing.is_some(),
        at: Instant::now(),
    });
    let Some(job) = existing else {
        // Deregistering an unknown job succeeds with zero-valued fields, and the index header
        // set from them like any other (`setIndex(resp, out.Index)` after the RPC).
        let mut headers = HeaderMap::new();
        headers.insert("X-Nomad-Index", HeaderValue::from_static("0"));
        return json_response(headers, deregister_reply_json("", 0, 0, 0));
    };
    let index = state.bump();
    if purge {
        // The twin drops the job's allocation with it; Nomad keeps terminal allocations until
        // garbage collection, but lists a purged job's allocations under no job the daemon
        // asks about again.
        state.jobs.remove(&key);
    } else {
        state.stop_job(&key, index);
    }
    // No evaluation for a parameterized (or periodic) parent; one for anything else.
    let (eval_id, eval_index) = if job.is_parameterized() {
        (String::new(), 0)
    } else {
        let eval_index = state.bump();
        (state.uuid(), eval_index)
    };
    let reply_index = eval_index.max(index);
    let mut headers = HeaderMap::new();
    headers.insert("X-Nomad-Index", HeaderValue::from(reply_index));
    json_response(
        headers,
        deregister_reply_json(&eval_id, eval_index, index, reply_index),
    )
}
