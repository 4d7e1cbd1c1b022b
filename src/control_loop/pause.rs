//! The operator's pause key, read every tick: while it says so, nothing is dispatched and
//! the reason is shown; a key that cannot be read is said once per change.

use tracing::{info, warn};

use super::Controller;
use crate::config::watch::Fetched;

impl Controller {
    /// Reads the pause key. A key that cannot be read keeps its last known value: an
    /// outage of Consul neither pauses CI nor lifts a pause.
    pub(super) async fn read_pause_key(&mut self) {
        let Some((key, source)) = &self.pause_key else {
            return;
        };
        let read = source.fetch(0, std::time::Duration::ZERO).await;
        let paused = match read {
            Ok(Fetched::Found { bytes, .. }) => crate::config::pause::pause_reason(key, &bytes),
            Ok(Fetched::Missing { .. }) => None,
            Err(e) => {
                if self.memory.pause_unreadable.as_deref() != Some(e.message.as_str()) {
                    warn!("the pause key could not be read; keeping its last value: {e}");
                    self.memory.pause_unreadable = Some(e.message);
                }
                return;
            }
        };
        self.memory.pause_unreadable = None;
        if paused != self.memory.paused {
            match &paused {
                Some(why) => warn!("dispatching paused by the operator: {why}"),
                None => info!("dispatching resumed: the pause key {key} is gone or false"),
            }
            self.memory.paused = paused;
        }
    }
}
