//! Nomad's dispatch of a parameterized job (`nomad/job_endpoint.go`, `Job.Dispatch`): its
//! checks in Nomad's order with Nomad's exact messages, the idempotency token that returns the
//! existing child without an evaluation, and the new child's id and meta.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use rand::Rng;

use super::jobs::{GroupSummary, PayloadRule, TwinJob};
use super::responses::TwinRefusal;
use super::state::TwinState;
use crate::observe::ChildStatus;

/// Nomad's limit on a dispatch payload, in decoded bytes (`DispatchPayloadSizeLimit`).
pub const DISPATCH_PAYLOAD_BYTES_MAX: usize = 16 * 1024;

/// A dispatch as the API receives it.
#[derive(Clone, Debug, Default)]
pub struct DispatchInput {
    pub meta: BTreeMap<String, String>,
    pub payload: Vec<u8>,
    pub idempotency_token: String,
    pub id_prefix_template: String,
}

/// What a dispatch returned: the JSON fields of Nomad's `JobDispatchResponse`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatchReply {
    pub index: u64,
    pub job_create_index: u64,
    pub eval_create_index: u64,
    pub eval_id: String,
    pub dispatched_job_id: String,
}

impl TwinState {
    pub(super) fn dispatch(
        &mut self,
        namespace: &str,
        parent_id: &str,
        input: DispatchInput,
    ) -> Result<DispatchReply, TwinRefusal> {
        let refuse = |message: String| TwinRefusal::new(StatusCode::INTERNAL_SERVER_ERROR, message);
        if parent_id.is_empty() {
            return Err(refuse("missing parameterized job ID".into()));
        }
        let parent = self
            .jobs
            .get(&(namespace.to_string(), parent_id.to_string()))
            .cloned()
            .ok_or_else(|| refuse("parameterized job not found".into()))?;
        if !parent.is_parameterized() {
            return Err(refuse(format!(
                "Specified job {parent_id:?} is not a parameterized job"
            )));
        }
        if parent.stop {
            return Err(refuse(format!("Specified job {parent_id:?} is stopped")));
        }
        let spec = parent.parameterized.clone().unwrap_or_default();
        let has_payload = !input.payload.is_empty();
        match spec.payload {
            PayloadRule::Required if !has_payload => {
                return Err(refuse(
                    "Payload is not provided but required by parameterized job".into(),
                ));
            }
            PayloadRule::Forbidden if has_payload => {
                return Err(refuse(
                    "Payload provided but forbidden by parameterized job".into(),
                ));
            }
            _ => {}
        }
        if input.payload.len() > DISPATCH_PAYLOAD_BYTES_MAX {
            return Err(refuse(format!(
                "Payload exceeds maximum size; {} > {DISPATCH_PAYLOAD_BYTES_MAX}",
                input.payload.len()
            )));
        }
        // Nomad prints these Go string slices with %v: `[a b]`. Its map order is random; the
        // twin sorts so tests can compare messages.
        let unpermitted: Vec<&str> = input
            .meta
            .keys()
            .filter(|k| !spec.meta_required.contains(k) && !spec.meta_optional.contains(k))
            .map(String::as_str)
            .collect();
        if !unpermitted.is_empty() {
            return Err(refuse(format!(
                "Dispatch request included unpermitted metadata keys: [{}]",
                unpermitted.join(" ")
            )));
        }
        let missing: Vec<&str> = spec
            .meta_required
            .iter()
            .filter(|k| !input.meta.contains_key(*k))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(refuse(format!(
                "Dispatch did not provide required meta keys: [{}]",
                missing.join(" ")
            )));
        }
        // Validation comes first in Nomad too: a replayed token with bad meta is refused.
        if !input.idempotency_token.is_empty()
            && let Some(existing) = self.jobs.values().find(|job| {
                job.namespace == namespace
                    && job.parent_id == parent_id
                    && job.dispatch_idempotency_token == input.idempotency_token
            })
        {
            return Ok(DispatchReply {
                index: existing.modify_index,
                job_create_index: existing.create_index,
                eval_create_index: 0,
                eval_id: String::new(),
                dispatched_job_id: existing.id.clone(),
            });
        }

        let mut meta = parent.meta.clone();
        meta.extend(input.meta);
        let suffix = format!("{:08x}", self.rng.random::<u32>());
        let template = if input.id_prefix_template.is_empty() {
            String::new()
        } else {
            format!("{}-", input.id_prefix_template)
        };
        let id = format!(
            "{parent_id}/dispatch-{template}{}-{suffix}",
            self.clock_unix_s
        );
        let job_create_index = self.bump();
        let child = TwinJob {
            id: id.clone(),
            namespace: namespace.to_string(),
            parent_id: parent_id.to_string(),
            status: ChildStatus::Pending,
            stop: false,
            meta,
            parameterized: Some(spec),
            dispatched: true,
            dispatch_idempotency_token: input.idempotency_token,
            payload: input.payload,
            // An evaluation exists and has not placed the allocation yet.
            summary: GroupSummary {
                queued: 1,
                ..GroupSummary::default()
            },
            allocation: None,
            submit_time_ns: self.clock_unix_s.saturating_mul(1_000_000_000),
            create_index: job_create_index,
            modify_index: job_create_index,
            job_modify_index: job_create_index,
        };
        self.jobs.insert((namespace.to_string(), id.clone()), child);
        let eval_create_index = self.bump();
        let eval_id = self.uuid();
        Ok(DispatchReply {
            index: eval_create_index,
            job_create_index,
            eval_create_index,
            eval_id,
            dispatched_job_id: id,
        })
    }
}
