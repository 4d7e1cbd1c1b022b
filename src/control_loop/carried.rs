//! What a term hands on to the next, and a daemon to itself after a restart: the crash-loop
//! backoff of its buckets and the children whose runner's registration it deleted. Both are
//! memory the daemon cannot read back from the services: the failed children that are the
//! backoff's evidence are purged the tick they are judged, and a deleted registration leaves
//! nothing behind. Lost, a restarted daemon would send a crash-looping bucket its whole
//! missing count at once (issue 19, defect 5) and count a runner no job can reach as supply.
//!
//! They live in one Consul key the daemon owns (`--state-key`, default `runners/state`),
//! read once at the start of every term and written whenever they change, by the lock holder
//! only and behind its fence; a standby reads nothing but the lock key. The choice over
//! Nomad's own record (failed children kept unpurged for the backoff window): that record
//! would keep a failed child's wrapped credential in Nomad's state that long, and a stopped
//! child or a purge by an operator would erase the evidence; the key costs one write per
//! change and one grant in the policy.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::model::{BucketKey, ChildId, LabelSet, RepoName};
use crate::plan::CrashBackoff;

/// The layout of the state key's JSON value; a later layout gets a new version.
pub const CARRIED_VERSION: u32 = 1;

/// The state key's value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Carried {
    pub version: u32,
    #[serde(default)]
    pub crash_backoff: Vec<CarriedBackoff>,
    #[serde(default)]
    pub deregistered: Vec<CarriedDeregistration>,
}

/// One bucket backing off after failed starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CarriedBackoff {
    pub repo: String,
    /// The bucket's label set as the `labels` meta spells it.
    pub labels: String,
    pub failed_starts: u32,
    pub next_dispatch_at: DateTime<Utc>,
    /// Written since the streak's start was kept; a key written before reads as starting at
    /// `next_dispatch_at`, which ignores more clean exits, not fewer.
    #[serde(default)]
    pub since: Option<DateTime<Utc>>,
}

/// A child whose runner's registration is gone, and a time by which it was.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CarriedDeregistration {
    pub job_id: String,
    pub namespace: String,
    pub gone_by: DateTime<Utc>,
}

impl Carried {
    pub fn of(
        crash: &BTreeMap<BucketKey, CrashBackoff>,
        deregistered: &BTreeMap<ChildId, DateTime<Utc>>,
    ) -> Carried {
        Carried {
            version: CARRIED_VERSION,
            crash_backoff: crash
                .iter()
                .map(|(bucket, b)| CarriedBackoff {
                    repo: bucket.repo.to_string(),
                    labels: bucket.labels.to_meta(),
                    failed_starts: b.failed_starts,
                    next_dispatch_at: b.next_dispatch_at,
                    since: Some(b.since),
                })
                .collect(),
            deregistered: deregistered
                .iter()
                .map(|(child, by)| CarriedDeregistration {
                    job_id: child.0.clone(),
                    namespace: child.1.clone(),
                    gone_by: *by,
                })
                .collect(),
        }
    }

    /// Parses the key's value. Entries that do not parse (a repo or label set written by
    /// hand) are dropped with the rest kept; a value that is not this layout at all is an
    /// error naming the key's problem.
    pub fn parse(bytes: &[u8]) -> Result<Carried, String> {
        let carried: Carried = serde_json::from_slice(bytes)
            .map_err(|e| format!("not the daemon's state (JSON): {e}"))?;
        if carried.version != CARRIED_VERSION {
            return Err(format!(
                "version {} is not one this daemon writes ({CARRIED_VERSION})",
                carried.version
            ));
        }
        Ok(carried)
    }

    /// The buckets backing off, by bucket.
    pub fn crash_backoff(&self) -> BTreeMap<BucketKey, CrashBackoff> {
        self.crash_backoff
            .iter()
            .filter_map(|b| {
                let repo = RepoName::parse(&b.repo)?;
                let labels = LabelSet::from_meta(&b.labels).ok()?;
                Some((
                    BucketKey { repo, labels },
                    CrashBackoff {
                        failed_starts: b.failed_starts,
                        next_dispatch_at: b.next_dispatch_at,
                        since: b.since.unwrap_or(b.next_dispatch_at),
                    },
                ))
            })
            .collect()
    }

    pub fn deregistered(&self) -> BTreeMap<ChildId, DateTime<Utc>> {
        self.deregistered
            .iter()
            .map(|d| (ChildId::new(&d.job_id, &d.namespace), d.gone_by))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_carried_reads_back_as_it_was_written() {
        let bucket = BucketKey {
            repo: RepoName::parse("acme/api").unwrap(),
            labels: LabelSet::parse(&["self-hosted", "gpu"]).unwrap(),
        };
        let at = DateTime::parse_from_rfc3339("2026-12-02T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let crash = BTreeMap::from([(
            bucket,
            CrashBackoff {
                failed_starts: 3,
                next_dispatch_at: at,
                since: at - chrono::Duration::minutes(5),
            },
        )]);
        let deregistered = BTreeMap::from([(ChildId::new("ci-runner/dispatch-1-abc", "ci"), at)]);
        let bytes = serde_json::to_vec(&Carried::of(&crash, &deregistered)).unwrap();
        let back = Carried::parse(&bytes).unwrap();
        assert_eq!(back.crash_backoff(), crash);
        assert_eq!(back.deregistered(), deregistered);
    }

    #[test]
    fn a_value_that_is_not_the_daemons_state_is_refused_and_bad_entries_are_dropped() {
        assert!(Carried::parse(b"{\"config\": true").is_err());
        assert!(
            Carried::parse(b"{\"version\": 7}")
                .unwrap_err()
                .contains("version 7")
        );
        let hand_edited = br#"{"version":1,"crashBackoff":[
            {"repo":"not a repo","labels":"self-hosted","failedStarts":2,"nextDispatchAt":"2026-12-02T12:00:00Z"},
            {"repo":"acme/api","labels":"self-hosted","failedStarts":2,"nextDispatchAt":"2026-12-02T12:00:00Z"}]}"#;
        let carried = Carried::parse(hand_edited).unwrap();
        assert_eq!(carried.crash_backoff().len(), 1);
    }
}
