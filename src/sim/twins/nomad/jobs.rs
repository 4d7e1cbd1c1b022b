//! What the twin stores: jobs (registered parents, plain jobs and dispatched children), each
//! with its one task group's summary and, once placed, its one allocation. Plain data that
//! every other part of the twin reads.

use std::collections::BTreeMap;

use crate::observe::ChildStatus;

/// Nomad's default namespace, used when a request names none.
pub const DEFAULT_NAMESPACE: &str = "default";
/// The one task group every twin job has.
pub const TASK_GROUP: &str = "runner";

/// A parameterized job's `payload` rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PayloadRule {
    #[default]
    Optional,
    Required,
    Forbidden,
}

impl PayloadRule {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            PayloadRule::Optional => "optional",
            PayloadRule::Required => "required",
            PayloadRule::Forbidden => "forbidden",
        }
    }
}

/// How a parent job is registered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParentSpec {
    /// `None`: the default namespace.
    pub namespace: Option<String>,
    /// The parent's own `meta`; children inherit it, overlaid with the dispatch meta.
    pub meta: BTreeMap<String, String>,
    pub meta_required: Vec<String>,
    pub meta_optional: Vec<String>,
    pub payload: PayloadRule,
}

/// Allocation counts of a job's one task group, as in a job summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupSummary {
    pub queued: u64,
    pub complete: u64,
    pub failed: u64,
    pub running: u64,
    pub starting: u64,
    pub lost: u64,
    pub unknown: u64,
}

/// An allocation's `ClientStatus`: what the client node reports of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocClientStatus {
    /// Placed on a node, its tasks not started yet.
    Pending,
    Running,
    Complete,
    Failed,
    Lost,
    /// On a client that disconnected: it may still run.
    Unknown,
}

impl AllocClientStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            AllocClientStatus::Pending => "pending",
            AllocClientStatus::Running => "running",
            AllocClientStatus::Complete => "complete",
            AllocClientStatus::Failed => "failed",
            AllocClientStatus::Lost => "lost",
            AllocClientStatus::Unknown => "unknown",
        }
    }

    /// Nomad's `ClientTerminalStatus`: complete, failed or lost.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            AllocClientStatus::Complete | AllocClientStatus::Failed | AllocClientStatus::Lost
        )
    }
}

/// The one allocation of a placed child (runner parents have one task group, count 1, and
/// neither restart nor reschedule, so a child never has a second one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TwinAllocation {
    pub id: String,
    pub eval_id: String,
    pub node_id: String,
    pub client_status: AllocClientStatus,
    /// `run`, or `stop` once the job was stopped.
    pub desired_status: &'static str,
    pub create_index: u64,
    pub modify_index: u64,
    /// Nanoseconds since the Unix epoch.
    pub create_time_ns: i64,
    pub modify_time_ns: i64,
    /// The runner task's exit code once it ended, shown as a `Terminated` task event.
    pub exit_code: Option<i32>,
}

/// One job in the twin: a registered parent (or plain job) or a dispatched child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TwinJob {
    pub id: String,
    pub namespace: String,
    /// The parent's id for a dispatched child; empty otherwise.
    pub parent_id: String,
    pub status: ChildStatus,
    pub stop: bool,
    /// Everything Nomad stores, secrets included: the daemon must drop what it does not need.
    pub meta: BTreeMap<String, String>,
    /// Set for parents and (as in Nomad, which copies the parent) for their children.
    pub parameterized: Option<ParentSpec>,
    pub dispatched: bool,
    pub dispatch_idempotency_token: String,
    pub payload: Vec<u8>,
    pub summary: GroupSummary,
    /// The child's allocation once placed; `None` before (or when nothing could be placed).
    pub allocation: Option<TwinAllocation>,
    /// Nanoseconds since the Unix epoch.
    pub submit_time_ns: i64,
    pub create_index: u64,
    pub modify_index: u64,
    pub job_modify_index: u64,
}

impl TwinJob {
    /// Nomad's `IsParameterized`: a parent, not one of its children.
    pub(super) fn is_parameterized(&self) -> bool {
        self.parameterized.is_some() && !self.dispatched
    }
}
