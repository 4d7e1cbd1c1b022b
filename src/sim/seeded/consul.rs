//! Consul's side of the document, as the daemon's own watcher meets it: the key behind a
//! blocking query, Consul's outages, and an invalid edit someone makes and later fixes. The
//! daemon reads it through the real watcher (`config::watch`), so a bad edit or an outage
//! must leave the loop running on the last good document.

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::options::Service;
use super::ports::{Call, Scope, Shared, Sim, lock};
use crate::config::watch::{DocumentSource, Fetched};
use crate::model::PortError;

/// The key as stored at the current second: its text and modify index (which moves on every
/// write, so each edit and its fix have their own).
fn stored(sim: &Sim) -> (String, u64) {
    match sim.options.bad_document {
        Some((start, end)) if start <= sim.t && sim.t < end => (sim.options.bad_document_text(), 2),
        Some((_, end)) if sim.t >= end => (sim.options.document(), 3),
        _ => (sim.options.document(), 1),
    }
}

/// The document key, read by one daemon's watcher.
pub struct SimDocument(pub Shared);

#[async_trait]
impl DocumentSource for SimDocument {
    async fn fetch(&self, index: u64, wait: Duration) -> Result<Fetched, PortError> {
        let there = lock(&self.0).transit(Service::Consul);
        tokio::time::sleep(there).await;
        // A blocking query: held until the key is written past `index`, the wait runs out,
        // or Consul goes away under it.
        let deadline = Instant::now() + wait;
        loop {
            let (index_now, down) = {
                let sim = lock(&self.0);
                let down = sim.options.outage_at(Service::Consul, sim.t).is_some();
                (stored(&sim).1, down)
            };
            if index == 0 || index_now > index || down {
                break;
            }
            // The key is written, and Consul goes away, on whole seconds of the world: look
            // again at each.
            let step = Duration::from_secs(1);
            if Instant::now() + step >= deadline {
                tokio::time::sleep_until(deadline).await;
                break;
            }
            tokio::time::sleep(step).await;
        }
        let answer = {
            let mut sim = lock(&self.0);
            sim.call(Call {
                scope: Scope::Document,
                service: Service::Consul,
                via_vault: false,
                budget: None,
                what: "read the configuration key",
            })
            .map(|()| {
                let (text, index) = stored(&sim);
                Fetched::Found {
                    bytes: text.into_bytes(),
                    index,
                }
            })
        };
        let back = lock(&self.0).transit(Service::Consul);
        tokio::time::sleep(back).await;
        answer
    }
}
