//! The config watcher following the Consul twin through the real Consul client: edits apply,
//! a bad edit keeps the last good config, an outage keeps it too.

use std::time::Duration;

use runner_scaler::clients::consul::{ConsulKv, ConsulSettings};
use runner_scaler::config::ConfigDefaults;
use runner_scaler::config::watch::{self, ConfigState, WatchSettings};
use runner_scaler::sim::twins::TwinServer;
use runner_scaler::sim::twins::consul::ConsulTwin;
use tokio::sync::{oneshot, watch as channel};

const KEY: &str = "runners/config";
const TEST_DEADLINE: Duration = Duration::from_secs(20);

const GOOD: &str = r#"{"acme/api": {"mode": "app", "maxConcurrent": 2}}"#;
const BAD: &str = r#"{
  "acme/api": {"mode": "app", "maxConcurrent": 2},
  "acme/web": {"mode": "vault", "vaultPath": "gh/poll", "registerVaultPath": "gh/poll",
               "profiles": [{"job": "go ci", "label": "go"}]}
}"#;
const FIXED: &str = r#"{
  "acme/api": {"mode": "app", "maxConcurrent": 2},
  "acme/web": {"mode": "vault", "vaultPath": "gh/poll", "registerVaultPath": "gh/admin",
               "profiles": [{"job": "go-ci", "label": "go"}]}
}"#;

/// Short pauses so that polling and backoff take milliseconds, not seconds.
fn quick() -> WatchSettings {
    WatchSettings {
        wait: Duration::from_secs(300),
        poll_interval: Duration::from_millis(20),
        fetch_interval_min: Duration::from_millis(5),
        backoff_initial: Duration::from_millis(10),
        backoff_max: Duration::from_millis(40),
    }
}

struct Running {
    state: channel::Receiver<ConfigState>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _server: TwinServer,
}

async fn start_watching(twin: &ConsulTwin) -> Running {
    let server = TwinServer::start(twin.router()).await.unwrap();
    let settings = ConsulSettings {
        address: server.base_url(),
        token: None,
        ca_cert: None,
        client_cert: None,
        client_key: None,
    };
    let kv = ConsulKv::new(&settings, KEY).unwrap();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let jitter = rand::SeedableRng::seed_from_u64(1);
    let (state, task) = watch::spawn(kv, ConfigDefaults::default(), quick(), jitter, async {
        let _ = stop_rx.await;
    });
    Running {
        state,
        stop: Some(stop_tx),
        task,
        _server: server,
    }
}

impl Running {
    async fn until(&mut self, what: &str, done: impl FnMut(&ConfigState) -> bool) -> ConfigState {
        let mut state = self.state.clone();
        match tokio::time::timeout(TEST_DEADLINE, state.wait_for(done)).await {
            Ok(found) => found.expect("watcher stopped").clone(),
            Err(_) => panic!("timed out waiting until {what}: {:?}", *self.state.borrow()),
        }
    }

    async fn stop(mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        tokio::time::timeout(TEST_DEADLINE, self.task)
            .await
            .expect("watcher did not stop")
            .unwrap();
    }
}

fn repo_count(state: &ConfigState) -> usize {
    state.config.as_ref().map_or(0, |c| c.repos.len())
}

#[tokio::test]
async fn edits_apply_and_a_bad_edit_keeps_the_last_good_config() {
    let twin = ConsulTwin::new();
    let good = twin.set(KEY, GOOD);
    let mut running = start_watching(&twin).await;

    let state = running
        .until("the good document applies", |s| {
            s.applied_index == Some(good)
        })
        .await;
    assert_eq!(repo_count(&state), 1);
    assert!(state.problems().is_empty(), "{:?}", state.problems());

    // Edits are written only once the watcher is blocked on the key: they must wake it.
    twin.blocked_reads_at_least(1).await;
    let bad = twin.set(KEY, BAD);
    let state = running
        .until("the bad edit is reported", |s| !s.errors.is_empty())
        .await;
    assert_eq!(state.applied_index, Some(good), "last good config kept");
    assert_eq!(repo_count(&state), 1);
    let rendered: Vec<String> = state.errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        rendered.len(),
        2,
        "every problem at once (edit at index {bad}): {rendered:#?}"
    );
    assert!(
        rendered
            .iter()
            .any(|e| e.starts_with("acme/web: profiles[0].job: \"go ci\""))
    );
    assert!(
        rendered
            .iter()
            .any(|e| e.starts_with("acme/web: registerVaultPath: must differ"))
    );
    for error in &state.errors {
        assert_eq!(error.repo.as_deref(), Some("acme/web"));
        assert!(error.field.is_some());
    }

    twin.blocked_reads_at_least(1).await;
    let fixed = twin.set(KEY, FIXED);
    let state = running
        .until("the fixed edit applies", |s| s.applied_index == Some(fixed))
        .await;
    assert_eq!(repo_count(&state), 2);
    assert!(state.errors.is_empty());
    running.stop().await;
}

#[tokio::test]
async fn an_outage_keeps_the_last_good_config_and_recovers() {
    let twin = ConsulTwin::new();
    let good = twin.set(KEY, GOOD);
    let mut running = start_watching(&twin).await;
    running
        .until("the good document applies", |s| {
            s.applied_index == Some(good)
        })
        .await;

    twin.blocked_reads_at_least(1).await;
    twin.set_unavailable(true);
    // The blocked read wakes on this write and finds Consul down.
    twin.set(KEY, FIXED);
    let state = running
        .until("the outage is reported", |s| s.source_error.is_some())
        .await;
    assert_eq!(state.applied_index, Some(good));
    assert!(
        state.source_error.as_deref().unwrap().contains("500"),
        "{:?}",
        state.source_error
    );

    twin.set_unavailable(false);
    let state = running
        .until("the edit made during the outage applies", |s| {
            s.source_error.is_none() && repo_count(s) == 2
        })
        .await;
    assert!(state.problems().is_empty(), "{:?}", state.problems());
    running.stop().await;
}

#[tokio::test]
async fn started_without_a_document_it_waits_for_one() {
    let twin = ConsulTwin::new();
    let mut running = start_watching(&twin).await;
    let state = running.until("the key is missing", |s| s.missing).await;
    assert!(state.config.is_none());
    assert!(!state.problems().is_empty());

    let index = twin.set(KEY, GOOD);
    let state = running
        .until("the document applies", |s| s.applied_index == Some(index))
        .await;
    assert!(!state.missing);
    running.stop().await;
}
