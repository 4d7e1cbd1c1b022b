//! The twin as the leader lock's [`LockStore`], without HTTP: the store's own operations
//! called directly, so the lock runs on tokio's paused clock in tests (a paused clock and real
//! sockets do not mix), with the same partition and outage switches as the endpoints.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use tokio::time::Instant;

use super::ConsulTwin;
use super::kv::BLOCKING_WAIT_MAX;
use super::store::LockEvent;
use crate::clients::consul_lock::duration_string;
use crate::leader::{LockError, LockKey, LockStore, SessionId, SessionRequest};
use crate::model::ErrorClass;
use crate::observe::PortError;

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

    async fn release(
        &self,
        key: &str,
        session: &SessionId,
        value: &[u8],
    ) -> Result<bool, LockError> {
        self.gate().await?;
        let released = self
            .twin
            .state()
            .release(key, &session.0, value.to_vec(), None);
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
