//! The lock held for one `once` tick: taken if free, its fence open for the tick, given
//! back (released, session destroyed) after it.

use std::sync::Arc;
use std::time::Duration;

use tracing::warn;

use super::LeaderSettings;
use super::fence::Fence;
use super::lock::{Holder, LockError, LockKey, LockStore};
use super::session::{KeptSession, within};
use super::term::ttl_hint;

/// A lock held for one `once` tick.
pub struct OneShot {
    session: KeptSession,
    store: Arc<dyn LockStore>,
    settings: LeaderSettings,
    pub fence: Fence,
}

/// Why `once` could not take the lock.
#[derive(Debug, thiserror::Error)]
pub enum OneShotRefused {
    #[error("the leader lock {key} is held by {holder}")]
    Held { key: String, holder: String },
    #[error("{0}")]
    Settings(String),
    #[error("{0}")]
    Consul(String),
}

impl OneShot {
    /// Takes the lock or says who holds it.
    pub async fn take(
        store: Arc<dyn LockStore>,
        settings: LeaderSettings,
    ) -> Result<OneShot, OneShotRefused> {
        let session = match KeptSession::create(&store, &settings).await {
            Ok(session) => session,
            Err(LockError::TtlRefused(message)) => {
                return Err(OneShotRefused::Settings(ttl_hint(&message)));
            }
            Err(e) => {
                return Err(OneShotRefused::Consul(format!(
                    "create the leader session: {e}"
                )));
            }
        };
        let value = settings.holder.to_value();
        let acquired = within(
            settings.request_timeout(),
            store.acquire(&settings.key, &session.id, &value),
        )
        .await;
        match acquired {
            Ok(true) => Ok(OneShot {
                fence: Fence::new(session.valid_until.clone(), settings.landing()),
                session,
                store,
                settings,
            }),
            Ok(false) => {
                let holder = match within(
                    settings.request_timeout(),
                    store.read_key(&settings.key, 0, Duration::ZERO),
                )
                .await
                {
                    Ok(LockKey {
                        session: Some(_),
                        value,
                        ..
                    }) => value
                        .as_deref()
                        .map(Holder::describe)
                        .unwrap_or_else(|| "a session that wrote no name".into()),
                    Ok(_) => "no one: a lock delay after the last holder's session ended is still running".into(),
                    Err(e) => format!("a daemon this one could not name ({e})"),
                };
                session.end(&store, &settings).await;
                Err(OneShotRefused::Held {
                    key: settings.key.clone(),
                    holder,
                })
            }
            Err(e) => {
                session.end(&store, &settings).await;
                Err(OneShotRefused::Consul(format!(
                    "acquire the leader lock {}: {e}",
                    settings.key
                )))
            }
        }
    }

    /// Closes the fence, releases the key and destroys the session.
    pub async fn give_back(self) {
        self.fence.close();
        if let Err(e) = within(
            self.settings.request_timeout(),
            self.store.release(
                &self.settings.key,
                &self.session.id,
                &self.settings.holder.to_value(),
            ),
        )
        .await
        {
            warn!(key = %self.settings.key, "release the leader lock: {e}");
        }
        self.session.end(&self.store, &self.settings).await;
    }
}
