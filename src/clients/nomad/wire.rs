//! The JSON Nomad is sent and answers with, for the calls the daemon makes; nothing else of
//! Nomad's answers is decoded.
//!
//! The listing asks for `meta=true`, so Nomad hands back every dispatch meta key, including
//! the `runner_token` the daemon passed in (BRIEF lesson 9): the wire type of a job's meta has
//! fields for the four keys the daemon reads and nothing else, so serde skips every other key
//! without ever storing it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

// ---- wire types: `GET /v1/jobs` stubs ----

#[derive(Deserialize)]
pub(super) struct JobStubWire {
    #[serde(rename = "ID")]
    pub(super) id: String,
    #[serde(rename = "ParentID", default)]
    pub(super) parent_id: String,
    #[serde(rename = "Status")]
    pub(super) status: String,
    #[serde(rename = "JobSummary", default)]
    pub(super) job_summary: Option<JobSummaryWire>,
    /// Nanoseconds since the Unix epoch.
    #[serde(rename = "SubmitTime", default)]
    pub(super) submit_time: Option<i64>,
    #[serde(rename = "Meta", default)]
    pub(super) meta: Option<ChildMetaWire>,
    /// Present on every stub; a Nomad without namespaces (before 1.0 open source) has only
    /// `default`.
    #[serde(rename = "Namespace", default)]
    pub(super) namespace: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct JobSummaryWire {
    #[serde(rename = "Summary", default)]
    pub(super) summary: Option<BTreeMap<String, TaskGroupSummaryWire>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct TaskGroupSummaryWire {
    #[serde(rename = "Queued")]
    pub(super) queued: u64,
    #[serde(rename = "Complete")]
    pub(super) complete: u64,
    #[serde(rename = "Failed")]
    pub(super) failed: u64,
    #[serde(rename = "Running")]
    pub(super) running: u64,
    #[serde(rename = "Starting")]
    pub(super) starting: u64,
    #[serde(rename = "Lost")]
    pub(super) lost: u64,
    /// Allocations on a disconnected client (Nomad ≥ 1.3).
    #[serde(rename = "Unknown")]
    pub(super) unknown: u64,
}

/// The only dispatch meta keys the daemon reads. There is deliberately no field for
/// `runner_token` or any other key: serde skips unknown keys without keeping their values.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct ChildMetaWire {
    pub(super) repo_url: Option<String>,
    pub(super) labels: Option<String>,
    pub(super) runner_name: Option<String>,
    pub(super) managed_by: Option<String>,
}

// ---- wire types: dispatch ----

#[derive(Serialize)]
pub(super) struct DispatchBodyWire<'a> {
    #[serde(rename = "Meta")]
    pub(super) meta: DispatchMetaWire<'a>,
    /// Put by Nomad (1.4.2 or later) between `dispatch-` and the time in the child's id, so an
    /// operator reads the repo off `nomad job status`. An older Nomad decodes the body without
    /// refusing unknown fields (`decodeBody` in command/agent/http.go) and ignores it: the id
    /// keeps its plain form, which the daemon recognises the same way.
    #[serde(rename = "IdPrefixTemplate", skip_serializing_if = "str::is_empty")]
    pub(super) id_prefix_template: &'a str,
}

/// Borrowed for the one serialisation of the request body; never `Debug`.
#[derive(Serialize)]
pub(super) struct DispatchMetaWire<'a> {
    pub(super) repo_url: &'a str,
    pub(super) labels: &'a str,
    pub(super) runner_name: &'a str,
    pub(super) managed_by: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) runner_token: Option<&'a str>,
}

#[derive(Deserialize)]
pub(super) struct DispatchResponseWire {
    #[serde(rename = "DispatchedJobID")]
    pub(super) dispatched_job_id: String,
    #[serde(rename = "EvalID", default)]
    pub(super) eval_id: String,
    #[serde(rename = "EvalCreateIndex", default)]
    pub(super) eval_create_index: u64,
}

// ---- wire types: allocations of a job ----

#[derive(Deserialize)]
pub(super) struct AllocStubWire {
    #[serde(rename = "ClientStatus")]
    pub(super) client_status: String,
    #[serde(rename = "CreateIndex", default)]
    pub(super) create_index: u64,
    #[serde(rename = "TaskStates", default)]
    pub(super) task_states: Option<BTreeMap<String, TaskStateWire>>,
}

#[derive(Deserialize)]
pub(super) struct TaskStateWire {
    #[serde(rename = "Events", default)]
    pub(super) events: Option<Vec<TaskEventWire>>,
}

#[derive(Deserialize)]
pub(super) struct TaskEventWire {
    #[serde(rename = "Type", default)]
    pub(super) kind: String,
    #[serde(rename = "Time", default)]
    pub(super) time: i64,
    #[serde(rename = "ExitCode", default)]
    pub(super) exit_code: i32,
}

// ---- wire types: read job ----

#[derive(Deserialize)]
pub(super) struct JobWire {
    #[serde(rename = "Status")]
    pub(super) status: String,
}

// ---- wire types: parent job ----

/// Only what says whether and how a parent may be dispatched: the full job may carry secrets
/// in its meta.
#[derive(Deserialize)]
pub(super) struct ParentWire {
    #[serde(rename = "Stop", default)]
    pub(super) stop: bool,
    #[serde(rename = "JobModifyIndex", default)]
    pub(super) modify_index: u64,
    #[serde(rename = "ParameterizedJob", default)]
    pub(super) parameterized: Option<ParameterizedWire>,
}

#[derive(Deserialize)]
pub(super) struct ParameterizedWire {
    #[serde(rename = "Payload", default)]
    pub(super) payload: Option<String>,
    #[serde(rename = "MetaRequired", default)]
    pub(super) meta_required: Option<Vec<String>>,
    #[serde(rename = "MetaOptional", default)]
    pub(super) meta_optional: Option<Vec<String>>,
}

// ---- wire types: the parents of our children ----

#[derive(Deserialize)]
pub(super) struct ParentOfWire {
    #[serde(rename = "ParentID", default)]
    pub(super) parent_id: String,
}
