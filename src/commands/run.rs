//! `run`: the daemon. It stands by for the leader lock and, while it holds it, watches the
//! document and ticks; it serves `--listen` and `--webhook-listen` throughout, and stops at
//! the first SIGTERM or SIGINT once the tick in progress is done.

use std::process::ExitCode;
use std::sync::Arc;

use async_trait::async_trait;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tracing::{info, warn};

use super::bad_settings;
use crate::cli::DaemonArgs;
use crate::clients::consul::ConsulKv;
use crate::config::watch::{DocumentSource, Fetched, WatchSettings};
use crate::control_loop::{Controller, Services};
use crate::leader::{self, LeaderState};
use crate::model::PortError;
use crate::report::live::Role;
use crate::wiring::build;

/// Completes at the first SIGTERM or SIGINT; a second one aborts the process.
async fn shutdown_signal() {
    let first = wait_for_signal().await;
    info!("{first} received: finishing the tick in progress, starting no new one");
    tokio::spawn(async {
        let second = wait_for_signal().await;
        warn!("{second} received again: exiting now");
        std::process::exit(130);
    });
}

async fn wait_for_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("install the SIGTERM handler");
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = tokio::signal::ctrl_c() => "SIGINT",
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "interrupt"
    }
}

/// The document source of one leadership term: the daemon's one Consul client, shared.
struct SharedKv(Arc<ConsulKv>);

#[async_trait]
impl DocumentSource for SharedKv {
    async fn fetch(&self, index: u64, wait: std::time::Duration) -> Result<Fetched, PortError> {
        self.0.fetch(index, wait).await
    }
}

pub async fn run(args: DaemonArgs, dry_run: bool) -> ExitCode {
    let built = match build(&args).await {
        Ok(built) => built,
        Err(e) => return bad_settings(e),
    };
    let read_token = match crate::secrets::read_secret(crate::cli::LISTEN_TOKEN_VAR) {
        Ok(token) => token.as_ref().map(crate::serve::ReadToken::new),
        Err(e) => return bad_settings(e),
    };
    // Bound before anything starts: a port in use is a bad setting, reported at once.
    let listener = match args.listen_addr() {
        Ok(Some(addr)) => match crate::serve::exposure_problem(addr, read_token.as_ref()) {
            Some(problem) => return bad_settings(problem),
            None => match crate::serve::bind(addr).await {
                Ok(listener) => {
                    // The bound address, not the setting: port 0 picks one.
                    if let Ok(bound) = listener.local_addr() {
                        info!(listen = %bound, "serving /metrics, /livez, /healthz and /status");
                    }
                    Some(listener)
                }
                Err(e) => return bad_settings(e),
            },
        },
        Ok(None) => None,
        Err(e) => return bad_settings(e),
    };
    let webhook_listener = match args.webhook_listen_addr() {
        Ok(Some(addr)) => match crate::webhook::bind(addr).await {
            Ok(listener) => {
                if let Ok(bound) = listener.local_addr() {
                    let routes = built.webhook_secrets.routes().join(" and ");
                    info!(webhook_listen = %bound, "receiving webhooks at {routes}");
                }
                Some(listener)
            }
            Err(e) => return bad_settings(e),
        },
        Ok(None) => None,
        Err(e) => return bad_settings(e),
    };
    let metrics = built.loop_settings.metrics.clone();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let (last_tick_tx, last_tick) = tokio::sync::watch::channel(None);
    let (role_tx, role) = tokio::sync::watch::channel(if dry_run {
        Role::Shadow
    } else {
        Role::Standby { leader: None }
    });
    let server = listener.map(|listener| {
        let endpoints = crate::serve::Endpoints {
            metrics: metrics.clone(),
            clock: Arc::new(crate::clock::SystemClock),
            last_tick,
            role,
            read_token,
        };
        crate::serve::spawn(
            "/metrics, /livez, /healthz and /status",
            listener,
            crate::serve::router(endpoints),
            stopped(stop_rx.clone()),
        )
    });
    // The port between the webhook receiver and the loop of each leadership term; a standby
    // runs no loop, so its receiver refuses hints (outcome `not_leader`).
    let hints = webhook_listener
        .as_ref()
        .map(|_| crate::webhook::Hints::new());
    let webhook_server = webhook_listener
        .zip(hints.clone())
        .map(|(listener, hints)| {
            let receiver = crate::webhook::Receiver::new(
                built.webhook_secrets.clone(),
                hints,
                metrics.clone(),
                Arc::new(crate::clock::SystemClock),
            );
            crate::serve::spawn(
                "webhooks",
                listener,
                crate::webhook::router(receiver),
                stopped(stop_rx.clone()),
            )
        });
    let admin_token_probe = built.admin_token_probe();
    let consul = Arc::new(built.consul);
    let pause_key = built.pause_key.key().to_string();
    let pause_source: Arc<dyn DocumentSource> = Arc::new(built.pause_key);
    let services = built.services;
    let state_key: Arc<dyn crate::act::services::CarriedStore> = built.state_key.clone();
    let mut rng = StdRng::from_os_rng();
    // One leadership term (or the whole shadow run): the document watched, ticks run until
    // `stop`, over `services` (fenced by the term's lease when leading).
    let mut term =
        |services: Services,
         carried: Arc<dyn crate::act::services::CarriedStore>,
         stop: Box<dyn std::future::Future<Output = ()> + Send + Unpin>| {
            let mut controller = Controller::new(
                services,
                built.loop_settings.clone(),
                Box::new(StdRng::from_rng(&mut rng)),
            )
            .with_carried(carried)
            .with_pause_key(pause_key.clone(), pause_source.clone())
            .with_status_publisher(last_tick_tx.clone())
            .with_admin_token_guard(admin_token_probe.clone());
            if let Some(hints) = &hints {
                controller = controller.with_hints(hints.clone());
            }
            let document = crate::control_loop::DocumentWatch {
                source: SharedKv(consul.clone()),
                defaults: built.defaults.clone(),
                settings: WatchSettings::default(),
                jitter: StdRng::from_rng(&mut rng),
            };
            let metrics = metrics.clone();
            async move {
                crate::control_loop::serve_term(
                    controller,
                    document,
                    &crate::clock::SystemClock,
                    dry_run,
                    stop,
                    |config| {
                        tokio::spawn(crate::report::record::count_config_rejections(
                            metrics,
                            config.clone(),
                        ));
                    },
                )
                .await;
            }
        };
    let outcome = if dry_run {
        info!(
            poll_interval = %humantime::format_duration(args.poll_interval),
            "runner-scaler started in shadow mode (--dry-run): it plans and reports, writes \
             nothing and takes no leader lock"
        );
        term(
            services,
            state_key.clone(),
            Box::new(Box::pin(shutdown_signal())),
        )
        .await;
        Ok(())
    } else {
        let (leader_tx, leader_rx) = tokio::sync::watch::channel(LeaderState::NoSession);
        tokio::spawn(follow_leader_state(leader_rx, role_tx, metrics.clone()));
        info!(
            poll_interval = %humantime::format_duration(args.poll_interval),
            lock_ttl = %humantime::format_duration(built.leader.ttl),
            leader_key = %built.leader.key,
            "runner-scaler started: standing by for the leader lock"
        );
        // Only the lock holder reads the document and ticks; a standby reads the lock key alone.
        leader::lead(
            built.lock,
            built.leader,
            leader_tx,
            shutdown_signal(),
            |fence: leader::Fence, stop: leader::StopTerm| {
                term(
                    leader::fenced(&services, &fence),
                    leader::fenced_carried(state_key.clone(), &fence),
                    Box::new(Box::pin(stop.wait())),
                )
            },
        )
        .await
    };
    let _ = stop_tx.send(true);
    if let Some(server) = server {
        let _ = server.await;
    }
    if let Some(server) = webhook_server {
        let _ = server.await;
    }
    match outcome {
        Ok(()) => {
            info!("runner-scaler stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("{e}");
            bad_settings(e)
        }
    }
}

/// Keeps the live status's role and the leader gauges in step with the leader lock.
async fn follow_leader_state(
    mut leader: tokio::sync::watch::Receiver<LeaderState>,
    role: tokio::sync::watch::Sender<Role>,
    metrics: Arc<crate::metrics::Metrics>,
) {
    loop {
        let state = leader.borrow_and_update().clone();
        metrics.set_leader(state == LeaderState::Leader);
        metrics.set_holds_session(state != LeaderState::NoSession);
        role.send_replace(match state {
            LeaderState::Leader => Role::Leader,
            LeaderState::Standby { holder } => Role::Standby { leader: holder },
            LeaderState::NoSession => Role::Standby { leader: None },
        });
        if leader.changed().await.is_err() {
            return;
        }
    }
}
