//! In-memory implementations of the ports: one shared world that plays a forge and Nomad.
//!
//! No sockets, so it runs under tokio's paused clock and replays exactly; the HTTP twins are
//! for client fidelity, this is for the loop's logic.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::act::{
    ChildControl, Credential, Deregistration, DispatchRequest, Dispatched, Registrar,
    RunnerIdentity, RunnerRegistry,
};
use crate::config::RepoConfig;
use crate::model::{ChildId, ErrorClass, LabelSet, NOMAD_DEFAULT_NAMESPACE, RepoName, RunnerName};
use crate::observe::{
    Child, ChildSource, ChildStatus, ForgeJob, JobState, Placement, PortError, QueueSource,
    RepoJobs, RunnerRegistration,
};
use crate::secrets::SecretString;

/// A job in the in-memory forge.
#[derive(Clone, Debug)]
pub struct MemoryJob {
    pub repo: RepoName,
    pub labels: Vec<String>,
    pub state: JobState,
    pub created_at: DateTime<Utc>,
    /// Not shown by the forge's API yet (its status lags the truth).
    pub hidden: bool,
}

/// A child in the in-memory Nomad.
#[derive(Clone, Debug)]
pub struct MemoryChild {
    pub child: Child,
    /// The registration token it was dispatched with, as Nomad would store it in meta.
    pub runner_token: Option<String>,
}

#[derive(Default)]
struct State {
    jobs: BTreeMap<u64, MemoryJob>,
    children: BTreeMap<ChildId, MemoryChild>,
    idempotency: BTreeMap<String, ChildId>,
    next_id: u64,
    now_unix: i64,
    /// Services that answer with a transient error until switched back.
    forge_down: bool,
    nomad_down: bool,
    /// Nomad refuses every dispatch as it refuses one for a stopped parent (HTTP 500), and
    /// every parent reads stopped.
    dispatch_refused: bool,
    /// Every parent's `JobModifyIndex`: moves whenever the parents change.
    parents_modify_index: u64,
    /// Every dispatch request, in order: (parent, labels meta, runner name, minted).
    dispatch_log: Vec<(String, String, RunnerName, bool)>,
    mints: u64,
    /// Every child stopped, in order.
    stopped: Vec<ChildId>,
    /// Runner registrations: id → (repo, registration).
    registrations: BTreeMap<u64, (RepoName, RunnerRegistration)>,
    /// Registrations deleted, in order.
    deregistered: Vec<u64>,
    /// Every listing of a repo's registrations, in order.
    runner_listings: Vec<RepoName>,
    /// The runner listing answers with a transient error until switched back.
    runners_down: bool,
    /// Deletes a registration even while its runner runs a job (GitHub has been seen to).
    deletes_busy_runners: bool,
    /// What the registrations listing answers while it lags (a copy taken when it began to);
    /// one registration read by its id answers the truth.
    stale_runner_listing: Option<BTreeMap<u64, (RepoName, RunnerRegistration)>>,
}

/// The shared world; clone it freely.
#[derive(Clone, Default)]
pub struct MemoryWorld {
    state: Arc<Mutex<State>>,
}

impl MemoryWorld {
    pub fn new(now: DateTime<Utc>) -> MemoryWorld {
        let world = MemoryWorld::default();
        world.state.lock().unwrap().now_unix = now.timestamp();
        world
    }

    pub fn set_now(&self, now: DateTime<Utc>) {
        self.state.lock().unwrap().now_unix = now.timestamp();
    }

    fn now(state: &State) -> DateTime<Utc> {
        DateTime::from_timestamp(state.now_unix, 0).unwrap_or_default()
    }

    /// Queues a job; returns its id.
    pub fn queue_job(&self, repo: &RepoName, labels: &[&str]) -> u64 {
        let mut s = self.state.lock().unwrap();
        s.next_id += 1;
        let id = s.next_id;
        let created_at = Self::now(&s);
        s.jobs.insert(
            id,
            MemoryJob {
                repo: repo.clone(),
                labels: labels.iter().map(|l| l.to_string()).collect(),
                state: JobState::Queued,
                created_at,
                hidden: false,
            },
        );
        id
    }

    /// The runner of `child` registers with the forge, online and idle; returns its id.
    pub fn register_runner(&self, child: &ChildId) -> u64 {
        let mut s = self.state.lock().unwrap();
        s.next_id += 1;
        let id = s.next_id;
        let c = &s.children[child].child;
        let repo = c
            .repo_url
            .as_deref()
            .and_then(|url| url.strip_prefix("https://github.com/"))
            .and_then(RepoName::parse)
            .expect("a child of ours names its repo");
        let registration = RunnerRegistration {
            id,
            name: c
                .runner_name
                .clone()
                .expect("a child of ours names its runner"),
            online: true,
            busy: false,
        };
        s.registrations.insert(id, (repo, registration));
        id
    }

    /// Registers a runner under `name` with no child behind it (one killed with its
    /// allocation leaves such a registration), online or not; returns its id.
    pub fn register_orphan(&self, repo: &RepoName, name: &str, online: bool) -> u64 {
        let mut s = self.state.lock().unwrap();
        s.next_id += 1;
        let id = s.next_id;
        let registration = RunnerRegistration {
            id,
            name: RunnerName(name.to_string()),
            online,
            busy: false,
        };
        s.registrations.insert(id, (repo.clone(), registration));
        id
    }

    /// Sets the `busy` flag the forge shows for a registration (it may lag the truth).
    pub fn set_runner_busy(&self, runner_id: u64, busy: bool) {
        if let Some((_, r)) = self.state.lock().unwrap().registrations.get_mut(&runner_id) {
            r.busy = busy;
        }
    }

    /// Registrations deleted so far, in order.
    pub fn deregistered(&self) -> Vec<u64> {
        self.state.lock().unwrap().deregistered.clone()
    }

    /// Lets the forge delete a busy runner's registration instead of answering 422.
    /// The repos whose registrations were listed, in order.
    pub fn runner_listings(&self) -> Vec<RepoName> {
        self.state.lock().unwrap().runner_listings.clone()
    }

    pub fn set_deletes_busy_runners(&self, deletes: bool) {
        self.state.lock().unwrap().deletes_busy_runners = deletes;
    }

    /// The registrations listing keeps answering what it says now (`true`) until switched
    /// back, as a listing that lags the runners' busy flags does; `GET` of one registration
    /// answers the truth meanwhile.
    pub fn freeze_runner_listing(&self, frozen: bool) {
        let mut s = self.state.lock().unwrap();
        s.stale_runner_listing = frozen.then(|| s.registrations.clone());
    }

    pub fn set_runners_down(&self, down: bool) {
        self.state.lock().unwrap().runners_down = down;
    }

    /// The runner of `child` takes job `job` (it must be placed and idle).
    pub fn take_job(&self, child: &ChildId, job: u64) {
        let mut s = self.state.lock().unwrap();
        let runner = s.children[child].child.runner_name.clone();
        let j = s.jobs.get_mut(&job).expect("job exists");
        j.state = JobState::InProgress { runner };
    }

    /// Hides a job from the forge's API, or shows it again: its status has not caught up.
    pub fn hide_job(&self, job: u64, hidden: bool) {
        if let Some(j) = self.state.lock().unwrap().jobs.get_mut(&job) {
            j.hidden = hidden;
        }
    }

    /// The job is cancelled while queued: it leaves the queue.
    pub fn cancel_job(&self, job: u64) {
        self.state.lock().unwrap().jobs.remove(&job);
    }

    /// The runner of `child` dies at boot (a bad image): its allocation failed.
    pub fn crash(&self, child: &ChildId) {
        let mut s = self.state.lock().unwrap();
        let c = s.children.get_mut(child).expect("child exists");
        c.child.status = ChildStatus::Dead;
        c.child.placement = Placement::Failed;
    }

    /// The job finished: it leaves the queue, and its runner's child dies.
    pub fn finish_job(&self, job: u64) {
        let mut s = self.state.lock().unwrap();
        if let Some(MemoryJob {
            state: JobState::InProgress {
                runner: Some(runner),
            },
            ..
        }) = s.jobs.remove(&job)
        {
            for c in s.children.values_mut() {
                if c.child.runner_name.as_ref() == Some(&runner) {
                    c.child.status = ChildStatus::Dead;
                    c.child.placement = Placement::Finished;
                }
            }
            // An ephemeral runner deregisters after its one job.
            s.registrations.retain(|_, (_, r)| r.name != runner);
        }
    }

    /// Nomad places a pending child: its runner exists from now on.
    pub fn place(&self, child: &ChildId) {
        let mut s = self.state.lock().unwrap();
        let c = s.children.get_mut(child).expect("child exists");
        c.child.status = ChildStatus::Running;
        c.child.placement = Placement::Placed;
    }

    pub fn children(&self) -> Vec<MemoryChild> {
        self.state
            .lock()
            .unwrap()
            .children
            .values()
            .cloned()
            .collect()
    }

    pub fn jobs(&self) -> BTreeMap<u64, MemoryJob> {
        self.state.lock().unwrap().jobs.clone()
    }

    /// Children stopped so far, in order.
    pub fn stopped(&self) -> Vec<ChildId> {
        self.state.lock().unwrap().stopped.clone()
    }

    pub fn dispatch_count(&self) -> usize {
        self.state.lock().unwrap().dispatch_log.len()
    }

    pub fn set_forge_down(&self, down: bool) {
        self.state.lock().unwrap().forge_down = down;
    }

    pub fn set_dispatch_refused(&self, refused: bool) {
        let mut s = self.state.lock().unwrap();
        s.dispatch_refused = refused;
        s.parents_modify_index += 1;
    }

    pub fn set_nomad_down(&self, down: bool) {
        self.state.lock().unwrap().nomad_down = down;
    }

    /// Adds a child dispatched by hand, without our marker.
    pub fn add_foreign_child(&self, parent: &str, status: ChildStatus) -> ChildId {
        let mut s = self.state.lock().unwrap();
        s.next_id += 1;
        let id = ChildId(
            format!("{parent}/dispatch-{}-{:08x}", s.now_unix, s.next_id),
            NOMAD_DEFAULT_NAMESPACE.to_string(),
        );
        let child = Child {
            id: id.clone(),
            parent: parent.to_string(),
            status,
            placement: Placement::Unplaced,
            ours: false,
            repo_url: None,
            labels: None,
            runner_name: None,
            submitted_at: None,
            placed_at: None,
        };
        s.children.insert(
            id.clone(),
            MemoryChild {
                child,
                runner_token: None,
            },
        );
        id
    }
}

fn down(what: &str) -> PortError {
    PortError::new(ErrorClass::Transient, format!("{what}: connection refused"))
}

#[async_trait]
impl QueueSource for MemoryWorld {
    async fn list_jobs(&self, repo: &RepoConfig) -> Result<RepoJobs, PortError> {
        let s = self.state.lock().unwrap();
        if s.forge_down {
            return Err(down("list runs"));
        }
        let jobs = s
            .jobs
            .iter()
            .filter(|(_, j)| j.repo == repo.repo && !j.hidden)
            .map(|(id, j)| ForgeJob {
                id: *id,
                labels: j.labels.clone(),
                state: j.state.clone(),
                queued_at: Some(j.created_at),
            })
            .collect();
        Ok(RepoJobs {
            jobs,
            truncated: false,
        })
    }
}

#[async_trait]
impl Registrar for MemoryWorld {
    async fn mint(
        &self,
        repo: &RepoConfig,
        _runner: RunnerIdentity<'_>,
    ) -> Result<Option<Credential>, PortError> {
        let mut s = self.state.lock().unwrap();
        if s.forge_down {
            return Err(down("create registration token"));
        }
        s.mints += 1;
        Ok(Some(Credential::RegistrationToken(SecretString::from(
            format!("REGTOKEN-{}-{}", repo.repo.name(), s.mints),
        ))))
    }

    fn repo_url(&self, repo: &RepoConfig) -> String {
        format!("https://github.com/{}", repo.repo)
    }
}

#[async_trait]
impl ChildSource for MemoryWorld {
    async fn list_children(&self, parent: &str) -> Result<Vec<Child>, PortError> {
        let s = self.state.lock().unwrap();
        if s.nomad_down {
            return Err(down("list jobs"));
        }
        Ok(s.children
            .values()
            .filter(|c| c.child.parent == parent)
            .map(|c| c.child.clone())
            .collect())
    }

    async fn parents_with_our_children(
        &self,
    ) -> Result<std::collections::BTreeSet<String>, PortError> {
        let s = self.state.lock().unwrap();
        if s.nomad_down {
            return Err(down("list jobs"));
        }
        Ok(s.children
            .values()
            .filter(|c| c.child.ours)
            .map(|c| c.child.parent.clone())
            .collect())
    }

    /// Every parent exists and takes what any mode sends; stopped while dispatches are refused.
    async fn read_parent(
        &self,
        _parent: &str,
        _namespace: Option<&str>,
    ) -> Result<crate::observe::ParentJob, PortError> {
        let s = self.state.lock().unwrap();
        if s.nomad_down {
            return Err(down("read parent job"));
        }
        Ok(crate::observe::ParentJob::Parameterized {
            stopped: s.dispatch_refused,
            payload_required: false,
            meta_required: Default::default(),
            meta_optional: [
                "repo_url",
                "labels",
                "runner_name",
                "managed_by",
                "runner_token",
            ]
            .into_iter()
            .map(str::to_string)
            .collect(),
            modify_index: s.parents_modify_index,
        })
    }
}

#[async_trait]
impl ChildControl for MemoryWorld {
    async fn dispatch(&self, request: &DispatchRequest) -> Result<Dispatched, PortError> {
        use secrecy::ExposeSecret;
        let mut s = self.state.lock().unwrap();
        if s.nomad_down {
            return Err(down("dispatch"));
        }
        if s.dispatch_refused {
            return Err(PortError::new(
                ErrorClass::Configuration,
                format!("dispatch {}: 500: job is stopped", request.parent),
            ));
        }
        if let Some(existing) = s.idempotency.get(&request.idempotency_token)
            && s.children.contains_key(existing)
        {
            return Ok(Dispatched {
                child: existing.clone(),
                deduplicated: true,
            });
        }
        s.next_id += 1;
        let id = ChildId(
            format!(
                "{}/dispatch-{}-{:08x}",
                request.parent, s.now_unix, s.next_id
            ),
            request
                .namespace
                .clone()
                .unwrap_or_else(|| NOMAD_DEFAULT_NAMESPACE.to_string()),
        );
        let labels = LabelSet::from_meta(&request.meta.labels)
            .map(|l| l.to_meta())
            .unwrap_or_default();
        let child = Child {
            id: id.clone(),
            parent: request.parent.clone(),
            status: ChildStatus::Pending,
            placement: Placement::Unplaced,
            ours: true,
            repo_url: Some(request.meta.repo_url.clone()),
            labels: Some(labels.clone()),
            runner_name: Some(request.meta.runner_name.clone()),
            submitted_at: Some(Self::now(&s)),
            placed_at: None,
        };
        let runner_token = request
            .meta
            .runner_token
            .as_ref()
            .map(|t| t.expose_secret().to_string());
        s.dispatch_log.push((
            request.parent.clone(),
            labels,
            request.meta.runner_name.clone(),
            runner_token.is_some(),
        ));
        s.children.insert(
            id.clone(),
            MemoryChild {
                child,
                runner_token,
            },
        );
        s.idempotency
            .insert(request.idempotency_token.clone(), id.clone());
        Ok(Dispatched {
            child: id,
            deduplicated: false,
        })
    }

    async fn child_status(&self, child: &ChildId) -> Result<Option<ChildStatus>, PortError> {
        let s = self.state.lock().unwrap();
        if s.nomad_down {
            return Err(down("read job"));
        }
        Ok(s.children.get(child).map(|c| c.child.status))
    }

    async fn purge(&self, child: &ChildId) -> Result<(), PortError> {
        let mut s = self.state.lock().unwrap();
        if s.nomad_down {
            return Err(down("purge"));
        }
        s.children.remove(child);
        Ok(())
    }

    async fn has_live_allocation(&self, child: &ChildId) -> Result<bool, PortError> {
        let s = self.state.lock().unwrap();
        if s.nomad_down {
            return Err(down("read allocations"));
        }
        Ok(s.children.get(child).is_some_and(|c| {
            c.child.placement == Placement::Placed && c.child.status.is_in_flight()
        }))
    }

    async fn stop(&self, child: &ChildId) -> Result<(), PortError> {
        let mut s = self.state.lock().unwrap();
        if s.nomad_down {
            return Err(down("stop"));
        }
        if let Some(c) = s.children.get_mut(child) {
            c.child.status = ChildStatus::Dead;
            if c.child.placement == Placement::Placed {
                c.child.placement = Placement::Finished;
            }
        }
        s.stopped.push(child.clone());
        Ok(())
    }
}

#[async_trait]
impl RunnerRegistry for MemoryWorld {
    async fn list_runners(&self, repo: &RepoConfig) -> Result<Vec<RunnerRegistration>, PortError> {
        let mut s = self.state.lock().unwrap();
        s.runner_listings.push(repo.repo.clone());
        if s.forge_down || s.runners_down {
            return Err(down("list runners"));
        }
        Ok(s.stale_runner_listing
            .as_ref()
            .unwrap_or(&s.registrations)
            .values()
            .filter(|(r, _)| *r == repo.repo)
            .map(|(_, registration)| registration.clone())
            .collect())
    }

    async fn get_runner(
        &self,
        repo: &RepoConfig,
        runner_id: u64,
    ) -> Result<Option<RunnerRegistration>, PortError> {
        let s = self.state.lock().unwrap();
        if s.forge_down || s.runners_down {
            return Err(down("read runner"));
        }
        Ok(s.registrations
            .get(&runner_id)
            .filter(|(r, _)| *r == repo.repo)
            .map(|(_, registration)| registration.clone()))
    }

    async fn delete_runner(
        &self,
        repo: &RepoConfig,
        runner_id: u64,
    ) -> Result<Deregistration, PortError> {
        let mut s = self.state.lock().unwrap();
        if s.forge_down {
            return Err(down("delete runner"));
        }
        // The forge refuses on its own truth: a runner that was handed a job is busy, whatever
        // its listed flag said.
        let busy_in_truth = |s: &State, name: &RunnerName| {
            s.jobs
                .values()
                .any(|j| matches!(&j.state, JobState::InProgress { runner: Some(r) } if r == name))
        };
        match s.registrations.get(&runner_id) {
            Some((r, registration)) if *r == repo.repo => {
                let busy = registration.busy || busy_in_truth(&s, &registration.name);
                if busy && !s.deletes_busy_runners {
                    return Ok(Deregistration::StillBusy);
                }
                s.registrations.remove(&runner_id);
                s.deregistered.push(runner_id);
                Ok(Deregistration::Deleted)
            }
            _ => Ok(Deregistration::NotFound),
        }
    }
}

impl MemoryWorld {
    /// Every port of the loop served by this world (it plays GitHub, Forgejo and Nomad).
    pub fn services(&self) -> crate::control_loop::Services {
        let forge = || crate::control_loop::Forge {
            queue: Arc::new(self.clone()),
            registrar: Arc::new(self.clone()),
            runners: Some(Arc::new(self.clone()) as Arc<dyn RunnerRegistry>),
            registered: None,
        };
        crate::control_loop::Services {
            github: Some(forge()),
            forgejo: Some(forge()),
            children: Arc::new(self.clone()),
            control: Arc::new(self.clone()),
            wrapper: None,
        }
    }
}
