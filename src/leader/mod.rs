//! The leader lock: of the daemons that share a Consul, only the holder of one lock acts.
//!
//! Each daemon holds a Consul session with a TTL and no health checks (so it is not tied to
//! the agent's `serfHealth`), `Behavior: release`, and a lock delay. A standby watches only
//! the lock key (a blocking query) and tries `?acquire=` whenever the key has no `Session`.
//! The holder renews every TTL/3 and **fences itself**: it writes nothing (no mint, dispatch,
//! stop, purge or registration deleted) after the moment it sent its last successful renew
//! plus TTL minus a margin, measured on the monotonic clock. Consul counts the TTL from when
//! the renew *arrived*, later than it was sent, so the holder stops writing at least `margin`
//! before Consul can invalidate the session, and the lock delay (at least the margin) keeps a
//! successor from acquiring for that long again after. A holder that loses its session (renew
//! 404, or its fence ran out) stops acting at once and stands by again with a new session.
//!
//! The holder also watches the key itself (a blocking read through the term): a key deleted
//! or rewritten under a valid session runs no lock delay, so a holder that watched only its
//! session would act on beside a successor. It closes its fence as soon as the key stops
//! naming its session; a successor that acquires a key that was gone (or finds the key
//! naming its own session unasked) waits out the lock delay before acting, giving the last
//! holder that long to hear of it.
//!
//! The fence is enforced at the write ports ([`fenced`]): the act step needs no change, a
//! fenced write is a [`PortError`] it reports like any refusal.
//!
//! Takeover bound: a holder that dies or is cut off renewed last at most TTL/3 before; Consul
//! invalidates its session at most 2 × TTL later (it may reap that late), and the key becomes
//! acquirable a lock delay after that; the standby retries within [`ACQUIRE_RETRY_MAX`].
//!
//! The pieces: [`lock`], the port the lock is taken through and the words it uses (the real
//! one is `clients::consul_lock`); [`session`], a session kept alive and how long it is
//! proven valid; [`fence`], the fence and the fenced write ports; [`term`], standing by,
//! acquiring and leading one term at a time, driving whatever [`term::LeaderTerm`] it is
//! given; [`one_shot`], the lock held for one `once` tick.

pub mod fence;
pub mod lock;
pub mod one_shot;
mod session;
pub mod term;

use std::time::Duration;

pub use fence::{Fence, Fenced, fenced, fenced_carried};
pub use lock::{Holder, LockError, LockKey, LockStore, SessionId, SessionRequest};
pub use one_shot::{OneShot, OneShotRefused};
pub use term::{LeadError, LeaderTerm, StopTerm, lead};

/// Default lock key.
pub const LEADER_KEY_DEFAULT: &str = "runners/leader";
/// Default session TTL: Consul's own minimum is 10 s (`session_ttl_min`).
pub const LOCK_TTL_DEFAULT: Duration = Duration::from_secs(15);
/// The shortest TTL the command line accepts; Consul refuses below its `session_ttl_min`.
pub const LOCK_TTL_MIN: Duration = Duration::from_secs(1);
/// How often a standby whose acquire was refused on an unheld key (a lock delay running)
/// tries again, at most.
pub const ACQUIRE_RETRY_MAX: Duration = Duration::from_secs(1);

/// The timings of the lock, all derived from the TTL.
#[derive(Clone, Debug)]
pub struct LeaderSettings {
    pub key: String,
    pub ttl: Duration,
    pub holder: Holder,
}

impl LeaderSettings {
    /// How long before the TTL runs out (counted from when a renew was sent) the holder stops
    /// writing: a third of the TTL, for the renew's own transit and a write in flight.
    pub fn margin(&self) -> Duration {
        self.ttl / 3
    }

    /// Consul's lock delay for our session: at least the margin, so that after Consul
    /// invalidates a silent holder's session no successor acts before a write the holder
    /// sent just before its fence closed has landed.
    pub fn lock_delay(&self) -> Duration {
        self.margin()
    }

    /// How long after the fence closes a write sent through it may land before a successor
    /// can act: Consul invalidates the session no sooner than the margin later, and the
    /// successor then waits out the lock delay.
    pub fn landing(&self) -> Duration {
        self.margin() + self.lock_delay()
    }

    /// How long a renew keeps the fence open, from when it was sent.
    pub fn fence_span(&self) -> Duration {
        self.ttl - self.margin()
    }

    pub fn renew_interval(&self) -> Duration {
        self.ttl / 3
    }

    /// A renew that failed for a transient reason is tried again this soon.
    fn renew_retry(&self) -> Duration {
        (self.ttl / 10).max(Duration::from_millis(100))
    }

    /// How long one lock request may take: less than the renew interval, so a stuck request
    /// cannot keep the holder from noticing that its fence closed.
    pub fn request_timeout(&self) -> Duration {
        self.renew_interval()
    }

    fn acquire_retry(&self) -> Duration {
        (self.lock_delay() / 4).clamp(Duration::from_millis(50), ACQUIRE_RETRY_MAX)
    }

    /// The longest a standby waits to take over from a holder that died or was cut off:
    /// its session may live 2 × TTL after its last renew (Consul's reaper), then the lock
    /// delay, then one retry.
    pub fn takeover_bound(&self) -> Duration {
        self.ttl * 2 + self.lock_delay() + self.acquire_retry()
    }
}

/// What this daemon is, for metrics and `/livez`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaderState {
    /// No session (starting, or Consul unreachable).
    NoSession,
    /// A session, not the lock; the holder as its value names it, when the key is held.
    Standby {
        holder: Option<String>,
    },
    Leader,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(ttl_s: u64) -> LeaderSettings {
        LeaderSettings {
            key: LEADER_KEY_DEFAULT.into(),
            ttl: Duration::from_secs(ttl_s),
            holder: Holder {
                holder: "test".into(),
                pid: 1,
            },
        }
    }

    #[test]
    fn the_lock_delay_covers_the_fence_margin() {
        for ttl in [1, 10, 15, 60] {
            let s = settings(ttl);
            assert!(s.lock_delay() >= s.margin(), "ttl {ttl}");
            assert!(s.fence_span() + s.margin() <= s.ttl, "ttl {ttl}");
            assert!(s.request_timeout() < s.fence_span(), "ttl {ttl}");
        }
        let defaults = settings(15);
        assert_eq!(defaults.margin(), Duration::from_secs(5));
        assert_eq!(defaults.lock_delay(), Duration::from_secs(5));
        assert_eq!(defaults.renew_interval(), Duration::from_secs(5));
        assert_eq!(defaults.takeover_bound(), Duration::from_secs(36));
    }
}
