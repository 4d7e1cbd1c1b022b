//! Consul as the daemon meets it: the document behind a blocking query, outages, and an
//! invalid edit someone makes and later fixes. The daemon's own watcher rules
//! ([`Follower`]) decide what is applied, so a bad edit or an outage must leave the loop
//! running on the last good document.

use std::sync::Arc;

use rand::rngs::StdRng;

use super::options::Service;
use super::ports::{Call, Scope, Sim};
use crate::config::watch::{Fetched, Follower, WatchSettings};
use crate::config::{Config, ConfigDefaults};

/// The key's modify index: it moves on every write, so each edit (and its fix) has its own.
fn stored(sim: &Sim) -> (String, u64) {
    match sim.options.bad_document {
        Some((start, end)) if start <= sim.t && sim.t < end => (sim.options.bad_document_text(), 2),
        Some((_, end)) if sim.t >= end => (sim.options.document(), 3),
        _ => (sim.options.document(), 1),
    }
}

/// The daemon's side of the key: its watcher rules, on the world's time.
pub struct ConsulWatch {
    follower: Follower,
    next_read_s: u64,
    /// When the blocking query in flight started.
    blocked_since: Option<u64>,
    rng: StdRng,
}

impl ConsulWatch {
    pub fn new(rng: StdRng) -> ConsulWatch {
        ConsulWatch {
            follower: Follower::new(ConfigDefaults::default(), WatchSettings::default()),
            next_read_s: 0,
            blocked_since: None,
            rng,
        }
    }

    /// Moves the watcher to `sim.t`: a blocking query answers when the key's index moves past
    /// the one asked for, when its wait runs out, or when Consul goes away under it.
    pub fn step(&mut self, sim: &mut Sim) {
        let t = sim.t;
        if t < self.next_read_s {
            return;
        }
        let (text, index) = stored(sim);
        let asked = self.follower.request_index();
        let down = sim.options.outage_at(Service::Consul, t).is_some();
        if asked > 0 && index <= asked && !down {
            let since = *self.blocked_since.get_or_insert(t);
            if t - since < self.follower.settings().wait.as_secs() {
                return;
            }
        }
        self.blocked_since = None;
        let result = sim
            .call(Call {
                scope: Scope::Document,
                service: Service::Consul,
                via_vault: false,
                budget: None,
                what: "read the configuration key",
            })
            .map(|()| Fetched::Found {
                bytes: text.into_bytes(),
                index,
            });
        let failed = result.is_err();
        let pause = self.follower.absorb(result, &mut self.rng);
        self.next_read_s = t + pause.as_secs_f64().ceil().max(1.0) as u64;
        if !failed && index != 1 {
            let applied = self.follower.state().applied_index;
            sim.trace.record(
                t,
                format!("consul read index {index}; applied index {applied:?}"),
            );
        }
    }

    /// The document the loop runs on: the last good one read.
    pub fn config(&self) -> Option<Arc<Config>> {
        self.follower.state().config.clone()
    }

    /// The index of the document the loop runs on (its config version).
    pub fn applied_index(&self) -> u64 {
        self.follower.state().applied_index.unwrap_or(0)
    }
}
