//! The leader lock: of the daemons that share a Consul, only the holder of one lock acts.
//!
//! Each daemon holds a Consul session with a TTL and no health checks (so it is not tied to
//! the agent's `serfHealth`), `Behavior: release`, and a lock delay. A standby watches only
//! the lock key (a blocking query) and tries `?acquire=` whenever the key has no `Session`.
//! The holder renews every TTL/3 and **fences itself**: it writes nothing (no mint, dispatch,
//! stop, purge or registration deleted) after the moment it sent its last successful renew
//! plus TTL minus a margin, measured on the monotonic clock. Consul counts the TTL from when
//! the renew *arrived*, later than it was sent, so the holder stops writing at least `margin`
//! before Consul can invalidate the session, and the lock delay (at least the margin) keeps a
//! successor from acquiring for that long again after. A holder that loses its session (renew
//! 404, or its fence ran out) stops acting at once and stands by again with a new session.
//!
//! The fence is enforced at the write ports ([`fenced`]): the act step needs no change, a
//! fenced write is a [`PortError`] it reports like any refusal.
//!
//! Takeover bound: a holder that dies or is cut off renewed last at most TTL/3 before; Consul
//! invalidates its session at most 2 × TTL later (it may reap that late), and the key becomes
//! acquirable a lock delay after that; the standby retries within [`ACQUIRE_RETRY_MAX`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::act::{
    ChildControl, Credential, Deregistration, DispatchRequest, Dispatched, RegisteredRunners,
    Registrar, RunnerIdentity, RunnerRegistry,
};
use crate::config::RepoConfig;
use crate::control_loop::{Forge, Services};
use crate::model::{ChildId, ErrorClass};
use crate::observe::{ChildStatus, PortError, RunnerRegistration};

/// Default lock key.
pub const LEADER_KEY_DEFAULT: &str = "runners/leader";
/// Default session TTL: Consul's own minimum is 10 s (`session_ttl_min`).
pub const LOCK_TTL_DEFAULT: Duration = Duration::from_secs(15);
/// The shortest TTL the command line accepts; Consul refuses below its `session_ttl_min`.
pub const LOCK_TTL_MIN: Duration = Duration::from_secs(1);
/// How often a standby whose acquire was refused on an unheld key (a lock delay running)
/// tries again, at most.
pub const ACQUIRE_RETRY_MAX: Duration = Duration::from_secs(1);

/// Who holds the lock, as this daemon says it and others show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// `hostname`, with the Nomad allocation when there is one.
    pub holder: String,
    pub pid: u32,
}

impl Holder {
    /// This process: the host name, `NOMAD_ALLOC_ID` when Nomad runs it, and the pid.
    pub fn of_this_process() -> Holder {
        let host = host_name().unwrap_or_else(|| "unknown-host".to_string());
        let holder = match std::env::var("NOMAD_ALLOC_ID") {
            Ok(alloc) if !alloc.trim().is_empty() => format!("{host} (alloc {})", alloc.trim()),
            _ => host,
        };
        Holder {
            holder,
            pid: std::process::id(),
        }
    }

    /// The lock key's value.
    pub fn to_value(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a holder serialises")
    }

    /// What another daemon wrote into the key, as a name; raw text when it is not ours.
    pub fn describe(value: &[u8]) -> String {
        match serde_json::from_slice::<Holder>(value) {
            Ok(holder) => holder.to_string(),
            Err(_) => {
                let text: String = String::from_utf8_lossy(value).chars().take(120).collect();
                text.escape_debug().to_string()
            }
        }
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} pid {}", self.holder, self.pid)
    }
}

fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success
    // when the name fits, and the last byte is kept 0 for the case it does not.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).trim().to_string();
    (!name.is_empty()).then_some(name)
}

/// The timings of the lock, all derived from the TTL.
#[derive(Clone, Debug)]
pub struct LeaderSettings {
    pub key: String,
    pub ttl: Duration,
    pub holder: Holder,
}

impl LeaderSettings {
    /// How long before the TTL runs out (counted from when a renew was sent) the holder stops
    /// writing: a third of the TTL, for the renew's own transit and a write in flight.
    pub fn margin(&self) -> Duration {
        self.ttl / 3
    }

    /// Consul's lock delay for our session: at least the margin, so that after Consul
    /// invalidates a silent holder's session no successor acts before a write the holder
    /// sent just before its fence closed has landed.
    pub fn lock_delay(&self) -> Duration {
        self.margin()
    }

    /// How long after the fence closes a write sent through it may land before a successor
    /// can act: Consul invalidates the session no sooner than the margin later, and the
    /// successor then waits out the lock delay.
    pub fn landing(&self) -> Duration {
        self.margin() + self.lock_delay()
    }

    /// How long a renew keeps the fence open, from when it was sent.
    pub fn fence_span(&self) -> Duration {
        self.ttl - self.margin()
    }

    pub fn renew_interval(&self) -> Duration {
        self.ttl / 3
    }

    /// A renew that failed for a transient reason is tried again this soon.
    fn renew_retry(&self) -> Duration {
        (self.ttl / 10).max(Duration::from_millis(100))
    }

    /// How long one lock request may take: less than the renew interval, so a stuck request
    /// cannot keep the holder from noticing that its fence closed.
    pub fn request_timeout(&self) -> Duration {
        self.renew_interval()
    }

    fn acquire_retry(&self) -> Duration {
        (self.lock_delay() / 4).clamp(Duration::from_millis(50), ACQUIRE_RETRY_MAX)
    }

    /// The longest a standby waits to take over from a holder that died or was cut off:
    /// its session may live 2 × TTL after its last renew (Consul's reaper), then the lock
    /// delay, then one retry.
    pub fn takeover_bound(&self) -> Duration {
        self.ttl * 2 + self.lock_delay() + self.acquire_retry()
    }
}

/// What this daemon is, for metrics and `/livez`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaderState {
    /// No session (starting, or Consul unreachable).
    NoSession,
    /// A session, not the lock; the holder as its value names it, when the key is held.
    Standby {
        holder: Option<String>,
    },
    Leader,
}

/// A session id, as Consul returned it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionId(pub String);

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What `session/create` is asked for.
#[derive(Clone, Debug)]
pub struct SessionRequest {
    pub name: String,
    pub ttl: Duration,
    pub lock_delay: Duration,
}

/// The lock key as read.
#[derive(Clone, Debug, Default)]
pub struct LockKey {
    /// `X-Consul-Index` of the answer, for the next blocking read.
    pub index: u64,
    /// The session holding the lock.
    pub session: Option<String>,
    pub value: Option<Vec<u8>>,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The session is unknown to Consul (expired, destroyed): renew answered 404.
    #[error("{0}")]
    SessionGone(String),
    /// Consul refused the session's TTL (below `session_ttl_min`): a setting to fix, not a
    /// transient failure.
    #[error("{0}")]
    TtlRefused(String),
    #[error("{0}")]
    Port(#[from] PortError),
}

/// The Consul calls the lock needs. Implemented over HTTP by
/// [`crate::clients::consul_lock::ConsulLock`].
#[async_trait]
pub trait LockStore: Send + Sync {
    async fn create_session(&self, request: &SessionRequest) -> Result<SessionId, LockError>;
    async fn renew_session(&self, session: &SessionId) -> Result<(), LockError>;
    async fn destroy_session(&self, session: &SessionId) -> Result<(), LockError>;
    /// `true` when this session now holds the lock.
    async fn acquire(
        &self,
        key: &str,
        session: &SessionId,
        value: &[u8],
    ) -> Result<bool, LockError>;
    async fn release(&self, key: &str, session: &SessionId) -> Result<bool, LockError>;
    /// Reads the key; with `index > 0`, waits up to `wait` for it to change past `index`.
    async fn read_key(&self, key: &str, index: u64, wait: Duration) -> Result<LockKey, LockError>;
}

/// A write refused because this daemon may no longer be the lock holder.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not written: this daemon's leader lock {0}")]
pub struct Fenced(&'static str);

/// Whether this daemon may write, shared by the write ports of one leadership term.
#[derive(Clone, Debug)]
pub struct Fence {
    /// The session's validity as its last successful renew proves it: until the renew's send
    /// time plus TTL minus the margin. `None` once the session is lost.
    valid_until: watch::Receiver<Option<Instant>>,
    /// Cleared when the term ends (shutdown, loss): closed for good.
    open: Arc<AtomicBool>,
    /// How long after the fence closes a write sent through it may still land before a
    /// successor can act: the margin (Consul counts the TTL from the renew's arrival) and the
    /// lock delay.
    landing: Duration,
}

impl Fence {
    fn new(valid_until: watch::Receiver<Option<Instant>>, landing: Duration) -> Fence {
        Fence {
            valid_until,
            open: Arc::new(AtomicBool::new(true)),
            landing,
        }
    }

    /// A fence open until `until` (tests, and one-shot ticks driven by hand), whose writes
    /// must have landed `landing` after it closes.
    pub fn open_until(
        until: Instant,
        landing: Duration,
    ) -> (Fence, watch::Sender<Option<Instant>>) {
        let (tx, rx) = watch::channel(Some(until));
        (Fence::new(rx, landing), tx)
    }

    /// How long a write sent now may take: until a successor could act. A write still
    /// unanswered then is abandoned; a request not yet sent by then is never sent. (One the
    /// server received may still land: the lock delay is the margin for that.)
    fn landing_budget(&self) -> Option<Duration> {
        let until = (*self.valid_until.borrow())? + self.landing;
        Some(until.saturating_duration_since(Instant::now()))
    }

    /// Runs `write` if the fence is open, within its landing budget: every write port goes
    /// through here.
    async fn write<T>(
        &self,
        doing: String,
        write: impl Future<Output = Result<T, PortError>>,
    ) -> Result<T, PortError> {
        self.refusal(&doing)?;
        let budget = self.landing_budget().unwrap_or_default();
        tokio::time::timeout(budget, write).await.unwrap_or_else(|_| {
            Err(PortError::new(
                ErrorClass::Transient,
                format!(
                    "{doing}: no answer before a successor could take over the leader lock; abandoned"
                ),
            ))
        })
    }

    pub fn may_write(&self) -> Result<(), Fenced> {
        if !self.open.load(Ordering::SeqCst) {
            return Err(Fenced("was given up"));
        }
        match *self.valid_until.borrow() {
            None => Err(Fenced("was lost")),
            Some(until) if Instant::now() >= until => Err(Fenced("may have expired")),
            Some(_) => Ok(()),
        }
    }

    /// Closes the fence for good.
    pub fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
    }

    fn refusal(&self, doing: impl std::fmt::Display) -> Result<(), PortError> {
        self.may_write().map_err(|fenced| {
            // Configuration-class: not retried as transient within this term; the term ends.
            PortError::new(ErrorClass::Configuration, format!("{doing}: {fenced}"))
        })
    }
}

/// `services` with every write port behind `fence`; reads pass through.
pub fn fenced(services: &Services, fence: &Fence) -> Services {
    let forge = |forge: &Option<Forge>| {
        forge.as_ref().map(|f| Forge {
            queue: f.queue.clone(),
            registrar: Arc::new(FencedRegistrar {
                inner: f.registrar.clone(),
                fence: fence.clone(),
            }),
            runners: f.runners.as_ref().map(|r| {
                Arc::new(FencedRunners {
                    inner: r.clone(),
                    fence: fence.clone(),
                }) as Arc<dyn RunnerRegistry>
            }),
            registered: f.registered.as_ref().map(|r| {
                Arc::new(FencedRegistered {
                    inner: r.clone(),
                    fence: fence.clone(),
                }) as Arc<dyn RegisteredRunners>
            }),
        })
    };
    Services {
        github: forge(&services.github),
        forgejo: forge(&services.forgejo),
        children: services.children.clone(),
        control: Arc::new(FencedControl {
            inner: services.control.clone(),
            fence: fence.clone(),
        }),
        // Wrapping follows a mint, which the fence already guards; it writes to no service
        // another daemon acts on.
        wrapper: services.wrapper.clone(),
    }
}

struct FencedControl {
    inner: Arc<dyn ChildControl>,
    fence: Fence,
}

#[async_trait]
impl ChildControl for FencedControl {
    async fn dispatch(&self, request: &DispatchRequest) -> Result<Dispatched, PortError> {
        self.fence
            .write(
                format!("dispatch {}", request.parent),
                self.inner.dispatch(request),
            )
            .await
    }

    async fn child_status(&self, child: &ChildId) -> Result<Option<ChildStatus>, PortError> {
        self.inner.child_status(child).await
    }

    async fn purge(&self, child: &ChildId) -> Result<(), PortError> {
        self.fence
            .write(format!("purge {child}"), self.inner.purge(child))
            .await
    }

    async fn has_live_allocation(&self, child: &ChildId) -> Result<bool, PortError> {
        self.inner.has_live_allocation(child).await
    }

    async fn stop(&self, child: &ChildId) -> Result<(), PortError> {
        self.fence
            .write(format!("stop {child}"), self.inner.stop(child))
            .await
    }
}

struct FencedRegistrar {
    inner: Arc<dyn Registrar>,
    fence: Fence,
}

#[async_trait]
impl Registrar for FencedRegistrar {
    async fn mint(
        &self,
        repo: &RepoConfig,
        runner: RunnerIdentity<'_>,
    ) -> Result<Option<Credential>, PortError> {
        let doing = format!(
            "mint a credential for runner {} of {}",
            runner.name, repo.repo
        );
        self.fence.write(doing, self.inner.mint(repo, runner)).await
    }

    fn repo_url(&self, repo: &RepoConfig) -> String {
        self.inner.repo_url(repo)
    }

    fn weaker_credential(&self, repo: &RepoConfig) -> Option<String> {
        self.inner.weaker_credential(repo)
    }
}

struct FencedRunners {
    inner: Arc<dyn RunnerRegistry>,
    fence: Fence,
}

#[async_trait]
impl RunnerRegistry for FencedRunners {
    async fn list_runners(&self, repo: &RepoConfig) -> Result<Vec<RunnerRegistration>, PortError> {
        self.inner.list_runners(repo).await
    }

    async fn delete_runner(
        &self,
        repo: &RepoConfig,
        runner_id: u64,
    ) -> Result<Deregistration, PortError> {
        let doing = format!("delete runner registration {runner_id} of {}", repo.repo);
        self.fence
            .write(doing, self.inner.delete_runner(repo, runner_id))
            .await
    }
}

struct FencedRegistered {
    inner: Arc<dyn RegisteredRunners>,
    fence: Fence,
}

#[async_trait]
impl RegisteredRunners for FencedRegistered {
    async fn delete_registered(
        &self,
        repo: &RepoConfig,
        runner_id: u64,
    ) -> Result<Deregistration, PortError> {
        let doing = format!("delete runner {runner_id} of {}", repo.repo);
        self.fence
            .write(doing, self.inner.delete_registered(repo, runner_id))
            .await
    }
}

/// Why [`lead`] returned with an error: a setting Consul refuses.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LeadError(pub String);

/// A live session: its id and a keeper task renewing it, publishing how long it is proven
/// valid.
struct KeptSession {
    id: SessionId,
    valid_until: watch::Receiver<Option<Instant>>,
    keeper: tokio::task::JoinHandle<()>,
}

impl KeptSession {
    /// Creates a session and starts renewing it.
    async fn create(
        store: &Arc<dyn LockStore>,
        settings: &LeaderSettings,
    ) -> Result<KeptSession, LockError> {
        let request = SessionRequest {
            name: format!("runner-scaler leader lock ({})", settings.holder),
            ttl: settings.ttl,
            lock_delay: settings.lock_delay(),
        };
        let sent = Instant::now();
        let id = within(settings.request_timeout(), store.create_session(&request)).await?;
        let (tx, valid_until) = watch::channel(Some(sent + settings.fence_span()));
        let keeper = tokio::spawn(keep(store.clone(), settings.clone(), id.clone(), tx));
        Ok(KeptSession {
            id,
            valid_until,
            keeper,
        })
    }

    /// Stops renewing and destroys the session (best effort: a session Consul cannot be
    /// told about expires on its own).
    async fn end(self, store: &Arc<dyn LockStore>, settings: &LeaderSettings) {
        self.keeper.abort();
        if let Err(e) = within(settings.request_timeout(), store.destroy_session(&self.id)).await {
            warn!(session = %self.id, "destroy the leader session: {e}; it expires on its own");
        }
    }

    fn lost(&self) -> bool {
        self.valid_until
            .borrow()
            .is_none_or(|until| Instant::now() >= until)
    }
}

async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, LockError>>,
) -> Result<T, LockError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result,
        Err(_) => Err(LockError::Port(PortError::new(
            ErrorClass::Transient,
            format!(
                "no answer from Consul within {}",
                humantime::format_duration(timeout)
            ),
        ))),
    }
}

/// Renews `session` every renew interval, measuring validity from when each renew was sent;
/// publishes `None` and returns once it is gone or its validity ran out.
async fn keep(
    store: Arc<dyn LockStore>,
    settings: LeaderSettings,
    session: SessionId,
    valid_until: watch::Sender<Option<Instant>>,
) {
    let mut next = Instant::now() + settings.renew_interval();
    loop {
        tokio::time::sleep_until(next).await;
        let sent = Instant::now();
        match within(settings.request_timeout(), store.renew_session(&session)).await {
            Ok(()) => {
                valid_until.send_replace(Some(sent + settings.fence_span()));
                next = sent + settings.renew_interval();
            }
            Err(LockError::SessionGone(message)) => {
                warn!(%session, "the leader session is gone: {message}");
                valid_until.send_replace(None);
                return;
            }
            Err(e) => {
                let until = *valid_until.borrow();
                if until.is_none_or(|until| Instant::now() >= until) {
                    warn!(%session, "could not renew the leader session in time: {e}");
                    valid_until.send_replace(None);
                    return;
                }
                warn!(%session, "renew the leader session: {e}; trying again");
                next = Instant::now() + settings.renew_retry();
            }
        }
    }
}

impl Drop for KeptSession {
    /// A daemon whose lead task is dropped (aborted) stops renewing at once, as a killed
    /// process would.
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// How one attempt to hold the lock ended.
enum Ended {
    Shutdown,
    Lost,
}

/// Holds the lock whenever it can and, while holding it, runs `act` (one leadership term:
/// typically `control_loop::run` over [`fenced`] services). `act` receives the term's fence
/// and a future that completes when the term must end; it should finish its current tick and
/// return. Returns at `shutdown`, having released the key and destroyed the session; or with
/// an error when Consul refuses the settings.
pub async fn lead<A, F>(
    store: Arc<dyn LockStore>,
    settings: LeaderSettings,
    state: watch::Sender<LeaderState>,
    shutdown: impl Future<Output = ()>,
    mut act: A,
) -> Result<(), LeadError>
where
    A: FnMut(Fence, StopTerm) -> F,
    F: Future<Output = ()>,
{
    let mut shutdown = std::pin::pin!(shutdown);
    let mut create_failures = 0u32;
    loop {
        state.send_replace(LeaderState::NoSession);
        let created = tokio::select! {
            biased;
            _ = &mut shutdown => return Ok(()),
            created = KeptSession::create(&store, &settings) => created,
        };
        let session = match created {
            Ok(session) => session,
            Err(LockError::TtlRefused(message)) => return Err(LeadError(ttl_hint(&message))),
            Err(e) => {
                create_failures = create_failures.saturating_add(1);
                let wait = settings
                    .renew_interval()
                    .saturating_mul(create_failures.min(8))
                    .min(settings.ttl * 4);
                warn!(
                    "create the leader session: {e}; trying again in {}",
                    humantime::format_duration(wait)
                );
                tokio::select! {
                    biased;
                    _ = &mut shutdown => return Ok(()),
                    _ = tokio::time::sleep(wait) => continue,
                }
            }
        };
        create_failures = 0;
        match hold(&store, &settings, &state, &session, &mut shutdown, &mut act).await {
            Ended::Shutdown => {
                session.end(&store, &settings).await;
                state.send_replace(LeaderState::NoSession);
                return Ok(());
            }
            Ended::Lost => session.end(&store, &settings).await,
        }
    }
}

/// What to do about a TTL Consul refused.
fn ttl_hint(refusal: &str) -> String {
    format!(
        "{refusal}: raise --lock-ttl (RUNNER_SCALER_LOCK_TTL) to at least Consul's \
         session_ttl_min (10s unless lowered in the Consul servers' configuration)"
    )
}

/// Completes when the leadership term must end.
pub struct StopTerm(watch::Receiver<bool>);

impl StopTerm {
    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}

/// Stands by with `session` until the lock is ours, then leads until the session is lost or
/// shutdown.
async fn hold<A, F>(
    store: &Arc<dyn LockStore>,
    settings: &LeaderSettings,
    state: &watch::Sender<LeaderState>,
    session: &KeptSession,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    act: &mut A,
) -> Ended
where
    A: FnMut(Fence, StopTerm) -> F,
    F: Future<Output = ()>,
{
    let value = settings.holder.to_value();
    let mut lost = session.valid_until.clone();
    let mut index = 0u64;
    loop {
        if session.lost() {
            return Ended::Lost;
        }
        // Stand by: read the key (blocking once an index is known) until it is unheld.
        let wait = settings.ttl.max(Duration::from_secs(1)) * 4;
        let read = tokio::select! {
            biased;
            _ = shutdown.as_mut() => return Ended::Shutdown,
            _ = lost.wait_for(|v| v.is_none()) => return Ended::Lost,
            read = within(wait + wait / 16 + settings.request_timeout(), store.read_key(&settings.key, index, wait)) => read,
        };
        let key = match read {
            Ok(key) => key,
            Err(e) => {
                warn!(key = %settings.key, "read the leader key: {e}");
                index = 0;
                tokio::select! {
                    biased;
                    _ = shutdown.as_mut() => return Ended::Shutdown,
                    _ = lost.wait_for(|v| v.is_none()) => return Ended::Lost,
                    _ = tokio::time::sleep(settings.renew_retry()) => continue,
                }
            }
        };
        // Consul: an index that goes backwards resets; never block with index 0.
        index = if key.index < index {
            0
        } else {
            key.index.max(1)
        };
        // Held by our own session only if a release failed: re-acquiring it succeeds.
        if let Some(holder) = key.session.as_ref().filter(|h| **h != session.id.0) {
            let name = key.value.as_deref().map(Holder::describe);
            tracing::debug!(session = %holder, "the leader lock is held: standing by");
            state.send_replace(LeaderState::Standby { holder: name });
            continue;
        }
        state.send_replace(LeaderState::Standby { holder: None });
        let acquired = within(
            settings.request_timeout(),
            store.acquire(&settings.key, &session.id, &value),
        )
        .await;
        match acquired {
            Ok(true) => {}
            Ok(false) => {
                // Another daemon was faster, or a lock delay runs: look again soon.
                index = 0;
                tokio::select! {
                    biased;
                    _ = shutdown.as_mut() => return Ended::Shutdown,
                    _ = lost.wait_for(|v| v.is_none()) => return Ended::Lost,
                    _ = tokio::time::sleep(settings.acquire_retry()) => continue,
                }
            }
            Err(e) => {
                warn!(key = %settings.key, "acquire the leader lock: {e}");
                index = 0;
                tokio::select! {
                    biased;
                    _ = shutdown.as_mut() => return Ended::Shutdown,
                    _ = lost.wait_for(|v| v.is_none()) => return Ended::Lost,
                    _ = tokio::time::sleep(settings.renew_retry()) => continue,
                }
            }
        }
        return lead_term(store, settings, state, session, shutdown, act).await;
    }
}

/// One leadership term: `act` runs behind a fence until the session is lost or shutdown.
async fn lead_term<A, F>(
    store: &Arc<dyn LockStore>,
    settings: &LeaderSettings,
    state: &watch::Sender<LeaderState>,
    session: &KeptSession,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    act: &mut A,
) -> Ended
where
    A: FnMut(Fence, StopTerm) -> F,
    F: Future<Output = ()>,
{
    let fence = Fence::new(session.valid_until.clone(), settings.landing());
    if fence.may_write().is_err() {
        fence.close();
        return Ended::Lost;
    }
    info!(key = %settings.key, holder = %settings.holder, "leader lock acquired: acting");
    state.send_replace(LeaderState::Leader);
    let (stop_tx, stop_rx) = watch::channel(false);
    let term = act(fence.clone(), StopTerm(stop_rx));
    let mut term = std::pin::pin!(term);
    let mut valid_until = session.valid_until.clone();
    let mut term_done = false;
    let ended = loop {
        // Wake when the fence closes on its own (no renew in time), not only on a change.
        let deadline = (*valid_until.borrow_and_update()).unwrap_or_else(Instant::now);
        tokio::select! {
            biased;
            _ = shutdown.as_mut() => break Ended::Shutdown,
            _ = tokio::time::sleep_until(deadline) => {
                if fence.may_write().is_err() {
                    break Ended::Lost;
                }
            }
            _ = valid_until.changed() => {}
            _ = term.as_mut() => {
                // The term ended on its own: nothing left to lead with.
                term_done = true;
                break Ended::Shutdown;
            }
        }
    };
    if matches!(ended, Ended::Lost) {
        fence.close();
        error!(
            key = %settings.key,
            "leader lock lost (the session expired or could not be renewed in time): stopped acting; standing by again"
        );
    }
    // The tick in progress finishes (its writes refused once the fence closed).
    let _ = stop_tx.send(true);
    if !term_done {
        term.await;
    }
    fence.close();
    if matches!(ended, Ended::Shutdown) {
        // Release before destroying: a destroyed session's keys enter its lock delay, a
        // released key does not, so a standby takes over at once.
        match within(
            settings.request_timeout(),
            store.release(&settings.key, &session.id),
        )
        .await
        {
            Ok(true) => info!(key = %settings.key, "leader lock released"),
            Ok(false) => warn!(key = %settings.key, "leader lock was no longer ours to release"),
            Err(e) => warn!(key = %settings.key, "release the leader lock: {e}"),
        }
    }
    state.send_replace(LeaderState::NoSession);
    ended
}

/// A lock held for one `once` tick.
pub struct OneShot {
    session: KeptSession,
    store: Arc<dyn LockStore>,
    settings: LeaderSettings,
    pub fence: Fence,
}

/// Why `once` could not take the lock.
#[derive(Debug, thiserror::Error)]
pub enum OneShotRefused {
    #[error("the leader lock {key} is held by {holder}")]
    Held { key: String, holder: String },
    #[error("{0}")]
    Settings(String),
    #[error("{0}")]
    Consul(String),
}

impl OneShot {
    /// Takes the lock or says who holds it.
    pub async fn take(
        store: Arc<dyn LockStore>,
        settings: LeaderSettings,
    ) -> Result<OneShot, OneShotRefused> {
        let session = match KeptSession::create(&store, &settings).await {
            Ok(session) => session,
            Err(LockError::TtlRefused(message)) => {
                return Err(OneShotRefused::Settings(ttl_hint(&message)));
            }
            Err(e) => {
                return Err(OneShotRefused::Consul(format!(
                    "create the leader session: {e}"
                )));
            }
        };
        let value = settings.holder.to_value();
        let acquired = within(
            settings.request_timeout(),
            store.acquire(&settings.key, &session.id, &value),
        )
        .await;
        match acquired {
            Ok(true) => Ok(OneShot {
                fence: Fence::new(session.valid_until.clone(), settings.landing()),
                session,
                store,
                settings,
            }),
            Ok(false) => {
                let holder = match within(
                    settings.request_timeout(),
                    store.read_key(&settings.key, 0, Duration::ZERO),
                )
                .await
                {
                    Ok(LockKey {
                        session: Some(_),
                        value,
                        ..
                    }) => value
                        .as_deref()
                        .map(Holder::describe)
                        .unwrap_or_else(|| "a session that wrote no name".into()),
                    Ok(_) => "no one: a lock delay after the last holder's session ended is still running".into(),
                    Err(e) => format!("a daemon this one could not name ({e})"),
                };
                session.end(&store, &settings).await;
                Err(OneShotRefused::Held {
                    key: settings.key.clone(),
                    holder,
                })
            }
            Err(e) => {
                session.end(&store, &settings).await;
                Err(OneShotRefused::Consul(format!(
                    "acquire the leader lock {}: {e}",
                    settings.key
                )))
            }
        }
    }

    /// Closes the fence, releases the key and destroys the session.
    pub async fn give_back(self) {
        self.fence.close();
        if let Err(e) = within(
            self.settings.request_timeout(),
            self.store.release(&self.settings.key, &self.session.id),
        )
        .await
        {
            warn!(key = %self.settings.key, "release the leader lock: {e}");
        }
        self.session.end(&self.store, &self.settings).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(ttl_s: u64) -> LeaderSettings {
        LeaderSettings {
            key: LEADER_KEY_DEFAULT.into(),
            ttl: Duration::from_secs(ttl_s),
            holder: Holder {
                holder: "test".into(),
                pid: 1,
            },
        }
    }

    #[test]
    fn the_lock_delay_covers_the_fence_margin() {
        for ttl in [1, 10, 15, 60] {
            let s = settings(ttl);
            assert!(s.lock_delay() >= s.margin(), "ttl {ttl}");
            assert!(s.fence_span() + s.margin() <= s.ttl, "ttl {ttl}");
            assert!(s.request_timeout() < s.fence_span(), "ttl {ttl}");
        }
        let defaults = settings(15);
        assert_eq!(defaults.margin(), Duration::from_secs(5));
        assert_eq!(defaults.lock_delay(), Duration::from_secs(5));
        assert_eq!(defaults.renew_interval(), Duration::from_secs(5));
        assert_eq!(defaults.takeover_bound(), Duration::from_secs(36));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_closes_at_its_deadline_and_when_closed() {
        let (fence, valid_until) =
            Fence::open_until(Instant::now() + Duration::from_secs(10), Duration::ZERO);
        assert_eq!(fence.may_write(), Ok(()));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(fence.may_write(), Ok(()));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(fence.may_write().is_err());
        valid_until.send_replace(Some(Instant::now() + Duration::from_secs(10)));
        assert_eq!(fence.may_write(), Ok(()));
        fence.close();
        assert!(fence.may_write().is_err());
        valid_until.send_replace(Some(Instant::now() + Duration::from_secs(10)));
        assert!(fence.may_write().is_err(), "a closed fence stays closed");
    }

    /// Nomad that received a request and never answered it.
    struct Unanswered;

    #[async_trait]
    impl ChildControl for Unanswered {
        async fn dispatch(&self, _: &DispatchRequest) -> Result<Dispatched, PortError> {
            std::future::pending().await
        }
        async fn child_status(&self, _: &ChildId) -> Result<Option<ChildStatus>, PortError> {
            std::future::pending().await
        }
        async fn purge(&self, _: &ChildId) -> Result<(), PortError> {
            std::future::pending().await
        }
        async fn has_live_allocation(&self, _: &ChildId) -> Result<bool, PortError> {
            std::future::pending().await
        }
        async fn stop(&self, _: &ChildId) -> Result<(), PortError> {
            std::future::pending().await
        }
    }

    /// A write sent just before the fence closes must not land after a successor took over
    /// and listed the children: it is abandoned when the successor could act, the fence's
    /// deadline plus the margin and the lock delay.
    #[tokio::test(start_paused = true)]
    async fn a_write_unanswered_when_a_successor_could_act_is_abandoned() {
        let mut services = crate::sim::memory::MemoryWorld::new(chrono::Utc::now()).services();
        services.control = Arc::new(Unanswered);
        let defaults = settings(15);
        let (fence, _valid_until) =
            Fence::open_until(Instant::now() + Duration::from_secs(1), defaults.landing());
        let ports = fenced(&services, &fence);
        let request = DispatchRequest {
            parent: "ci-runner".into(),
            namespace: None,
            meta: crate::act::DispatchMeta {
                repo_url: "https://github.com/acme/api".into(),
                labels: "self-hosted".into(),
                runner_name: crate::model::RunnerName("ci-runner-0123456789ab".into()),
                runner_token: None,
            },
            idempotency_token: "0".repeat(32),
        };
        let sent = Instant::now();
        let answer =
            tokio::time::timeout(Duration::from_secs(3600), ports.control.dispatch(&request))
                .await
                .expect("abandoned, not left waiting");
        let error = answer.unwrap_err();
        assert_eq!(error.class, ErrorClass::Transient, "{}", error.message);
        assert!(
            error.message.starts_with("dispatch ci-runner: "),
            "{}",
            error.message
        );
        assert_eq!(sent.elapsed(), Duration::from_secs(1) + defaults.landing());
        let child = ChildId::new("ci-runner/dispatch-1-00000001", "default");
        tokio::time::timeout(Duration::from_secs(3600), ports.control.stop(&child))
            .await
            .expect("a closed fence refuses at once")
            .unwrap_err();
    }

    /// Counts the deletions that reach it.
    #[derive(Default)]
    struct CountingDeletes(std::sync::atomic::AtomicUsize);

    #[async_trait]
    impl RegisteredRunners for CountingDeletes {
        async fn delete_registered(
            &self,
            _repo: &RepoConfig,
            _runner_id: u64,
        ) -> Result<Deregistration, PortError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(Deregistration::Deleted)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn deleting_a_registered_forgejo_runner_is_fenced_like_every_write() {
        let deletes = Arc::new(CountingDeletes::default());
        let mut services = crate::sim::memory::MemoryWorld::new(chrono::Utc::now()).services();
        services.forgejo.as_mut().unwrap().registered = Some(deletes.clone());
        let config = crate::config::parse_document(
            br#"{ "alex/s3": { "mode": "forgejo", "forgejoUrl": "https://forgejo.example",
                  "vaultPath": "forgejo/scaler", "labels": ["build"] } }"#,
            &Default::default(),
        )
        .unwrap();
        let repo = config.repos.values().next().unwrap();
        let (fence, _valid_until) =
            Fence::open_until(Instant::now() + Duration::from_secs(10), Duration::ZERO);
        let ports = fenced(&services, &fence);
        let registered = ports.forgejo.as_ref().unwrap().registered.as_ref().unwrap();

        assert!(registered.delete_registered(repo, 7).await.is_ok());
        assert_eq!(deletes.0.load(Ordering::SeqCst), 1);
        fence.close();
        let refused = registered.delete_registered(repo, 8).await.unwrap_err();
        assert!(
            refused.message.contains("runner 8 of alex/s3"),
            "{}",
            refused.message
        );
        assert_eq!(
            deletes.0.load(Ordering::SeqCst),
            1,
            "a closed fence let it through"
        );
    }

    #[test]
    fn a_holder_names_itself_and_others_are_shown_raw() {
        let holder = Holder {
            holder: "node-1 (alloc 1234)".into(),
            pid: 42,
        };
        assert_eq!(
            Holder::describe(&holder.to_value()),
            "node-1 (alloc 1234) pid 42"
        );
        assert_eq!(Holder::describe(b"someone else"), "someone else");
    }
}
