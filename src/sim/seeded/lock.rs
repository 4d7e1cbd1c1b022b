//! Consul's side of the leader lock, as the daemons meet it: sessions with a TTL that
//! Consul enforces lazily (a session lives between one and two TTLs after its last renew
//! arrived), `Behavior: release` with the session's lock delay after an invalidation or a
//! destroy, `?acquire=` and `?release=` on one key, and blocking reads of that key. Every
//! call travels and meets Consul's faults like any other call of the world.
//!
//! The truth kept here ([`LockTruth`]) is what the invariants judge one actor at a time by:
//! which session holds the key, whose it is, and when each term began and ended.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;
use tokio::time::Instant;

use super::options::Service;
use super::ports::{Call, Scope, Shared, Sim, lock, over_the_wire};
use crate::leader::{LockError, LockKey, LockStore, SessionId, SessionRequest};
use crate::model::{ErrorClass, PortError};

/// The daemon a foreign session belongs to: none of the world's.
pub const FOREIGN: usize = usize::MAX;

/// The key the daemons of the world lock.
pub const LEADER_KEY: &str = "runners/leader";

/// One session as Consul keeps it.
#[derive(Clone, Debug)]
pub struct SessionTruth {
    pub daemon: usize,
    lock_delay: Duration,
    /// Consul invalidates the session once this passes without a renew.
    expires_at: Instant,
    ttl: Duration,
}

/// One term: a session holding the key, from the acquire that landed to the moment the key
/// stopped naming it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    pub daemon: usize,
    pub session: String,
    pub began_s: u64,
    /// Milliseconds since the run began, for judging writes sent inside it.
    pub began_ms: u64,
    pub ended_ms: Option<u64>,
}

/// What someone else does to the lock key (an operator, a cleanup script, a snapshot
/// restore): nothing in the daemon's own logic causes these, and a holder that watched only
/// its session's validity would not notice them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockHazard {
    /// `consul kv delete runners/leader` (or a recursive delete of its prefix): the key is
    /// gone, no lock delay runs, the holder's session stays valid.
    Deleted,
    /// The key is rewritten to name a session that is none of ours (a snapshot restore, a
    /// transaction, `consul lock` on the same key) for `held_s`, then released.
    TakenOver { held_s: u64 },
}

/// Consul's truth about the lock.
pub struct LockTruth {
    sessions: BTreeMap<String, SessionTruth>,
    /// The session holding the key.
    holder: Option<String>,
    value: Option<Vec<u8>>,
    /// The key's modify index.
    index: u64,
    /// No session may acquire before this (the lock delay of the session that lost it).
    delay_until: Option<Instant>,
    next_session: u64,
    /// Wakes blocked reads when the index moves (or Consul goes away). A `Notify`, not a
    /// `watch`: tokio's watch spreads its waiters over eight lists picked at random, so two
    /// daemons blocked on the key would wake in a different order from run to run, and a
    /// seed would not replay.
    changed: Arc<tokio::sync::Notify>,
    pub terms: Vec<Term>,
    /// When Consul last failed a lock call.
    pub last_fault_s: Option<u64>,
    /// When each daemon last sent a write, in milliseconds since the run began.
    latest_write_ms: BTreeMap<usize, u64>,
    /// A foreign session holding the key, and when it lets go.
    foreign: Option<(String, u64)>,
    /// The daemons' state key (`--state-key`): what a term hands on to the next.
    pub state_key: Option<Vec<u8>>,
}

impl Default for LockTruth {
    fn default() -> Self {
        LockTruth {
            sessions: BTreeMap::new(),
            holder: None,
            value: None,
            index: 1,
            delay_until: None,
            next_session: 0,
            changed: Arc::new(tokio::sync::Notify::new()),
            terms: Vec::new(),
            last_fault_s: None,
            latest_write_ms: BTreeMap::new(),
            foreign: None,
            state_key: None,
        }
    }
}

impl LockTruth {
    /// The daemon whose session holds the key, and since when.
    pub fn term(&self) -> Option<&Term> {
        self.terms
            .last()
            .filter(|t| t.ended_ms.is_none() && t.daemon != FOREIGN)
    }

    fn set_holder(&mut self, holder: Option<String>, t: u64, now_ms: u64) {
        if let Some(term) = self.terms.last_mut()
            && term.ended_ms.is_none()
        {
            term.ended_ms = Some(now_ms);
        }
        if let Some(session) = &holder {
            let daemon = self.sessions.get(session).map_or(FOREIGN, |s| s.daemon);
            self.terms.push(Term {
                daemon,
                session: session.clone(),
                began_s: t,
                began_ms: now_ms,
                ended_ms: None,
            });
        }
        self.holder = holder;
        self.index += 1;
        self.changed.notify_waiters();
    }

    /// The session `id` is gone: the key it held is released, and nobody may acquire it for
    /// the session's lock delay.
    fn invalidate(&mut self, id: &str, now: Instant, t: u64, now_ms: u64) -> Option<SessionTruth> {
        let session = self.sessions.remove(id)?;
        if self.holder.as_deref() == Some(id) {
            self.delay_until = Some(now + session.lock_delay);
            self.set_holder(None, t, now_ms);
        }
        Some(session)
    }

    /// Wakes blocked reads without a change (Consul went away under them).
    pub fn poke(&self) {
        self.changed.notify_waiters();
    }
}

impl Sim {
    /// Milliseconds of virtual time since the run began.
    pub fn now_ms(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.started)
            .as_millis() as u64
    }

    /// Someone else does `hazard` to the lock key now.
    pub fn lock_hazard(&mut self, hazard: LockHazard) {
        let t = self.t;
        let now_ms = self.now_ms();
        match hazard {
            LockHazard::Deleted => {
                self.lock.value = None;
                self.lock.set_holder(None, t, now_ms);
                self.trace
                    .record(t, "the leader key was deleted (consul kv delete)");
            }
            LockHazard::TakenOver { held_s } => {
                let id = "session-of-someone-else".to_string();
                self.lock.value = Some(b"restored from a snapshot".to_vec());
                self.lock.set_holder(Some(id.clone()), t, now_ms);
                self.lock.foreign = Some((id, t + held_s));
                self.trace.record(
                    t,
                    format!("the leader key was rewritten to a foreign session for {held_s} s"),
                );
            }
        }
    }

    /// A daemon (`None`: a baseline, which holds no lock) sends a write now: it must be
    /// inside its lease (its session holding the key, or the key changed so lately that the
    /// news cannot have reached it yet), and no other daemon may have written since its term
    /// began: one actor at a time.
    pub fn write_sent(&mut self, writer: Option<usize>, what: &str) {
        let Some(daemon) = writer else { return };
        let now_ms = self.now_ms();
        // The change reaches a holder as the answer to its blocking read of the key: one way
        // of a Consul call, and a second of its own work.
        let notice_ms = self.options.latency(Service::Consul).max().as_millis() as u64 + 1_000;
        let term = self
            .lock
            .terms
            .iter()
            .rev()
            .find(|t| t.daemon == daemon)
            .cloned();
        let found = match &term {
            None => Some(format!("daemon {daemon} sent {what} without ever holding the lock")),
            Some(term) => match term.ended_ms {
                Some(end) if now_ms > end + notice_ms => Some(format!(
                    "daemon {daemon} sent {what} at {now_ms} ms, {} ms after the key stopped naming its session ({}) at {end} ms",
                    now_ms - end,
                    term.session
                )),
                _ => self
                    .lock
                    .latest_write_ms
                    .iter()
                    .find(|(other, at)| **other != daemon && **at > term.began_ms)
                    .map(|(other, at)| {
                        format!(
                            "daemon {daemon} sent {what} at {now_ms} ms while daemon {other} had written at {at} ms, after daemon {daemon}'s term began at {} ms",
                            term.began_ms
                        )
                    }),
            },
        };
        if let Some(message) = found {
            let t = self.t;
            self.violation.get_or_insert(super::invariants::Violation {
                invariant: "I8",
                step: t,
                message,
            });
        }
        self.lock.latest_write_ms.insert(daemon, now_ms);
    }

    /// Consul's session reaper: sessions past their TTL are invalidated; a foreign session
    /// lets go of the key when its time is up.
    pub fn reap_sessions(&mut self) {
        let now = Instant::now();
        let t = self.t;
        let now_ms = self.now_ms();
        if let Some((id, until)) = self.lock.foreign.clone()
            && t >= until
        {
            self.lock.foreign = None;
            if self.lock.holder.as_deref() == Some(id.as_str()) {
                self.lock.set_holder(None, t, now_ms);
                self.trace
                    .record(t, "the foreign session let go of the leader key");
            }
        }
        let expired: Vec<String> = self
            .lock
            .sessions
            .iter()
            .filter(|(_, s)| s.expires_at <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            if let Some(session) = self.lock.invalidate(&id, now, t, now_ms) {
                self.trace.record(
                    t,
                    format!(
                        "consul invalidated session {id} of daemon {} (no renew within its TTL)",
                        session.daemon
                    ),
                );
            }
        }
    }

    /// When a renew arriving now lets the session expire: Consul reaps lazily, between one
    /// and two TTLs later.
    fn expiry(&mut self, ttl: Duration) -> Instant {
        let slack = Duration::from_millis(self.rng.random_range(0..=ttl.as_millis() as u64));
        Instant::now() + ttl + slack
    }
}

/// One daemon's handle on Consul's lock.
pub struct SimLock {
    pub shared: Shared,
    pub daemon: usize,
}

fn consul_call(sim: &mut Sim, what: &str) -> Result<(), LockError> {
    let called = sim.call(Call {
        scope: Scope::Lock,
        service: Service::Consul,
        via_vault: false,
        budget: None,
        what,
    });
    if called.is_err() {
        sim.lock.last_fault_s = Some(sim.t);
    }
    called.map_err(LockError::Port)
}

fn key_read(sim: &Sim) -> LockKey {
    LockKey {
        index: sim.lock.index,
        session: sim.lock.holder.clone(),
        value: sim.lock.value.clone(),
    }
}

#[async_trait]
impl LockStore for SimLock {
    async fn create_session(&self, request: &SessionRequest) -> Result<SessionId, LockError> {
        let daemon = self.daemon;
        over_the_wire(&self.shared, Service::Consul, |sim| {
            consul_call(sim, "create session")?;
            sim.lock.next_session += 1;
            let id = format!("session-{}-{}", daemon, sim.lock.next_session);
            let expires_at = sim.expiry(request.ttl);
            sim.lock.sessions.insert(
                id.clone(),
                SessionTruth {
                    daemon,
                    lock_delay: request.lock_delay,
                    expires_at,
                    ttl: request.ttl,
                },
            );
            Ok(SessionId(id))
        })
        .await
    }

    async fn renew_session(&self, session: &SessionId) -> Result<(), LockError> {
        over_the_wire(&self.shared, Service::Consul, |sim| {
            consul_call(sim, "renew session")?;
            let Some(ttl) = sim.lock.sessions.get(&session.0).map(|s| s.ttl) else {
                return Err(LockError::SessionGone(format!(
                    "renew session {session}: 404 Session id '{session}' not found"
                )));
            };
            let expires_at = sim.expiry(ttl);
            if let Some(s) = sim.lock.sessions.get_mut(&session.0) {
                s.expires_at = expires_at;
            }
            Ok(())
        })
        .await
    }

    async fn destroy_session(&self, session: &SessionId) -> Result<(), LockError> {
        over_the_wire(&self.shared, Service::Consul, |sim| {
            consul_call(sim, "destroy session")?;
            let (t, now_ms) = (sim.t, sim.now_ms());
            sim.lock.invalidate(&session.0, Instant::now(), t, now_ms);
            Ok(())
        })
        .await
    }

    async fn acquire(
        &self,
        key: &str,
        session: &SessionId,
        value: &[u8],
    ) -> Result<bool, LockError> {
        let daemon = self.daemon;
        over_the_wire(&self.shared, Service::Consul, |sim| {
            consul_call(sim, "acquire the lock")?;
            if key != LEADER_KEY || !sim.lock.sessions.contains_key(&session.0) {
                return Err(LockError::Port(PortError::new(
                    ErrorClass::Configuration,
                    format!("acquire {key}: 500 invalid session \"{session}\""),
                )));
            }
            let t = sim.t;
            let delayed = sim
                .lock
                .delay_until
                .is_some_and(|until| Instant::now() < until);
            match sim.lock.holder.as_deref() {
                Some(held) if held == session.0 => {
                    sim.lock.value = Some(value.to_vec());
                    Ok(true)
                }
                Some(_) => Ok(false),
                None if delayed => Ok(false),
                None => {
                    sim.lock.value = Some(value.to_vec());
                    let now_ms = sim.now_ms();
                    sim.lock.set_holder(Some(session.0.clone()), t, now_ms);
                    // What the last term read says nothing of what the new one will.
                    sim.queue_reads.clear();
                    sim.trace.record(
                        t,
                        format!("daemon {daemon} acquired the leader lock ({session})"),
                    );
                    Ok(true)
                }
            }
        })
        .await
    }

    async fn release(
        &self,
        key: &str,
        session: &SessionId,
        value: &[u8],
    ) -> Result<bool, LockError> {
        let daemon = self.daemon;
        over_the_wire(&self.shared, Service::Consul, |sim| {
            consul_call(sim, "release the lock")?;
            if key != LEADER_KEY || sim.lock.holder.as_deref() != Some(session.0.as_str()) {
                return Ok(false);
            }
            let (t, now_ms) = (sim.t, sim.now_ms());
            sim.lock.value = Some(value.to_vec());
            sim.lock.set_holder(None, t, now_ms);
            sim.trace
                .record(t, format!("daemon {daemon} released the leader lock"));
            Ok(true)
        })
        .await
    }

    async fn read_key(&self, key: &str, index: u64, wait: Duration) -> Result<LockKey, LockError> {
        if key != LEADER_KEY {
            return Err(LockError::Port(PortError::new(
                ErrorClass::Configuration,
                format!("read {key}: not the world's leader key"),
            )));
        }
        if index == 0 {
            return over_the_wire(&self.shared, Service::Consul, |sim| {
                consul_call(sim, "read the leader key")?;
                Ok(key_read(sim))
            })
            .await;
        }
        // A blocking query: the request travels, Consul holds it until the index moves past
        // `index`, the wait (plus up to a sixteenth, Consul's jitter) runs out, or Consul goes
        // away under it; then the answer travels back.
        let (there, jitter, changed) = {
            let mut sim = lock(&self.shared);
            let there = sim.transit(Service::Consul);
            let jitter = Duration::from_millis(
                sim.rng
                    .random_range(0..=(wait.as_millis() / 16).max(1) as u64),
            );
            (there, jitter, sim.lock.changed.clone())
        };
        tokio::time::sleep(there).await;
        let deadline = Instant::now() + wait + jitter;
        loop {
            // Registered before the look, so a change made after it still wakes this read.
            let notified = changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let sim = lock(&self.shared);
                let down = sim.options.outage_at(Service::Consul, sim.t).is_some();
                if sim.lock.index > index || down {
                    break;
                }
            }
            tokio::select! {
                biased;
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        let answer = {
            let mut sim = lock(&self.shared);
            consul_call(&mut sim, "read the leader key").map(|()| key_read(&sim))
        };
        let back = lock(&self.shared).transit(Service::Consul);
        tokio::time::sleep(back).await;
        answer
    }
}

/// Every daemon's lock over the same Consul.
/// One daemon's handle on the state key: a plain read and a plain write, the write judged
/// against the daemon's lease when it is sent (I8).
pub struct SimStateKey {
    pub shared: Shared,
    pub daemon: usize,
}

#[async_trait]
impl crate::act::services::CarriedStore for SimStateKey {
    async fn load(&self) -> Result<Option<Vec<u8>>, PortError> {
        over_the_wire(&self.shared, Service::Consul, |sim| {
            consul_call(sim, "read the state key").map_err(port_error)?;
            Ok(sim.lock.state_key.clone())
        })
        .await
    }

    async fn save(&self, value: Vec<u8>) -> Result<(), PortError> {
        let daemon = self.daemon;
        lock(&self.shared).write_sent(Some(daemon), "a write of the state key");
        over_the_wire(&self.shared, Service::Consul, |sim| {
            consul_call(sim, "write the state key").map_err(port_error)?;
            sim.lock.state_key = Some(value);
            Ok(())
        })
        .await
    }
}

fn port_error(e: LockError) -> PortError {
    match e {
        LockError::Port(e) => e,
        other => PortError::new(ErrorClass::Transient, other.to_string()),
    }
}

pub fn store(shared: &Shared, daemon: usize) -> Arc<dyn LockStore> {
    Arc::new(SimLock {
        shared: shared.clone(),
        daemon,
    })
}
