//! Deliveries seen in the last [`DEDUP_WINDOW`], by id and by the digest of their body: a
//! forge that redelivers, or an attacker who replays a captured, validly signed delivery,
//! gets no second hint. The signature covers the body only (no timestamp, no delivery id),
//! so a replay under a new id is caught by its digest; the id alone catches a redelivery
//! whose body a forge rewrote.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sha2::{Digest as _, Sha256};

use super::hints::WebhookForge;

/// How long a delivery is remembered.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(10 * 60);

/// Deliveries remembered at most, whatever the rate: the oldest go first beyond it. Far
/// above what a forge delivers in ten minutes to one receiver (it would take 160 a second);
/// at most about 40 MiB (an id of up to [`DELIVERY_ID_LEN_MAX`] bytes kept twice, a digest
/// twice). Only signed deliveries are remembered, so only the forge can fill it.
const REMEMBERED_MAX: usize = 100_000;

/// Longest delivery id taken: GitHub's and Forgejo's are 36-character GUIDs.
pub const DELIVERY_ID_LEN_MAX: usize = 128;

/// A delivery id as a forge sends it: 1 to [`DELIVERY_ID_LEN_MAX`] printable ASCII
/// characters, no spaces. A delivery without one is refused, since it could not be told
/// from its own redelivery.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeliveryId(String);

impl DeliveryId {
    pub fn parse(raw: &str) -> Option<DeliveryId> {
        let fits = !raw.is_empty()
            && raw.len() <= DELIVERY_ID_LEN_MAX
            && raw.bytes().all(|b| b.is_ascii_graphic());
        fits.then(|| DeliveryId(raw.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The SHA-256 of a delivery's raw body: what the forge signed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BodyDigest([u8; 32]);

impl BodyDigest {
    pub fn of(body: &[u8]) -> BodyDigest {
        BodyDigest(Sha256::digest(body).into())
    }
}

/// Deliveries by first sighting; pure, `now` is an input.
#[derive(Debug, Default)]
pub struct SeenDeliveries {
    order: VecDeque<(DateTime<Utc>, Seen)>,
    ids: HashSet<(WebhookForge, DeliveryId)>,
    digests: HashSet<(WebhookForge, BodyDigest)>,
}

#[derive(Debug)]
struct Seen {
    forge: WebhookForge,
    id: DeliveryId,
    digest: BodyDigest,
}

impl SeenDeliveries {
    /// `true` the first time a delivery is seen from `forge` within the window (neither its
    /// id nor its body's digest seen before), and remembers both; `false` for a repeat of
    /// either, which is not remembered again.
    pub fn first_sighting(
        &mut self,
        forge: WebhookForge,
        id: &DeliveryId,
        digest: BodyDigest,
        now: DateTime<Utc>,
    ) -> bool {
        self.forget_before(now - chrono::Duration::from_std(DEDUP_WINDOW).unwrap_or_default());
        let id_key = (forge, id.clone());
        if self.ids.contains(&id_key) || self.digests.contains(&(forge, digest)) {
            return false;
        }
        if self.order.len() >= REMEMBERED_MAX
            && let Some((_, oldest)) = self.order.pop_front()
        {
            self.forget(&oldest);
        }
        self.ids.insert(id_key);
        self.digests.insert((forge, digest));
        self.order.push_back((
            now,
            Seen {
                forge,
                id: id.clone(),
                digest,
            },
        ));
        true
    }

    fn forget_before(&mut self, cutoff: DateTime<Utc>) {
        while let Some((seen, _)) = self.order.front() {
            if *seen > cutoff {
                break;
            }
            if let Some((_, seen)) = self.order.pop_front() {
                self.forget(&seen);
            }
        }
    }

    fn forget(&mut self, seen: &Seen) {
        self.ids.remove(&(seen.forge, seen.id.clone()));
        self.digests.remove(&(seen.forge, seen.digest));
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + s, 0).unwrap()
    }

    const GH: WebhookForge = WebhookForge::GitHub;

    fn id(raw: &str) -> DeliveryId {
        DeliveryId::parse(raw).unwrap()
    }

    fn body(n: i64) -> BodyDigest {
        BodyDigest::of(format!("body-{n}").as_bytes())
    }

    #[test]
    fn a_repeat_within_ten_minutes_is_refused_and_after_them_accepted() {
        let mut seen = SeenDeliveries::default();
        assert!(seen.first_sighting(GH, &id("d-1"), body(1), t(0)));
        assert!(!seen.first_sighting(GH, &id("d-1"), body(1), t(1)));
        assert!(!seen.first_sighting(GH, &id("d-1"), body(1), t(599)));
        assert!(seen.first_sighting(GH, &id("d-2"), body(2), t(599)));
        // Ten minutes after its first sighting, d-1 is forgotten.
        assert!(seen.first_sighting(GH, &id("d-1"), body(1), t(600)));
    }

    #[test]
    fn the_same_body_under_a_new_id_is_a_repeat_and_so_is_the_same_id_with_a_new_body() {
        let mut seen = SeenDeliveries::default();
        assert!(seen.first_sighting(GH, &id("d-1"), body(1), t(0)));
        assert!(!seen.first_sighting(GH, &id("d-2"), body(1), t(1)));
        assert!(!seen.first_sighting(GH, &id("d-1"), body(2), t(2)));
        // Neither repeat was remembered: d-2 with a body of its own is new.
        assert!(seen.first_sighting(GH, &id("d-2"), body(2), t(3)));
        assert_eq!(seen.len(), 2);
    }

    #[test]
    fn old_deliveries_are_evicted_so_memory_stays_bounded() {
        let mut seen = SeenDeliveries::default();
        for i in 0..1_000 {
            seen.first_sighting(GH, &id(&format!("d-{i}")), body(i), t(i));
        }
        // Only the last ten minutes' deliveries are kept.
        assert_eq!(seen.len(), 600);
        assert_eq!(seen.ids.len(), 600);
        assert_eq!(seen.digests.len(), 600);
    }

    #[test]
    fn the_forges_have_separate_ids_and_digests() {
        let mut seen = SeenDeliveries::default();
        assert!(seen.first_sighting(GH, &id("d-1"), body(1), t(0)));
        assert!(seen.first_sighting(WebhookForge::Forgejo, &id("d-1"), body(1), t(0)));
    }

    #[test]
    fn an_id_is_one_to_128_printable_ascii_characters() {
        assert!(DeliveryId::parse("72d3162e-cc78-11e3-81ab-4c9367dc0958").is_some());
        assert!(DeliveryId::parse(&"a".repeat(DELIVERY_ID_LEN_MAX)).is_some());
        for refused in [
            String::new(),
            "a".repeat(DELIVERY_ID_LEN_MAX + 1),
            "d 1".into(),
            "d-\u{e9}".into(),
            "d-\t".into(),
        ] {
            assert_eq!(DeliveryId::parse(&refused), None, "{refused:?}");
        }
    }
}
