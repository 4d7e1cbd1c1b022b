//! The fence: whether this daemon may still write, and the write ports that ask it first.
//! Every write of a term (mint, dispatch, stop, purge, registration deleted) goes through
//! [`fenced`] ports, so the act step needs no change: a fenced write is a [`PortError`] it
//! reports like any refusal, and one not answered before a successor could act is abandoned.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::act::services::{Forge, Services};
use crate::act::{
    ChildControl, Credential, Deregistration, DispatchRequest, Dispatched, RegisteredRunners,
    Registrar, RunnerIdentity, RunnerRegistry,
};
use crate::config::RepoConfig;
use crate::model::{ChildId, ErrorClass, PortError};
use crate::observe::{ChildStatus, RunnerRegistration};

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
    pub(super) fn new(valid_until: watch::Receiver<Option<Instant>>, landing: Duration) -> Fence {
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

/// The state key behind `fence`: read freely, written only while the fence is open.
pub fn fenced_carried(
    store: Arc<dyn crate::act::services::CarriedStore>,
    fence: &Fence,
) -> Arc<dyn crate::act::services::CarriedStore> {
    Arc::new(FencedCarried {
        inner: store,
        fence: fence.clone(),
    })
}

struct FencedCarried {
    inner: Arc<dyn crate::act::services::CarriedStore>,
    fence: Fence,
}

#[async_trait]
impl crate::act::services::CarriedStore for FencedCarried {
    async fn load(&self) -> Result<Option<Vec<u8>>, PortError> {
        self.inner.load().await
    }

    async fn save(&self, value: Vec<u8>) -> Result<(), PortError> {
        self.fence
            .write("write the state key".into(), self.inner.save(value))
            .await
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

    async fn get_runner(
        &self,
        repo: &RepoConfig,
        runner_id: u64,
    ) -> Result<Option<RunnerRegistration>, PortError> {
        self.inner.get_runner(repo, runner_id).await
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
