//! One leadership term as the daemon serves it (and the seeded world, through the same
//! code): the document watched from its source, ticks run on it until the term must end,
//! then the watcher stopped. `run` calls it for each term the leader lock grants, and once
//! for a whole shadow run.

use std::future::Future;

use rand::rngs::StdRng;
use tokio::sync::watch;

use super::{Controller, run};
use crate::clock::Clock;
use crate::config::ConfigDefaults;
use crate::config::watch::{ConfigState, DocumentSource, WatchSettings, spawn};

/// Where a term reads its document from, and how.
pub struct DocumentWatch<S> {
    pub source: S,
    pub defaults: ConfigDefaults,
    pub settings: WatchSettings,
    /// Draws the watcher's backoff jitter.
    pub jitter: StdRng,
}

/// Serves one term: watches the document, ticks until `stop`, stops the watcher. `follow`
/// sees the watcher's channel before the first tick (the daemon counts rejected documents
/// from it; the seeded world checks that the loop keeps the last good one).
pub async fn serve_term<S>(
    controller: Controller,
    document: DocumentWatch<S>,
    clock: &dyn Clock,
    dry_run: bool,
    stop: impl Future<Output = ()>,
    follow: impl FnOnce(&watch::Receiver<ConfigState>),
) where
    S: DocumentSource + 'static,
{
    let (watch_stop_tx, mut watch_stop_rx) = watch::channel(false);
    let (config_rx, watcher) = spawn(
        document.source,
        document.defaults,
        document.settings,
        document.jitter,
        async move {
            let _ = watch_stop_rx.wait_for(|stop| *stop).await;
        },
    );
    follow(&config_rx);
    run(controller, config_rx, clock, dry_run, stop).await;
    let _ = watch_stop_tx.send(true);
    let _ = watcher.await;
}
