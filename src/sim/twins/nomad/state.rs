//! The twin's state behind its lock: the job table keyed by (namespace, id), Nomad's raft
//! index, the clock child ids are taken from, the generator of its ids, and the log of the
//! requests and deregistrations it served. Moving a child through its life is here; a
//! dispatch, with its validation, is in `dispatch.rs`.

use std::collections::BTreeMap;
use std::time::Instant;

use rand::Rng;
use rand::rngs::StdRng;

use super::jobs::{AllocClientStatus, GroupSummary, TwinAllocation, TwinJob};
use crate::observe::ChildStatus;

/// One `DELETE /v1/job/{id}` the twin served: a stop, or a purge with `purge=true`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deregistration {
    pub namespace: String,
    pub job_id: String,
    pub purge: bool,
    /// False when no such job existed (Nomad still answers 200).
    pub existed: bool,
    /// When the twin served it, to order it against what other twins recorded.
    pub at: Instant,
}

/// One request as the twin received it: method, raw path and raw query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    pub query: String,
}

impl RecordedRequest {
    /// The query parameters, percent-decoded.
    pub fn query_pairs(&self) -> Vec<(String, String)> {
        url::form_urlencoded::parse(self.query.as_bytes())
            .into_owned()
            .collect()
    }

    pub fn query_param(&self, key: &str) -> Option<String> {
        self.query_pairs()
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }
}

/// What a child's transition does to its allocation.
pub(super) enum AllocationMove {
    /// None placed, or the evaluation failed: no allocation.
    Remove,
    /// Placed (created when absent) with this client status.
    Set(AllocClientStatus),
}

pub(super) struct TwinState {
    pub(super) acl_token: Option<String>,
    /// Namespaces where the token lacks `submit-job`, which Nomad requires to deregister.
    pub(super) deregister_denied: std::collections::BTreeSet<String>,
    pub(super) unavailable: bool,
    /// Unix seconds; child ids and submit times are taken from it.
    pub(super) clock_unix_s: i64,
    pub(super) index: u64,
    /// Keyed by (namespace, id).
    pub(super) jobs: BTreeMap<(String, String), TwinJob>,
    pub(super) requests: Vec<RecordedRequest>,
    pub(super) deregistrations: Vec<Deregistration>,
    pub(super) rng: StdRng,
}

impl TwinState {
    pub(super) fn bump(&mut self) -> u64 {
        self.index += 1;
        self.index
    }

    pub(super) fn uuid(&mut self) -> String {
        let bytes: [u8; 16] = self.rng.random();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }

    pub(super) fn find_mut(&mut self, id: &str) -> Option<&mut TwinJob> {
        self.jobs.values_mut().find(|job| job.id == id)
    }

    /// Moves a child to `status` with `summary` and its allocation as `allocation` says,
    /// bumping its indexes.
    pub(super) fn transition(
        &mut self,
        child: &str,
        status: ChildStatus,
        summary: GroupSummary,
        allocation: AllocationMove,
    ) -> Result<(), String> {
        let index = self.bump();
        let now_ns = self.clock_unix_s.saturating_mul(1_000_000_000);
        // Ids are drawn (before the job is borrowed) only for a new allocation, so the ids
        // of later dispatches stay what they were before allocations existed.
        let placing = matches!(allocation, AllocationMove::Set(_))
            && self
                .find_mut(child)
                .is_some_and(|job| job.allocation.is_none());
        let new_ids = placing.then(|| (self.uuid(), self.uuid(), self.uuid()));
        let job = self
            .find_mut(child)
            .filter(|job| job.dispatched)
            .ok_or_else(|| format!("no child {child}"))?;
        job.status = status;
        job.summary = summary;
        job.modify_index = index;
        match allocation {
            AllocationMove::Remove => job.allocation = None,
            AllocationMove::Set(client_status) => {
                if let Some((id, eval_id, node_id)) = new_ids {
                    job.allocation = Some(TwinAllocation {
                        id,
                        eval_id,
                        node_id,
                        client_status,
                        desired_status: "run",
                        create_index: index,
                        modify_index: index,
                        create_time_ns: now_ns,
                        modify_time_ns: now_ns,
                        exit_code: None,
                    });
                }
                if let Some(allocation) = &mut job.allocation {
                    allocation.client_status = client_status;
                    allocation.modify_index = index;
                    allocation.modify_time_ns = now_ns;
                }
            }
        }
        Ok(())
    }

    /// `DELETE /v1/job/{id}` without `purge` on a known job: Nomad sets `Stop`, the scheduler
    /// tells the allocation to stop (`DesiredStatus: stop`) and the client ends it
    /// (`complete`); with nothing left to run, the job is `dead`. The twin does all of it at
    /// once. An allocation that had already ended keeps its client status.
    pub(super) fn stop_job(&mut self, key: &(String, String), index: u64) {
        let now_ns = self.clock_unix_s.saturating_mul(1_000_000_000);
        let Some(job) = self.jobs.get_mut(key) else {
            return;
        };
        job.stop = true;
        job.status = ChildStatus::Dead;
        job.modify_index = index;
        job.job_modify_index = index;
        if !job.dispatched {
            return;
        }
        match &mut job.allocation {
            Some(allocation) => {
                if !allocation.client_status.is_terminal() {
                    allocation.client_status = AllocClientStatus::Complete;
                    job.summary = GroupSummary {
                        complete: 1,
                        ..GroupSummary::default()
                    };
                }
                allocation.desired_status = "stop";
                allocation.modify_index = index;
                allocation.modify_time_ns = now_ns;
            }
            // Nothing was placed: the queued placement is dropped with the job.
            None => job.summary = GroupSummary::default(),
        }
    }
}
