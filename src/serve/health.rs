//! The health decisions: pure functions of [`HealthFacts`] and `now`.
//!
//! `/livez` answers "should Nomad restart this process?": only when its loop stopped turning.
//! `/healthz` answers "should an operator look?": the loop turns but makes no progress. A
//! restart cures a wedged loop, never a stuck queue, so the two are kept apart.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::metrics::{HealthFacts, POLL_INTERVALS_TOLERATED};

/// A verdict and, when it is not ok, every reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Health {
    pub ok: bool,
    pub reasons: Vec<String>,
}

impl Health {
    fn of(reasons: Vec<String>) -> Health {
        Health {
            ok: reasons.is_empty(),
            reasons,
        }
    }
}

fn tolerated(facts: &HealthFacts) -> chrono::Duration {
    chrono::Duration::from_std(facts.poll_interval.saturating_mul(POLL_INTERVALS_TOLERATED))
        .unwrap_or(chrono::Duration::MAX)
}

fn since(then: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let secs = (now - then).num_seconds().max(0) as u64;
    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
}

/// Alive: the leader's loop finished a turn within three poll intervals (counting from the
/// start before the first). A standby runs no loop: it is alive unless the leader lock says
/// it lost its session.
pub fn livez(facts: &HealthFacts, now: DateTime<Utc>) -> Health {
    if !facts.leader {
        return Health::of(if facts.holds_session == Some(false) {
            vec!["standby without a Consul session".into()]
        } else {
            Vec::new()
        });
    }
    let last = facts.last_turn_at.unwrap_or(facts.started_at);
    if now - last > tolerated(facts) {
        return Health::of(vec![format!(
            "the control loop has not finished a turn for {}",
            since(last, now)
        )]);
    }
    Health::of(Vec::new())
}

/// Progress: on the leader, a tick read Nomad and a forge within three poll intervals, a
/// valid document is applied, and no bucket whose cap has room has a job queued for longer
/// than `stuck_after`. A standby makes no progress by design and is healthy.
pub fn healthz(facts: &HealthFacts, now: DateTime<Utc>) -> Health {
    if !facts.leader {
        return Health::of(Vec::new());
    }
    let mut reasons = Vec::new();
    if !facts.config_valid {
        reasons.push("no valid configuration: nothing is dispatched".to_string());
    }
    let last = facts.last_observed_at.unwrap_or(facts.started_at);
    if now - last > tolerated(facts) {
        reasons.push(format!(
            "no tick has read Nomad and a forge for {}",
            since(last, now)
        ));
    }
    let stuck_after =
        chrono::Duration::from_std(facts.stuck_after).unwrap_or(chrono::Duration::MAX);
    for bucket in &facts.buckets {
        let Some(queued_at) = bucket.oldest_queued_at else {
            continue;
        };
        if bucket.held_by_cap || now - queued_at <= stuck_after {
            continue;
        }
        reasons.push(format!(
            "{} [{}]: a job has been queued for {} while the cap had room",
            bucket.repo,
            bucket.labels,
            since(queued_at, now)
        ));
    }
    Health::of(reasons)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::metrics::BucketFacts;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + s, 0).unwrap()
    }

    /// A leader started at t(0), polling every 15 s, stuck after 15 min, that ticked and
    /// observed at t(1000) with one empty bucket.
    fn leader() -> HealthFacts {
        HealthFacts {
            leader: true,
            holds_session: None,
            started_at: t(0),
            poll_interval: Duration::from_secs(15),
            stuck_after: Duration::from_secs(900),
            config_valid: true,
            last_turn_at: Some(t(1000)),
            last_observed_at: Some(t(1000)),
            buckets: vec![bucket(None, false)],
        }
    }

    fn bucket(oldest_queued_at: Option<DateTime<Utc>>, held_by_cap: bool) -> BucketFacts {
        BucketFacts {
            repo: "acme/api".into(),
            labels: "self-hosted".into(),
            oldest_queued_at,
            held_by_cap,
        }
    }

    #[test]
    fn healthz_table() {
        type Edit = fn(&mut HealthFacts);
        let cases: &[(&str, Edit, i64, bool, &str)] = &[
            ("fresh leader", |_| {}, 1010, true, ""),
            (
                "a burst younger than stuck-after",
                |f| f.buckets = vec![bucket(Some(t(200)), false)],
                1010,
                true,
                "",
            ),
            (
                "a job older than stuck-after, cap with room",
                |f| f.buckets = vec![bucket(Some(t(100)), false)],
                1010,
                false,
                "acme/api [self-hosted]: a job has been queued for 15m 10s",
            ),
            (
                "a job older than stuck-after, held by a cap",
                |f| f.buckets = vec![bucket(Some(t(100)), true)],
                1010,
                true,
                "",
            ),
            (
                "exactly stuck-after is not yet stuck",
                |f| f.buckets = vec![bucket(Some(t(110)), false)],
                1010,
                true,
                "",
            ),
            (
                "no observation for three polls",
                |_| {},
                1046,
                false,
                "no tick has read Nomad and a forge for 46s",
            ),
            (
                "no observation for exactly three polls",
                |_| {},
                1045,
                true,
                "",
            ),
            (
                "never observed, counted from the start",
                |f| f.last_observed_at = None,
                46,
                false,
                "no tick has read Nomad and a forge for 46s",
            ),
            (
                "never observed, just started",
                |f| f.last_observed_at = None,
                30,
                true,
                "",
            ),
            (
                "no valid configuration",
                |f| f.config_valid = false,
                1010,
                false,
                "no valid configuration",
            ),
            (
                "a standby with everything wrong",
                |f| {
                    f.leader = false;
                    f.config_valid = false;
                    f.buckets = vec![bucket(Some(t(0)), false)];
                },
                99_999,
                true,
                "",
            ),
        ];
        for (name, edit, now, ok, reason) in cases {
            let mut facts = leader();
            edit(&mut facts);
            let health = healthz(&facts, t(*now));
            assert_eq!(health.ok, *ok, "{name}: {health:?}");
            assert!(
                health.reasons.iter().any(|r| r.starts_with(reason)) || *ok,
                "{name}: {health:?}"
            );
            assert_eq!(health.reasons.is_empty(), *ok, "{name}");
        }
    }

    #[test]
    fn livez_table() {
        type Edit = fn(&mut HealthFacts);
        let cases: &[(&str, Edit, i64, bool)] = &[
            ("a turn just now", |_| {}, 1010, true),
            ("a turn three polls ago", |_| {}, 1045, true),
            ("no turn for more than three polls", |_| {}, 1046, false),
            (
                "a stuck queue does not make it dead",
                |f| f.buckets = vec![bucket(Some(t(0)), false)],
                1010,
                true,
            ),
            (
                "no valid configuration is alive",
                |f| f.config_valid = false,
                1010,
                true,
            ),
            (
                "no turn yet, just started",
                |f| f.last_turn_at = None,
                40,
                true,
            ),
            (
                "no turn since the start",
                |f| f.last_turn_at = None,
                46,
                false,
            ),
            (
                "a standby turns no loop and is alive",
                |f| f.leader = false,
                99_999,
                true,
            ),
            (
                "a standby that lost its session",
                |f| {
                    f.leader = false;
                    f.holds_session = Some(false);
                },
                1010,
                false,
            ),
        ];
        for (name, edit, now, ok) in cases {
            let mut facts = leader();
            edit(&mut facts);
            assert_eq!(livez(&facts, t(*now)).ok, *ok, "{name}");
        }
    }
}
