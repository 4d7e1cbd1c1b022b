//! Consul's state store as the twin keeps it: the KV table and its raft index, the sessions
//! with their TTLs and lock delays, and the lock operations on keys (`?acquire=`,
//! `?release=`, invalidation on destroy or expiry). Both the HTTP endpoints and [`TwinLock`]
//! (without HTTP) change the twin only through here.
//!
//! [`TwinLock`]: super::TwinLock

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;
use tokio::time::Instant;

use super::go_duration::{go_duration_string, parse_go_duration};

/// Consul's default `session_ttl_min` and its fixed `SessionTTLMax`.
pub const SESSION_TTL_MIN_DEFAULT: Duration = Duration::from_secs(10);
pub const SESSION_TTL_MAX: Duration = Duration::from_secs(24 * 3600);
/// Consul's default `LockDelay` of a session that names none.
pub const LOCK_DELAY_DEFAULT: Duration = Duration::from_secs(15);
/// Consul caps `LockDelay` at 60 s.
pub const LOCK_DELAY_MAX: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(super) struct KvState {
    pub(super) entries: BTreeMap<String, Entry>,
    /// The KV table's raft index: the index of the last write, deletes included.
    pub(super) index: u64,
    /// With a token, ACLs are on with default policy `deny` and only this token may read
    /// and write.
    pub(super) token: Option<String>,
    /// Further tokens accepted while ACLs are on (one per daemon of a test).
    pub(super) more_tokens: BTreeSet<String>,
    pub(super) unavailable: bool,
    /// Requests presenting one of these tokens never get an answer, as if the network
    /// between that daemon and Consul dropped them.
    pub(super) partitioned: BTreeSet<String>,
    pub(super) sessions: BTreeMap<String, Session>,
    /// Keys whose lock cannot be acquired until then (after an invalidation).
    lock_delays: BTreeMap<String, Instant>,
    pub(super) session_ttl_min: Option<Duration>,
    sessions_created: u64,
    /// Session operations in order, for tests.
    pub(super) lock_events: Vec<LockEvent>,
}

#[derive(Clone, Debug)]
pub(super) struct Session {
    name: String,
    node: String,
    ttl: Duration,
    lock_delay: Duration,
    behavior: String,
    node_checks: Vec<String>,
    create_index: u64,
    expires_at: Instant,
    /// The token that created it, so tests can tell whose session holds a lock.
    pub(super) token: Option<String>,
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
pub(super) struct Entry {
    pub(super) create_index: u64,
    pub(super) modify_index: u64,
    pub(super) lock_index: u64,
    pub(super) flags: u64,
    pub(super) value: Vec<u8>,
    pub(super) session: Option<String>,
}

impl KvState {
    pub(super) fn bump(&mut self) -> u64 {
        self.index += 1;
        self.index
    }

    /// Ends `id` (destroy or expiry): its keys lose their lock and enter its lock delay.
    pub(super) fn invalidate(&mut self, id: &str, event: LockEvent) -> Option<u64> {
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
    pub(super) fn acquire(
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
    pub(super) fn release(
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
    pub(super) fn create_session(
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
    pub(super) fn renew_session(
        &mut self,
        id: &str,
    ) -> Result<(serde_json::Value, Instant), String> {
        let now = Instant::now();
        let Some(session) = self.sessions.get_mut(id).filter(|s| s.expires_at > now) else {
            return Err(format!("Session id '{id}' not found"));
        };
        session.expires_at = now + session.ttl;
        Ok((json!([session_json(id, session)]), session.expires_at))
    }

    /// Expires every session whose TTL ran out; the new index when any did.
    pub(super) fn expire_due(&mut self) -> Option<u64> {
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

    pub(super) fn put(&mut self, key: &str, value: Vec<u8>, flags: Option<u64>) -> u64 {
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
    pub(super) fn read_index(&self, key: &str, recurse: bool) -> u64 {
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

pub(super) fn session_json(id: &str, session: &Session) -> serde_json::Value {
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
