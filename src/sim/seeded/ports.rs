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

use super::github_http::GitHubForge;
use super::options::{ForgeKind, Options, Service};
use super::trace::Trace;
use super::world::{EPOCH_UNIX, SimChild, Visible, World};
use crate::act::{
    ChildControl, Credential, DispatchRequest, Dispatched, Registrar, RunnerIdentity,
};
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
    Stop,
    /// Finding the parents of our children whatever the document names.
    Discover,
    /// Reading or deleting a repo's runner registrations.
    Runners(RepoName),
    /// Minting an installation's shared read token (its owner): a failure holds back the
    /// reads of every repo it names, a success clears none of their faults.
    ReadToken(String),
    /// Reading the document from Consul.
    Document,
    /// The leader lock's calls to Consul (sessions, the key).
    Lock,
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
    /// Rate-limit budget holder → the second its budget resets, while less than a quarter of
    /// it remains: the daemon may read its repos less often so it lasts
    /// (`control_loop::polls::budget_stretch`).
    pub low: BTreeMap<String, u64>,
    pub injected_total: u64,
    /// The daemon found the parents of its children at least once (until then it holds
    /// every dispatch, and a failing discovery excuses that).
    pub discovered_once: bool,
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
    /// Per repo, the last successful read of its queue: when, and whether the daemon then had
    /// reason to keep it on the busy cadence (jobs in the reading, or children in flight).
    pub queue_reads: BTreeMap<RepoName, QueueRead>,
    mints: u64,
    /// Draws how long each call travels.
    latency_rng: StdRng,
    /// Consul's truth about the leader lock.
    pub lock: super::lock::LockTruth,
    /// The daemons whose process runs now (a crashed one is absent until it restarts).
    pub daemons_up: BTreeSet<usize>,
    /// A violation found outside the world's own step (in a daemon's output), for the
    /// driver to report at the end of the step.
    pub violation: Option<super::invariants::Violation>,
    /// When the run began, on the runtime's clock.
    pub started: tokio::time::Instant,
    /// The invariants, judged after every step of the world and after every call that
    /// changes it (a dispatch that lands mid-second can fill a cap a step never sees full);
    /// `None` once a baseline has failed one (it is measured, not judged, from then on).
    pub checker: Option<super::invariants::Checker>,
    /// The end of the latest call drawn from a service's latency tail.
    pub slow_call_until_s: u64,
    /// The document each daemon's loop runs on, as its watcher publishes it.
    pub daemon_configs:
        BTreeMap<usize, tokio::sync::watch::Receiver<crate::config::watch::ConfigState>>,
}

/// One successful read of a repo's queue, as I2 judges the daemon's polling by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueRead {
    pub at_s: u64,
    pub busy: bool,
}

impl Sim {
    /// The daemon read `repo`'s queue now and got `jobs` jobs.
    pub fn queue_read(&mut self, repo: &RepoName, jobs: usize) {
        let children = self
            .world
            .in_flight()
            .any(|(_, child)| child.repo.as_ref() == Some(repo));
        self.queue_reads.insert(
            repo.clone(),
            QueueRead {
                at_s: self.t,
                busy: jobs > 0 || children,
            },
        );
    }
}

/// Requests the loop made, as the services would bill them (the benchmark reads these).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Requests {
    /// GitHub requests that count against a primary rate limit (a `304 Not Modified` to a
    /// conditional request does not).
    pub github_primary: u64,
    /// The same, per repo the request was about.
    pub github_primary_by_repo: BTreeMap<String, u64>,
    /// GitHub listings answered `304 Not Modified` (free).
    pub github_not_modified: u64,
    /// Every request to Nomad's HTTP API.
    pub nomad: u64,
    /// Every request that reached GitHub, refused, `304` or billed.
    pub github_sent: u64,
    /// Primary-limit requests by what they did (why a repo costs what it costs).
    pub github_primary_by_kind: BTreeMap<&'static str, u64>,
    /// Primary-limit requests per budget owner (installation, polling token, the App).
    pub github_primary_by_owner: BTreeMap<String, u64>,
    /// Installation tokens, JIT configurations and registration tokens GitHub created.
    pub github_token_mints: u64,
    /// The most GitHub requests entered and not yet answered at once.
    pub github_concurrent_max: u64,
    /// GitHub's secondary-limit points per owner over a sliding minute.
    pub secondary: SecondaryPoints,
}

/// GitHub's secondary limit counts points per owner and minute, whatever the primary limit
/// says: a `GET`, `HEAD` or `OPTIONS` costs 1 point, a `POST`, `PATCH`, `PUT` or `DELETE` 5
/// ("Calculating points for the secondary rate limit", REST API rate limits), a `304` as
/// much as a `200`. Kept per second over the last 60 seconds, so the busiest minute is found
/// wherever it starts.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SecondaryPoints {
    /// The most points one owner spent within 60 seconds.
    pub per_min_max: u64,
    #[serde(skip)]
    windows: BTreeMap<String, (std::collections::VecDeque<(u64, u64)>, u64)>,
}

impl SecondaryPoints {
    /// Points of one request by `method`.
    pub fn points(method: &http::Method) -> u64 {
        match *method {
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS => 1,
            _ => 5,
        }
    }

    /// `owner` spent the points of a `method` request at second `t`.
    pub fn spend(&mut self, owner: &str, method: &http::Method, t: u64) {
        let points = Self::points(method);
        let (seconds, sum) = self.windows.entry(owner.to_string()).or_default();
        while seconds.front().is_some_and(|(at, _)| at + 60 <= t) {
            let (_, old) = seconds.pop_front().expect("checked");
            *sum -= old;
        }
        match seconds.back_mut() {
            Some((at, p)) if *at == t => *p += points,
            _ => seconds.push_back((t, points)),
        }
        *sum += points;
        self.per_min_max = self.per_min_max.max(*sum);
    }
}

/// What a faulted call meets, before it is told to the caller: a port error for the
/// in-memory ports, an HTTP answer for the in-memory GitHub service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The whole service is out.
    Outage,
    /// Vault is out, and the call needs a token from it.
    VaultOutage,
    /// The budget the call spends was exhausted earlier and resets in `wait_s`.
    Exhausted {
        wait_s: u64,
    },
    Transient(Transient),
    /// A body that does not parse.
    Malformed,
    /// A rate limit hit now; the budget is exhausted for `wait_s`.
    RateLimited {
        wait_s: u64,
        secondary: bool,
    },
}

/// The ways a request fails without a useful answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transient {
    BadGateway,
    TimedOut,
    ConnectionReset,
}

impl Transient {
    fn as_str(self) -> &'static str {
        match self {
            Transient::BadGateway => "502 Bad Gateway",
            Transient::TimedOut => "operation timed out",
            Transient::ConnectionReset => "connection reset by peer",
        }
    }
}

impl Fault {
    /// The fault as the in-memory ports report it.
    pub fn error(self, what: &str) -> PortError {
        match self {
            Fault::Outage => PortError::new(
                ErrorClass::Transient,
                format!("{what}: 503 Service Unavailable"),
            ),
            Fault::VaultOutage => PortError::new(
                ErrorClass::Transient,
                format!("{what}: read the token from Vault: 503 Vault is sealed"),
            ),
            Fault::Exhausted { wait_s } => rate_limited(what, wait_s, false),
            Fault::Transient(kind) => {
                PortError::new(ErrorClass::Transient, format!("{what}: {}", kind.as_str()))
            }
            Fault::Malformed => PortError::new(
                ErrorClass::Malformed,
                format!("{what}: invalid JSON: expected value at line 1 column 17"),
            ),
            Fault::RateLimited { wait_s, secondary } => rate_limited(what, wait_s, secondary),
        }
    }
}

pub type Shared = Arc<Mutex<Sim>>;

/// One call to `service`: the request travels, `serve` meets the world as it is when the
/// request arrives (which may be seconds after the caller decided to make it), and the
/// answer travels back.
pub async fn over_the_wire<T>(
    shared: &Shared,
    service: Service,
    serve: impl FnOnce(&mut Sim) -> T,
) -> T {
    let there = lock(shared).transit(service);
    tokio::time::sleep(there).await;
    let answer = {
        let mut sim = lock(shared);
        let answer = serve(&mut sim);
        sim.judge();
        answer
    };
    let back = lock(shared).transit(service);
    tokio::time::sleep(back).await;
    answer
}

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
    pub fn new(
        options: Options,
        config: Config,
        world: World,
        rng: StdRng,
        latency_rng: StdRng,
        trace: Trace,
    ) -> Sim {
        Sim {
            t: 0,
            options,
            config,
            world,
            rng,
            trace,
            faults: Faults::default(),
            requests: Requests::default(),
            queue_reads: BTreeMap::new(),
            mints: 0,
            latency_rng,
            lock: Default::default(),
            daemons_up: BTreeSet::new(),
            violation: None,
            daemon_configs: BTreeMap::new(),
            slow_call_until_s: 0,
            checker: None,
            started: tokio::time::Instant::now(),
        }
    }

    /// Checks the invariants against the world as it is now; the first violation is kept
    /// for the driver.
    pub fn judge(&mut self) {
        if self.violation.is_some() {
            return;
        }
        if let Some(mut checker) = self.checker.take() {
            self.violation = checker.after_step(self);
            self.checker = Some(checker);
        }
    }

    /// How long one way of a call to `service` takes now. A draw from the tail is
    /// remembered until it is over: like a fault, it excuses what it holds back.
    pub fn transit(&mut self, service: Service) -> std::time::Duration {
        let latency = self.options.latency(service);
        let d = latency.draw(&mut self.latency_rng);
        if d.as_millis() as u64 > latency.body_ms.1 {
            let over = self.t + d.as_secs() + 1;
            self.slow_call_until_s = self.slow_call_until_s.max(over);
        }
        d
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
        let what = call.what;
        match self.fault(call) {
            Some(fault) => Err(fault.error(what)),
            None => Ok(()),
        }
    }

    /// Whether `call` fails, and how; a failure is recorded against its scope, a success
    /// clears the scope.
    pub(super) fn fault(&mut self, call: Call<'_>) -> Option<Fault> {
        if call.service == Service::Nomad {
            self.requests.nomad += 1;
        }
        match self.inject(&call) {
            None => {
                self.faults.failing.remove(&call.scope);
                None
            }
            Some(fault) => {
                let e = fault.error(call.what);
                self.record_fault(&call.scope, call.service, &e);
                self.faults.injected_total += 1;
                Some(fault)
            }
        }
    }

    /// Remembers that a call of `scope` failed, so the checker excuses what it held back.
    pub(super) fn record_fault(&mut self, scope: &Scope, service: Service, e: &PortError) {
        self.faults.failing.insert(scope.clone());
        self.faults.injected_now.insert(scope.clone());
        self.trace.record(
            self.t,
            format!(
                "fault {} {:?}: {} ({})",
                service.as_str(),
                scope,
                e.class.as_str(),
                e.message
            ),
        );
    }

    fn inject(&mut self, call: &Call<'_>) -> Option<Fault> {
        let t = self.t;
        let o = &self.options;
        if t >= o.faults_end_s {
            return None;
        }
        if o.outage_at(call.service, t).is_some() {
            return Some(Fault::Outage);
        }
        if call.via_vault && o.outage_at(Service::Vault, t).is_some() {
            return Some(Fault::VaultOutage);
        }
        if let Some(holder) = &call.budget
            && let Some(reset) = self.faults.exhausted.get(holder)
            && *reset > t
        {
            return Some(Fault::Exhausted { wait_s: reset - t });
        }
        let rates = o.rates(call.service);
        let roll: f64 = self.rng.random();
        if roll < rates.transient {
            let kind = [
                Transient::BadGateway,
                Transient::TimedOut,
                Transient::ConnectionReset,
            ]
            .choose(&mut self.rng)
            .expect("non-empty");
            return Some(Fault::Transient(*kind));
        }
        if roll < rates.transient + rates.malformed {
            return Some(Fault::Malformed);
        }
        if let Some(holder) = &call.budget
            && roll < rates.transient + rates.malformed + rates.rate_limited
        {
            let (low, high) = o.rate_limit_reset_s;
            let mut wait_s = self.rng.random_range(low..=high);
            let secondary = self.rng.random_bool(0.3);
            // The world's secondary limits last a minute or more, and `retry-after` says
            // exactly how long: the budget is out as long as the client is asked to wait.
            if secondary && call.service == Service::GitHub {
                wait_s = wait_s.max(crate::clients::github::SECONDARY_LIMIT_WAIT_S);
            }
            self.faults.exhausted.insert(holder.clone(), t + wait_s);
            return Some(Fault::RateLimited { wait_s, secondary });
        }
        None
    }

    pub(super) fn mint_canary(&mut self) -> SecretString {
        self.mints += 1;
        SecretString::from(format!("{CANARY}{:06}", self.mints))
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
pub(super) fn budget_of(repo: &RepoConfig) -> String {
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

/// One registration token from `service`, after the faults that call may meet.
async fn mint_through(
    shared: &Shared,
    repo: &RepoConfig,
    service: Service,
    via_vault: bool,
) -> Result<Option<Credential>, PortError> {
    over_the_wire(shared, service, |sim| {
        sim.call(Call {
            scope: Scope::Mint(repo.repo.clone()),
            service,
            via_vault,
            budget: Some(budget_of(repo)),
            what: "create registration token",
        })?;
        Ok(Some(Credential::RegistrationToken(sim.mint_canary())))
    })
    .await
}

/// Forgejo (`forgejo` repos): no timestamps, no runner names; a claimed job reads as claimed.
/// The writer is the daemon whose calls these are (`None`: a baseline, which holds no lock).
pub struct ForgejoPort(pub Shared, pub Option<usize>);

#[async_trait]
impl QueueSource for ForgejoPort {
    async fn list_jobs(&self, repo: &RepoConfig) -> Result<RepoJobs, PortError> {
        over_the_wire(&self.0, Service::Forgejo, |sim| Self::search(sim, repo)).await
    }
}

impl ForgejoPort {
    fn search(sim: &mut Sim, repo: &RepoConfig) -> Result<RepoJobs, PortError> {
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
            .collect::<Vec<_>>();
        sim.queue_read(&repo.repo, jobs.len());
        Ok(RepoJobs {
            jobs,
            truncated: false,
        })
    }
}

#[async_trait]
impl Registrar for ForgejoPort {
    async fn mint(
        &self,
        repo: &RepoConfig,
        _runner: RunnerIdentity<'_>,
    ) -> Result<Option<Credential>, PortError> {
        lock(&self.0).write_sent(self.1, "mint a Forgejo registration token");
        // The Forgejo API token comes from Vault, so a Vault outage stops minting too.
        mint_through(&self.0, repo, Service::Forgejo, true).await
    }

    fn repo_url(&self, repo: &RepoConfig) -> String {
        repo_url(repo)
    }
}

/// Nomad: one listing per parent, dispatch with idempotency tokens, re-read, purge.
/// The writer is the daemon whose calls these are (`None`: a baseline, which holds no lock).
pub struct NomadPort(pub Shared, pub Option<usize>);

#[async_trait]
impl ChildSource for NomadPort {
    async fn list_children(&self, parent: &str) -> Result<Vec<Child>, PortError> {
        over_the_wire(&self.0, Service::Nomad, |sim| Self::list(sim, parent)).await
    }

    async fn parents_with_our_children(&self) -> Result<BTreeSet<String>, PortError> {
        over_the_wire(&self.0, Service::Nomad, |sim| {
            sim.call(Call {
                scope: Scope::Discover,
                service: Service::Nomad,
                via_vault: false,
                budget: None,
                what: "list jobs by filter",
            })?;
            sim.faults.discovered_once = true;
            Ok(NomadPort::parents_with_ours(sim))
        })
        .await
    }
}

impl NomadPort {
    fn list(sim: &mut Sim, parent: &str) -> Result<Vec<Child>, PortError> {
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
                placed_at: None,
            })
            .collect())
    }

    /// Every parent with children of ours, as Nomad's filtered job listing finds them.
    fn parents_with_ours(sim: &Sim) -> BTreeSet<String> {
        sim.world
            .children
            .values()
            .filter(|c| c.repo_url.is_some())
            .map(|c| c.parent.clone())
            .collect()
    }
}

impl NomadPort {
    fn dispatch_now(sim: &mut Sim, request: &DispatchRequest) -> Result<Dispatched, PortError> {
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
            .map(|t| t.expose_secret().to_string());
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

    fn status_now(sim: &mut Sim, child: &ChildId) -> Result<Option<ChildStatus>, PortError> {
        sim.call(Call {
            scope: Scope::Reread,
            service: Service::Nomad,
            via_vault: false,
            budget: None,
            what: "read job",
        })?;
        Ok(sim.world.children.get(child).map(|c| c.status))
    }

    fn purge_now(sim: &mut Sim, child: &ChildId) -> Result<(), PortError> {
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

    fn live_allocation_now(sim: &mut Sim, child: &ChildId) -> Result<bool, PortError> {
        sim.call(Call {
            scope: Scope::Reread,
            service: Service::Nomad,
            via_vault: false,
            budget: None,
            what: "read job allocations",
        })?;
        Ok(sim
            .world
            .children
            .get(child)
            .is_some_and(SimChild::has_allocation))
    }

    fn stop_now(sim: &mut Sim, child: &ChildId) -> Result<(), PortError> {
        sim.call(Call {
            scope: Scope::Stop,
            service: Service::Nomad,
            via_vault: false,
            budget: None,
            what: "stop job",
        })?;
        sim.world.stop(sim.t, child, &sim.options, &mut sim.trace);
        Ok(())
    }
}

#[async_trait]
impl ChildControl for NomadPort {
    async fn dispatch(&self, request: &DispatchRequest) -> Result<Dispatched, PortError> {
        lock(&self.0).write_sent(self.1, "a dispatch");
        over_the_wire(&self.0, Service::Nomad, |sim| {
            Self::dispatch_now(sim, request)
        })
        .await
    }

    async fn child_status(&self, child: &ChildId) -> Result<Option<ChildStatus>, PortError> {
        over_the_wire(&self.0, Service::Nomad, |sim| Self::status_now(sim, child)).await
    }

    async fn purge(&self, child: &ChildId) -> Result<(), PortError> {
        lock(&self.0).write_sent(self.1, "a purge");
        over_the_wire(&self.0, Service::Nomad, |sim| Self::purge_now(sim, child)).await
    }

    async fn has_live_allocation(&self, child: &ChildId) -> Result<bool, PortError> {
        over_the_wire(&self.0, Service::Nomad, |sim| {
            Self::live_allocation_now(sim, child)
        })
        .await
    }

    async fn stop(&self, child: &ChildId) -> Result<(), PortError> {
        lock(&self.0).write_sent(self.1, "a stop");
        over_the_wire(&self.0, Service::Nomad, |sim| Self::stop_now(sim, child)).await
    }
}

/// Every port of the loop over the shared world; GitHub is the real client over
/// [`GitHubHttp`](super::github_http::GitHubHttp), with conditional requests.
pub fn services(shared: &Shared) -> Services {
    services_with(shared, true)
}

/// [`services`], with the GitHub client's conditional requests on or off (the benchmark's
/// baseline polls without ETags).
pub fn services_with(shared: &Shared, conditional_requests: bool) -> Services {
    services_over(
        shared,
        super::github_http::GitHubHttp::new(shared),
        conditional_requests,
        None,
    )
}

/// A daemon's ports: its own GitHub client over `github`, GitHub's side of the API, which
/// every daemon of the world shares; `writer` is the daemon, whose writes are judged against
/// its lease.
pub fn services_over(
    shared: &Shared,
    github: super::github_http::GitHubHttp,
    conditional_requests: bool,
    writer: Option<usize>,
) -> Services {
    let github =
        Arc::new(GitHubForge::over(shared, github, conditional_requests).with_writer(writer));
    let forgejo = Arc::new(ForgejoPort(shared.clone(), writer));
    let nomad = Arc::new(NomadPort(shared.clone(), writer));
    Services {
        github: Some(Forge {
            queue: github.clone(),
            registrar: github.clone(),
            runners: Some(github),
            registered: None,
        }),
        // The seeded Forgejo is an instance before 15: it hands out the shared registration
        // token and registers no runner per dispatch, so there is nothing to delete.
        forgejo: Some(Forge {
            queue: forgejo.clone(),
            registrar: forgejo,
            runners: None,
            registered: None,
        }),
        children: nomad.clone(),
        control: nomad,
        wrapper: None,
    }
}

#[cfg(test)]
mod secondary_tests {
    use super::SecondaryPoints;
    use http::Method;

    #[test]
    fn secondary_points_count_reads_as_one_and_writes_as_five_per_owner_over_a_sliding_minute() {
        assert_eq!(SecondaryPoints::points(&Method::GET), 1);
        assert_eq!(SecondaryPoints::points(&Method::HEAD), 1);
        assert_eq!(SecondaryPoints::points(&Method::POST), 5);
        assert_eq!(SecondaryPoints::points(&Method::DELETE), 5);
        let mut points = SecondaryPoints::default();
        // 10 GETs and a POST at second 30, 10 GETs at second 80: 25 points within 60 s
        // (30..=80), though neither calendar minute holds more than 15.
        for _ in 0..10 {
            points.spend("installation", &Method::GET, 30);
        }
        points.spend("installation", &Method::POST, 30);
        for _ in 0..10 {
            points.spend("installation", &Method::GET, 80);
        }
        assert_eq!(points.per_min_max, 25);
        // A second later the first second has left the window; another owner has its own.
        points.spend("installation", &Method::GET, 90);
        points.spend("the App", &Method::POST, 90);
        assert_eq!(points.per_min_max, 25);
        for _ in 0..20 {
            points.spend("installation", &Method::GET, 91);
        }
        assert_eq!(points.per_min_max, 31);
    }
}
