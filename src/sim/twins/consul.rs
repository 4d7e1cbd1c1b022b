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
//!
//! # Layout
//!
//! This file holds the [`ConsulTwin`] handle and what tests set and read through it. `store`
//! is the KV table, the sessions and the locks; `kv` and `sessions` are the HTTP endpoints
//! over it, `http` what they share; `twin_lock` is the same store as a [`LockStore`] without
//! HTTP; `go_duration` reads and prints Go's durations.
//!
//! [`LockStore`]: crate::leader::LockStore

mod go_duration;
mod http;
mod kv;
mod sessions;
mod store;
mod twin_lock;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::http::HeaderMap;
use axum::routing::{get, put};
use tokio::sync::watch;
use tokio::time::Instant;

pub use go_duration::{go_duration_string, parse_go_duration};
use http::presented_token;
pub use kv::{BLOCKING_WAIT_DEFAULT, BLOCKING_WAIT_MAX, VALUE_SIZE_MAX_BYTES};
use kv::{read, remove, write};
use sessions::{session_create, session_destroy, session_info, session_renew};
use store::KvState;
pub use store::{
    LOCK_DELAY_DEFAULT, LOCK_DELAY_MAX, LockEvent, SESSION_TTL_MAX, SESSION_TTL_MIN_DEFAULT,
};
pub use twin_lock::TwinLock;

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
