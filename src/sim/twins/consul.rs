//! Twin of Consul's KV HTTP API: `GET`, `PUT` and `DELETE /v1/kv/{key}`, with blocking
//! queries, ACL tokens and an outage switch; and of its sessions (`/v1/session/create`,
//! `renew`, `destroy`, `info`) with `?acquire=` and `?release=` on KV writes, for the leader
//! lock.
//!
//! Shapes follow Consul's docs and `agent/kvs_endpoint.go`: reads return a JSON array even for
//! one key with base64 `Value` (`null` when empty) and `Session` only while a lock is held;
//! a missing key is a 404 with an empty body that still carries `X-Consul-Index`, so that a
//! blocking read can wait for a key to appear; ACL refusals are 403 with a plain-text reason.
//!
//! Sessions (`agent/session_endpoint.go`, `agent/consul/session_endpoint.go`): a TTL outside
//! `[session_ttl_min, 24h]` is a 500 with Consul's own text; renewing an unknown or expired
//! session is a 404 `Session id '<id>' not found`; a session expires exactly one TTL after its
//! last renewal (Consul may take up to twice as long: the twin is the worst case for a holder
//! that stopped renewing, and the best case for a standby waiting on it). Its time is tokio's,
//! so a paused clock drives it. An invalidated session's keys are released and cannot be
//! acquired for its `LockDelay`; an explicit release before destroying starts no lock delay.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use rand::Rng;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::clients::consul_lock::duration_string;
use crate::leader::{LockError, LockKey, LockStore, SessionId, SessionRequest};
use crate::model::ErrorClass;
use crate::observe::PortError;

/// Consul's default and longest blocking wait (`agent/http.go`).
pub const BLOCKING_WAIT_DEFAULT: Duration = Duration::from_secs(5 * 60);
pub const BLOCKING_WAIT_MAX: Duration = Duration::from_secs(10 * 60);
/// Consul's default `kv_max_value_size`.
pub const VALUE_SIZE_MAX_BYTES: usize = 512 * 1024;
/// Consul's default `session_ttl_min` and its fixed `SessionTTLMax`.
pub const SESSION_TTL_MIN_DEFAULT: Duration = Duration::from_secs(10);
pub const SESSION_TTL_MAX: Duration = Duration::from_secs(24 * 3600);
/// Consul's default `LockDelay` of a session that names none.
pub const LOCK_DELAY_DEFAULT: Duration = Duration::from_secs(15);
/// Consul caps `LockDelay` at 60 s.
pub const LOCK_DELAY_MAX: Duration = Duration::from_secs(60);

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
    /// Further tokens accepted while ACLs are on (one per daemon of a test).
    more_tokens: BTreeSet<String>,
    unavailable: bool,
    /// Requests presenting one of these tokens never get an answer, as if the network
    /// between that daemon and Consul dropped them.
    partitioned: BTreeSet<String>,
    sessions: BTreeMap<String, Session>,
    /// Keys whose lock cannot be acquired until then (after an invalidation).
    lock_delays: BTreeMap<String, Instant>,
    session_ttl_min: Option<Duration>,
    sessions_created: u64,
    /// Session operations in order, for tests.
    lock_events: Vec<LockEvent>,
}

#[derive(Clone, Debug)]
struct Session {
    name: String,
    node: String,
    ttl: Duration,
    lock_delay: Duration,
    behavior: String,
    node_checks: Vec<String>,
    create_index: u64,
    expires_at: Instant,
    /// The token that created it, so tests can tell whose session holds a lock.
    token: Option<String>,
}

/// A session or lock operation the twin carried out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockEvent {
    Created {
        session: String,
    },
    Acquired {
        key: String,
        session: String,
    },
    Released {
        key: String,
        session: String,
    },
    Destroyed {
        session: String,
    },
    /// The TTL ran out.
    Expired {
        session: String,
    },
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

    /// Ends `id` (destroy or expiry): its keys lose their lock and enter its lock delay.
    fn invalidate(&mut self, id: &str, event: LockEvent) -> Option<u64> {
        let session = self.sessions.remove(id)?;
        self.lock_events.push(event);
        let index = self.bump();
        let held: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| e.session.as_deref() == Some(id))
            .map(|(k, _)| k.clone())
            .collect();
        let now = Instant::now();
        for key in held {
            if session.behavior == "delete" {
                self.entries.remove(&key);
            } else if let Some(entry) = self.entries.get_mut(&key) {
                entry.session = None;
                entry.modify_index = index;
            }
            if !session.lock_delay.is_zero() {
                self.lock_delays.insert(key, now + session.lock_delay);
            }
        }
        Some(index)
    }

    /// `?acquire=<session>` (`kvsLockTxn` in Consul's state store): `Ok(None)` is Consul's
    /// `false` (held by another session, or within a lock delay); an unknown session is an
    /// error (HTTP 500).
    fn acquire(
        &mut self,
        key: &str,
        session: &str,
        value: Vec<u8>,
        flags: Option<u64>,
    ) -> Result<Option<u64>, String> {
        if !self.sessions.contains_key(session) {
            return Err(format!("invalid session {session:?}"));
        }
        if self
            .lock_delays
            .get(key)
            .is_some_and(|until| Instant::now() < *until)
        {
            return Ok(None);
        }
        let held_by = self.entries.get(key).and_then(|e| e.session.clone());
        if held_by.as_deref().is_some_and(|other| other != session) {
            return Ok(None);
        }
        let index = self.put(key, value, flags);
        let entry = self.entries.get_mut(key).expect("just written");
        // Re-acquiring by the holder updates the value without counting a new acquisition.
        if held_by.is_none() {
            entry.lock_index += 1;
            entry.session = Some(session.to_string());
            self.lock_events.push(LockEvent::Acquired {
                key: key.to_string(),
                session: session.to_string(),
            });
        }
        Ok(Some(index))
    }

    /// `?release=<session>`: only the holding session releases; the value is written too.
    fn release(
        &mut self,
        key: &str,
        session: &str,
        value: Vec<u8>,
        flags: Option<u64>,
    ) -> Result<Option<u64>, String> {
        if !self.sessions.contains_key(session) {
            return Err(format!("invalid session {session:?}"));
        }
        let held_by = self.entries.get(key).and_then(|e| e.session.clone());
        if held_by.as_deref() != Some(session) {
            return Ok(None);
        }
        let index = self.put(key, value, flags);
        if let Some(entry) = self.entries.get_mut(key) {
            entry.session = None;
        }
        self.lock_events.push(LockEvent::Released {
            key: key.to_string(),
            session: session.to_string(),
        });
        Ok(Some(index))
    }

    /// `session/create` with a decoded body: the new id and when it expires, or Consul's
    /// status and text.
    fn create_session(
        &mut self,
        request: &serde_json::Value,
        token: Option<String>,
    ) -> Result<(String, Instant), (StatusCode, String)> {
        let ttl = match request.get("TTL").and_then(|t| t.as_str()) {
            None | Some("") => None,
            Some(raw) => match parse_go_duration(raw) {
                Some(ttl) => Some(ttl),
                None => {
                    return Err((
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("Session TTL '{raw}' invalid: time: invalid duration {raw:?}"),
                    ));
                }
            },
        };
        let ttl_min = self.session_ttl_min.unwrap_or(SESSION_TTL_MIN_DEFAULT);
        if let Some(ttl) = ttl
            && !ttl.is_zero()
            && (ttl < ttl_min || ttl > SESSION_TTL_MAX)
        {
            // agent/consul/session_endpoint.go: the TTL printed with %d (nanoseconds).
            return Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "Invalid Session TTL '{}', must be between [{}={}]",
                    ttl.as_nanos(),
                    go_duration_string(ttl_min),
                    go_duration_string(SESSION_TTL_MAX)
                ),
            ));
        }
        let lock_delay = match request.get("LockDelay") {
            None => LOCK_DELAY_DEFAULT,
            Some(value) => match lock_delay_of(value) {
                Some(delay) => delay.min(LOCK_DELAY_MAX),
                None => {
                    return Err((
                        StatusCode::BAD_REQUEST,
                        "Request decode failed: invalid LockDelay".to_string(),
                    ));
                }
            },
        };
        let behavior = request
            .get("Behavior")
            .and_then(|b| b.as_str())
            .unwrap_or("release")
            .to_string();
        if !matches!(behavior.as_str(), "release" | "delete") {
            return Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Invalid Behavior setting '{behavior}'"),
            ));
        }
        // Sending Checks or NodeChecks replaces the default serfHealth check.
        let checks = |field: &str| {
            request.get(field).map(|c| {
                c.as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default()
            })
        };
        let node_checks = match (checks("NodeChecks"), checks("Checks")) {
            (None, None) => vec!["serfHealth".to_string()],
            (node, legacy) => node.into_iter().chain(legacy).flatten().collect(),
        };
        self.sessions_created += 1;
        let id = format!("adf4238a-882b-4a9d-9ddc-{:012x}", self.sessions_created);
        let create_index = self.bump();
        // A session without a TTL never expires on its own.
        let ttl = ttl.unwrap_or(Duration::ZERO);
        let expires_at = if ttl.is_zero() {
            Instant::now() + SESSION_TTL_MAX * 365
        } else {
            Instant::now() + ttl
        };
        let text_field = |field: &str, default: &str| {
            request
                .get(field)
                .and_then(|n| n.as_str())
                .unwrap_or(default)
                .to_string()
        };
        let session = Session {
            name: text_field("Name", ""),
            node: text_field("Node", "twin-node"),
            ttl,
            lock_delay,
            behavior,
            node_checks,
            create_index,
            expires_at,
            token,
        };
        self.sessions.insert(id.clone(), session);
        self.lock_events.push(LockEvent::Created {
            session: id.clone(),
        });
        Ok((id, expires_at))
    }

    /// `session/renew`: the session as JSON and its new expiry, or Consul's 404 text.
    fn renew_session(&mut self, id: &str) -> Result<(serde_json::Value, Instant), String> {
        let now = Instant::now();
        let Some(session) = self.sessions.get_mut(id).filter(|s| s.expires_at > now) else {
            return Err(format!("Session id '{id}' not found"));
        };
        session.expires_at = now + session.ttl;
        Ok((json!([session_json(id, session)]), session.expires_at))
    }

    /// Expires every session whose TTL ran out; the new index when any did.
    fn expire_due(&mut self) -> Option<u64> {
        let now = Instant::now();
        let due: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.expires_at <= now)
            .map(|(id, _)| id.clone())
            .collect();
        due.into_iter()
            .filter_map(|id| {
                let event = LockEvent::Expired {
                    session: id.clone(),
                };
                self.invalidate(&id, event)
            })
            .max()
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
            .route("/v1/session/create", put(session_create))
            .route("/v1/session/renew/{id}", put(session_renew))
            .route("/v1/session/destroy/{id}", put(session_destroy))
            .route("/v1/session/info/{id}", get(session_info))
            .with_state(self.clone())
    }

    /// Accepts `token` too while ACLs are on.
    pub fn allow_token(&self, token: &str) {
        self.state().more_tokens.insert(token.to_string());
    }

    /// While set, requests presenting `token` hang unanswered (the client's timeout ends
    /// them), as if the network between that daemon and Consul were cut.
    pub fn set_partitioned(&self, token: &str, partitioned: bool) {
        let mut state = self.state();
        if partitioned {
            state.partitioned.insert(token.to_string());
        } else {
            state.partitioned.remove(token);
        }
    }

    /// Consul's `session_ttl_min` (default 10 s): tests lower it to run short TTLs.
    pub fn set_session_ttl_min(&self, min: Duration) {
        self.state().session_ttl_min = Some(min);
    }

    /// The session holding the lock on `key`, if any.
    pub fn lock_holder(&self, key: &str) -> Option<String> {
        self.state()
            .entries
            .get(key)
            .and_then(|e| e.session.clone())
    }

    /// The token that created the session holding `key`'s lock.
    pub fn lock_holder_token(&self, key: &str) -> Option<String> {
        let state = self.state();
        let session = state.entries.get(key)?.session.as_ref()?;
        state.sessions.get(session)?.token.clone()
    }

    /// Live sessions.
    pub fn sessions(&self) -> Vec<String> {
        self.state().sessions.keys().cloned().collect()
    }

    /// Session and lock operations so far, in order.
    pub fn lock_events(&self) -> Vec<LockEvent> {
        self.state().lock_events.clone()
    }

    /// Expires a session now, as Consul's reaper would once its TTL ran out.
    pub fn expire_session(&self, id: &str) -> bool {
        let index = self.state().invalidate(
            id,
            LockEvent::Expired {
                session: id.to_string(),
            },
        );
        if let Some(index) = index {
            self.notify_write(index);
        }
        index.is_some()
    }

    /// Expires the sessions due at `at` (and keeps doing so while the twin lives): run on
    /// every session create and renew.
    fn schedule_expiry(&self, at: Instant) {
        let weak = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let Some(shared) = weak.upgrade() else {
                return;
            };
            let twin = ConsulTwin { shared };
            let index = twin.state().expire_due();
            if let Some(index) = index {
                twin.notify_write(index);
            }
        });
    }

    /// Hangs forever when `headers` carry a partitioned token.
    async fn partition_gate(&self, headers: &HeaderMap) {
        let cut =
            presented_token(headers).is_some_and(|token| self.state().partitioned.contains(token));
        if cut {
            std::future::pending::<()>().await;
        }
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
    match presented_token(headers) {
        Some(token) if token == expected || state.more_tokens.contains(token) => None,
        // Consul resolves an unknown secret to "ACL not found"; no token means the anonymous
        // token, which the default-deny policy refuses.
        Some(_) => Some(text(StatusCode::FORBIDDEN, policy, "ACL not found")),
        None => Some(text(StatusCode::FORBIDDEN, policy, "Permission denied")),
    }
}

/// `X-Consul-Token`, or a Bearer `Authorization`.
fn presented_token(headers: &HeaderMap) -> Option<&str> {
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

async fn remove(
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

/// Go's `time.Duration.String()` for the durations a twin prints: `10s`, `24h0m0s`, `500ms`.
pub fn go_duration_string(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let total = d.as_secs();
    let (h, m, s) = (total / 3600, total / 60 % 60, total % 60);
    let millis = d.subsec_millis();
    let seconds = if millis == 0 {
        format!("{s}s")
    } else {
        format!("{s}.{}s", format!("{millis:03}").trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

/// `LockDelay` as Consul decodes it: a duration string, or a number of nanoseconds where
/// numbers below 1000 mean seconds.
fn lock_delay_of(value: &serde_json::Value) -> Option<Duration> {
    match value {
        serde_json::Value::String(raw) => parse_go_duration(raw),
        serde_json::Value::Number(n) => {
            let n = n.as_u64()?;
            Some(if n < 1000 {
                Duration::from_secs(n)
            } else {
                Duration::from_nanos(n)
            })
        }
        _ => None,
    }
}

fn session_json(id: &str, session: &Session) -> serde_json::Value {
    json!({
        "ID": id,
        "Name": session.name,
        "Node": session.node,
        "LockDelay": session.lock_delay.as_nanos() as u64,
        "Behavior": session.behavior,
        "TTL": go_duration_string(session.ttl),
        "NodeChecks": session.node_checks,
        "ServiceChecks": serde_json::Value::Null,
        "CreateIndex": session.create_index,
        "ModifyIndex": session.create_index,
    })
}

fn json_body(policy: &'static str, body: serde_json::Value) -> Response {
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

async fn session_create(
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

async fn session_renew(
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

async fn session_destroy(
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

async fn session_info(
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

/// The twin as a [`LockStore`] without HTTP: the handlers' own state changes, called
/// directly, so that the leader lock can be tested on a paused clock (tokio's paused clock
/// and real sockets do not mix). `token` names the daemon, as its `X-Consul-Token` would;
/// a partitioned token's calls never return.
pub struct TwinLock {
    pub twin: ConsulTwin,
    pub token: String,
}

impl TwinLock {
    async fn gate(&self) -> Result<(), LockError> {
        let (cut, down) = {
            let state = self.twin.state();
            (state.partitioned.contains(&self.token), state.unavailable)
        };
        if cut {
            std::future::pending::<()>().await;
        }
        if down {
            return Err(LockError::Port(PortError::new(
                ErrorClass::Transient,
                "Consul twin: 500: No cluster leader",
            )));
        }
        Ok(())
    }

    fn server_error(message: String) -> LockError {
        LockError::Port(PortError::new(
            ErrorClass::Transient,
            format!("Consul twin: 500: {message}"),
        ))
    }
}

#[async_trait]
impl LockStore for TwinLock {
    async fn create_session(&self, request: &SessionRequest) -> Result<SessionId, LockError> {
        self.gate().await?;
        let body = json!({
            "Name": request.name,
            "TTL": duration_string(request.ttl),
            "LockDelay": duration_string(request.lock_delay),
            "Behavior": "release",
            "Checks": [],
            "NodeChecks": [],
        });
        let created = self
            .twin
            .state()
            .create_session(&body, Some(self.token.clone()));
        match created {
            Ok((id, expires_at)) => {
                self.twin.schedule_expiry(expires_at);
                Ok(SessionId(id))
            }
            Err((_, message)) if message.contains("Invalid Session TTL") => {
                Err(LockError::TtlRefused(message))
            }
            Err((_, message)) => Err(Self::server_error(message)),
        }
    }

    async fn renew_session(&self, session: &SessionId) -> Result<(), LockError> {
        self.gate().await?;
        let renewed = self.twin.state().renew_session(&session.0);
        match renewed {
            Ok((_, expires_at)) => {
                self.twin.schedule_expiry(expires_at);
                Ok(())
            }
            Err(message) => Err(LockError::SessionGone(message)),
        }
    }

    async fn destroy_session(&self, session: &SessionId) -> Result<(), LockError> {
        self.gate().await?;
        let event = LockEvent::Destroyed {
            session: session.0.clone(),
        };
        let index = self.twin.state().invalidate(&session.0, event);
        if let Some(index) = index {
            self.twin.notify_write(index);
        }
        Ok(())
    }

    async fn acquire(
        &self,
        key: &str,
        session: &SessionId,
        value: &[u8],
    ) -> Result<bool, LockError> {
        self.gate().await?;
        let acquired = self
            .twin
            .state()
            .acquire(key, &session.0, value.to_vec(), None);
        match acquired {
            Err(message) => Err(Self::server_error(message)),
            Ok(None) => Ok(false),
            Ok(Some(index)) => {
                self.twin.notify_write(index);
                Ok(true)
            }
        }
    }

    async fn release(&self, key: &str, session: &SessionId) -> Result<bool, LockError> {
        self.gate().await?;
        let released = self.twin.state().release(key, &session.0, Vec::new(), None);
        match released {
            Err(message) => Err(Self::server_error(message)),
            Ok(None) => Ok(false),
            Ok(Some(index)) => {
                self.twin.notify_write(index);
                Ok(true)
            }
        }
    }

    async fn read_key(&self, key: &str, index: u64, wait: Duration) -> Result<LockKey, LockError> {
        self.gate().await?;
        let deadline = Instant::now() + wait.min(BLOCKING_WAIT_MAX);
        let mut writes = self.twin.shared.writes.subscribe();
        loop {
            writes.mark_unchanged();
            {
                let state = self.twin.state();
                let current = state.read_index(key, false);
                if index == 0 || current > index || Instant::now() >= deadline {
                    let entry = state.entries.get(key);
                    return Ok(LockKey {
                        index: current,
                        session: entry.and_then(|e| e.session.clone()),
                        value: entry.map(|e| e.value.clone()),
                    });
                }
            }
            tokio::select! {
                _ = writes.changed() => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
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

    #[test]
    fn durations_print_like_go() {
        let cases = [
            (Duration::from_secs(10), "10s"),
            (Duration::from_secs(24 * 3600), "24h0m0s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(500), "500ms"),
        ];
        for (d, want) in cases {
            assert_eq!(go_duration_string(d), want);
        }
    }
}
