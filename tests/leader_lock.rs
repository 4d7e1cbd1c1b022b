//! The leader lock: two daemons against one Consul never both write.
//!
//! Most cases run `leader::lead` on tokio's paused clock against the Consul twin's own state
//! (`TwinLock`: the twin without sockets, since a paused clock and real sockets do not mix),
//! with each leadership term writing through `leader::fenced` ports into a shared "Nomad"
//! that checks, as every write lands, that no other daemon holds the lock. Writes take time
//! to land (`TRANSIT`), as requests do. The HTTP cases at the end run the real clients and
//! the real control loop against the Consul and Nomad twins on loopback, in real time.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use runner_scaler::act::{ChildControl, DispatchMeta, DispatchRequest, Dispatched};
use runner_scaler::control_loop::Services;
use runner_scaler::leader::{
    self, Fence, Holder, LeadError, LeaderSettings, LeaderState, LockStore, OneShot,
    OneShotRefused, StopTerm,
};
use runner_scaler::model::{ChildId, RunnerName};
use runner_scaler::observe::{ChildStatus, PortError};
use runner_scaler::sim::memory::MemoryWorld;
use runner_scaler::sim::twins::consul::{ConsulTwin, LockEvent, TwinLock};
use secrecy::SecretString;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const KEY: &str = "runners/leader";
const TTL: Duration = Duration::from_secs(15);

fn settings(name: &str, ttl: Duration) -> LeaderSettings {
    LeaderSettings {
        key: KEY.into(),
        ttl,
        holder: Holder {
            holder: name.into(),
            pid: 1,
        },
    }
}

/// One write as it reached "Nomad".
#[derive(Clone, Debug)]
struct Landed {
    by: String,
    at: Instant,
    /// The daemon whose session held the lock when the write landed.
    holder: Option<String>,
}

/// "Nomad": the writes of every daemon, checked as they land against the Consul twin.
#[derive(Clone)]
struct Nomad {
    consul: ConsulTwin,
    landed: Arc<Mutex<Vec<Landed>>>,
}

impl Nomad {
    fn new(consul: &ConsulTwin) -> Nomad {
        Nomad {
            consul: consul.clone(),
            landed: Arc::default(),
        }
    }

    fn land(&self, by: &str) {
        let holder = self.consul.lock_holder_token(KEY);
        self.landed.lock().unwrap().push(Landed {
            by: by.to_string(),
            at: Instant::now(),
            holder,
        });
    }

    /// Writes that landed while another daemon held the lock: two writers at once.
    fn while_another_held(&self) -> Vec<Landed> {
        self.landed
            .lock()
            .unwrap()
            .iter()
            .filter(|w| w.holder.as_ref().is_some_and(|h| *h != w.by))
            .cloned()
            .collect()
    }

    /// Writes that landed while their writer did not hold the lock (the strict check).
    fn not_by_the_holder(&self) -> Vec<Landed> {
        self.landed
            .lock()
            .unwrap()
            .iter()
            .filter(|w| w.holder.as_deref() != Some(w.by.as_str()))
            .cloned()
            .collect()
    }

    fn writes_by(&self, by: &str) -> Vec<Instant> {
        self.landed
            .lock()
            .unwrap()
            .iter()
            .filter(|w| w.by == by)
            .map(|w| w.at)
            .collect()
    }
}

/// One daemon's Nomad client: each write takes `transit` to land.
struct NomadPort {
    nomad: Nomad,
    daemon: String,
    transit: Duration,
}

#[async_trait]
impl ChildControl for NomadPort {
    async fn dispatch(&self, request: &DispatchRequest) -> Result<Dispatched, PortError> {
        tokio::time::sleep(self.transit).await;
        self.nomad.land(&self.daemon);
        Ok(Dispatched {
            child: ChildId::new(
                format!("{}/dispatch-{}", request.parent, request.idempotency_token),
                "default",
            ),
            deduplicated: false,
        })
    }

    async fn child_status(&self, _child: &ChildId) -> Result<Option<ChildStatus>, PortError> {
        Ok(None)
    }

    async fn purge(&self, _child: &ChildId) -> Result<(), PortError> {
        tokio::time::sleep(self.transit).await;
        self.nomad.land(&self.daemon);
        Ok(())
    }

    async fn has_live_allocation(&self, _child: &ChildId) -> Result<bool, PortError> {
        Ok(false)
    }

    async fn stop(&self, _child: &ChildId) -> Result<(), PortError> {
        tokio::time::sleep(self.transit).await;
        self.nomad.land(&self.daemon);
        Ok(())
    }
}

fn request(n: u64) -> DispatchRequest {
    DispatchRequest {
        parent: "ci-runner".into(),
        namespace: None,
        meta: DispatchMeta {
            repo_url: "https://github.com/acme/api".into(),
            labels: "self-hosted".into(),
            runner_name: RunnerName(format!("ci-runner-{n:012x}")),
            runner_token: Some(SecretString::from("reg")),
        },
        idempotency_token: n.to_string(),
    }
}

/// A leadership term that ticks every `period`; a tick makes `writes_per_tick` writes one
/// after another and, like the real loop, runs to its end even when the term is told to stop.
fn ticking(
    services: Arc<Services>,
    period: Duration,
    writes_per_tick: u64,
) -> impl FnMut(Fence, StopTerm) -> futures::future::BoxFuture<'static, ()> + Send {
    move |fence: Fence, stop: StopTerm| {
        let ports = leader::fenced(&services, &fence);
        if writes_per_tick == 0 {
            return Box::pin(in_flight(ports, period, stop));
        }
        Box::pin(async move {
            let mut stop = std::pin::pin!(stop.wait());
            let mut n = 0;
            loop {
                tokio::select! {
                    biased;
                    _ = &mut stop => return,
                    _ = tokio::time::sleep(period) => {}
                }
                for _ in 0..writes_per_tick {
                    n += 1;
                    // A refused write is reported by the act step; the tick goes on.
                    let _ = ports.control.dispatch(&request(n)).await;
                }
            }
        })
    }
}

/// A term that sends one write every `period` without waiting for the previous one to
/// land: writes are always in flight, the last one checked just before the fence closed.
async fn in_flight(ports: Services, period: Duration, stop: StopTerm) {
    let ports = Arc::new(ports);
    let mut stop = std::pin::pin!(stop.wait());
    for n in 0.. {
        tokio::select! {
            biased;
            _ = &mut stop => return,
            _ = tokio::time::sleep(period) => {}
        }
        let ports = ports.clone();
        tokio::spawn(async move {
            let _ = ports.control.dispatch(&request(n)).await;
        });
    }
}

struct Daemon {
    name: String,
    state: watch::Receiver<LeaderState>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: JoinHandle<Result<(), LeadError>>,
}

impl Daemon {
    /// A daemon named `name` (its Consul token too) whose terms tick with `writes_per_tick`
    /// writes, each `transit` long.
    fn start(
        consul: &ConsulTwin,
        nomad: &Nomad,
        name: &str,
        ttl: Duration,
        transit: Duration,
        writes_per_tick: u64,
    ) -> Daemon {
        let world = MemoryWorld::new(chrono::Utc::now());
        let mut services = world.services();
        services.control = Arc::new(NomadPort {
            nomad: nomad.clone(),
            daemon: name.to_string(),
            transit,
        });
        let store: Arc<dyn LockStore> = Arc::new(TwinLock {
            twin: consul.clone(),
            token: name.to_string(),
        });
        let (state_tx, state) = watch::channel(LeaderState::NoSession);
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let term = ticking(
            Arc::new(services),
            Duration::from_millis(200),
            writes_per_tick,
        );
        let task = tokio::spawn(leader::lead(
            store,
            settings(name, ttl),
            state_tx,
            async move {
                let _ = shutdown_rx.await;
            },
            term,
        ));
        Daemon {
            name: name.to_string(),
            state,
            shutdown: Some(shutdown_tx),
            task,
        }
    }

    async fn until(&mut self, wanted: impl Fn(&LeaderState) -> bool) -> LeaderState {
        self.state
            .wait_for(|s| wanted(s))
            .await
            .unwrap_or_else(|_| panic!("{} stopped", self.name))
            .clone()
    }

    async fn leading(&mut self) {
        self.until(|s| *s == LeaderState::Leader).await;
    }
}

fn standby_naming(state: &LeaderState, holder: &str) -> bool {
    matches!(state, LeaderState::Standby { holder: Some(h) } if h.contains(holder))
}

/// The first daemon leads, the second stands by naming it.
async fn two_daemons(
    consul: &ConsulTwin,
    nomad: &Nomad,
    ttl: Duration,
    transit: Duration,
    writes_per_tick: u64,
) -> (Daemon, Daemon) {
    let mut a = Daemon::start(consul, nomad, "daemon-a", ttl, transit, writes_per_tick);
    a.leading().await;
    let mut b = Daemon::start(consul, nomad, "daemon-b", ttl, transit, writes_per_tick);
    b.until(|s| standby_naming(s, "daemon-a")).await;
    (a, b)
}

#[tokio::test(start_paused = true)]
async fn a_standby_takes_over_within_two_ttls_and_the_lock_delay_when_the_holder_dies_mid_tick() {
    let consul = ConsulTwin::new();
    let nomad = Nomad::new(&consul);
    let (a, mut b) = two_daemons(&consul, &nomad, TTL, Duration::from_millis(300), 5).await;
    // A minute of leading: A renewed all along and B never acted.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(nomad.writes_by("daemon-b").is_empty());
    let a_writes = nomad.writes_by("daemon-a").len();
    assert!(a_writes > 100, "A wrote {a_writes} times");
    // Killed in the middle of a tick: between two writes of one tick.
    let mut landed = nomad.writes_by("daemon-a").len();
    while landed % 5 != 2 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        landed = nomad.writes_by("daemon-a").len();
    }
    a.task.abort();
    let killed = Instant::now();
    b.leading().await;
    let took = killed.elapsed();
    let bound = settings("b", TTL).takeover_bound();
    assert!(took <= bound, "took {took:?}, bound {bound:?}");
    // The twin expires at exactly one TTL (Consul may take up to two): then the lock delay.
    assert!(took >= TTL + settings("b", TTL).lock_delay() - Duration::from_secs(6));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!nomad.writes_by("daemon-b").is_empty(), "B never wrote");
    assert!(
        nomad.not_by_the_holder().is_empty(),
        "{:?}",
        nomad.not_by_the_holder()
    );
}

#[tokio::test(start_paused = true)]
async fn a_holder_cut_off_from_consul_stops_writing_before_a_successor_can_acquire() {
    let consul = ConsulTwin::new();
    let nomad = Nomad::new(&consul);
    // Ticks of 10 writes, each 40% of the margin in transit: a tick is still running when
    // A's fence closes, and a write checked just before it closed lands well after.
    let margin = settings("a", TTL).margin();
    let transit = margin * 2 / 5;
    let (mut a, mut b) = two_daemons(&consul, &nomad, TTL, transit, 10).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    // The network between A and Consul drops everything; A still reaches Nomad.
    consul.set_partitioned("daemon-a", true);
    let cut = Instant::now();
    a.until(|s| *s == LeaderState::NoSession).await;
    let a_stopped = cut.elapsed();
    assert!(
        a_stopped <= settings("a", TTL).fence_span(),
        "A acted {a_stopped:?} after it was cut off"
    );
    b.leading().await;
    let took = cut.elapsed();
    assert!(took <= settings("b", TTL).takeover_bound(), "took {took:?}");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let a_last = *nomad.writes_by("daemon-a").last().expect("A wrote");
    let b_first = *nomad.writes_by("daemon-b").first().expect("B wrote");
    assert!(a_last < b_first, "A's last write landed after B's first");
    assert!(
        nomad.while_another_held().is_empty(),
        "two writers: {:?}",
        nomad.while_another_held()
    );
    // Once Consul answers again, A stands by with a new session, naming B.
    consul.set_partitioned("daemon-a", false);
    a.until(|s| standby_naming(s, "daemon-b")).await;
}

#[tokio::test(start_paused = true)]
async fn a_write_sent_just_before_the_fence_closed_lands_before_a_successor_can_acquire() {
    let consul = ConsulTwin::new();
    let nomad = Nomad::new(&consul);
    // Writes take one and a half margins to land (a slow network): only a lock delay of at
    // least the margin keeps the successor from acting before the last of them lands.
    let transit = settings("a", TTL).margin() * 3 / 2;
    let (_a, mut b) = two_daemons(&consul, &nomad, TTL, transit, 0).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    consul.set_partitioned("daemon-a", true);
    b.leading().await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(!nomad.writes_by("daemon-b").is_empty(), "B never wrote");
    assert!(
        nomad.while_another_held().is_empty(),
        "two writers: {:?}",
        nomad.while_another_held()
    );
}

#[tokio::test(start_paused = true)]
async fn a_holder_whose_session_expired_stops_at_once_and_stands_by_with_a_new_session() {
    let consul = ConsulTwin::new();
    let nomad = Nomad::new(&consul);
    let (mut a, mut b) = two_daemons(&consul, &nomad, TTL, Duration::from_millis(100), 3).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let a_session = consul.lock_holder(KEY).expect("A holds the lock");
    // Consul lost A's session (a reaped TTL, an operator): A's next renew gets a 404.
    assert!(consul.expire_session(&a_session));
    let lost = Instant::now();
    a.until(|s| *s != LeaderState::Leader).await;
    assert!(
        lost.elapsed() <= settings("a", TTL).renew_interval(),
        "A acted on for {:?}",
        lost.elapsed()
    );
    // Whoever retries first after the lock delay leads (A, with its new session, may).
    let bound = settings("b", TTL).takeover_bound();
    tokio::time::timeout(bound, async {
        loop {
            let leading = [&a.state, &b.state]
                .iter()
                .filter(|s| *s.borrow() == LeaderState::Leader)
                .count();
            if leading == 1 {
                break;
            }
            // Woken by the next change of either daemon's state.
            tokio::select! {
                _ = a.state.changed() => {}
                _ = b.state.changed() => {}
            }
        }
    })
    .await
    .expect("a leader within the takeover bound");
    assert!(!consul.sessions().contains(&a_session));
    assert_eq!(consul.sessions().len(), 2, "A stands by with a new session");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        b.state.borrow().clone() == LeaderState::Leader
            || standby_naming(&b.state.borrow(), "daemon-a")
    );
    // A session ended abruptly mid-TTL leaves a write already in flight to land unheld (the
    // fence cannot foresee it); what must never happen is a write landing while another
    // daemon holds the lock.
    assert!(
        nomad.while_another_held().is_empty(),
        "{:?}",
        nomad.while_another_held()
    );
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_releases_the_lock_then_destroys_the_session_so_the_standby_takes_over_at_once()
 {
    let consul = ConsulTwin::new();
    let nomad = Nomad::new(&consul);
    let (mut a, mut b) = two_daemons(&consul, &nomad, TTL, Duration::from_millis(100), 3).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let a_session = consul.lock_holder(KEY).expect("A holds the lock");
    let _ = a.shutdown.take().unwrap().send(());
    let asked = Instant::now();
    (&mut a.task).await.unwrap().expect("A stops cleanly");
    b.leading().await;
    // A released the key: no lock delay to wait out.
    let took = asked.elapsed();
    assert!(
        took < settings("b", TTL).lock_delay(),
        "B took {took:?} to take over"
    );
    let events: Vec<LockEvent> = consul
        .lock_events()
        .into_iter()
        .filter(|e| match e {
            LockEvent::Released { session, .. } | LockEvent::Destroyed { session } => {
                *session == a_session
            }
            _ => false,
        })
        .collect();
    assert_eq!(
        events,
        vec![
            LockEvent::Released {
                key: KEY.into(),
                session: a_session.clone()
            },
            LockEvent::Destroyed { session: a_session }
        ]
    );
    assert!(
        nomad.not_by_the_holder().is_empty(),
        "{:?}",
        nomad.not_by_the_holder()
    );
}

#[tokio::test(start_paused = true)]
async fn a_ttl_below_consuls_minimum_is_a_clear_error_naming_the_setting() {
    let consul = ConsulTwin::new();
    let store: Arc<dyn LockStore> = Arc::new(TwinLock {
        twin: consul.clone(),
        token: "daemon-a".into(),
    });
    let (state_tx, _state) = watch::channel(LeaderState::NoSession);
    let error = leader::lead(
        store.clone(),
        settings("daemon-a", Duration::from_secs(5)),
        state_tx,
        std::future::pending(),
        |_fence: Fence, _stop: StopTerm| async { panic!("no term without a session") },
    )
    .await
    .expect_err("refused");
    assert!(error.0.contains("Invalid Session TTL"), "{error}");
    assert!(error.0.contains("session_ttl_min"), "{error}");
    let refused = OneShot::take(store, settings("daemon-a", Duration::from_secs(5)))
        .await
        .err()
        .expect("refused");
    assert!(matches!(refused, OneShotRefused::Settings(_)), "{refused}");
    assert!(consul.sessions().is_empty());
}

#[tokio::test(start_paused = true)]
async fn once_is_refused_naming_the_holder_and_takes_and_gives_back_a_free_lock() {
    let consul = ConsulTwin::new();
    let nomad = Nomad::new(&consul);
    let store = |name: &str| -> Arc<dyn LockStore> {
        Arc::new(TwinLock {
            twin: consul.clone(),
            token: name.into(),
        })
    };
    let a = Daemon::start(&consul, &nomad, "daemon-a", TTL, Duration::ZERO, 1);
    let mut a = a;
    a.leading().await;
    let refused = OneShot::take(store("once"), settings("once", TTL))
        .await
        .err()
        .expect("refused while A holds the lock");
    assert!(refused.to_string().contains("daemon-a pid 1"), "{refused}");
    assert_eq!(consul.sessions().len(), 1, "once destroyed its session");

    let _ = a.shutdown.take().unwrap().send(());
    (&mut a.task).await.unwrap().unwrap();
    let lease = OneShot::take(store("once"), settings("once", TTL))
        .await
        .expect("a free lock is taken");
    assert_eq!(lease.fence.may_write(), Ok(()));
    assert_eq!(consul.lock_holder_token(KEY).as_deref(), Some("once"));
    let fence = lease.fence.clone();
    lease.give_back().await;
    assert!(fence.may_write().is_err());
    assert_eq!(consul.lock_holder(KEY), None);
    assert!(consul.sessions().is_empty());
}

/// The real Consul client against the twin over loopback (real time: no paused clock with
/// sockets): the calls the lock makes, with Consul's answers.
#[tokio::test]
async fn the_consul_client_speaks_sessions_and_locks_as_the_twin_answers_them() {
    use runner_scaler::clients::consul::{ConsulKv, ConsulSettings};
    use runner_scaler::clients::consul_lock::ConsulLock;
    use runner_scaler::leader::{LockError, SessionRequest};
    use runner_scaler::sim::twins::TwinServer;

    let twin = ConsulTwin::with_token("daemon-a");
    twin.allow_token("daemon-b");
    let server = TwinServer::start(twin.router()).await.expect("serve");
    let client = |token: &str| {
        let settings = ConsulSettings {
            address: server.base_url(),
            token: Some(SecretString::from(token.to_string())),
            ca_cert: None,
            client_cert: None,
            client_key: None,
        };
        let kv = ConsulKv::new(&settings, "runners/config").expect("client");
        ConsulLock::new(&kv, settings.token.clone())
    };
    let (a, b) = (client("daemon-a"), client("daemon-b"));
    let request = |ttl_s| SessionRequest {
        name: "test".into(),
        ttl: Duration::from_secs(ttl_s),
        lock_delay: Duration::from_secs(5),
    };
    let refused = a.create_session(&request(5)).await.expect_err("refused");
    assert!(
        matches!(&refused, LockError::TtlRefused(m) if m.contains("Invalid Session TTL '5000000000', must be between [10s=24h0m0s]")),
        "{refused}"
    );
    let sa = a.create_session(&request(15)).await.expect("session a");
    let sb = b.create_session(&request(15)).await.expect("session b");
    let value = Holder {
        holder: "daemon-a".into(),
        pid: 7,
    }
    .to_value();
    assert!(a.acquire(KEY, &sa, &value).await.unwrap());
    assert!(!b.acquire(KEY, &sb, b"b").await.unwrap(), "held by a");
    let key = b.read_key(KEY, 0, Duration::ZERO).await.unwrap();
    assert_eq!(key.session.as_deref(), Some(sa.0.as_str()));
    assert_eq!(Holder::describe(&key.value.unwrap()), "daemon-a pid 7");
    assert!(key.index > 0);
    a.renew_session(&sa).await.expect("renewed");
    // A blocking read returns when the key changes: here, when a releases it.
    let waiting = tokio::spawn({
        let b = client("daemon-b");
        async move { b.read_key(KEY, key.index, Duration::from_secs(30)).await }
    });
    twin.blocked_reads_at_least(1).await;
    assert!(a.release(KEY, &sa, b"a").await.unwrap());
    let released = waiting.await.unwrap().unwrap();
    assert_eq!(released.session, None);
    a.destroy_session(&sa).await.expect("destroyed");
    assert!(matches!(
        a.renew_session(&sa).await,
        Err(LockError::SessionGone(m)) if m.contains(&format!("Session id '{sa}' not found"))
    ));
    // No health checks: the session is not tied to the agent's serfHealth.
    runner_scaler::clients::http::install_crypto_provider();
    let info: serde_json::Value = reqwest::Client::new()
        .get(format!("{}/v1/session/info/{sb}", server.base_url()))
        .header("X-Consul-Token", "daemon-b")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info[0]["NodeChecks"], serde_json::json!([]));
    assert_eq!(info[0]["TTL"], "15s");
    assert_eq!(info[0]["LockDelay"], 5_000_000_000u64);
    assert_eq!(info[0]["Behavior"], "release");
    assert!(
        b.acquire(KEY, &sb, b"b").await.unwrap(),
        "free after release, no lock delay"
    );
}

/// The twin's session bodies have the fields and JSON kinds of Consul's documented examples
/// (`tests/fixtures/consul/session-*.json`), and it takes the documented create request.
#[tokio::test]
async fn the_twins_session_answers_match_consuls_documented_examples() {
    use runner_scaler::sim::twins::TwinServer;
    use support::fixtures::{fixture, json_type};

    let twin = ConsulTwin::new();
    // The documented request asks for a 30s TTL, above the default minimum.
    let server = TwinServer::start(twin.router()).await.expect("serve");
    runner_scaler::clients::http::install_crypto_provider();
    let http = reqwest::Client::new();
    let put = |path: String, body: String| {
        let http = http.clone();
        let url = format!("{}{path}", server.base_url());
        async move {
            let response = http.put(url).body(body).send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.text().await.unwrap())
        }
    };
    let shape = |value: &serde_json::Value| -> Vec<(String, &'static str)> {
        let mut keys: Vec<_> = value
            .as_object()
            .expect("an object")
            .iter()
            // ServiceChecks is null in the example; the kinds of lists are compared elsewhere.
            .map(|(k, v)| (k.clone(), json_type(v)))
            .collect();
        keys.sort();
        keys
    };
    let request = fixture("consul", "session-create.request.json");
    let (status, created) = put("/v1/session/create".into(), request.to_string()).await;
    assert_eq!(status, 200, "{created}");
    let created: serde_json::Value = serde_json::from_str(&created).unwrap();
    assert_eq!(
        shape(&created),
        shape(&fixture("consul", "session-create.response.json"))
    );
    let id = created["ID"].as_str().unwrap().to_string();

    let (status, renewed) = put(format!("/v1/session/renew/{id}"), String::new()).await;
    assert_eq!(status, 200);
    let renewed: serde_json::Value = serde_json::from_str(&renewed).unwrap();
    let documented = fixture("consul", "session-renew.response.json");
    assert_eq!(shape(&renewed[0]), shape(&documented[0]));
    assert_eq!(renewed[0]["TTL"], "30s");
    assert_eq!(renewed[0]["LockDelay"], documented[0]["LockDelay"]);

    let info: serde_json::Value = http
        .get(format!("{}/v1/session/info/{id}", server.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let documented = fixture("consul", "session-info.response.json");
    assert_eq!(shape(&info[0]), shape(&documented[0]));

    let (status, destroyed) = put(format!("/v1/session/destroy/{id}"), String::new()).await;
    assert_eq!((status, destroyed.trim()), (200, "true"));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&destroyed).unwrap(),
        fixture("consul", "session-destroy.response.json")
    );
    let (status, gone) = put(format!("/v1/session/renew/{id}"), String::new()).await;
    assert_eq!(
        (status, gone),
        (404, format!("Session id '{id}' not found"))
    );
}

/// Writes that reached the Nomad twin over HTTP, each checked as it arrived against the
/// Consul twin's lock holder.
#[derive(Clone, Default)]
struct WriteCheck {
    landed: Arc<Mutex<Vec<Landed>>>,
    count: Arc<watch::Sender<usize>>,
}

impl WriteCheck {
    fn by(&self, daemon: &str) -> usize {
        self.landed
            .lock()
            .unwrap()
            .iter()
            .filter(|w| w.by == daemon)
            .count()
    }

    fn violations(&self) -> Vec<Landed> {
        self.landed
            .lock()
            .unwrap()
            .iter()
            .filter(|w| w.holder.as_deref() != Some(w.by.as_str()))
            .cloned()
            .collect()
    }

    async fn until(&self, wanted: impl Fn(&WriteCheck) -> bool) {
        let mut rx = self.count.subscribe();
        let _ = rx.wait_for(|_| wanted(self)).await;
    }
}

/// Real daemons (the real clients, `leader::lead` driving `control_loop::run`) against
/// the Consul and Nomad twins over loopback, in real time with a 3 s TTL. Every dispatch,
/// stop and purge Nomad receives is checked against the lock holder as it arrives. Each
/// dispatch queues one more job, so the leader writes on every tick.
#[tokio::test]
async fn over_http_a_standby_takes_over_from_a_killed_and_from_a_cut_off_holder_and_never_both_write()
 {
    use axum::extract::Request;
    use axum::middleware::{self, Next};
    use rand::SeedableRng;
    use runner_scaler::clients::consul_lock::ConsulLock;
    use runner_scaler::config::watch::ConfigState;
    use runner_scaler::control_loop::{Controller, LoopSettings};
    use runner_scaler::sim::daemon_clients::TwinCredentials;
    use runner_scaler::sim::twins::TwinServer;
    use support::twins::{CREDENTIALS, Twins, config};

    const TTL_HTTP: Duration = Duration::from_secs(3);
    let twins = Twins::start().await;
    twins.consul.set_session_ttl_min(Duration::from_secs(1));
    let acme = twins.add_app_repo("acme/api");
    twins.register_token_parent("ci-runner");
    twins.github.add_run(&acme, vec![vec!["self-hosted"]; 2]);
    // Each daemon presents its own token to Nomad and Consul: that is how a write is traced.
    twins.nomad.set_acl_token(None);
    for daemon in ["daemon-a", "daemon-b", "daemon-c"] {
        twins.consul.allow_token(daemon);
    }
    let check = WriteCheck::default();
    let nomad_server = TwinServer::start(twins.nomad.router().layer(middleware::from_fn({
        let check = check.clone();
        let consul = twins.consul.clone();
        let github = twins.github.clone();
        let acme = acme.clone();
        move |request: Request, next: Next| {
            let check = check.clone();
            let consul = consul.clone();
            let github = github.clone();
            let acme = acme.clone();
            async move {
                let path = request.uri().path().to_string();
                let method = request.method().clone();
                let write = (method == axum::http::Method::POST && path.ends_with("/dispatch"))
                    || method == axum::http::Method::DELETE;
                if write {
                    let by = request
                        .headers()
                        .get("X-Nomad-Token")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string();
                    let holder = consul.lock_holder_token(KEY);
                    check.landed.lock().unwrap().push(Landed {
                        by,
                        at: Instant::now(),
                        holder,
                    });
                    if path.ends_with("/dispatch") {
                        github.add_run(&acme, vec![vec!["self-hosted"]]);
                    }
                    check.count.send_modify(|n| *n += 1);
                }
                next.run(request).await
            }
        }
    })))
    .await
    .expect("serve the checked Nomad twin");
    let mut addresses = twins.addresses();
    addresses.nomad = nomad_server.base_url();
    let document = config(r#"{ "acme/api": { "mode": "app", "maxConcurrent": 1000 } }"#);
    let (_config_tx, config_rx) = watch::channel(ConfigState {
        config: Some(Arc::new(document)),
        applied_index: Some(1),
        ..ConfigState::default()
    });
    let start = |name: &'static str| {
        let credentials = TwinCredentials {
            nomad_token: name,
            consul_token: name,
            ..CREDENTIALS
        };
        let clients = addresses
            .clients(&credentials, Duration::from_secs(2))
            .expect("the daemon's clients");
        let store: Arc<dyn LockStore> = Arc::new(ConsulLock::new(
            &clients.consul,
            Some(SecretString::from(name)),
        ));
        let services = clients.services;
        let config_rx = config_rx.clone();
        let (state_tx, state) = watch::channel(LeaderState::NoSession);
        let task = tokio::spawn(leader::lead(
            store,
            settings(name, TTL_HTTP),
            state_tx,
            std::future::pending(),
            move |fence: Fence, stop: StopTerm| {
                let controller = Controller::new(
                    leader::fenced(&services, &fence),
                    LoopSettings {
                        poll_interval: Duration::from_millis(250),
                        ..LoopSettings::default()
                    },
                    // Each daemon names its runners differently: GitHub refuses a JIT config
                    // for a runner name already registered.
                    Box::new(rand::rngs::StdRng::seed_from_u64(u64::from(
                        name.bytes().last().unwrap_or(0),
                    ))),
                );
                runner_scaler::control_loop::run(
                    controller,
                    config_rx.clone(),
                    &runner_scaler::clock::SystemClock,
                    false,
                    stop.wait(),
                )
            },
        ));
        Daemon {
            name: name.to_string(),
            state,
            shutdown: None,
            task,
        }
    };
    let mut a = start("daemon-a");
    a.leading().await;
    check.until(|c| c.by("daemon-a") >= 3).await;
    let mut b = start("daemon-b");
    b.until(|s| standby_naming(s, "daemon-a")).await;
    // Killed as it writes: in the middle of a tick.
    let seen = check.by("daemon-a");
    check.until(|c| c.by("daemon-a") > seen).await;
    a.task.abort();
    let killed = Instant::now();
    b.leading().await;
    let took = killed.elapsed();
    let bound = settings("daemon-b", TTL_HTTP).takeover_bound();
    assert!(took <= bound, "took {took:?}, bound {bound:?}");
    check.until(|c| c.by("daemon-b") >= 3).await;

    // Now B, the holder, is cut off from Consul while it still reaches Nomad: it stops
    // writing when its fence closes, before C can acquire.
    let mut c = start("daemon-c");
    c.until(|s| standby_naming(s, "daemon-b")).await;
    twins.consul.set_partitioned("daemon-b", true);
    let cut = Instant::now();
    c.leading().await;
    let took = cut.elapsed();
    assert!(took <= bound, "took {took:?}, bound {bound:?}");
    assert_ne!(*b.state.borrow(), LeaderState::Leader);
    let b_writes = check.by("daemon-b");
    check.until(|c| c.by("daemon-c") >= 3).await;
    assert_eq!(check.by("daemon-b"), b_writes, "B wrote after C took over");
    assert!(check.violations().is_empty(), "{:?}", check.violations());
}

#[tokio::test(start_paused = true)]
async fn a_holder_whose_key_is_deleted_or_rewritten_under_it_stops_before_another_daemon_acts() {
    for rewritten in [false, true] {
        let consul = ConsulTwin::new();
        let nomad = Nomad::new(&consul);
        let transit = Duration::from_millis(100);
        let (mut a, mut b) = two_daemons(&consul, &nomad, TTL, transit, 3).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!nomad.writes_by("daemon-a").is_empty(), "A never wrote");
        let a_session = consul.lock_holder(KEY).expect("A holds the lock");
        let changed = Instant::now();
        if rewritten {
            // A snapshot restore or a transaction leaves the key naming B's session: B finds
            // it holds the lock without having acquired it.
            let b_session = consul
                .sessions()
                .into_iter()
                .find(|s| *s != a_session)
                .expect("B's session");
            consul.set_session(KEY, Some(&b_session));
        } else {
            // `consul kv delete`: no lock delay runs, and A's session stays valid.
            assert!(consul.delete(KEY));
        }
        // A hears of it as the answer to its blocking read of the key, not a TTL later: it
        // stops acting and gives up that session (it may lead again with a new one).
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !consul.sessions().contains(&a_session),
            "A still acts on its session a second after its key was {}",
            if rewritten { "rewritten" } else { "deleted" }
        );
        // Someone leads again, and at no moment did two act.
        tokio::time::timeout(settings("b", TTL).takeover_bound(), async {
            loop {
                let leading = [&a.state, &b.state]
                    .iter()
                    .filter(|s| *s.borrow() == LeaderState::Leader)
                    .count();
                if leading == 1 {
                    break;
                }
                tokio::select! {
                    _ = a.state.changed() => {}
                    _ = b.state.changed() => {}
                }
            }
        })
        .await
        .expect("a leader again within the takeover bound");
        tokio::time::sleep(Duration::from_secs(10)).await;
        // A write A sent before it heard may land after the change (a successor's lock delay
        // covers it); none it sent later lands while the other holds the lock.
        let heard = changed + Duration::from_secs(1) + transit;
        let late: Vec<Landed> = nomad
            .while_another_held()
            .into_iter()
            .filter(|w| w.at > heard)
            .collect();
        assert!(
            late.is_empty(),
            "key {}: {late:?}",
            if rewritten { "rewritten" } else { "deleted" },
        );
        let _ = b.shutdown.take().map(|s| s.send(()));
        let _ = a.shutdown.take().map(|s| s.send(()));
    }
}
