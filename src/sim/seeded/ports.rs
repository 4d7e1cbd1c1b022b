//! The loop's ports over the simulated world, with faults injected per service.
//!
//! Every call first asks [`Sim::call`] whether it fails: a whole-service outage, a Vault
//! outage (for the repos whose forge token lives in Vault), an exhausted rate-limit budget, or
//! a random transient, malformed or rate-limit failure at the rates the seed chose. Each
//! failure is remembered per [`Scope`] until a call of that scope succeeds again, so the
//! invariant checker knows which delays a fault excuses.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use secrecy::{ExposeSecret, SecretString};

use super::options::{ForgeKind, Options, Service};
use super::trace::Trace;
use super::world::{EPOCH_UNIX, Visible, World};
use crate::act::{ChildControl, DispatchRequest, Dispatched, Registrar, RegistrationToken};
use crate::config::{Config, Mode, RepoConfig};
use crate::control_loop::{Forge, Services};
use crate::model::{ChildId, ErrorClass, RepoName};
use crate::observe::{
    Child, ChildSource, ChildStatus, ForgeJob, JobState, PortError, QueueSource, RepoJobs,
};

/// Every registration token the world mints starts with this, so a leak is found by search.
pub const CANARY: &str = "CANARY-registration-token-";

/// What a failed call held back: the loop's own scopes, as the world sees them.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    Queue(RepoName),
    Mint(RepoName),
    List(String),
    /// Dispatching a parent for a repo.
    Dispatch(String, RepoName),
    Reread,
    Purge,
    /// Reading the document from Consul.
    Document,
}

/// Faults injected so far, as the invariant checker needs them.
#[derive(Debug, Default)]
pub struct Faults {
    /// Scopes whose last call failed.
    pub failing: BTreeSet<Scope>,
    /// Scopes that had a fault injected during the current step.
    pub injected_now: BTreeSet<Scope>,
    /// Rate-limit budget holder → the second its budget resets.
    pub exhausted: BTreeMap<String, u64>,
    pub injected_total: u64,
}

/// The world and everything that moves it, shared by the ports and the driver.
pub struct Sim {
    /// The current simulated second.
    pub t: u64,
    pub options: Options,
    pub config: Config,
    pub world: World,
    pub rng: StdRng,
    pub trace: Trace,
    pub faults: Faults,
    pub requests: Requests,
    mints: u64,
}

/// Requests the loop made, as the services would bill them (the benchmark reads these).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Requests {
    /// GitHub requests that count against a primary rate limit (a `304 Not Modified` to a
    /// conditional request does not).
    pub github_primary: u64,
    /// Every request to Nomad's HTTP API.
    pub nomad: u64,
}

pub type Shared = Arc<Mutex<Sim>>;

pub fn lock(shared: &Shared) -> MutexGuard<'_, Sim> {
    // A panic inside a tick is reported by the driver; the world itself stays consistent.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One port call, as fault injection sees it.
pub struct Call<'a> {
    pub scope: Scope,
    pub service: Service,
    /// The forge token of the repo is read from Vault first.
    pub via_vault: bool,
    /// Whose rate-limit budget the call spends.
    pub budget: Option<String>,
    pub what: &'a str,
}

impl Sim {
    pub fn new(options: Options, config: Config, world: World, rng: StdRng, trace: Trace) -> Sim {
        Sim {
            t: 0,
            options,
            config,
            world,
            rng,
            trace,
            faults: Faults::default(),
            requests: Requests::default(),
            mints: 0,
        }
    }

    /// Moves the world one second on.
    pub fn advance(&mut self, t: u64) {
        self.t = t;
        self.faults.injected_now.clear();
        let Sim {
            options,
            world,
            rng,
            trace,
            ..
        } = self;
        world.advance(t, options, rng, trace);
    }

    pub fn call(&mut self, call: Call<'_>) -> Result<(), PortError> {
        if call.service == Service::Nomad {
            self.requests.nomad += 1;
        }
        match self.inject(&call) {
            Ok(()) => {
                self.faults.failing.remove(&call.scope);
                Ok(())
            }
            Err(e) => {
                self.faults.failing.insert(call.scope.clone());
                self.faults.injected_now.insert(call.scope.clone());
                self.faults.injected_total += 1;
                self.trace.record(
                    self.t,
                    format!(
                        "fault {} {:?}: {} ({})",
                        call.service.as_str(),
                        call.scope,
                        e.class.as_str(),
                        e.message
                    ),
                );
                Err(e)
            }
        }
    }

    fn inject(&mut self, call: &Call<'_>) -> Result<(), PortError> {
        let t = self.t;
        let o = &self.options;
        if t >= o.faults_end_s {
            return Ok(());
        }
        let what = call.what;
        if o.outage_at(call.service, t).is_some() {
            return Err(PortError::new(
                ErrorClass::Transient,
                format!("{what}: 503 Service Unavailable"),
            ));
        }
        if call.via_vault && o.outage_at(Service::Vault, t).is_some() {
            return Err(PortError::new(
                ErrorClass::Transient,
                format!("{what}: read the token from Vault: 503 Vault is sealed"),
            ));
        }
        if let Some(holder) = &call.budget
            && let Some(reset) = self.faults.exhausted.get(holder)
            && *reset > t
        {
            return Err(rate_limited(what, reset - t, false));
        }
        let rates = o.rates(call.service);
        let roll: f64 = self.rng.random();
        if roll < rates.transient {
            let why = [
                "502 Bad Gateway",
                "operation timed out",
                "connection reset by peer",
            ]
            .choose(&mut self.rng)
            .expect("non-empty");
            return Err(PortError::new(
                ErrorClass::Transient,
                format!("{what}: {why}"),
            ));
        }
        if roll < rates.transient + rates.malformed {
            return Err(PortError::new(
                ErrorClass::Malformed,
                format!("{what}: invalid JSON: expected value at line 1 column 17"),
            ));
        }
        if let Some(holder) = &call.budget
            && roll < rates.transient + rates.malformed + rates.rate_limited
        {
            let (low, high) = o.rate_limit_reset_s;
            let wait = self.rng.random_range(low..=high);
            self.faults.exhausted.insert(holder.clone(), t + wait);
            let secondary = self.rng.random_bool(0.3);
            return Err(rate_limited(what, wait, secondary));
        }
        Ok(())
    }

    fn mint_canary(&mut self) -> RegistrationToken {
        self.mints += 1;
        RegistrationToken(SecretString::from(format!("{CANARY}{:06}", self.mints)))
    }
}

/// GitHub signals a primary limit with 403 and `x-ratelimit-remaining: 0`, a secondary one
/// with 429 and `retry-after`; both reach the loop as the same class with the wait.
fn rate_limited(what: &str, wait_s: u64, secondary: bool) -> PortError {
    let why = if secondary {
        "429 Too Many Requests: secondary rate limit (retry-after)"
    } else {
        "403 API rate limit exceeded (x-ratelimit-remaining: 0)"
    };
    PortError::new(ErrorClass::RateLimited, format!("{what}: {why}")).with_retry_after(Some(wait_s))
}

/// The rate-limit budget a repo's forge calls spend: the App installation of its owner, the
/// polling token's user, or the Forgejo instance (BRIEF lesson 10).
fn budget_of(repo: &RepoConfig) -> String {
    match &repo.mode {
        Mode::App => format!("installation of {}", repo.repo.owner()),
        Mode::Vault { vault_path, .. } => format!("token at {vault_path}"),
        Mode::Forgejo { url, .. } => format!("forgejo at {url}"),
    }
}

/// The URL runners of `repo` register against, as the real clients build it.
pub fn repo_url(repo: &RepoConfig) -> String {
    match &repo.mode {
        Mode::Forgejo { url, .. } => format!(
            "{}/{}/{}",
            url.as_str().trim_end_matches('/'),
            repo.repo.owner(),
            repo.repo.name()
        ),
        _ => format!("https://github.com/{}", repo.repo),
    }
}

fn queued_at(seconds: i64) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp(EPOCH_UNIX + seconds, 0)
}

/// GitHub (`app` and `vault` repos): jobs as the API shows them, lag included.
pub struct GitHubPort(pub Shared);

#[async_trait]
impl QueueSource for GitHubPort {
    async fn list_jobs(&self, repo: &RepoConfig) -> Result<RepoJobs, PortError> {
        let mut sim = lock(&self.0);
        sim.call(Call {
            scope: Scope::Queue(repo.repo.clone()),
            service: Service::GitHub,
            via_vault: matches!(repo.mode, Mode::Vault { .. }),
            budget: Some(budget_of(repo)),
            what: "list workflow runs",
        })?;
        let jobs = sim
            .world
            .jobs
            .iter()
            .filter(|(_, j)| j.repo == repo.repo && j.forge == ForgeKind::GitHub)
            .filter_map(|(id, j)| {
                let state = match &j.visible {
                    Visible::Hidden => return None,
                    Visible::Queued => JobState::Queued,
                    Visible::Running(runner) => JobState::InProgress {
                        runner: Some(runner.clone()),
                    },
                };
                Some(ForgeJob {
                    id: *id,
                    labels: j.raw_labels.clone(),
                    state,
                    queued_at: queued_at(j.queued_at_s),
                })
            })
            .collect();
        Ok(RepoJobs {
            jobs,
            truncated: false,
        })
    }
}

#[async_trait]
impl Registrar for GitHubPort {
    async fn mint(&self, repo: &RepoConfig) -> Result<Option<RegistrationToken>, PortError> {
        // In `vault` mode the runner job reads its admin token itself: nothing to mint.
        if !matches!(repo.mode, Mode::App) {
            return Ok(None);
        }
        mint_through(&self.0, repo, Service::GitHub, false)
    }

    fn repo_url(&self, repo: &RepoConfig) -> String {
        repo_url(repo)
    }
}

/// One registration token from `service`, after the faults that call may meet.
fn mint_through(
    shared: &Shared,
    repo: &RepoConfig,
    service: Service,
    via_vault: bool,
) -> Result<Option<RegistrationToken>, PortError> {
    let mut sim = lock(shared);
    sim.call(Call {
        scope: Scope::Mint(repo.repo.clone()),
        service,
        via_vault,
        budget: Some(budget_of(repo)),
        what: "create registration token",
    })?;
    Ok(Some(sim.mint_canary()))
}

/// Forgejo (`forgejo` repos): no timestamps, no runner names; a claimed job reads as claimed.
pub struct ForgejoPort(pub Shared);

#[async_trait]
impl QueueSource for ForgejoPort {
    async fn list_jobs(&self, repo: &RepoConfig) -> Result<RepoJobs, PortError> {
        let mut sim = lock(&self.0);
        sim.call(Call {
            scope: Scope::Queue(repo.repo.clone()),
            service: Service::Forgejo,
            via_vault: true,
            budget: Some(budget_of(repo)),
            what: "search runner jobs",
        })?;
        let jobs = sim
            .world
            .jobs
            .iter()
            .filter(|(_, j)| j.repo == repo.repo && j.forge == ForgeKind::Forgejo)
            .filter_map(|(id, j)| {
                let state = match &j.visible {
                    Visible::Hidden => return None,
                    Visible::Queued => JobState::Queued,
                    Visible::Running(_) => JobState::Claimed,
                };
                Some(ForgeJob {
                    id: *id,
                    labels: j.raw_labels.clone(),
                    state,
                    queued_at: None,
                })
            })
            .collect();
        Ok(RepoJobs {
            jobs,
            truncated: false,
        })
    }
}

#[async_trait]
impl Registrar for ForgejoPort {
    async fn mint(&self, repo: &RepoConfig) -> Result<Option<RegistrationToken>, PortError> {
        // The Forgejo API token comes from Vault, so a Vault outage stops minting too.
        mint_through(&self.0, repo, Service::Forgejo, true)
    }

    fn repo_url(&self, repo: &RepoConfig) -> String {
        repo_url(repo)
    }
}

/// Nomad: one listing per parent, dispatch with idempotency tokens, re-read, purge.
pub struct NomadPort(pub Shared);

#[async_trait]
impl ChildSource for NomadPort {
    async fn list_children(&self, parent: &str) -> Result<Vec<Child>, PortError> {
        let mut sim = lock(&self.0);
        sim.call(Call {
            scope: Scope::List(parent.to_string()),
            service: Service::Nomad,
            via_vault: false,
            budget: None,
            what: "list children",
        })?;
        Ok(sim
            .world
            .children_of(parent)
            .map(|(id, c)| Child {
                id: id.clone(),
                parent: c.parent.clone(),
                status: c.status,
                placement: c.placement,
                ours: c.repo_url.is_some(),
                repo_url: c.repo_url.clone(),
                labels: c.repo_url.as_ref().map(|_| c.labels.to_meta()),
                runner_name: c.runner.clone(),
                submitted_at: queued_at(c.submitted_s as i64),
            })
            .collect())
    }
}

#[async_trait]
impl ChildControl for NomadPort {
    async fn dispatch(&self, request: &DispatchRequest) -> Result<Dispatched, PortError> {
        let mut sim = lock(&self.0);
        let sim = &mut *sim;
        let url = request.meta.repo_url.trim_end_matches('/');
        let Some(repo) = sim.world.repo_urls.get(url).cloned() else {
            return Err(PortError::new(
                ErrorClass::Configuration,
                format!("dispatch {}: no repo has the URL {url}", request.parent),
            ));
        };
        let outage = sim.options.outage_at(Service::Nomad, sim.t).is_some();
        let fault = sim.call(Call {
            scope: Scope::Dispatch(request.parent.clone(), repo.clone()),
            service: Service::Nomad,
            via_vault: false,
            budget: None,
            what: "dispatch",
        });
        // Half of the transient failures outside an outage happen after Nomad committed the
        // child: the response is lost, and only the idempotency token keeps the retry from
        // starting a second runner.
        let committed_anyway = matches!(&fault, Err(e) if e.class == ErrorClass::Transient)
            && !outage
            && sim.rng.random_bool(0.5);
        if !committed_anyway {
            fault.clone()?;
        }
        if let Some(existing) = sim.world.idempotency.get(&request.idempotency_token)
            && sim.world.children.contains_key(existing)
        {
            let existing = existing.clone();
            sim.world.counts.dispatches_deduplicated += 1;
            sim.trace
                .record(sim.t, format!("dispatch deduplicated to {existing}"));
            fault?;
            return Ok(Dispatched {
                child: existing,
                deduplicated: true,
            });
        }
        let token = request
            .meta
            .runner_token
            .as_ref()
            .map(|t| t.0.expose_secret().to_string());
        let t = sim.t;
        let child = sim.world.dispatch(
            t,
            &sim.options,
            &mut sim.rng,
            &request.parent,
            &request.meta.repo_url,
            &request.meta.labels,
            &request.meta.runner_name,
            token,
        );
        sim.world
            .idempotency
            .insert(request.idempotency_token.clone(), child.clone());
        sim.trace.record(
            t,
            format!(
                "dispatched {child} runner={} labels={}{}",
                request.meta.runner_name,
                request.meta.labels,
                if committed_anyway {
                    " (response lost)"
                } else {
                    ""
                }
            ),
        );
        fault?;
        Ok(Dispatched {
            child,
            deduplicated: false,
        })
    }

    async fn child_status(&self, child: &ChildId) -> Result<Option<ChildStatus>, PortError> {
        let mut sim = lock(&self.0);
        sim.call(Call {
            scope: Scope::Reread,
            service: Service::Nomad,
            via_vault: false,
            budget: None,
            what: "read job",
        })?;
        Ok(sim.world.children.get(child).map(|c| c.status))
    }

    async fn purge(&self, child: &ChildId) -> Result<(), PortError> {
        let mut sim = lock(&self.0);
        let sim = &mut *sim;
        sim.call(Call {
            scope: Scope::Purge,
            service: Service::Nomad,
            via_vault: false,
            budget: None,
            what: "purge job",
        })?;
        sim.world.purge(sim.t, child, &mut sim.trace);
        Ok(())
    }
}

/// Every port of the loop over the shared world.
pub fn services(shared: &Shared) -> Services {
    let github = Arc::new(GitHubPort(shared.clone()));
    let forgejo = Arc::new(ForgejoPort(shared.clone()));
    let nomad = Arc::new(NomadPort(shared.clone()));
    Services {
        github: Some(Forge {
            queue: github.clone(),
            registrar: github,
        }),
        forgejo: Some(Forge {
            queue: forgejo.clone(),
            registrar: forgejo,
        }),
        children: nomad.clone(),
        control: nomad,
    }
}
