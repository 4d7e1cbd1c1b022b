//! The port the leader lock is taken through, and the words it uses: the session, the key
//! as read, what went wrong, and the holder's name the key's value carries. The real store
//! is Consul's (`clients::consul_lock`); the twins serve the same calls.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::model::PortError;

/// Who holds the lock, as this daemon says it and others show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// `hostname`, with the Nomad allocation when there is one.
    pub holder: String,
    pub pid: u32,
}

impl Holder {
    /// This process: the host name, `NOMAD_ALLOC_ID` when Nomad runs it, and the pid.
    pub fn of_this_process() -> Holder {
        let host = host_name().unwrap_or_else(|| "unknown-host".to_string());
        let holder = match std::env::var("NOMAD_ALLOC_ID") {
            Ok(alloc) if !alloc.trim().is_empty() => format!("{host} (alloc {})", alloc.trim()),
            _ => host,
        };
        Holder {
            holder,
            pid: std::process::id(),
        }
    }

    /// The lock key's value.
    pub fn to_value(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a holder serialises")
    }

    /// What another daemon wrote into the key, as a name; raw text when it is not ours.
    pub fn describe(value: &[u8]) -> String {
        match serde_json::from_slice::<Holder>(value) {
            Ok(holder) => holder.to_string(),
            Err(_) => {
                let text: String = String::from_utf8_lossy(value).chars().take(120).collect();
                text.escape_debug().to_string()
            }
        }
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} pid {}", self.holder, self.pid)
    }
}

fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success
    // when the name fits, and the last byte is kept 0 for the case it does not.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).trim().to_string();
    (!name.is_empty()).then_some(name)
}

/// A session id, as Consul returned it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionId(pub String);

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What `session/create` is asked for.
#[derive(Clone, Debug)]
pub struct SessionRequest {
    pub name: String,
    pub ttl: Duration,
    pub lock_delay: Duration,
}

/// The lock key as read.
#[derive(Clone, Debug, Default)]
pub struct LockKey {
    /// `X-Consul-Index` of the answer, for the next blocking read.
    pub index: u64,
    /// The session holding the lock.
    pub session: Option<String>,
    pub value: Option<Vec<u8>>,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The session is unknown to Consul (expired, destroyed): renew answered 404.
    #[error("{0}")]
    SessionGone(String),
    /// Consul refused the session's TTL (below `session_ttl_min`): a setting to fix, not a
    /// transient failure.
    #[error("{0}")]
    TtlRefused(String),
    #[error("{0}")]
    Port(#[from] PortError),
}

/// The Consul calls the lock needs. Implemented over HTTP by
/// `clients::consul_lock::ConsulLock`.
#[async_trait]
pub trait LockStore: Send + Sync {
    async fn create_session(&self, request: &SessionRequest) -> Result<SessionId, LockError>;
    async fn renew_session(&self, session: &SessionId) -> Result<(), LockError>;
    async fn destroy_session(&self, session: &SessionId) -> Result<(), LockError>;
    /// `true` when this session now holds the lock.
    async fn acquire(
        &self,
        key: &str,
        session: &SessionId,
        value: &[u8],
    ) -> Result<bool, LockError>;
    /// Releases the lock, writing `value` (this daemon's name) so that the key still says who
    /// held it last: a key that reads empty was deleted, not released, and its last holder
    /// may not know it lost it.
    async fn release(
        &self,
        key: &str,
        session: &SessionId,
        value: &[u8],
    ) -> Result<bool, LockError>;
    /// Reads the key; with `index > 0`, waits up to `wait` for it to change past `index`.
    async fn read_key(&self, key: &str, index: u64, wait: Duration) -> Result<LockKey, LockError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_names_itself_and_others_are_shown_raw() {
        let holder = Holder {
            holder: "node-1 (alloc 1234)".into(),
            pid: 42,
        };
        assert_eq!(
            Holder::describe(&holder.to_value()),
            "node-1 (alloc 1234) pid 42"
        );
        assert_eq!(Holder::describe(b"someone else"), "someone else");
    }
}
