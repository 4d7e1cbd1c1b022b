//! Standing by, acquiring, and leading one term at a time. [`lead`] keeps a session, reads
//! the lock key while another holds it, acquires it when it is free, and runs one term of a
//! [`LeaderTerm`] behind the term's fence until the session is lost or the daemon stops;
//! then it ends the term, releases or loses the key, and stands by again.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::fence::Fence;
use super::lock::{Holder, LockError, LockStore, SessionId};
use super::session::{KeptSession, within};
use super::{LeaderSettings, LeaderState};

/// What a leadership term runs: the daemon's control loop over [`super::fenced`] ports, or
/// whatever a test or the seeded world drives in its place, under the real term logic.
/// `term` receives the term's fence and a [`StopTerm`] that completes when the term must end;
/// it should finish its current tick and return.
pub trait LeaderTerm {
    fn term(&mut self, fence: Fence, stop: StopTerm) -> impl Future<Output = ()>;
}

/// Any `FnMut(Fence, StopTerm) -> impl Future` is a term: the daemon's `run` passes one.
impl<A, F> LeaderTerm for A
where
    A: FnMut(Fence, StopTerm) -> F,
    F: Future<Output = ()>,
{
    fn term(&mut self, fence: Fence, stop: StopTerm) -> impl Future<Output = ()> {
        self(fence, stop)
    }
}

/// Why [`lead`] returned with an error: a setting Consul refuses.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LeadError(pub String);

/// How one attempt to hold the lock ended.
enum Ended {
    Shutdown,
    Lost,
}

/// Holds the lock whenever it can and, while holding it, runs `act` (one leadership term:
/// typically `control_loop::run` over [`super::fenced`] services). `act` receives the term's fence
/// and a future that completes when the term must end; it should finish its current tick and
/// return. Returns at `shutdown`, having released the key and destroyed the session; or with
/// an error when Consul refuses the settings.
pub async fn lead(
    store: Arc<dyn LockStore>,
    settings: LeaderSettings,
    state: watch::Sender<LeaderState>,
    shutdown: impl Future<Output = ()>,
    mut act: impl LeaderTerm,
) -> Result<(), LeadError> {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut create_failures = 0u32;
    loop {
        state.send_replace(LeaderState::NoSession);
        let created = tokio::select! {
            biased;
            _ = &mut shutdown => return Ok(()),
            created = KeptSession::create(&store, &settings) => created,
        };
        let session = match created {
            Ok(session) => session,
            Err(LockError::TtlRefused(message)) => return Err(LeadError(ttl_hint(&message))),
            Err(e) => {
                create_failures = create_failures.saturating_add(1);
                let wait = settings
                    .renew_interval()
                    .saturating_mul(create_failures.min(8))
                    .min(settings.ttl * 4);
                warn!(
                    "create the leader session: {e}; trying again in {}",
                    humantime::format_duration(wait)
                );
                tokio::select! {
                    biased;
                    _ = &mut shutdown => return Ok(()),
                    _ = tokio::time::sleep(wait) => continue,
                }
            }
        };
        create_failures = 0;
        match hold(&store, &settings, &state, &session, &mut shutdown, &mut act).await {
            Ended::Shutdown => {
                session.end(&store, &settings).await;
                state.send_replace(LeaderState::NoSession);
                return Ok(());
            }
            Ended::Lost => session.end(&store, &settings).await,
        }
    }
}

/// What to do about a TTL Consul refused.
pub(super) fn ttl_hint(refusal: &str) -> String {
    format!(
        "{refusal}: raise --lock-ttl (RUNNER_SCALER_LOCK_TTL) to at least Consul's \
         session_ttl_min (10s unless lowered in the Consul servers' configuration)"
    )
}

/// Completes when the leadership term must end.
pub struct StopTerm(watch::Receiver<bool>);

impl StopTerm {
    /// A term's end, completing when `stop` says true (a test or the seeded world ends terms
    /// it drives itself).
    pub fn new(stop: watch::Receiver<bool>) -> StopTerm {
        StopTerm(stop)
    }
}

impl StopTerm {
    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}

/// Stands by with `session` until the lock is ours, then leads until the session is lost or
/// shutdown.
async fn hold(
    store: &Arc<dyn LockStore>,
    settings: &LeaderSettings,
    state: &watch::Sender<LeaderState>,
    session: &KeptSession,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    act: &mut impl LeaderTerm,
) -> Ended {
    let value = settings.holder.to_value();
    let mut lost = session.valid_until.clone();
    let mut index = 0u64;
    // Whether this standby has seen another session hold the key: if it then finds the key
    // gone, someone deleted it under that holder.
    let mut seen_held = false;
    loop {
        if session.lost() {
            return Ended::Lost;
        }
        // Stand by: read the key (blocking once an index is known) until it is unheld.
        let wait = settings.ttl.max(Duration::from_secs(1)) * 4;
        let read = tokio::select! {
            biased;
            _ = shutdown.as_mut() => return Ended::Shutdown,
            _ = lost.wait_for(|v| v.is_none()) => return Ended::Lost,
            read = within(wait + wait / 16 + settings.request_timeout(), store.read_key(&settings.key, index, wait)) => read,
        };
        let key = match read {
            Ok(key) => key,
            Err(e) => {
                warn!(key = %settings.key, "read the leader key: {e}");
                index = 0;
                tokio::select! {
                    biased;
                    _ = shutdown.as_mut() => return Ended::Shutdown,
                    _ = lost.wait_for(|v| v.is_none()) => return Ended::Lost,
                    _ = tokio::time::sleep(settings.renew_retry()) => continue,
                }
            }
        };
        // Consul: an index that goes backwards resets; never block with index 0.
        index = if key.index < index {
            0
        } else {
            key.index.max(1)
        };
        // Held by our own session only if a release failed: re-acquiring it succeeds.
        if let Some(holder) = key.session.as_ref().filter(|h| **h != session.id.0) {
            seen_held = true;
            let name = key.value.as_deref().map(Holder::describe);
            tracing::debug!(session = %holder, "the leader lock is held: standing by");
            state.send_replace(LeaderState::Standby { holder: name });
            continue;
        }
        state.send_replace(LeaderState::Standby { holder: None });
        let acquired = within(
            settings.request_timeout(),
            store.acquire(&settings.key, &session.id, &value),
        )
        .await;
        match acquired {
            Ok(true) => {}
            Ok(false) => {
                // Another daemon was faster, or a lock delay runs: look again soon.
                index = 0;
                tokio::select! {
                    biased;
                    _ = shutdown.as_mut() => return Ended::Shutdown,
                    _ = lost.wait_for(|v| v.is_none()) => return Ended::Lost,
                    _ = tokio::time::sleep(settings.acquire_retry()) => continue,
                }
            }
            Err(e) => {
                warn!(key = %settings.key, "acquire the leader lock: {e}");
                index = 0;
                tokio::select! {
                    biased;
                    _ = shutdown.as_mut() => return Ended::Shutdown,
                    _ = lost.wait_for(|v| v.is_none()) => return Ended::Lost,
                    _ = tokio::time::sleep(settings.renew_retry()) => continue,
                }
            }
        }
        // A key its holder released, or whose session Consul invalidated (running the lock
        // delay itself), is still there, unheld. One this standby saw held that is now gone
        // was deleted, and one that names our session without our having acquired it was
        // rewritten (a snapshot restore, a transaction): its last holder may not know yet
        // that it lost it. (A key missing at the first look was never written, or deleted
        // before this daemon started: its holder, if any, has heard by the time a first
        // tick's reads are done.)
        let predecessor_may_act = (key.value.is_none() && seen_held) || key.session.is_some();
        return lead_term(
            store,
            settings,
            state,
            session,
            shutdown,
            act,
            predecessor_may_act,
        )
        .await;
    }
}

/// Completes when the lock key no longer names `session` (deleted, released by someone else,
/// or rewritten to another session), saying so; reads the key blocking-query style. A read
/// that fails is tried again: while Consul cannot be reached, the session's own validity
/// (the fence) is what ends the term.
async fn until_key_lost(
    store: &Arc<dyn LockStore>,
    settings: &LeaderSettings,
    session: &SessionId,
) -> String {
    let wait = settings.ttl.max(Duration::from_secs(1)) * 4;
    let mut index = 0u64;
    loop {
        let read = within(
            wait + wait / 16 + settings.request_timeout(),
            store.read_key(&settings.key, index, wait),
        )
        .await;
        match read {
            Ok(key) => {
                if key.session.as_deref() != Some(session.0.as_str()) {
                    return match key.session {
                        None => "the leader key no longer names this daemon's session (deleted, or released by someone else)".to_string(),
                        Some(other) => format!(
                            "the leader key names another session ({other}{}) instead of this daemon's",
                            key.value
                                .as_deref()
                                .map(|v| format!(", value {}", Holder::describe(v)))
                                .unwrap_or_default()
                        ),
                    };
                }
                index = if key.index < index {
                    0
                } else {
                    key.index.max(1)
                };
            }
            Err(e) => {
                warn!(key = %settings.key, "watch the leader key: {e}");
                index = 0;
                tokio::time::sleep(settings.renew_retry()).await;
            }
        }
    }
}

/// One leadership term: `act` runs behind a fence until the session is lost, the key stops
/// naming it, or shutdown.
async fn lead_term(
    store: &Arc<dyn LockStore>,
    settings: &LeaderSettings,
    state: &watch::Sender<LeaderState>,
    session: &KeptSession,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    act: &mut impl LeaderTerm,
    predecessor_may_act: bool,
) -> Ended {
    let mut key_lost = std::pin::pin!(until_key_lost(store, settings, &session.id));
    // The key names us, but a predecessor may not know yet that it lost it: a key deleted or
    // rewritten under its holder (`consul kv delete`, a snapshot restore) runs no lock delay,
    // and the holder hears of it only as the answer to its blocking read of the key. Waiting
    // out the lock delay before the first write gives it that long to stop.
    if predecessor_may_act {
        tokio::select! {
            biased;
            _ = shutdown.as_mut() => return Ended::Shutdown,
            why = key_lost.as_mut() => {
                warn!(key = %settings.key, "{why} before this daemon acted: standing by again");
                return Ended::Lost;
            }
            _ = tokio::time::sleep(settings.lock_delay()) => {}
        }
    }
    let fence = Fence::new(session.valid_until.clone(), settings.landing());
    if fence.may_write().is_err() {
        fence.close();
        return Ended::Lost;
    }
    info!(key = %settings.key, holder = %settings.holder, "leader lock acquired: acting");
    state.send_replace(LeaderState::Leader);
    let (stop_tx, stop_rx) = watch::channel(false);
    let term = act.term(fence.clone(), StopTerm(stop_rx));
    let mut term = std::pin::pin!(term);
    let mut valid_until = session.valid_until.clone();
    let mut term_done = false;
    let ended = loop {
        // Wake when the fence closes on its own (no renew in time), not only on a change.
        let deadline = (*valid_until.borrow_and_update()).unwrap_or_else(Instant::now);
        tokio::select! {
            biased;
            _ = shutdown.as_mut() => break Ended::Shutdown,
            _ = tokio::time::sleep_until(deadline) => {
                if fence.may_write().is_err() {
                    error!(
                        key = %settings.key,
                        "leader lock lost (the session expired or could not be renewed in time): stopped acting; standing by again"
                    );
                    break Ended::Lost;
                }
            }
            _ = valid_until.changed() => {}
            why = key_lost.as_mut() => {
                // Close before anything else runs: the writes of this tick are refused from
                // here on.
                fence.close();
                error!(key = %settings.key, "{why}: stopped acting; standing by again");
                break Ended::Lost;
            }
            _ = term.as_mut() => {
                // The term ended on its own: nothing left to lead with.
                term_done = true;
                break Ended::Shutdown;
            }
        }
    };
    if matches!(ended, Ended::Lost) {
        fence.close();
    }
    // The tick in progress finishes (its writes refused once the fence closed).
    let _ = stop_tx.send(true);
    if !term_done {
        term.await;
    }
    fence.close();
    if matches!(ended, Ended::Shutdown) {
        // Release before destroying: a destroyed session's keys enter its lock delay, a
        // released key does not, so a standby takes over at once.
        match within(
            settings.request_timeout(),
            store.release(&settings.key, &session.id, &settings.holder.to_value()),
        )
        .await
        {
            Ok(true) => info!(key = %settings.key, "leader lock released"),
            Ok(false) => warn!(key = %settings.key, "leader lock was no longer ours to release"),
            Err(e) => warn!(key = %settings.key, "release the leader lock: {e}"),
        }
    }
    state.send_replace(LeaderState::NoSession);
    ended
}
