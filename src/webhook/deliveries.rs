//! Delivery ids seen in the last [`DEDUP_WINDOW`]: a forge that redelivers (or an attacker
//! who replays a captured, validly signed delivery; the signature covers no timestamp) gets
//! no second hint.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::hints::WebhookForge;

/// How long a delivery id is remembered.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(10 * 60);

/// Ids remembered at most, whatever the rate: the oldest go first beyond it. Far above what
/// a forge delivers in ten minutes to one receiver.
const REMEMBERED_MAX: usize = 100_000;

/// Longer ids are not remembered (GitHub's and Forgejo's are 36-character GUIDs).
const ID_LEN_MAX: usize = 128;

type Key = (WebhookForge, String);

/// Delivery ids by first sighting; pure, `now` is an input.
#[derive(Debug, Default)]
pub struct SeenDeliveries {
    order: VecDeque<(DateTime<Utc>, Key)>,
    ids: HashSet<Key>,
}

impl SeenDeliveries {
    /// `true` the first time `id` is seen from `forge` within the window, and remembers it;
    /// `false` for a repeat. An id too long to remember is always new.
    pub fn first_sighting(&mut self, forge: WebhookForge, id: &str, now: DateTime<Utc>) -> bool {
        self.forget_before(now - chrono::Duration::from_std(DEDUP_WINDOW).unwrap_or_default());
        if id.len() > ID_LEN_MAX {
            return true;
        }
        let key = (forge, id.to_string());
        if self.ids.contains(&key) {
            return false;
        }
        if self.order.len() >= REMEMBERED_MAX
            && let Some((_, oldest)) = self.order.pop_front()
        {
            self.ids.remove(&oldest);
        }
        self.ids.insert(key.clone());
        self.order.push_back((now, key));
        true
    }

    fn forget_before(&mut self, cutoff: DateTime<Utc>) {
        while let Some((seen, _)) = self.order.front() {
            if *seen > cutoff {
                break;
            }
            if let Some((_, key)) = self.order.pop_front() {
                self.ids.remove(&key);
            }
        }
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

    #[test]
    fn a_repeat_within_ten_minutes_is_refused_and_after_them_accepted() {
        let mut seen = SeenDeliveries::default();
        assert!(seen.first_sighting(GH, "d-1", t(0)));
        assert!(!seen.first_sighting(GH, "d-1", t(1)));
        assert!(!seen.first_sighting(GH, "d-1", t(599)));
        assert!(seen.first_sighting(GH, "d-2", t(599)));
        // Ten minutes after its first sighting, d-1 is forgotten.
        assert!(seen.first_sighting(GH, "d-1", t(600)));
    }

    #[test]
    fn old_ids_are_evicted_so_memory_stays_bounded() {
        let mut seen = SeenDeliveries::default();
        for i in 0..1_000 {
            seen.first_sighting(GH, &format!("d-{i}"), t(i));
        }
        // Only the last ten minutes' ids are kept.
        assert_eq!(seen.len(), 600);
        assert_eq!(seen.ids.len(), 600);
    }

    #[test]
    fn the_forges_have_separate_ids() {
        let mut seen = SeenDeliveries::default();
        assert!(seen.first_sighting(GH, "d-1", t(0)));
        assert!(seen.first_sighting(WebhookForge::Forgejo, "d-1", t(0)));
    }
}
