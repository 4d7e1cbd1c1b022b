//! Twin of the Nomad HTTP API, for the endpoints the daemon uses: dispatch, list jobs (with
//! a `filter`), read job, list a job's allocations, stop, purge.
//!
//! Fidelity follows Nomad's own source (`nomad/job_endpoint.go`, `command/agent/*.go`) and the
//! fixtures in `tests/fixtures/nomad/`: errors are `text/plain`, dispatch validation failures
//! are HTTP 500 with Nomad's exact messages, an idempotency token returns the existing child
//! without an evaluation, stubs carry `Meta` only with `meta=true` and only when the job has
//! meta, a job's allocations are `[]` (never 404) for an unknown job, stopping a job
//! (`DELETE` without `purge`) keeps it listed as `dead` with its allocation told to stop, and
//! deregistering an unknown job is a 200 with zero-valued fields.
//!
//! A [`NomadTwin`] is a cheap handle to shared state: tests and the simulated world keep one
//! to register parents, move children through their life (placed, finished, failed
//! placement), take the cluster down, and count the requests the daemon made; every stop and
//! purge is recorded ([`NomadTwin::deregistrations`]) so a test can ask what was torn down
//! and when.
//!
//! Namespaces as in Nomad: jobs are stored per namespace, every endpoint reads `?namespace=`
//! (`default` when absent), a job asked for in another namespace than its own is `404 job not
//! found`, and the job list takes `namespace=*` for all of them, each stub naming its
//! `Namespace`. [`NomadTwin::deny_deregister_in`] plays an ACL policy without `submit-job` in
//! a namespace: a stop or purge there is `403 Permission denied`.
//!
//! # Layout
//!
//! This file holds the [`NomadTwin`] handle: how tests and the world set the cluster up and
//! move it, and what they read back. `jobs` is what the twin stores; `state` the table
//! behind the lock and a child's moves; `dispatch` Nomad's dispatch; `responses` the JSON
//! and plain-text answers; `endpoints` the HTTP routes; `filter` the `filter` expressions.

mod dispatch;
mod endpoints;
mod filter;
mod jobs;
mod responses;
mod state;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use axum::Router;
use axum::middleware;
use axum::routing::{any, get};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::observe::ChildStatus;
use crate::sim::twins::TwinServer;
pub use dispatch::{DISPATCH_PAYLOAD_BYTES_MAX, DispatchInput, DispatchReply};
use endpoints::{gatekeeper, job_path, list_jobs};
pub use jobs::{
    AllocClientStatus, DEFAULT_NAMESPACE, GroupSummary, ParentSpec, PayloadRule, TASK_GROUP,
    TwinAllocation, TwinJob,
};
pub use responses::TwinRefusal;
use state::{AllocationMove, TwinState};
pub use state::{Deregistration, RecordedRequest};

/// The twin on a Unix socket. Dropping it stops the server and removes the socket file.
pub struct UnixTwinServer {
    pub path: std::path::PathBuf,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl UnixTwinServer {
    /// `unix://<path>`, as `NOMAD_ADDR` names a socket.
    pub fn address(&self) -> String {
        format!("unix://{}", self.path.display())
    }
}

impl Drop for UnixTwinServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Shared handle to the twin's state. Clones share the state.
#[derive(Clone)]
pub struct NomadTwin {
    state: Arc<Mutex<TwinState>>,
}

impl Default for NomadTwin {
    fn default() -> Self {
        NomadTwin::new()
    }
}

impl NomadTwin {
    /// An empty cluster without ACLs, its clock at the current time, random ids seeded by 0.
    pub fn new() -> NomadTwin {
        NomadTwin::with_seed(0)
    }

    /// An empty cluster whose generated ids derive from `seed`.
    pub fn with_seed(seed: u64) -> NomadTwin {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        NomadTwin {
            state: Arc::new(Mutex::new(TwinState {
                acl_token: None,
                deregister_denied: Default::default(),
                unavailable: false,
                clock_unix_s: now,
                index: 10,
                jobs: BTreeMap::new(),
                requests: Vec::new(),
                deregistrations: Vec::new(),
                rng: StdRng::seed_from_u64(seed),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, TwinState> {
        // A test that panicked while holding the lock has already failed; keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The axum router serving the twin's endpoints.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/jobs", get(list_jobs))
            .route("/v1/job/{*rest}", any(job_path))
            .layer(middleware::from_fn_with_state(self.clone(), gatekeeper))
            .with_state(self.clone())
    }

    /// Serves the twin on loopback.
    pub async fn serve(&self) -> std::io::Result<TwinServer> {
        TwinServer::start(self.router()).await
    }

    /// Serves the twin on a Unix socket at `path`, as Nomad serves a task's API socket
    /// (`${NOMAD_SECRETS_DIR}/api.sock`).
    pub async fn serve_unix(&self, path: &std::path::Path) -> std::io::Result<UnixTwinServer> {
        let listener = tokio::net::UnixListener::bind(path)?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let router = self.router();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(UnixTwinServer {
            path: path.to_path_buf(),
            shutdown: Some(tx),
        })
    }

    // ---- configuration ----

    /// With `Some(token)`, every request must carry it (`X-Nomad-Token` or a Bearer header).
    pub fn set_acl_token(&self, token: Option<&str>) {
        self.lock().acl_token = token.map(str::to_string);
    }

    /// The token may not stop or purge jobs in `namespace` (its policy lacks `submit-job`
    /// there): every `DELETE /v1/job/…` in it is refused with Nomad's `403 Permission denied`.
    pub fn deny_deregister_in(&self, namespace: &str) {
        self.lock().deregister_denied.insert(namespace.to_string());
    }

    /// An outage: every request gets Nomad's `500 No cluster leader`.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.lock().unavailable = unavailable;
    }

    pub fn set_clock(&self, unix_s: i64) {
        self.lock().clock_unix_s = unix_s;
    }

    pub fn advance_clock(&self, seconds: i64) {
        self.lock().clock_unix_s += seconds;
    }

    pub fn clock(&self) -> i64 {
        self.lock().clock_unix_s
    }

    /// Registers a parameterized batch job in the default namespace.
    pub fn register_parent(
        &self,
        id: &str,
        meta_required: &[&str],
        meta_optional: &[&str],
        payload: PayloadRule,
    ) {
        self.register_parent_spec(
            id,
            ParentSpec {
                meta_required: meta_required.iter().map(|s| s.to_string()).collect(),
                meta_optional: meta_optional.iter().map(|s| s.to_string()).collect(),
                payload,
                ..ParentSpec::default()
            },
        );
    }

    /// Registers (or replaces) a parameterized batch job.
    pub fn register_parent_spec(&self, id: &str, spec: ParentSpec) {
        let namespace = spec
            .namespace
            .clone()
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string());
        self.register_job(TwinJob {
            id: id.to_string(),
            namespace,
            parent_id: String::new(),
            // A parameterized job never runs itself; Nomad reports it `running`.
            status: ChildStatus::Running,
            stop: false,
            meta: spec.meta.clone(),
            parameterized: Some(spec),
            dispatched: false,
            dispatch_idempotency_token: String::new(),
            payload: Vec::new(),
            summary: GroupSummary::default(),
            allocation: None,
            submit_time_ns: 0,
            create_index: 0,
            modify_index: 0,
            job_modify_index: 0,
        });
    }

    /// Registers a plain (not parameterized) batch job, e.g. to dispatch to it by mistake.
    pub fn register_plain_job(&self, id: &str) {
        self.register_job(TwinJob {
            id: id.to_string(),
            namespace: DEFAULT_NAMESPACE.to_string(),
            parent_id: String::new(),
            status: ChildStatus::Pending,
            stop: false,
            meta: BTreeMap::new(),
            parameterized: None,
            dispatched: false,
            dispatch_idempotency_token: String::new(),
            payload: Vec::new(),
            summary: GroupSummary {
                queued: 1,
                ..GroupSummary::default()
            },
            allocation: None,
            submit_time_ns: 0,
            create_index: 0,
            modify_index: 0,
            job_modify_index: 0,
        });
    }

    fn register_job(&self, mut job: TwinJob) {
        let mut state = self.lock();
        let index = state.bump();
        job.create_index = index;
        job.modify_index = index;
        job.job_modify_index = index;
        job.submit_time_ns = state.clock_unix_s.saturating_mul(1_000_000_000);
        state
            .jobs
            .insert((job.namespace.clone(), job.id.clone()), job);
    }

    /// `nomad job stop <parent>`: further dispatches are refused.
    pub fn stop_parent(&self, id: &str) -> Result<(), String> {
        let mut state = self.lock();
        let index = state.bump();
        let job = state
            .find_mut(id)
            .filter(|job| job.is_parameterized())
            .ok_or_else(|| format!("no parent {id}"))?;
        job.stop = true;
        job.modify_index = index;
        job.job_modify_index = index;
        Ok(())
    }

    // ---- the world moving ----

    /// Dispatches as `nomad job dispatch` would, in `namespace` (e.g. a child started by
    /// hand, without `managed_by`).
    pub fn dispatch(
        &self,
        namespace: &str,
        parent: &str,
        input: DispatchInput,
    ) -> Result<DispatchReply, TwinRefusal> {
        self.lock().dispatch(namespace, parent, input)
    }

    /// The children of `parent` in any namespace, oldest first.
    pub fn children(&self, parent: &str) -> Vec<TwinJob> {
        let mut children: Vec<TwinJob> = self
            .lock()
            .jobs
            .values()
            .filter(|job| job.dispatched && job.parent_id == parent)
            .cloned()
            .collect();
        children.sort_by_key(|job| job.create_index);
        children
    }

    /// One job by id, in any namespace.
    pub fn job(&self, id: &str) -> Option<TwinJob> {
        self.lock().jobs.values().find(|job| job.id == id).cloned()
    }

    /// The allocation was placed and runs: `running`, one allocation running.
    pub fn place(&self, child: &str) -> Result<(), String> {
        self.lock().transition(
            child,
            ChildStatus::Running,
            GroupSummary {
                running: 1,
                ..GroupSummary::default()
            },
            AllocationMove::Set(AllocClientStatus::Running),
        )
    }

    /// The allocation was placed on a node and its task is starting: its client status is
    /// `pending`. A job with an allocation not yet terminal is `running` in Nomad
    /// (`getJobStatus`), and the summary counts the allocation as starting.
    pub fn place_starting(&self, child: &str) -> Result<(), String> {
        self.lock().transition(
            child,
            ChildStatus::Running,
            GroupSummary {
                starting: 1,
                ..GroupSummary::default()
            },
            AllocationMove::Set(AllocClientStatus::Pending),
        )
    }

    /// The node running the allocation disconnected: client status `unknown`, the job still
    /// `running` (the allocation may still run a runner).
    pub fn disconnect(&self, child: &str) -> Result<(), String> {
        self.lock().transition(
            child,
            ChildStatus::Running,
            GroupSummary {
                unknown: 1,
                ..GroupSummary::default()
            },
            AllocationMove::Set(AllocClientStatus::Unknown),
        )
    }

    /// The allocation ended, successfully or not (`ok: false` is a runner that failed, e.g.
    /// at boot): `dead`, one allocation complete or failed.
    pub fn finish(&self, child: &str, ok: bool) -> Result<(), String> {
        let (summary, client_status) = if ok {
            (
                GroupSummary {
                    complete: 1,
                    ..GroupSummary::default()
                },
                AllocClientStatus::Complete,
            )
        } else {
            (
                GroupSummary {
                    failed: 1,
                    ..GroupSummary::default()
                },
                AllocClientStatus::Failed,
            )
        };
        self.lock().transition(
            child,
            ChildStatus::Dead,
            summary,
            AllocationMove::Set(client_status),
        )
    }

    /// The runner task exited with `code` (the runner contract: 0 after a job, 3 idle, 4 a
    /// credential already used): `dead`, its allocation complete for 0 and failed otherwise,
    /// with a `Terminated` event carrying the code.
    pub fn finish_with_exit(&self, child: &str, code: i32) -> Result<(), String> {
        self.finish(child, code == 0)?;
        let mut state = self.lock();
        let allocation = state
            .find_mut(child)
            .and_then(|job| job.allocation.as_mut())
            .ok_or_else(|| format!("{child} has no allocation"))?;
        allocation.exit_code = Some(code);
        Ok(())
    }

    /// The evaluation failed without placing anything: `dead` with no allocation at all.
    pub fn fail_evaluation(&self, child: &str) -> Result<(), String> {
        self.lock().transition(
            child,
            ChildStatus::Dead,
            GroupSummary::default(),
            AllocationMove::Remove,
        )
    }

    /// Back to `pending` with the allocation queued (the state right after dispatch).
    pub fn leave_pending(&self, child: &str) -> Result<(), String> {
        self.lock().transition(
            child,
            ChildStatus::Pending,
            GroupSummary {
                queued: 1,
                ..GroupSummary::default()
            },
            AllocationMove::Remove,
        )
    }

    // ---- what was torn down ----

    /// Every `DELETE /v1/job/{id}` served, stops and purges, in order.
    pub fn deregistrations(&self) -> Vec<Deregistration> {
        self.lock().deregistrations.clone()
    }

    /// When the job `id` (in any namespace) was first stopped without purging, if ever.
    pub fn stopped_at(&self, id: &str) -> Option<Instant> {
        self.lock()
            .deregistrations
            .iter()
            .find(|d| d.job_id == id && d.existed && !d.purge)
            .map(|d| d.at)
    }

    /// Whether the job `id` was stopped without purging.
    pub fn was_stopped(&self, id: &str) -> bool {
        self.stopped_at(id).is_some()
    }

    /// Whether the job `id` was purged (`purge=true`) while it existed.
    pub fn was_purged(&self, id: &str) -> bool {
        self.lock()
            .deregistrations
            .iter()
            .any(|d| d.job_id == id && d.existed && d.purge)
    }

    // ---- the request log ----

    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.clone()
    }

    /// Returns the log and empties it, e.g. between ticks.
    pub fn take_requests(&self) -> Vec<RecordedRequest> {
        std::mem::take(&mut self.lock().requests)
    }
}
