//! What the twin answers with: Nomad's JSON shapes (job stubs, the full job, allocation
//! stubs built on the docs' fixture, the deregistration reply), the read headers, and errors
//! as Nomad sends them, in plain text ([`TwinRefusal`]).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{Value, json};

use super::jobs::{AllocClientStatus, GroupSummary, TASK_GROUP, TwinAllocation, TwinJob};
use crate::observe::ChildStatus;

/// A refused request: the status and the plain-text body Nomad would send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TwinRefusal {
    pub status: StatusCode,
    pub message: String,
}

impl TwinRefusal {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> TwinRefusal {
        TwinRefusal {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for TwinRefusal {
    fn into_response(self) -> Response {
        text_response(self.status, self.message)
    }
}

pub(super) fn text_response(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message.into(),
    )
        .into_response()
}

/// `X-Nomad-Index`, `X-Nomad-KnownLeader` and `X-Nomad-LastContact`, as on Nomad reads.
pub(super) fn query_meta_headers(index: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("X-Nomad-Index", HeaderValue::from(index));
    headers.insert("X-Nomad-KnownLeader", HeaderValue::from_static("true"));
    headers.insert("X-Nomad-LastContact", HeaderValue::from_static("0"));
    headers
}

pub(super) fn json_response(headers: HeaderMap, body: Value) -> Response {
    (StatusCode::OK, headers, axum::Json(body)).into_response()
}

fn summary_json(summary: &GroupSummary) -> Value {
    json!({
        "Queued": summary.queued,
        "Complete": summary.complete,
        "Failed": summary.failed,
        "Running": summary.running,
        "Starting": summary.starting,
        "Lost": summary.lost,
        "Unknown": summary.unknown,
    })
}

/// The `JobListStub` of `job`, as `GET /v1/jobs` returns it.
pub(super) fn stub_json(
    job: &TwinJob,
    all: &BTreeMap<(String, String), TwinJob>,
    with_meta: bool,
) -> Value {
    let children = all
        .values()
        .filter(|c| c.dispatched && c.namespace == job.namespace && c.parent_id == job.id);
    let (mut pending, mut running, mut dead) = (0u64, 0u64, 0u64);
    for child in children {
        match child.status {
            ChildStatus::Pending => pending += 1,
            ChildStatus::Running => running += 1,
            ChildStatus::Dead => dead += 1,
        }
    }
    let mut stub = json!({
        "ID": job.id,
        "ParentID": job.parent_id,
        "Name": job.id,
        "Namespace": job.namespace,
        "Datacenters": ["dc1"],
        "NodePool": "default",
        "Multiregion": null,
        "Type": "batch",
        "Priority": 50,
        "Periodic": false,
        "ParameterizedJob": job.is_parameterized(),
        "Stop": job.stop,
        "Status": job.status.as_str(),
        "StatusDescription": "",
        "JobSummary": {
            "JobID": job.id,
            "Namespace": job.namespace,
            "Summary": { TASK_GROUP: summary_json(&job.summary) },
            "Children": { "Pending": pending, "Running": running, "Dead": dead },
            "CreateIndex": job.create_index,
            "ModifyIndex": job.modify_index,
        },
        "CreateIndex": job.create_index,
        "ModifyIndex": job.modify_index,
        "JobModifyIndex": job.job_modify_index,
        "SubmitTime": job.submit_time_ns,
    });
    // `Meta` is omitempty in Nomad's stub: absent without `meta=true` or without meta.
    if with_meta && !job.meta.is_empty() {
        stub["Meta"] = json!(job.meta);
    }
    stub
}

/// An allocation stub of Nomad's docs: the current full stub of "List Allocations", with the
/// keys only the older "List Job Allocations" example shows (`PreviousAllocation`,
/// `NextAllocation`) added, so the twin answers with every field either fixture has.
static ALLOCATION_STUB_TEMPLATE: LazyLock<Value> = LazyLock::new(|| {
    let parse = |text: &str| -> Value {
        let mut list: Vec<Value> = serde_json::from_str(text).expect("fixture is a JSON array");
        list.remove(0)
    };
    let mut stub = parse(include_str!(
        "../../../../tests/fixtures/nomad/list-allocations.response.json"
    ));
    let older = parse(include_str!(
        "../../../../tests/fixtures/nomad/list-job-allocations.response.json"
    ));
    if let (Value::Object(stub), Value::Object(older)) = (&mut stub, older) {
        for (key, value) in older {
            stub.entry(key).or_insert(value);
        }
    }
    stub
});

fn rfc3339_of_ns(ns: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_nanos(ns)
        .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// The `AllocListStub` of `job`'s allocation, as `GET /v1/job/{id}/allocations` returns it.
pub(super) fn allocation_stub_json(job: &TwinJob, allocation: &TwinAllocation) -> Value {
    let template = &*ALLOCATION_STUB_TEMPLATE;
    let mut stub = template.clone();
    let status = allocation.client_status;
    let (task_state, client_description) = match status {
        AllocClientStatus::Pending => ("pending", "No tasks have started"),
        AllocClientStatus::Running | AllocClientStatus::Unknown => ("running", "Tasks are running"),
        AllocClientStatus::Complete => ("dead", "All tasks have completed"),
        AllocClientStatus::Failed => ("dead", "Failed tasks"),
        AllocClientStatus::Lost => ("dead", "alloc is lost since its node is down"),
    };
    let created = rfc3339_of_ns(allocation.create_time_ns);
    let finished = status
        .is_terminal()
        .then(|| rfc3339_of_ns(allocation.modify_time_ns));
    // One task named like the group, with the fixture's first event ("Received") at creation.
    let mut task = template["TaskStates"]
        .as_object()
        .and_then(|tasks| tasks.values().next())
        .cloned()
        .unwrap_or_else(|| json!({}));
    task["State"] = json!(task_state);
    task["Failed"] = json!(status == AllocClientStatus::Failed);
    task["StartedAt"] = if status == AllocClientStatus::Pending {
        Value::Null
    } else {
        json!(created)
    };
    task["FinishedAt"] = json!(finished);
    let mut received = task["Events"][0].clone();
    received["Time"] = json!(allocation.create_time_ns);
    let mut events = vec![received.clone()];
    if let Some(code) = allocation.exit_code {
        let mut terminated = received;
        terminated["Type"] = json!("Terminated");
        terminated["Time"] = json!(allocation.modify_time_ns);
        terminated["ExitCode"] = json!(code);
        terminated["FailsTask"] = json!(code != 0);
        terminated["Message"] = json!("");
        events.push(terminated);
    }
    task["Events"] = json!(events);
    stub["ID"] = json!(allocation.id);
    stub["EvalID"] = json!(allocation.eval_id);
    stub["Name"] = json!(format!("{}.{TASK_GROUP}[0]", job.id));
    stub["Namespace"] = json!(job.namespace);
    stub["NodeID"] = json!(allocation.node_id);
    stub["NodeName"] = json!("twin-node");
    stub["JobID"] = json!(job.id);
    stub["JobType"] = json!("batch");
    stub["JobVersion"] = json!(0);
    stub["TaskGroup"] = json!(TASK_GROUP);
    stub["DesiredStatus"] = json!(allocation.desired_status);
    stub["DesiredDescription"] = json!(if allocation.desired_status == "stop" {
        "alloc not needed due to job update"
    } else {
        ""
    });
    stub["ClientStatus"] = json!(status.as_str());
    stub["ClientDescription"] = json!(client_description);
    stub["TaskStates"] = json!({ TASK_GROUP: task });
    // A batch job has no deployment; runner parents neither restart nor reschedule.
    stub["DeploymentStatus"] = Value::Null;
    stub["RescheduleTracker"] = Value::Null;
    stub["PreviousAllocation"] = json!("");
    stub["NextAllocation"] = json!("");
    stub["FollowupEvalID"] = json!("");
    stub["PreemptedAllocations"] = Value::Null;
    stub["PreemptedByAllocation"] = json!("");
    stub["CreateIndex"] = json!(allocation.create_index);
    stub["ModifyIndex"] = json!(allocation.modify_index);
    stub["CreateTime"] = json!(allocation.create_time_ns);
    stub["ModifyTime"] = json!(allocation.modify_time_ns);
    stub
}

/// The full job, as `GET /v1/job/{id}` returns it (secrets in meta included, as in Nomad).
pub(super) fn job_json(job: &TwinJob) -> Value {
    let parameterized = job.parameterized.as_ref().map(|spec| {
        json!({
            "Payload": spec.payload.as_str(),
            "MetaRequired": spec.meta_required,
            "MetaOptional": spec.meta_optional,
        })
    });
    // Nomad stores a child's payload snappy-compressed and returns those bytes; the twin
    // returns the raw bytes, base64-encoded like any []byte.
    let payload = (!job.payload.is_empty())
        .then(|| base64::engine::general_purpose::STANDARD.encode(&job.payload));
    json!({
        "Region": "global",
        "Namespace": job.namespace,
        "ID": job.id,
        "ParentID": job.parent_id,
        "Name": job.id,
        "Type": "batch",
        "Priority": 50,
        "AllAtOnce": false,
        "Datacenters": ["dc1"],
        "NodePool": "default",
        "Constraints": null,
        "Affinities": null,
        "Spreads": null,
        "TaskGroups": [{
            "Name": TASK_GROUP,
            "Count": 1,
            "RestartPolicy": {
                "Attempts": 0,
                "Interval": 86_400_000_000_000u64,
                "Delay": 15_000_000_000u64,
                "Mode": "fail",
            },
            "Tasks": [{
                "Name": TASK_GROUP,
                "Driver": "docker",
                "Config": { "image": "ghcr.io/actions/actions-runner:latest" },
                "Resources": { "CPU": 1000, "MemoryMB": 2048 },
            }],
            "Meta": null,
        }],
        "Update": { "Stagger": 0, "MaxParallel": 0 },
        "Multiregion": null,
        "Periodic": null,
        "ParameterizedJob": parameterized,
        "Dispatched": job.dispatched,
        "DispatchIdempotencyToken": job.dispatch_idempotency_token,
        "Payload": payload,
        "Meta": job.meta,
        "Stop": job.stop,
        "Status": job.status.as_str(),
        "StatusDescription": "",
        "Stable": false,
        "Version": 0,
        "SubmitTime": job.submit_time_ns,
        "CreateIndex": job.create_index,
        "ModifyIndex": job.modify_index,
        "JobModifyIndex": job.job_modify_index,
    })
}

/// `JobDeregisterResponse`: the three fields of the docs' sample plus the rest of the
/// source struct and its embedded query meta.
pub(super) fn deregister_reply_json(
    eval_id: &str,
    eval_create_index: u64,
    job_modify_index: u64,
    index: u64,
) -> Value {
    json!({
        "EvalID": eval_id,
        "EvalCreateIndex": eval_create_index,
        "JobModifyIndex": job_modify_index,
        "VolumeEvalID": "",
        "VolumeEvalIndex": 0,
        "Index": index,
        "LastContact": 0,
        "KnownLeader": false,
        "NextToken": "",
    })
}
