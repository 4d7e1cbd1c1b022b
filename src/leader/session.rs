//! One Consul session kept alive: created, renewed every TTL/3 by a task of its own, and how
//! long its last successful renew proves it valid (from when that renew was *sent*), which
//! is what the fence closes on. Dropped, it stops renewing at once, as a killed process would.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::warn;

use super::LeaderSettings;
use super::lock::{LockError, LockStore, SessionId, SessionRequest};
use crate::model::{ErrorClass, PortError};

/// A live session: its id and a keeper task renewing it, publishing how long it is proven
/// valid.
pub(super) struct KeptSession {
    pub(super) id: SessionId,
    pub(super) valid_until: watch::Receiver<Option<Instant>>,
    keeper: tokio::task::JoinHandle<()>,
}

impl KeptSession {
    /// Creates a session and starts renewing it.
    pub(super) async fn create(
        store: &Arc<dyn LockStore>,
        settings: &LeaderSettings,
    ) -> Result<KeptSession, LockError> {
        let request = SessionRequest {
            name: format!("runner-scaler leader lock ({})", settings.holder),
            ttl: settings.ttl,
            lock_delay: settings.lock_delay(),
        };
        let sent = Instant::now();
        let id = within(settings.request_timeout(), store.create_session(&request)).await?;
        let (tx, valid_until) = watch::channel(Some(sent + settings.fence_span()));
        let keeper = tokio::spawn(keep(store.clone(), settings.clone(), id.clone(), tx));
        Ok(KeptSession {
            id,
            valid_until,
            keeper,
        })
    }

    /// Stops renewing and destroys the session (best effort: a session Consul cannot be
    /// told about expires on its own).
    pub(super) async fn end(self, store: &Arc<dyn LockStore>, settings: &LeaderSettings) {
        self.keeper.abort();
        if let Err(e) = within(settings.request_timeout(), store.destroy_session(&self.id)).await {
            warn!(session = %self.id, "destroy the leader session: {e}; it expires on its own");
        }
    }

    pub(super) fn lost(&self) -> bool {
        self.valid_until
            .borrow()
            .is_none_or(|until| Instant::now() >= until)
    }
}

pub(super) async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, LockError>>,
) -> Result<T, LockError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result,
        Err(_) => Err(LockError::Port(PortError::new(
            ErrorClass::Transient,
            format!(
                "no answer from Consul within {}",
                humantime::format_duration(timeout)
            ),
        ))),
    }
}

/// Renews `session` every renew interval, measuring validity from when each renew was sent;
/// publishes `None` and returns once it is gone or its validity ran out.
async fn keep(
    store: Arc<dyn LockStore>,
    settings: LeaderSettings,
    session: SessionId,
    valid_until: watch::Sender<Option<Instant>>,
) {
    let mut next = Instant::now() + settings.renew_interval();
    loop {
        tokio::time::sleep_until(next).await;
        let sent = Instant::now();
        match within(settings.request_timeout(), store.renew_session(&session)).await {
            Ok(()) => {
                valid_until.send_replace(Some(sent + settings.fence_span()));
                next = sent + settings.renew_interval();
            }
            Err(LockError::SessionGone(message)) => {
                warn!(%session, "the leader session is gone: {message}");
                valid_until.send_replace(None);
                return;
            }
            Err(e) => {
                let until = *valid_until.borrow();
                if until.is_none_or(|until| Instant::now() >= until) {
                    warn!(%session, "could not renew the leader session in time: {e}");
                    valid_until.send_replace(None);
                    return;
                }
                warn!(%session, "renew the leader session: {e}; trying again");
                next = Instant::now() + settings.renew_retry();
            }
        }
    }
}

impl Drop for KeptSession {
    /// A daemon whose lead task is dropped (aborted) stops renewing at once, as a killed
    /// process would.
    fn drop(&mut self) {
        self.keeper.abort();
    }
}
