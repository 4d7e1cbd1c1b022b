//! What failed and when it is tried again: each failure is kept per scope (a repo's queue,
//! minting for it, dispatching one of its parents), with a backoff for transient errors, a
//! slow retry for terminal ones (so a fix made outside the document is noticed), and one
//! report per change rather than one per tick.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::{debug, error, warn};

use super::Controller;
use crate::model::{ErrorClass, RATE_LIMIT_WAIT_MAX_S, RepoName};
use crate::observe::PortError;

/// What failed, so that its backoff and its report are kept apart from other failures.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Scope {
    Queue(RepoName),
    Mint(RepoName),
    Dispatch(String, RepoName),
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Queue(repo) => write!(f, "queue of {repo}"),
            Scope::Mint(repo) => write!(f, "minting for {repo}"),
            Scope::Dispatch(parent, repo) => write!(f, "dispatching {parent} for {repo}"),
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct Failure {
    pub(super) class: ErrorClass,
    pub(super) message: String,
    consecutive: u32,
    pub(super) retry_at: DateTime<Utc>,
    /// The config version under which a terminal error was last reported.
    reported_for: Option<u64>,
}

impl Controller {
    pub(super) fn succeeded(&mut self, scope: &Scope) {
        if let Scope::Dispatch(parent, repo) = scope {
            self.memory.held_parents.dispatched(parent, repo);
        }
        if let Some(f) = self.memory.failures.remove(scope) {
            debug!("{scope} recovered after {} failure(s)", f.consecutive);
        }
    }

    /// Records a failure and decides when the scope is next tried: transient errors back off
    /// exponentially from the next tick, rate limits wait as asked, terminal errors are
    /// reported once per config version and retried slowly.
    pub(super) fn failed(
        &mut self,
        scope: Scope,
        error: &PortError,
        config_version: u64,
        now: DateTime<Utc>,
    ) {
        let previous = self.memory.failures.remove(&scope);
        let consecutive = previous.as_ref().map_or(1, |f| f.consecutive + 1);
        let poll = self.settings.poll_interval;
        let (delay, terminal) = match error.class {
            ErrorClass::Transient | ErrorClass::Malformed => {
                // The first failure is retried at the next tick; then 1, 2, 4… polls.
                let doublings = consecutive.saturating_sub(2).min(16);
                let base = if consecutive < 2 {
                    Duration::ZERO
                } else {
                    poll.saturating_mul(1 << doublings)
                };
                let capped = base.min(self.settings.transient_backoff_max);
                // Up to a quarter of jitter keeps repos that failed together from retrying
                // together.
                let jitter_ms = (capped.as_millis() as u64 / 4).max(1);
                (
                    capped + Duration::from_millis(self.rng.next_u64() % jitter_ms),
                    false,
                )
            }
            ErrorClass::RateLimited => (
                Duration::from_secs(error.retry_after_s.unwrap_or(60).min(RATE_LIMIT_WAIT_MAX_S)),
                false,
            ),
            ErrorClass::Unauthorized
            | ErrorClass::Forbidden
            | ErrorClass::NotFound
            | ErrorClass::Configuration => (self.settings.terminal_retry, true),
        };
        let mut reported_for = previous.as_ref().and_then(|f| f.reported_for);
        if terminal {
            let same_kind = previous.as_ref().is_some_and(|f| f.class == error.class);
            if !(same_kind && reported_for == Some(config_version)) {
                error!(
                    class = error.class.as_str(),
                    "{}; retrying in {}",
                    error.message,
                    humantime::format_duration(delay)
                );
                reported_for = Some(config_version);
            } else {
                debug!(class = error.class.as_str(), "{}", error.message);
            }
        } else {
            warn!(
                class = error.class.as_str(),
                attempt = consecutive,
                "{}",
                error.message
            );
        }
        let retry_at = crate::clock::after(now, delay);
        self.memory.failures.insert(
            scope,
            Failure {
                class: error.class,
                message: error.message.clone(),
                consecutive,
                retry_at,
                reported_for,
            },
        );
    }
}
