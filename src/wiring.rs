//! Builds the real clients from process settings and runs `run`, `once`, `status` and
//! `simulate`. Bad process settings are reported here and exit with 64.

use std::process::ExitCode;
use std::sync::Arc;

use async_trait::async_trait;
use rand::SeedableRng;
use rand::rngs::StdRng;
use secrecy::{ExposeSecret, SecretString};
use tracing::{info, warn};
use tracing_subscriber::EnvFilter;

use crate::cli::{
    Command, DaemonArgs, EXIT_BAD_SETTINGS, EXIT_INVALID, LogFormat, SimulateArgs, read_secret,
    read_secret_file,
};
use crate::clients::consul::{ConsulKv, ConsulSettings};
use crate::clients::consul_lock::ConsulLock;
use crate::clients::forgejo::Forgejo;
use crate::clients::github::{AppCredentials, GitHub, GitHubSettings};
use crate::clients::http::TlsFiles;
use crate::clients::nomad::{NomadClient, NomadSettings};
use crate::clients::vault::{VaultKv, VaultSettings};
use crate::config::ConfigDefaults;
use crate::config::watch::{DocumentSource, Fetched, WatchSettings};
use crate::control_loop::{Controller, LoopSettings, Services};
use crate::leader::{
    self, Holder, LeaderSettings, LeaderState, LockStore, OneShot, OneShotRefused,
};
use crate::model::ErrorClass;
use crate::observe::PortError;
use crate::plan::PlanSettings;
use crate::plan::reap::ReapPolicy;
use crate::report::live::Role;
use crate::secrets::SecretSource;

/// Crates whose own logging is noise next to ours (every 404 at ERROR, every request at
/// INFO); our clients log what matters with context.
const QUIET_CRATES: &str = "consulrs=off,rustify=off,vaultrs=off";

/// Logs go to stderr, so `--json` output on stdout stays clean. `RUST_LOG` overrides.
pub fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("info,{QUIET_CRATES}")));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        // One JSON object per line, the event's fields flattened beside `message`.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}

fn bad_settings(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("runner-scaler: {message}");
    ExitCode::from(EXIT_BAD_SETTINGS as u8)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("start the tokio runtime")
}

pub fn run_command(command: Command, log_format: LogFormat) -> ExitCode {
    init_tracing(log_format);
    match command {
        Command::Run {
            daemon: args,
            dry_run,
        } => runtime().block_on(daemon(*args, dry_run)),
        Command::Once {
            daemon,
            dry_run,
            json,
        } => runtime().block_on(once(*daemon, dry_run, json)),
        Command::Status { daemon, json, addr } => runtime().block_on(status(*daemon, json, addr)),
        Command::Simulate(args) => simulate(args),
        Command::Config { .. } => unreachable!("handled in main"),
    }
}

/// Stands in for Vault when `VAULT_TOKEN` is not set: repos that need a Vault secret report
/// a configuration error, the others go on.
struct NoVault;

#[async_trait]
impl SecretSource for NoVault {
    async fn read_field(&self, path: &str, field: &str) -> Result<SecretString, PortError> {
        Err(PortError::new(
            ErrorClass::Configuration,
            format!("read {field} at {path}: VAULT_TOKEN is not set"),
        ))
    }
}

/// Everything the daemon is built from.
pub struct Built {
    pub services: Services,
    pub consul: ConsulKv,
    /// The operator's pause key (`--pause-key`).
    pub pause_key: ConsulKv,
    /// The leader lock's Consul calls, and its settings.
    pub lock: Arc<dyn LockStore>,
    pub leader: LeaderSettings,
    pub loop_settings: LoopSettings,
    pub defaults: ConfigDefaults,
    /// The webhook secrets; empty unless `--webhook-listen` is set.
    pub webhook_secrets: crate::webhook::WebhookSecrets,
    /// The concrete clients, for `config check --live` and the admin-token guard.
    pub live: crate::check::LiveClients,
}

/// Builds the clients from settings; an error is a bad process setting.
pub async fn build(args: &DaemonArgs) -> Result<Built, String> {
    args.validate()?;
    let timeout = args.request_timeout;
    let nomad = Arc::new(NomadClient::new(
        NomadSettings {
            addr: args.nomad_addr.clone(),
            token: read_secret("NOMAD_TOKEN")?,
            namespace: Some(args.runner_namespace.clone()),
            region: args.nomad_region.clone(),
            tls: TlsFiles {
                ca_cert: args.nomad_cacert.clone(),
                client_cert: args.nomad_client_cert.clone(),
                client_key: args.nomad_client_key.clone(),
            },
        },
        timeout,
    )?);
    let consul_settings = ConsulSettings {
        address: args.consul_http_addr.clone(),
        token: read_secret("CONSUL_HTTP_TOKEN")?,
        ca_cert: args.consul_cacert.clone(),
        client_cert: args.consul_client_cert.clone(),
        client_key: args.consul_client_key.clone(),
    };
    let consul_token = consul_settings.token.clone();
    let consul = ConsulKv::new(&consul_settings, &args.runner_scaler_config_key)?;
    let pause_key = ConsulKv::new(&consul_settings, &args.pause_key)?;
    crate::clients::consul::check_key(&args.leader_key)
        .map_err(|e| format!("--leader-key (RUNNER_SCALER_LEADER_KEY): {e}"))?;
    let lock: Arc<dyn LockStore> = Arc::new(ConsulLock::new(&consul, consul_token));
    if args.github_app_vault_path.is_some() && args.github_app_private_key_file.is_some() {
        return Err("set GITHUB_APP_PRIVATE_KEY_FILE or GITHUB_APP_VAULT_PATH, not both".into());
    }
    let vault = match read_secret("VAULT_TOKEN")? {
        Some(token) => Some(Arc::new(VaultKv::new(VaultSettings {
            addr: args.vault_addr.clone(),
            token,
            namespace: args.vault_namespace.clone(),
            ca_cert: args.vault_cacert.clone(),
            mount: args.vault_mount.clone(),
        })?)),
        None => None,
    };
    let secrets: Arc<dyn SecretSource> = match &vault {
        Some(vault) => vault.clone(),
        None => Arc::new(NoVault),
    };
    let mut vault_webhook_secret = None;
    let app = match (
        &args.github_app_id,
        &args.github_app_private_key_file,
        &args.github_app_vault_path,
    ) {
        (Some(app_id), Some(key_file), None) => Some(AppCredentials {
            app_id: app_id.clone(),
            private_key: read_secret_file(key_file, "GITHUB_APP_PRIVATE_KEY_FILE")?,
            installation_id: args.github_app_installation_id,
        }),
        (_, None, Some(path)) => {
            let Some(vault) = &vault else {
                return Err("GITHUB_APP_VAULT_PATH is set but VAULT_TOKEN is not".into());
            };
            let secret = vault
                .read_app_credentials(path)
                .await
                .map_err(|e| format!("read the GitHub App from Vault at {path}: {e}"))?;
            vault_webhook_secret = secret.webhook_secret;
            Some(AppCredentials {
                app_id: args.github_app_id.clone().unwrap_or(secret.app_id),
                private_key: secret.private_key,
                installation_id: args.github_app_installation_id.or(secret.installation_id),
            })
        }
        (None, None, None) => None,
        (None, Some(_), None) => {
            return Err("GITHUB_APP_PRIVATE_KEY_FILE is set but GITHUB_APP_ID is not".into());
        }
        (Some(_), None, None) => {
            return Err(
                "GITHUB_APP_ID is set but neither GITHUB_APP_PRIVATE_KEY_FILE nor GITHUB_APP_VAULT_PATH is"
                    .into(),
            );
        }
        (_, Some(_), Some(_)) => unreachable!("refused above"),
    };
    if app.is_none() {
        info!("no GitHub App configured: only vault and forgejo repos can be served");
    }
    let github = Arc::new(GitHub::new(
        GitHubSettings {
            api_url: args.github_api_url.clone(),
            app,
            request_timeout: timeout,
        },
        secrets.clone(),
    )?);
    let forgejo_tls = TlsFiles {
        ca_cert: args.forgejo_cacert.clone(),
        ..TlsFiles::default()
    };
    let forgejo = Arc::new(
        Forgejo::new(secrets, &forgejo_tls, timeout)
            .map_err(|e| format!("--forgejo-cacert (FORGEJO_CACERT): {e}"))?,
    );
    let webhook_secrets = if args.webhook_listen_addr()?.is_some() {
        crate::webhook::read_secrets(vault_webhook_secret)?
    } else {
        crate::webhook::WebhookSecrets::default()
    };
    let live = crate::check::LiveClients {
        nomad: nomad.clone(),
        github: github.clone(),
        forgejo: forgejo.clone(),
        vault: vault.clone(),
    };
    Ok(Built {
        webhook_secrets,
        live,
        services: match &vault {
            Some(vault) => Services::of(github, forgejo, nomad).with_wrapper(vault.clone()),
            None => {
                warn!(
                    "VAULT_TOKEN is not set: runner credentials go into Nomad dispatch meta as \
                     they are, readable by anyone with read-job in the runners' namespace; set \
                     VAULT_TOKEN or VAULT_TOKEN_FILE so that each is wrapped in a single-use \
                     Vault token"
                );
                Services::of(github, forgejo, nomad)
            }
        },
        consul,
        pause_key,
        lock,
        leader: LeaderSettings {
            key: args.leader_key.clone(),
            ttl: args.lock_ttl,
            holder: Holder::of_this_process(),
        },
        loop_settings: LoopSettings {
            poll_interval: args.poll_interval,
            idle_poll_interval: args.idle_poll_interval.unwrap_or(
                if args.webhook_listen_addr()?.is_some() {
                    crate::control_loop::polls::IDLE_POLL_INTERVAL_WITH_WEBHOOKS
                } else {
                    crate::control_loop::polls::IDLE_POLL_INTERVAL_DEFAULT
                },
            ),
            list_concurrency_max: usize::from(args.max_concurrent_polls),
            plan: PlanSettings {
                max_in_flight: args.max_in_flight,
                vault_children_cleanup: args.vault_children_cleanup,
                reap: ReapPolicy {
                    orphan_grace: args.orphan_grace,
                    idle_confirm: args.idle_confirm,
                    hard_bound: args.hard_bound,
                    placement_timeout: args.placement_timeout,
                },
            },
            metrics: Arc::new(crate::metrics::Metrics::new(
                args.poll_interval,
                args.stuck_after,
                crate::clock::Clock::now(&crate::clock::SystemClock),
            )),
            ..LoopSettings::default()
        },
        defaults: ConfigDefaults {
            default_job: args.default_job.clone(),
            default_repo_max: args.default_repo_max,
        },
    })
}

/// The daemon asks Vault whether it can read an admin token whenever it has Vault.
fn admin_token_probe(
    live: &crate::check::LiveClients,
) -> Option<Arc<dyn crate::check::CapabilityProbe>> {
    live.vault
        .clone()
        .map(|vault| vault as Arc<dyn crate::check::CapabilityProbe>)
}

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

async fn daemon(args: DaemonArgs, dry_run: bool) -> ExitCode {
    let built = match build(&args).await {
        Ok(built) => built,
        Err(e) => return bad_settings(e),
    };
    let read_token = match crate::cli::read_secret(crate::cli::LISTEN_TOKEN_VAR) {
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
    let consul = Arc::new(built.consul);
    let pause_key = built.pause_key.key().to_string();
    let pause_source: Arc<dyn DocumentSource> = Arc::new(built.pause_key);
    let services = built.services;
    let admin_token_probe = admin_token_probe(&built.live);
    let mut rng = StdRng::from_os_rng();
    // One leadership term (or the whole shadow run): the document watched, ticks run until
    // `stop`, over `services` (fenced by the term's lease when leading).
    let mut term =
        |services: Services, stop: Box<dyn std::future::Future<Output = ()> + Send + Unpin>| {
            let mut controller = Controller::new(
                services,
                built.loop_settings.clone(),
                Box::new(StdRng::from_rng(&mut rng)),
            )
            .with_pause_key(pause_key.clone(), pause_source.clone())
            .with_status_publisher(last_tick_tx.clone())
            .with_admin_token_guard(admin_token_probe.clone());
            if let Some(hints) = &hints {
                controller = controller.with_hints(hints.clone());
            }
            let consul = SharedKv(consul.clone());
            let defaults = built.defaults.clone();
            let metrics = metrics.clone();
            async move {
                let (watch_stop_tx, watch_stop_rx) = tokio::sync::watch::channel(false);
                let (config_rx, watcher) = crate::config::watch::spawn(
                    consul,
                    defaults,
                    WatchSettings::default(),
                    async move {
                        let mut watch_stop_rx = watch_stop_rx;
                        let _ = watch_stop_rx.wait_for(|stop| *stop).await;
                    },
                );
                tokio::spawn(crate::report::record::count_config_rejections(
                    metrics,
                    config_rx.clone(),
                ));
                crate::control_loop::run(
                    controller,
                    config_rx,
                    &crate::clock::SystemClock,
                    dry_run,
                    stop,
                )
                .await;
                let _ = watch_stop_tx.send(true);
                let _ = watcher.await;
            }
        };
    let outcome = if dry_run {
        info!(
            poll_interval = %humantime::format_duration(args.poll_interval),
            "runner-scaler started in shadow mode (--dry-run): it plans and reports, writes \
             nothing and takes no leader lock"
        );
        term(services, Box::new(Box::pin(shutdown_signal()))).await;
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
            |fence, stop| {
                term(
                    leader::fenced(&services, &fence),
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

/// How long `status` waits for the running daemon before showing a dry-run tick instead.
const LIVE_STATUS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// `status`: the running daemon's own view (`GET /status` at `addr`), or, when none answers,
/// a fresh dry-run tick, saying that it cannot know the daemon's backoffs and readings.
async fn status(args: DaemonArgs, json: bool, addr: url::Url) -> ExitCode {
    match live_status(&addr, json).await {
        Ok(body) => {
            print!("{body}");
            if json {
                println!();
            }
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!(
                "no daemon answered at {addr} ({why}); showing a fresh dry-run tick instead, \
                 which cannot know a running daemon's backoffs, holds or readings"
            );
            once(args, true, json).await
        }
    }
}

/// The live status as the daemon renders it: JSON, or the text table.
async fn live_status(addr: &url::Url, json: bool) -> Result<String, String> {
    let client = crate::clients::http::build_client(
        "runner-scaler",
        &TlsFiles::default(),
        LIVE_STATUS_TIMEOUT,
    )?;
    let mut url = addr.join("status").map_err(|e| e.to_string())?;
    if !json {
        url.set_query(Some("format=text"));
    }
    let doing = format!("read the status at {}", url.path());
    let mut request = client.get(url);
    if let Some(token) = crate::cli::read_secret(crate::cli::LISTEN_TOKEN_VAR)? {
        // A sensitive header value: never shown by a Debug of the request.
        let mut bearer =
            reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.expose_secret()))
                .map_err(|_| {
                    format!(
                        "{} is not a valid header value",
                        crate::cli::LISTEN_TOKEN_VAR
                    )
                })?;
        bearer.set_sensitive(true);
        request = request.header(reqwest::header::AUTHORIZATION, bearer);
    }
    let response = request
        .send()
        .await
        .map_err(|e| crate::clients::http::transport_error("runner-scaler", &doing, &e).message)?;
    let status = response.status();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return Err(format!(
            "{doing}: 401: the daemon requires its listen token: set {}_FILE to the file the \
             daemon reads",
            crate::cli::LISTEN_TOKEN_VAR
        ));
    }
    if !status.is_success() {
        return Err(format!("{doing}: {status}"));
    }
    response
        .text()
        .await
        .map_err(|e| crate::clients::http::transport_error("runner-scaler", &doing, &e).message)
}

/// `once` and `status`: read the document once, run one tick (acting unless `dry_run`).
async fn once(args: DaemonArgs, dry_run: bool, json: bool) -> ExitCode {
    let built = match build(&args).await {
        Ok(built) => built,
        Err(e) => return bad_settings(e),
    };
    let document = match built.consul.fetch(0, std::time::Duration::ZERO).await {
        Ok(Fetched::Found { bytes, .. }) => bytes,
        Ok(Fetched::Missing { .. }) => {
            eprintln!(
                "the document {} does not exist in Consul: nothing to do",
                args.runner_scaler_config_key
            );
            return ExitCode::from(EXIT_INVALID as u8);
        }
        Err(e) => {
            eprintln!("read the document {}: {e}", args.runner_scaler_config_key);
            return ExitCode::from(EXIT_INVALID as u8);
        }
    };
    let config = match crate::config::parse_document(&document, &built.defaults) {
        Ok(config) => config,
        Err(problems) => {
            for p in problems {
                eprintln!("{p}");
            }
            return ExitCode::from(EXIT_INVALID as u8);
        }
    };
    // Acting needs the leader lock, as the daemon does; looking needs none.
    let lease = if dry_run {
        None
    } else {
        match OneShot::take(built.lock.clone(), built.leader.clone()).await {
            Ok(lease) => Some(lease),
            Err(refused @ OneShotRefused::Settings(_)) => return bad_settings(refused),
            Err(refused) => {
                eprintln!(
                    "runner-scaler once: {refused}; not acting (`once --dry-run` shows what a tick would do)"
                );
                return ExitCode::from(EXIT_INVALID as u8);
            }
        }
    };
    let services = match &lease {
        Some(lease) => leader::fenced(&built.services, &lease.fence),
        None => built.services,
    };
    let pause_key = built.pause_key.key().to_string();
    let mut controller = Controller::new(
        services,
        built.loop_settings,
        Box::new(StdRng::from_os_rng()),
    )
    .with_pause_key(pause_key, Arc::new(built.pause_key))
    .with_admin_token_guard(admin_token_probe(&built.live));
    use crate::clock::Clock;
    let view = controller
        .tick(&config, 0, crate::clock::SystemClock.now(), dry_run)
        .await;
    if let Some(lease) = lease {
        lease.give_back().await;
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&view).expect("a tick view serialises")
        );
    } else {
        print!("{}", view.render_text());
    }
    ExitCode::SUCCESS
}

/// `simulate`: the seeded world (`--scenario NAME --seeds N` sweeps, `--seed S` replays one)
/// or, for the `demo` scenario, the HTTP demo world. The seeded world runs on its own
/// current-thread runtimes, so it is driven from plain threads, outside any runtime.
fn simulate(args: SimulateArgs) -> ExitCode {
    use crate::sim::seeded::Scenario;
    if args.bench_process {
        return simulate_process_bench(args);
    }
    if args.bench {
        return simulate_bench(&args);
    }
    if args.scenario == "demo" {
        if args.seeds.is_some() {
            eprintln!(
                "runner-scaler simulate: the demo world runs one seed; --seeds needs a --scenario ({})",
                Scenario::known_names().join(", ")
            );
            return ExitCode::from(EXIT_BAD_SETTINGS as u8);
        }
        return runtime().block_on(simulate_demo(args));
    }
    let Some(scenario) = Scenario::parse(&args.scenario) else {
        eprintln!(
            "runner-scaler simulate: unknown scenario {:?}; known: demo, {}",
            args.scenario,
            Scenario::known_names().join(", ")
        );
        return ExitCode::from(EXIT_BAD_SETTINGS as u8);
    };
    let Some(strategy) = crate::sim::seeded::Strategy::parse(&args.strategy) else {
        eprintln!(
            "runner-scaler simulate: unknown strategy {:?}; known: {}",
            args.strategy,
            crate::sim::seeded::Strategy::ALL
                .map(|s| s.as_str())
                .join(", ")
        );
        return ExitCode::from(EXIT_BAD_SETTINGS as u8);
    };
    let settings = crate::sim::seeded::RunSettings {
        strategy,
        keep_trace: args.seed.is_some() && !args.json,
        ..Default::default()
    };
    match (args.seeds, args.seed) {
        (Some(n), _) => simulate_sweep(scenario, n, args.json, settings),
        (None, Some(seed)) => simulate_replay(scenario, seed, args.json, settings),
        (None, None) => {
            eprintln!(
                "runner-scaler simulate: --scenario {scenario} needs --seeds N (a sweep of seeds 1..=N) or --seed S (a replay)"
            );
            ExitCode::from(EXIT_BAD_SETTINGS as u8)
        }
    }
}

fn simulate_sweep(
    scenario: crate::sim::seeded::Scenario,
    seeds: u64,
    json: bool,
    settings: crate::sim::seeded::RunSettings,
) -> ExitCode {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    if !json {
        println!("sweeping scenario {scenario}: seeds 1..={seeds} on {threads} threads");
    }
    let report = crate::sim::seeded::sweep_with(scenario, 1..=seeds, threads, settings);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("a sweep report serialises")
        );
    } else {
        print!("{}", report.render_text());
    }
    if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_INVALID as u8)
    }
}

/// Seeds each (strategy, scenario) of the benchmark runs when `--seeds` is not given.
const BENCH_SEEDS_DEFAULT: u64 = 100;

fn simulate_bench(args: &SimulateArgs) -> ExitCode {
    use crate::sim::seeded::{Scenario, bench};
    if args.seed.is_some() {
        eprintln!("runner-scaler simulate: --bench runs seeds 1..=N (--seeds N), not one --seed");
        return ExitCode::from(EXIT_BAD_SETTINGS as u8);
    }
    // `idle` runs with the named scenarios; `fleet-500` (500 repos, minutes of wall time
    // per seed) only when asked for by name.
    let scenarios = if args.scenario == "demo" {
        Scenario::NAMED
            .into_iter()
            .chain([Scenario::Idle])
            .collect()
    } else {
        match Scenario::parse(&args.scenario) {
            Some(scenario) => vec![scenario],
            None => {
                eprintln!(
                    "runner-scaler simulate: unknown scenario {:?}; known: {}",
                    args.scenario,
                    Scenario::known_names().join(", ")
                );
                return ExitCode::from(EXIT_BAD_SETTINGS as u8);
            }
        }
    };
    let seeds = args.seeds.unwrap_or(BENCH_SEEDS_DEFAULT);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    if !args.json {
        println!(
            "benchmark: strategies {} over seeds 1..={seeds} of {} scenario(s), on {threads} threads",
            bench::Strategy::ALL.map(|s| s.as_str()).join(", "),
            scenarios.len()
        );
    }
    let started = std::time::Instant::now();
    let rows = bench::run(&scenarios, seeds, threads);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("benchmark rows serialise")
        );
    } else {
        print!("{}", bench::render_text(&rows));
        println!("wall time {:.1} s", started.elapsed().as_secs_f64());
    }
    ExitCode::SUCCESS
}

fn simulate_replay(
    scenario: crate::sim::seeded::Scenario,
    seed: u64,
    json: bool,
    settings: crate::sim::seeded::RunSettings,
) -> ExitCode {
    if !json {
        println!("replaying scenario {scenario}, seed {seed}");
    }
    let outcome = crate::sim::seeded::run_seed_with(scenario, seed, settings);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&outcome).expect("a seed outcome serialises")
        );
    } else {
        print!("{}", crate::sim::seeded::render_replay(&outcome));
    }
    if outcome.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_INVALID as u8)
    }
}

async fn simulate_demo(args: SimulateArgs) -> ExitCode {
    let options = crate::sim::world::WorldOptions {
        seed: args.seed.unwrap_or(1),
        ..Default::default()
    };
    println!(
        "simulating seed {}: twins of GitHub, Forgejo, Nomad, Consul and Vault on loopback; the real daemon against them",
        options.seed
    );
    match crate::sim::world::run_world(options).await {
        Ok(summary) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&summary).expect("a summary serialises")
                );
            } else {
                print!("{}", summary.render_text());
            }
            if summary.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_INVALID as u8)
            }
        }
        Err(e) => {
            eprintln!("simulate: {e}");
            ExitCode::from(EXIT_INVALID as u8)
        }
    }
}

/// `simulate --bench-process`: this binary's `run` as a child process against the twins of
/// the `demo` world or the `fleet-500` one, for `--window` of real time; reports its CPU
/// time, peak RSS and tick wall times.
#[cfg(unix)]
fn simulate_process_bench(args: SimulateArgs) -> ExitCode {
    use crate::sim::process_bench::{ProcessBenchOptions, ProcessScenario, run_process_bench};
    let Some(scenario) = ProcessScenario::parse(&args.scenario) else {
        eprintln!(
            "runner-scaler simulate: --bench-process runs the worlds {}; --scenario {} is not supported with it",
            ProcessScenario::ALL.map(ProcessScenario::as_str).join(", "),
            args.scenario
        );
        return ExitCode::from(EXIT_BAD_SETTINGS as u8);
    };
    let options = ProcessBenchOptions {
        scenario,
        window: args.window.unwrap_or(scenario.default_window()),
        seed: args.seed.unwrap_or(1),
        github_latency: args.github_latency.unwrap_or_default(),
    };
    if options.window.is_zero() {
        eprintln!("runner-scaler simulate: --window must be longer than zero");
        return ExitCode::from(EXIT_BAD_SETTINGS as u8);
    }
    let daemon_exe = match std::env::current_exe() {
        Ok(path) => path,
        Err(e) => {
            eprintln!("simulate: find this program's own path to run the daemon: {e}");
            return ExitCode::from(EXIT_INVALID as u8);
        }
    };
    if !args.json {
        println!(
            "running `runner-scaler run` as its own process against twins on loopback ({} world) for {}, polling every {}",
            scenario.as_str(),
            humantime::format_duration(options.window),
            humantime::format_duration(scenario.poll_interval(options.window))
        );
    }
    match runtime().block_on(run_process_bench(&daemon_exe, &options)) {
        Ok(report) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("a bench report serialises")
                );
            } else {
                print!("{}", report.render_text());
            }
            if report.ok() {
                ExitCode::SUCCESS
            } else {
                if args.json {
                    for problem in report.problems() {
                        eprintln!("simulate --bench-process: {problem}");
                    }
                    for line in &report.daemon_log_tail {
                        eprintln!("  daemon: {line}");
                    }
                }
                ExitCode::from(EXIT_INVALID as u8)
            }
        }
        Err(e) => {
            eprintln!("simulate --bench-process: {e}");
            ExitCode::from(EXIT_INVALID as u8)
        }
    }
}

#[cfg(not(unix))]
fn simulate_process_bench(_args: SimulateArgs) -> ExitCode {
    eprintln!(
        "runner-scaler simulate: --bench-process reads the daemon's usage with wait4, which needs a Unix system"
    );
    ExitCode::from(EXIT_BAD_SETTINGS as u8)
}
