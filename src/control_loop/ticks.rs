//! The loop itself: a tick at start, then one every poll interval, sooner for a due webhook
//! hint or a document arriving; a shutdown lets the tick in progress finish.

use futures::FutureExt;
use tracing::{debug, error, warn};

use super::Controller;
use crate::config::watch::ConfigState;
use crate::model::RepoName;
use crate::report;

/// The repos of the next due webhook hint; never completes without hints.
pub(super) async fn next_hinted(
    hints: Option<&crate::webhook::Hints>,
    clock: &dyn crate::clock::Clock,
) -> Vec<RepoName> {
    match hints {
        Some(hints) => hints.next_hinted(clock).await,
        None => std::future::pending().await,
    }
}

/// Runs ticks until `shutdown` completes: a tick at start, then one every poll interval. A
/// shutdown lets the tick in progress finish and starts no new one. Without a valid
/// document it dispatches nothing and says why once per change of reason. With `dry_run`
/// (shadow mode) every tick plans and reports and writes nothing.
///
/// With webhook hints ([`Controller::with_hints`]), the seam is here and only here: the
/// hints follow each document applied (so the receiver refuses repos it does not name, and
/// every hint once the loop stops), a due hint wakes the wait between ticks, and every tick,
/// hinted or not, counts as the hint-poll of whatever is due by then. A hinted tick is a
/// full tick for now; polling only the hinted repos comes with adaptive polling.
pub async fn run(
    mut controller: Controller,
    mut config: tokio::sync::watch::Receiver<ConfigState>,
    clock: &dyn crate::clock::Clock,
    dry_run: bool,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut interval = tokio::time::interval(controller.settings.poll_interval);
    // A tick that overran is not followed by a burst of catch-up ticks.
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut applied: Option<u64> = None;
    let mut last_idle_reason: Option<String> = None;
    let metrics = controller.settings.metrics.clone();
    metrics.set_poll_interval(controller.settings.poll_interval);
    // Until the leader lock exists, the copy that runs ticks is the leader.
    metrics.set_leader(true);
    let hints = controller.hints.clone();
    loop {
        // Without a document, a change of the watcher's state is worth a tick at once: the
        // first read lands moments after start, and waiting a whole poll interval for it
        // would delay the first dispatch for nothing.
        let without_document = config.borrow().config.is_none();
        let mut hinted = Vec::new();
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            _ = interval.tick() => {}
            Ok(()) = config.changed(), if without_document => {}
            due = next_hinted(hints.as_ref(), clock) => {
                debug!(repos = ?due.iter().map(ToString::to_string).collect::<Vec<_>>(), "ticking now for webhook hints");
                hinted = due;
            }
        }
        if let Some(hints) = &hints {
            // Whatever woke the loop, this tick serves the hints due by now: their repos are
            // read in it, whatever their poll schedule says.
            hinted.extend(hints.take_due(clock.now()));
            let now = clock.now();
            for repo in &hinted {
                controller.hint(repo, now);
            }
        }
        let state = config.borrow_and_update().clone();
        metrics.set_config_valid(state.config.is_some());
        let Some(document) = state.config.clone() else {
            metrics.loop_turned(clock.now());
            // Before the watcher's first answer there is nothing to say yet.
            if state == ConfigState::default() {
                continue;
            }
            let why = state.problems().join("; ");
            if last_idle_reason.as_deref() != Some(why.as_str()) {
                warn!("dispatching nothing: {why}");
                last_idle_reason = Some(why);
            }
            continue;
        };
        last_idle_reason = None;
        let version = state.applied_index.unwrap_or(0);
        if applied != Some(version) {
            if applied.is_some() {
                controller.config_changed();
            }
            if let Some(hints) = &hints {
                hints.follow(&document);
            }
            applied = Some(version);
        }
        // The tick runs to its end even if shutdown is asked meanwhile. A panic inside it (a
        // bug met by some input) costs that tick, not the daemon: the next tick starts from
        // a fresh observation.
        let tick = controller.tick(&document, version, clock.now(), dry_run);
        match std::panic::AssertUnwindSafe(tick).catch_unwind().await {
            Ok(view) if dry_run => report::log_shadow_tick(&view),
            Ok(_) => {}
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                error!("tick aborted by a bug: {what}; the next tick starts afresh");
            }
        }
    }
    if let Some(hints) = &hints {
        hints.stop_following();
    }
}
