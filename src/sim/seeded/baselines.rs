//! The strategies the benchmark compares ours against, run over the same ports, the same world
//! and the same faults as the real controller.
//!
//! - [`SeedPoller`]: the poller of the field report this project started from. Each poll it
//!   groups queued jobs by (repo, labels), counts the runners in flight from Nomad
//!   *allocations* (a child the cluster has not placed has none, so it is not counted), reads
//!   each such child's job to learn its bucket, counts a runner as supply even while it runs a
//!   job, dispatches the difference, and purges a runner only once its allocation finished. It
//!   never reaps and makes no conditional requests.
//! - [`EphemerdPreVeto`]: the webhook-driven scheduler of the ephemerd report, before its veto.
//!   It balances runners per label set, keeps a ledger of each runner's intent job, the jobs
//!   seen running and the runners seen bound, and on every job completion retires a runner
//!   that is unbound, whose intent job was seen running, in a class without unmet demand. What
//!   it learns comes from webhooks, which show what GitHub's API shows, with its lag.

use std::collections::{BTreeMap, BTreeSet};

use super::ports::{Shared, lock};
use super::world::Visible;
use crate::act::{DispatchMeta, DispatchRequest};
use crate::config::{Config, RepoConfig, Route};
use crate::control_loop::Services;
use crate::model::{ChildId, LabelSet, RepoName, RunnerName};
use crate::observe::{ChildStatus, JobState, Placement};

/// A runner name and idempotency token no other dispatch of the run has.
fn fresh_request(
    parent: &str,
    repo_url: String,
    labels: &LabelSet,
    serial: u64,
    token: Option<crate::act::Credential>,
) -> DispatchRequest {
    DispatchRequest {
        parent: parent.to_string(),
        namespace: None,
        meta: DispatchMeta {
            repo_url,
            labels: labels.to_meta(),
            runner_name: runner_name(parent, serial),
            runner_token: token.map(|t| t.plain().clone()),
        },
        idempotency_token: format!("baseline-{serial:032x}"),
    }
}

fn runner_name(parent: &str, serial: u64) -> RunnerName {
    RunnerName::for_parent(parent, &format!("{serial:012x}"))
}

/// Mints for the next runner of a baseline: these strategies register runners with
/// registration tokens, as the systems they stand for did.
async fn mint_next(
    forge: &crate::control_loop::Forge,
    repo: &RepoConfig,
    parent: &str,
    labels: &LabelSet,
    serial: &mut u64,
) -> Result<Option<crate::act::Credential>, crate::observe::PortError> {
    *serial += 1;
    let mut repo = repo.clone();
    repo.credential = crate::config::CredentialKind::Registration;
    let name = runner_name(parent, *serial);
    forge
        .registrar
        .mint(
            &repo,
            crate::act::RunnerIdentity {
                name: &name,
                labels,
            },
        )
        .await
}

/// The cap a route is held to: its profile's, else none beyond the repo's.
fn profile_cap(repo: &RepoConfig, route: &Route) -> Option<u32> {
    route
        .profile
        .and_then(|i| repo.profiles.get(i))
        .and_then(|p| p.max_concurrent)
}

/// The seed's poll-and-dispatch, with its `HandleRunner` children waiting on allocations.
pub struct SeedPoller {
    services: Services,
    shared: Shared,
    /// Children whose `HandleRunner` still waits for the allocation to finish.
    handled: BTreeSet<ChildId>,
    serial: u64,
}

/// A runner the seed sees in flight: a child with a pending or running allocation.
struct Slot {
    parent: String,
    repo_url: String,
    labels: String,
}

impl SeedPoller {
    pub fn new(services: Services, shared: Shared) -> SeedPoller {
        SeedPoller {
            services,
            shared,
            handled: BTreeSet::new(),
            serial: 0,
        }
    }

    pub async fn tick(&mut self, config: &Config) {
        self.finish_handled().await;
        for repo in config.repos.values() {
            self.poll_repo(repo).await;
        }
    }

    /// `RunnerTerminal` for each waiting child (one request each); a finished one is stopped
    /// and purged. A child without an allocation is not finished.
    async fn finish_handled(&mut self) {
        let waiting: Vec<ChildId> = self.handled.iter().cloned().collect();
        for child in waiting {
            match self.services.control.child_status(&child).await {
                Ok(None) => {
                    self.handled.remove(&child);
                }
                Ok(Some(ChildStatus::Dead)) => {
                    if self.services.control.purge(&child).await.is_ok() {
                        self.handled.remove(&child);
                    }
                }
                Ok(Some(_)) | Err(_) => {}
            }
        }
    }

    /// `ActiveRunnerSlots`: the parent's allocations, then one job read per active one.
    async fn active_slots(&self, parent: &str) -> Option<Vec<Slot>> {
        let children = self.services.children.list_children(parent).await.ok()?;
        let slots: Vec<Slot> = children
            .into_iter()
            .filter(|c| c.placement == Placement::Placed && c.status.is_in_flight())
            .filter_map(|c| {
                Some(Slot {
                    parent: c.parent,
                    repo_url: c.repo_url?,
                    labels: c.labels?,
                })
            })
            .collect();
        lock(&self.shared).requests.nomad += slots.len() as u64;
        Some(slots)
    }

    async fn poll_repo(&mut self, repo: &RepoConfig) {
        let Some(forge) = self.services.forge(&repo.mode) else {
            return;
        };
        let Ok(listing) = forge.queue.list_jobs(repo).await else {
            return;
        };
        let mut queued: BTreeMap<LabelSet, u32> = BTreeMap::new();
        for job in listing.jobs.iter().filter(|j| j.state == JobState::Queued) {
            let Ok(labels) = LabelSet::parse(&job.labels) else {
                continue;
            };
            if repo.mode.is_github() && !labels.contains("self-hosted") {
                continue;
            }
            *queued.entry(labels).or_default() += 1;
        }
        if queued.is_empty() {
            return;
        }
        let repo_url = forge.registrar.repo_url(repo);
        let mut slots = Vec::new();
        for parent in repo.parents() {
            match self.active_slots(&parent).await {
                Some(found) => slots.extend(found),
                // The seed's poll fails as a whole when Nomad cannot be read.
                None => return,
            }
        }
        let mut repo_active = slots.iter().filter(|s| s.repo_url == repo_url).count() as u32;
        for (labels, queued) in queued {
            let Ok(route) = repo.route(&labels) else {
                continue;
            };
            let meta = labels.to_meta();
            let bucket_active = slots
                .iter()
                .filter(|s| s.repo_url == repo_url && s.labels == meta)
                .count() as u32;
            let profile_active = slots
                .iter()
                .filter(|s| s.repo_url == repo_url && s.parent == route.parent)
                .count() as u32;
            let mut room = queued
                .saturating_sub(bucket_active)
                .min(repo.max_concurrent.saturating_sub(repo_active));
            if let Some(cap) = profile_cap(repo, &route) {
                room = room.min(cap.saturating_sub(profile_active));
            }
            for _ in 0..room {
                let Ok(token) =
                    mint_next(forge, repo, &route.parent, &labels, &mut self.serial).await
                else {
                    break;
                };
                let request =
                    fresh_request(&route.parent, repo_url.clone(), &labels, self.serial, token);
                match self.services.control.dispatch(&request).await {
                    Ok(dispatched) => {
                        self.handled.insert(dispatched.child);
                        repo_active += 1;
                        slots.push(Slot {
                            parent: route.parent.clone(),
                            repo_url: repo_url.clone(),
                            labels: meta.clone(),
                        });
                    }
                    Err(_) => break,
                }
            }
        }
    }
}

/// ephemerd's scheduler without the veto.
pub struct EphemerdPreVeto {
    services: Services,
    shared: Shared,
    runners: BTreeMap<RunnerName, Runner>,
    /// Jobs an `in_progress` webhook showed running.
    started: BTreeSet<u64>,
    /// Runners an `in_progress` webhook named.
    bound: BTreeSet<RunnerName>,
    /// Jobs the webhooks showed open (queued or running) at the last step.
    open: BTreeSet<u64>,
    serial: u64,
    grace_s: u64,
}

struct Runner {
    child: ChildId,
    repo: RepoName,
    labels: LabelSet,
    parent: String,
    intent: u64,
    dispatched_s: u64,
}

/// ephemerd's default orphan grace: an unbound runner older than this is swept.
pub const EPHEMERD_ORPHAN_GRACE_S: u64 = 600;

/// A job as the webhooks have shown it.
struct Seen {
    repo: RepoName,
    labels: LabelSet,
    visible: Visible,
}

impl EphemerdPreVeto {
    pub fn new(services: Services, shared: Shared) -> EphemerdPreVeto {
        EphemerdPreVeto {
            services,
            shared,
            runners: BTreeMap::new(),
            started: BTreeSet::new(),
            bound: BTreeSet::new(),
            open: BTreeSet::new(),
            serial: 0,
            grace_s: EPHEMERD_ORPHAN_GRACE_S,
        }
    }

    /// One simulated second: take in the webhooks, provision for queued work, sweep on a
    /// completion, and on a poll tick reap runners whose process exited.
    pub async fn step(&mut self, config: &Config, t: u64, poll: bool) {
        let seen = self.webhooks();
        let completed = self.open.iter().any(|id| !seen.contains_key(id));
        self.open = seen.keys().copied().collect();
        self.provision(config, &seen, t).await;
        if completed {
            self.sweep(&seen, t).await;
        }
        if poll {
            self.reap_exited().await;
        }
    }

    /// What the webhook deliveries have told so far: every open job as the API shows it.
    fn webhooks(&mut self) -> BTreeMap<u64, Seen> {
        let sim = lock(&self.shared);
        let mut seen = BTreeMap::new();
        for (id, job) in &sim.world.jobs {
            if job.visible == Visible::Hidden {
                continue;
            }
            if let Visible::Running(runner) = &job.visible {
                self.started.insert(*id);
                self.bound.insert(runner.clone());
            }
            seen.insert(
                *id,
                Seen {
                    repo: job.repo.clone(),
                    labels: job.labels.clone(),
                    visible: job.visible.clone(),
                },
            );
        }
        seen
    }

    fn queued_in<'a>(
        seen: &'a BTreeMap<u64, Seen>,
        repo: &'a RepoName,
        labels: &'a LabelSet,
    ) -> impl Iterator<Item = u64> + 'a {
        seen.iter()
            .filter(move |(_, s)| {
                s.visible == Visible::Queued && &s.repo == repo && &s.labels == labels
            })
            .map(|(id, _)| *id)
    }

    /// Label-set balance: a class with N queued jobs gets N unbound runners, within its caps.
    async fn provision(&mut self, config: &Config, seen: &BTreeMap<u64, Seen>, t: u64) {
        let classes: BTreeSet<(RepoName, LabelSet)> = seen
            .values()
            .filter(|s| s.visible == Visible::Queued)
            .map(|s| (s.repo.clone(), s.labels.clone()))
            .collect();
        for (repo_name, labels) in classes {
            let Some(repo) = config.repos.get(&repo_name) else {
                continue;
            };
            let Ok(route) = repo.route(&labels) else {
                continue;
            };
            let Some(forge) = self.services.forge(&repo.mode) else {
                continue;
            };
            let queued: Vec<u64> = Self::queued_in(seen, &repo_name, &labels).collect();
            let unbound = self
                .runners
                .iter()
                .filter(|(name, r)| {
                    r.repo == repo_name && r.labels == labels && !self.bound.contains(*name)
                })
                .count();
            let in_repo = self
                .runners
                .values()
                .filter(|r| r.repo == repo_name)
                .count() as u32;
            let in_profile = self
                .runners
                .values()
                .filter(|r| r.repo == repo_name && r.parent == route.parent)
                .count() as u32;
            let mut room = (queued.len().saturating_sub(unbound) as u32)
                .min(repo.max_concurrent.saturating_sub(in_repo));
            if let Some(cap) = profile_cap(repo, &route) {
                room = room.min(cap.saturating_sub(in_profile));
            }
            let intents: BTreeSet<u64> = self.runners.values().map(|r| r.intent).collect();
            let mut without_runner = queued.iter().filter(|id| !intents.contains(id));
            for _ in 0..room {
                let intent = without_runner.next().or(queued.first()).copied();
                let Some(intent) = intent else { break };
                let Ok(token) =
                    mint_next(forge, repo, &route.parent, &labels, &mut self.serial).await
                else {
                    break;
                };
                let request = fresh_request(
                    &route.parent,
                    forge.registrar.repo_url(repo),
                    &labels,
                    self.serial,
                    token,
                );
                let Ok(dispatched) = self.services.control.dispatch(&request).await else {
                    break;
                };
                self.runners.insert(
                    request.meta.runner_name.clone(),
                    Runner {
                        child: dispatched.child,
                        repo: repo_name.clone(),
                        labels: labels.clone(),
                        parent: route.parent.clone(),
                        intent,
                        dispatched_s: t,
                    },
                );
            }
        }
    }

    /// The surplus rule and the orphan grace, acted on at once: no check that the runner is
    /// idle before it is destroyed.
    async fn sweep(&mut self, seen: &BTreeMap<u64, Seen>, t: u64) {
        let mut doomed = Vec::new();
        for (name, runner) in &self.runners {
            if self.bound.contains(name) {
                continue;
            }
            let queued = Self::queued_in(seen, &runner.repo, &runner.labels).count();
            let live = self
                .runners
                .values()
                .filter(|r| r.repo == runner.repo && r.labels == runner.labels)
                .count();
            let discharged = self.started.contains(&runner.intent);
            let surplus = discharged && queued <= live.saturating_sub(1);
            let orphaned = t.saturating_sub(runner.dispatched_s) >= self.grace_s;
            if surplus || orphaned {
                doomed.push(name.clone());
            }
        }
        for name in doomed {
            let child = self.runners[&name].child.clone();
            if self.services.control.purge(&child).await.is_ok() {
                self.runners.remove(&name);
            }
        }
    }

    /// Runners whose process exited (after their job, or idle) are torn down.
    async fn reap_exited(&mut self) {
        let parents: BTreeSet<String> = self.runners.values().map(|r| r.parent.clone()).collect();
        let mut dead = BTreeSet::new();
        for parent in parents {
            if let Ok(children) = self.services.children.list_children(&parent).await {
                dead.extend(
                    children
                        .into_iter()
                        .filter(|c| c.status == ChildStatus::Dead)
                        .map(|c| c.id),
                );
            }
        }
        let exited: Vec<RunnerName> = self
            .runners
            .iter()
            .filter(|(_, r)| dead.contains(&r.child))
            .map(|(n, _)| n.clone())
            .collect();
        for name in exited {
            let child = self.runners[&name].child.clone();
            if self.services.control.purge(&child).await.is_ok() {
                self.runners.remove(&name);
                self.bound.remove(&name);
            }
        }
    }
}
