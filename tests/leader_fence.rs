//! The fenced write ports of a leadership term over the in-memory world: a write that is
//! never answered is abandoned once a successor could act, and every write (a Forgejo
//! runner's deletion too) is refused once the fence is closed.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use runner_scaler::act::{
    ChildControl, Deregistration, DispatchRequest, Dispatched, RegisteredRunners,
};
use runner_scaler::config::RepoConfig;
use runner_scaler::leader::{Fence, Holder, LEADER_KEY_DEFAULT, LeaderSettings, fenced};
use runner_scaler::model::{ChildId, ErrorClass, PortError};
use runner_scaler::observe::ChildStatus;
use runner_scaler::sim::memory::MemoryWorld;
use tokio::time::Instant;

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
    let mut services = MemoryWorld::new(chrono::Utc::now()).services();
    services.control = Arc::new(Unanswered);
    let defaults = settings(15);
    let (fence, _valid_until) =
        Fence::open_until(Instant::now() + Duration::from_secs(1), defaults.landing());
    let ports = fenced(&services, &fence);
    let request = DispatchRequest {
        parent: "ci-runner".into(),
        namespace: None,
        meta: runner_scaler::act::DispatchMeta {
            repo_url: "https://github.com/acme/api".into(),
            labels: "self-hosted".into(),
            runner_name: runner_scaler::model::RunnerName("ci-runner-0123456789ab".into()),
            runner_token: None,
        },
        idempotency_token: "0".repeat(32),
    };
    let sent = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(3600), ports.control.dispatch(&request))
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
    let mut services = MemoryWorld::new(chrono::Utc::now()).services();
    services.forgejo.as_mut().unwrap().registered = Some(deletes.clone());
    let config = runner_scaler::config::parse_document(
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
