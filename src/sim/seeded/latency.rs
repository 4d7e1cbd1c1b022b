//! How long a call to a service takes, each way, drawn per call from the seed: a body of
//! ordinary answers and a tail of slow ones (a GitHub search that takes seconds, a Nomad
//! server electing a leader, a Consul follower forwarding to a busy leader). Time passes
//! inside a tick because of these: the world keeps moving while a request travels, so
//! what a tick read at its start may no longer hold when its writes land.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;

use super::options::Service;

/// One way of one call to a service, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latency {
    /// Most calls take between these.
    pub body_ms: (u64, u64),
    /// The share of calls in the tail.
    pub tail: f64,
    /// A call in the tail takes between these.
    pub tail_ms: (u64, u64),
}

impl Latency {
    pub const NONE: Latency = Latency {
        body_ms: (0, 0),
        tail: 0.0,
        tail_ms: (0, 0),
    };

    pub fn draw(&self, rng: &mut StdRng) -> Duration {
        let (low, high) = if self.tail > 0.0 && rng.random_bool(self.tail) {
            self.tail_ms
        } else {
            self.body_ms
        };
        Duration::from_millis(rng.random_range(low..=high.max(low)))
    }

    /// The longest one way can take.
    pub fn max(&self) -> Duration {
        Duration::from_millis(self.body_ms.1.max(self.tail_ms.1))
    }
}

/// Latencies per service, drawn from the seed: each service is fast or sluggish in this run,
/// and has a tail of its own.
pub fn draw(rng: &mut StdRng) -> BTreeMap<Service, Latency> {
    let mut pick = |body_ms: (u64, u64), tail_ms: (u64, u64)| {
        let slow = rng.random_range(1..=3);
        Latency {
            body_ms: (body_ms.0, body_ms.1 * slow),
            tail: *[0.0, 0.01, 0.03]
                .get(rng.random_range(0..3))
                .expect("in range"),
            tail_ms,
        }
    };
    BTreeMap::from([
        // GitHub's REST API: tens to hundreds of milliseconds, searches sometimes seconds.
        (Service::GitHub, pick((40, 250), (1_000, 6_000))),
        (Service::Forgejo, pick((10, 80), (500, 3_000))),
        // Nomad's servers: fast, but an election or a busy leader stalls a call for seconds.
        (Service::Nomad, pick((3, 40), (500, 4_000))),
        (Service::Vault, pick((3, 30), (200, 2_000))),
        (Service::Consul, pick((2, 20), (200, 2_000))),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_draw_stays_within_the_body_or_the_tail_and_the_tail_shows_at_its_rate() {
        let latency = Latency {
            body_ms: (10, 20),
            tail: 0.1,
            tail_ms: (1_000, 2_000),
        };
        let mut rng = StdRng::seed_from_u64(7);
        let draws: Vec<Duration> = (0..10_000).map(|_| latency.draw(&mut rng)).collect();
        let slow = draws
            .iter()
            .filter(|d| **d >= Duration::from_secs(1))
            .count();
        assert!(draws.iter().all(|d| *d <= latency.max()));
        assert!(
            draws.iter().all(
                |d| (10..=20).contains(&(d.as_millis() as u64)) || *d >= Duration::from_secs(1)
            )
        );
        assert!((800..=1_200).contains(&slow), "{slow} slow calls of 10,000");
        assert_eq!(Latency::NONE.draw(&mut rng), Duration::ZERO);
    }
}
