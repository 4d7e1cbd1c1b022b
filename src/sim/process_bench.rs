//! `simulate --bench-process`: the daemon's own CPU time and peak RSS.
//!
//! The demo world measures behaviour with the daemon in-process, where its cost cannot be
//! told apart from the twins' and the world's. Here the daemon is `runner-scaler run` in its
//! own process, configured through its environment exactly as a deployment configures it,
//! against the twins on loopback, while the world keeps queuing jobs at a steady pace and its
//! runners take and finish them. After a fixed real-time window the daemon gets SIGTERM, and
//! `wait4` reports what the kernel accounted to it.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::config::{Config, ConfigDefaults, parse_document};
use crate::sim::world::{SIM_CREDENTIALS, SimTwins, World, WorldOptions, burst, fleet_repo};

/// How long the daemon may take to finish its tick and exit after SIGTERM before it is
/// killed (and the run reported as failed).
const STOP_GRACE: Duration = Duration::from_secs(30);
/// Lines of the daemon's log kept to show when the run fails.
const LOG_TAIL_LINES: usize = 20;
/// WARN and ERROR lines of the daemon kept in the report.
const FIRST_WARNINGS_KEPT: usize = 5;
/// `ru_maxrss` is in KiB on Linux and the BSDs, in bytes on macOS.
#[cfg(target_os = "macos")]
const MAXRSS_UNIT_BYTES: f64 = 1.0;
#[cfg(not(target_os = "macos"))]
const MAXRSS_UNIT_BYTES: f64 = 1024.0;

/// Repos of the `fleet-500` world.
pub const FLEET_REPOS: usize = 500;
/// Repos of the fleet that get most of its jobs, at a steady pace.
const FLEET_HOT_REPOS: usize = 10;
/// The share of the fleet's jobs that land in its hot repos; the rest land anywhere.
const FLEET_HOT_SHARE: f64 = 0.8;
/// `fleet-500` polls as the fleet does (and a deployment by default), when the
/// window holds enough ticks at that pace.
const FLEET_POLL_INTERVAL: Duration = Duration::from_secs(15);
/// Ticks the window must hold for the fleet to poll at [`FLEET_POLL_INTERVAL`]; a shorter
/// window polls at the demo's pace.
const FLEET_MIN_TICKS: u32 = 8;
/// An idle repo is read every this many poll intervals: 60 s at a 15 s poll, the daemon's
/// defaults without webhooks. Left at its default of 60 s, a demo polling every 3 s would
/// read its repos once a minute as soon as they fall idle, and see almost none of its jobs.
const IDLE_POLLS: u32 = 4;
/// `--max-concurrent-polls` of the daemon: its default.
const MAX_CONCURRENT_POLLS: u16 = 8;
/// What issue 9 asks of the daemon at 500 repos: peak RSS and p99 tick wall time.
const FLEET_RSS_TARGET_MIB: u32 = 64;
const FLEET_TICK_P99_TARGET_MS: u64 = 2_000;
/// The daemon's default log filter plus the per-tick line that gives the tick's length.
const DAEMON_LOG_FILTER: &str =
    "info,consulrs=off,rustify=off,vaultrs=off,runner_scaler::report::record=debug";
/// The field of the daemon's `tick recorded` line that gives the tick's wall time.
const TICK_MS_FIELD: &str = "tick_ms=";

/// The world the daemon runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessScenario {
    /// The BRIEF document's three repos (GitHub App, Forgejo, Vault-token GitHub).
    Demo,
    /// [`FLEET_REPOS`] `app` repos on one installation: most idle, a few busy.
    Fleet500,
}

impl ProcessScenario {
    pub const ALL: [ProcessScenario; 2] = [ProcessScenario::Demo, ProcessScenario::Fleet500];

    pub fn as_str(self) -> &'static str {
        match self {
            ProcessScenario::Demo => "demo",
            ProcessScenario::Fleet500 => "fleet-500",
        }
    }

    pub fn parse(name: &str) -> Option<ProcessScenario> {
        ProcessScenario::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
    }

    /// `--window` when none is given: long enough for about twenty ticks.
    pub fn default_window(self) -> Duration {
        match self {
            ProcessScenario::Demo => Duration::from_secs(60),
            ProcessScenario::Fleet500 => Duration::from_secs(5 * 60),
        }
    }

    /// The daemon's `--poll-interval` for a run of `window`.
    pub fn poll_interval(self, window: Duration) -> Duration {
        match self {
            ProcessScenario::Fleet500 if window >= FLEET_POLL_INTERVAL * FLEET_MIN_TICKS => {
                FLEET_POLL_INTERVAL
            }
            _ => poll_interval_for(window),
        }
    }
}

/// The daemon's `--idle-poll-interval` at `poll_interval`: the proportion of its defaults.
fn idle_poll_interval(poll_interval: Duration) -> Duration {
    poll_interval * IDLE_POLLS
}

/// What to run.
#[derive(Clone, Debug)]
pub struct ProcessBenchOptions {
    pub scenario: ProcessScenario,
    /// Real time the daemon runs for.
    pub window: Duration,
    /// Seeds the world's job mix, arrival times and runner timings.
    pub seed: u64,
    /// Round-trip time of every GitHub answer; zero answers at loopback speed.
    pub github_latency: Duration,
}

/// What one run measured. `cpu_s` and `peak_rss_mib` are the daemon's alone, as the kernel
/// accounted them to its process.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessBenchReport {
    pub version: &'static str,
    pub scenario: &'static str,
    /// Repos in the daemon's document.
    pub repos: usize,
    pub window_s: f64,
    pub poll_interval_s: f64,
    /// Round-trip time the GitHub twin adds to every answer.
    pub github_latency_ms: f64,
    /// `--idle-poll-interval` as set for the daemon.
    pub idle_poll_interval_s: f64,
    /// `--max-concurrent-polls` as set for the daemon.
    pub max_concurrent_polls: u16,
    /// User plus system CPU time.
    pub cpu_s: f64,
    pub user_cpu_s: f64,
    pub system_cpu_s: f64,
    pub peak_rss_mib: f64,
    /// Ticks that ran on a valid document (the daemon's `poll complete` lines).
    pub ticks: usize,
    /// Wall time of the daemon's ticks, from its `tick recorded tick_ms=` lines: from the
    /// tick's start (observing) to its end (acted and recorded). Nearest rank.
    pub tick_wall_ms_p50: Option<u64>,
    pub tick_wall_ms_p99: Option<u64>,
    pub tick_wall_ms_max: Option<u64>,
    /// The first tick's: it reads every repo of the document and mints their tokens, where
    /// later ticks read only the repos due.
    pub tick_wall_ms_first: Option<u64>,
    pub dispatches: usize,
    pub purges: usize,
    pub jobs_queued: usize,
    pub jobs_served: usize,
    /// WARN and ERROR lines the daemon logged.
    pub daemon_warnings: usize,
    /// The first of those lines, to tell a fault of the world from one of the daemon.
    pub daemon_first_warnings: Vec<String>,
    /// The daemon's exit code, when it exited rather than being killed by a signal.
    pub daemon_exit_code: Option<i32>,
    pub daemon_signal: Option<i32>,
    /// The daemon exited on its own before the window ended.
    pub daemon_stopped_early: bool,
    /// The daemon's last log lines, shown when the run failed.
    #[serde(skip)]
    pub daemon_log_tail: Vec<String>,
}

impl ProcessBenchReport {
    /// The daemon ran the whole window, exited cleanly on SIGTERM, and dispatched.
    pub fn ok(&self) -> bool {
        self.problems().is_empty()
    }

    /// Why the run does not count, if it does not.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.daemon_stopped_early {
            problems.push("the daemon exited before the window ended".to_string());
        }
        match (self.daemon_exit_code, self.daemon_signal) {
            (Some(0), _) => {}
            (Some(code), _) => problems.push(format!("the daemon exited with code {code}")),
            (None, Some(signal)) => {
                problems.push(format!("the daemon was ended by signal {signal}"))
            }
            (None, None) => problems.push("the daemon's exit status is unknown".to_string()),
        }
        if self.dispatches == 0 {
            problems.push("the daemon dispatched nothing".to_string());
        }
        if self.tick_wall_ms_max.is_none() {
            problems.push(format!(
                "the daemon logged no tick's length (a `{TICK_MS_FIELD}` field)"
            ));
        }
        problems
    }

    pub fn render_text(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "\nprocess bench (runner-scaler {}): `runner-scaler run` as its own process\n",
            self.version
        ));
        out.push_str(&format!(
            "  scenario             {} ({} repos)\n",
            self.scenario, self.repos
        ));
        out.push_str(&format!("  window               {:.1} s\n", self.window_s));
        out.push_str(&format!(
            "  poll interval        {:.1} s\n",
            self.poll_interval_s
        ));
        if self.github_latency_ms > 0.0 {
            out.push_str(&format!(
                "  GitHub latency       {:.0} ms a request\n",
                self.github_latency_ms
            ));
        }
        out.push_str(&format!(
            "  idle poll interval   {:.1} s\n",
            self.idle_poll_interval_s
        ));
        out.push_str(&format!(
            "  concurrent polls     {} at most\n",
            self.max_concurrent_polls
        ));
        out.push_str(&format!("  ticks                {}\n", self.ticks));
        let ms = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| format!("{v} ms"));
        out.push_str(&format!(
            "  tick wall time       p50 {}, p99 {}, max {} (first tick {})\n",
            ms(self.tick_wall_ms_p50),
            ms(self.tick_wall_ms_p99),
            ms(self.tick_wall_ms_max),
            ms(self.tick_wall_ms_first)
        ));
        out.push_str(&format!("  jobs queued          {}\n", self.jobs_queued));
        out.push_str(&format!("  jobs served          {}\n", self.jobs_served));
        out.push_str(&format!("  dispatches           {}\n", self.dispatches));
        out.push_str(&format!("  purges               {}\n", self.purges));
        out.push_str(&format!(
            "  daemon warnings      {} (WARN/ERROR lines)\n",
            self.daemon_warnings
        ));
        for line in &self.daemon_first_warnings {
            out.push_str(&format!("    {line}\n"));
        }
        out.push_str(&format!(
            "  cpu                  {:.3} s (user {:.3} s, system {:.3} s)\n",
            self.cpu_s, self.user_cpu_s, self.system_cpu_s
        ));
        out.push_str(&format!(
            "  peak RSS             {:.1} MiB\n",
            self.peak_rss_mib
        ));
        if self.scenario == ProcessScenario::Fleet500.as_str() {
            let met = |yes: bool| if yes { "met" } else { "NOT met" };
            out.push_str(&format!(
                "  issue 9 asks         peak RSS under {FLEET_RSS_TARGET_MIB} MiB ({}), p99 tick under {} ms ({})\n",
                met(self.peak_rss_mib < FLEET_RSS_TARGET_MIB as f64),
                FLEET_TICK_P99_TARGET_MS,
                met(self
                    .tick_wall_ms_p99
                    .is_some_and(|p99| p99 < FLEET_TICK_P99_TARGET_MS))
            ));
        }
        let problems = self.problems();
        if !problems.is_empty() {
            for problem in problems {
                out.push_str(&format!("  FAILED               {problem}\n"));
            }
            out.push_str("  the daemon's last log lines:\n");
            for line in &self.daemon_log_tail {
                out.push_str(&format!("    {line}\n"));
            }
        }
        out
    }
}

/// About twenty ticks in the window, between half a second (so a few-second window still
/// sees dispatches and purges) and five seconds, in whole tenths.
pub fn poll_interval_for(window: Duration) -> Duration {
    let millis = (window / 20).as_millis().clamp(500, 5_000) as u64;
    Duration::from_millis(millis / 100 * 100)
}

/// The world's movement, its timings scaled to the poll interval. The demo's runners boot
/// within a third of a tick and run jobs of half a tick to two ticks. The fleet's run jobs
/// of one to four ticks (15 s to a minute at its poll) on a cluster big enough for its busy
/// repos, and its world moves less often: the twins share the machine with the daemon.
fn world_options(
    scenario: ProcessScenario,
    seed: u64,
    poll_interval: Duration,
    window: Duration,
) -> WorldOptions {
    let poll = poll_interval.as_millis() as u64;
    let demo = WorldOptions {
        seed,
        poll_interval,
        step: Duration::from_millis(50),
        cluster_slots: 6,
        boot_ms: (poll / 10, poll / 3),
        job_ms: (poll / 2, poll * 2),
        runner_idle_timeout: poll_interval * 4,
        deadline: window,
    };
    match scenario {
        ProcessScenario::Demo => demo,
        ProcessScenario::Fleet500 => WorldOptions {
            step: Duration::from_millis(100),
            cluster_slots: 40,
            job_ms: (poll, poll * 4),
            ..demo
        },
    }
}

/// Where and when the world queues jobs.
enum Arrivals {
    /// The demo's mix of repos and label sets, a job about every three quarters of a tick:
    /// below what the document's caps let the daemon serve, so the queue stays steady rather
    /// than growing without end.
    Demo(Vec<(&'static str, Vec<&'static str>)>),
    /// A job about every third of a tick, most in the hot repos (about one a minute each at
    /// a 15 s poll, under their cap of two in flight), the rest in any repo of the fleet:
    /// most repos see no job in the window, some one now and then.
    Fleet { hot: Vec<String>, repos: usize },
}

/// The label set of every fleet job: one bucket per repo.
const FLEET_LABELS: &[&str] = &["self-hosted"];

impl Arrivals {
    fn new(scenario: ProcessScenario, rng: &mut StdRng) -> Arrivals {
        match scenario {
            ProcessScenario::Demo => Arrivals::Demo(burst()),
            ProcessScenario::Fleet500 => {
                let mut hot: Vec<usize> = Vec::new();
                while hot.len() < FLEET_HOT_REPOS {
                    let i = rng.random_range(0..FLEET_REPOS);
                    if !hot.contains(&i) {
                        hot.push(i);
                    }
                }
                Arrivals::Fleet {
                    hot: hot.into_iter().map(fleet_repo).collect(),
                    repos: FLEET_REPOS,
                }
            }
        }
    }

    /// The job queued before the daemon starts, so that its first tick has work.
    fn first(&self) -> (String, Vec<&'static str>) {
        match self {
            Arrivals::Demo(mix) => (mix[0].0.to_string(), mix[0].1.clone()),
            Arrivals::Fleet { hot, .. } => (hot[0].clone(), FLEET_LABELS.to_vec()),
        }
    }

    fn pick(&self, rng: &mut StdRng) -> (String, Vec<&'static str>) {
        match self {
            Arrivals::Demo(mix) => {
                let (repo, labels) = &mix[rng.random_range(0..mix.len())];
                (repo.to_string(), labels.clone())
            }
            Arrivals::Fleet { hot, repos } => {
                let repo = if rng.random_bool(FLEET_HOT_SHARE) {
                    hot[rng.random_range(0..hot.len())].clone()
                } else {
                    fleet_repo(rng.random_range(0..*repos))
                };
                (repo, FLEET_LABELS.to_vec())
            }
        }
    }

    fn gap(&self, rng: &mut StdRng, poll_interval: Duration) -> Duration {
        let mean = match self {
            Arrivals::Demo(_) => 0.75,
            Arrivals::Fleet { .. } => 1.0 / 3.0,
        };
        poll_interval.mul_f64(mean * rng.random_range(0.5..1.5))
    }
}

/// Starts the twins and sets the scenario's world up on them; returns the document.
async fn provision(scenario: ProcessScenario) -> Result<(SimTwins, Config, usize), String> {
    let twins = SimTwins::start().await?;
    let document = match scenario {
        ProcessScenario::Demo => twins.provision(),
        ProcessScenario::Fleet500 => twins.provision_fleet(FLEET_REPOS),
    };
    let config = parse_document(document.as_bytes(), &ConfigDefaults::default())
        .map_err(|errors| format!("the {} document is invalid: {errors:?}", scenario.as_str()))?;
    let repos = config.repos.len();
    Ok((twins, config, repos))
}

/// Runs the bench: `daemon_exe run` as a child process against the scenario's twins for
/// `options.window`. An error is a failure to set the run up; a daemon that failed is a
/// report whose [`ProcessBenchReport::ok`] is false.
pub async fn run_process_bench(
    daemon_exe: &Path,
    options: &ProcessBenchOptions,
) -> Result<ProcessBenchReport, String> {
    if options.window.is_zero() {
        return Err("the window must be longer than zero".into());
    }
    let scenario = options.scenario;
    let poll_interval = scenario.poll_interval(options.window);
    let idle_poll_interval = idle_poll_interval(poll_interval);
    let world_options = world_options(scenario, options.seed, poll_interval, options.window);
    let (twins, config, repos) = provision(scenario).await?;
    twins.github.set_latency(options.github_latency);
    let key_file = AppKeyFile::write(SIM_CREDENTIALS.github_app_private_key_pem)?;

    let mut rng = StdRng::seed_from_u64(options.seed);
    let arrivals = Arrivals::new(scenario, &mut rng);
    let mut world = World::new(&twins, config, world_options.clone());
    let (repo, labels) = arrivals.first();
    world.queue_job(&repo, &labels)?;

    let mut command = Command::new(daemon_exe);
    command
        .arg("run")
        // Nothing of this shell's environment (a VAULT_NAMESPACE, an HTTPS_PROXY) reaches the
        // daemon: only what a deployment would set.
        .env_clear()
        .envs(twins.addresses.daemon_env(&SIM_CREDENTIALS, &key_file.0))
        .env(
            "RUNNER_SCALER_POLL_INTERVAL",
            humantime::format_duration(poll_interval).to_string(),
        )
        .env(
            "RUNNER_SCALER_IDLE_POLL_INTERVAL",
            humantime::format_duration(idle_poll_interval).to_string(),
        )
        .env(
            "RUNNER_SCALER_MAX_CONCURRENT_POLLS",
            MAX_CONCURRENT_POLLS.to_string(),
        )
        .env("RUST_LOG", DAEMON_LOG_FILTER)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|e| format!("start `{} run`: {e}", daemon_exe.display()))?;
    let stderr = child.stderr.take().expect("the daemon's stderr is piped");
    let (daemon, mut exited) = RunningDaemon::watch(child.id());
    // `wait4` reaps the child; std's handle must not wait for it too.
    drop(child);
    let log = std::thread::spawn(move || read_daemon_log(stderr));

    let window_end = started + options.window;
    let mut next_job = started + arrivals.gap(&mut rng, poll_interval);
    let mut setup_error = None;
    let mut early = None;
    while setup_error.is_none() {
        tokio::select! {
            reaped = &mut exited => {
                early = Some(reaped);
                break;
            }
            _ = tokio::time::sleep(world_options.step) => {}
        }
        let now = Instant::now();
        if now >= window_end {
            break;
        }
        while now >= next_job {
            let (repo, labels) = arrivals.pick(&mut rng);
            if let Err(e) = world.queue_job(&repo, &labels) {
                setup_error = Some(e);
                break;
            }
            next_job += arrivals.gap(&mut rng, poll_interval);
        }
        world.step();
    }

    let stopped_early = early.is_some();
    let reaped = match early {
        Some(reaped) => reaped,
        None => {
            daemon.signal(libc::SIGTERM);
            let stop_asked = Instant::now();
            let mut killed = false;
            // The world keeps moving while the daemon finishes its tick.
            loop {
                tokio::select! {
                    reaped = &mut exited => break reaped,
                    _ = tokio::time::sleep(world_options.step) => {}
                }
                world.step();
                if !killed && stop_asked.elapsed() > STOP_GRACE {
                    daemon.signal(libc::SIGKILL);
                    killed = true;
                }
            }
        }
    };
    world.step();
    let summary = world.finish();
    let log = log
        .join()
        .unwrap_or_else(|_| DaemonLog::unreadable("the log reader panicked"));
    if let Some(e) = setup_error {
        return Err(e);
    }
    let reaped = reaped
        .map_err(|_| "the daemon's reaper thread ended without a status".to_string())?
        .map_err(|e| format!("wait for the daemon (pid {}): {e}", daemon.pid))?;

    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let user_cpu_s = seconds(reaped.usage.ru_utime);
    let system_cpu_s = seconds(reaped.usage.ru_stime);
    let status = reaped.status;
    let tick_ms = |percentile: f64| nearest_rank(&log.tick_ms, percentile);
    Ok(ProcessBenchReport {
        version: env!("CARGO_PKG_VERSION"),
        scenario: scenario.as_str(),
        repos,
        window_s: options.window.as_secs_f64(),
        poll_interval_s: poll_interval.as_secs_f64(),
        github_latency_ms: options.github_latency.as_secs_f64() * 1e3,
        idle_poll_interval_s: idle_poll_interval.as_secs_f64(),
        max_concurrent_polls: MAX_CONCURRENT_POLLS,
        cpu_s: user_cpu_s + system_cpu_s,
        user_cpu_s,
        system_cpu_s,
        peak_rss_mib: reaped.usage.ru_maxrss as f64 * MAXRSS_UNIT_BYTES / (1024.0 * 1024.0),
        ticks: log.ticks,
        tick_wall_ms_p50: tick_ms(0.50),
        tick_wall_ms_p99: tick_ms(0.99),
        tick_wall_ms_max: log.tick_ms.iter().copied().max(),
        tick_wall_ms_first: log.tick_ms.first().copied(),
        dispatches: summary.dispatches,
        purges: summary.purges,
        jobs_queued: summary.jobs_total,
        jobs_served: summary.jobs_served,
        daemon_warnings: log.warnings,
        daemon_first_warnings: log.first_warnings,
        daemon_exit_code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        daemon_signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        daemon_stopped_early: stopped_early,
        daemon_log_tail: log.tail.into(),
    })
}

/// What `wait4` returned for the daemon.
struct Reaped {
    status: libc::c_int,
    usage: libc::rusage,
}

/// The daemon's process, reaped by a thread of its own. Dropped before it is reaped (an
/// error or a panic on the way), it kills the daemon rather than leave it running.
struct RunningDaemon {
    pid: libc::pid_t,
    reaped: Arc<AtomicBool>,
}

impl RunningDaemon {
    /// Starts the reaper; the receiver gets what `wait4` returned once the daemon exits.
    fn watch(
        pid: u32,
    ) -> (
        RunningDaemon,
        tokio::sync::oneshot::Receiver<std::io::Result<Reaped>>,
    ) {
        let pid = pid as libc::pid_t;
        let reaped = Arc::new(AtomicBool::new(false));
        let (tx, exited) = tokio::sync::oneshot::channel();
        std::thread::spawn({
            let reaped = reaped.clone();
            move || {
                let result = wait_for_exit(pid);
                reaped.store(true, Ordering::SeqCst);
                let _ = tx.send(result);
            }
        });
        (RunningDaemon { pid, reaped }, exited)
    }

    fn signal(&self, signal: libc::c_int) {
        if !self.reaped.load(Ordering::SeqCst) {
            // SAFETY: kill has no memory effects; the pid is our unreaped child, so it
            // cannot name another process.
            unsafe {
                libc::kill(self.pid, signal);
            }
        }
    }
}

impl Drop for RunningDaemon {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}

/// Blocks until the child `pid` exits, and returns its status and resource usage.
fn wait_for_exit(pid: libc::pid_t) -> std::io::Result<Reaped> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain integers, for which all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: both pointers are to live locals of the right types.
        let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if waited == pid {
            return Ok(Reaped { status, usage });
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// What the daemon's log showed.
struct DaemonLog {
    ticks: usize,
    /// Each tick's wall time, in the order logged.
    tick_ms: Vec<u64>,
    warnings: usize,
    first_warnings: Vec<String>,
    tail: VecDeque<String>,
}

impl DaemonLog {
    fn unreadable(why: &str) -> DaemonLog {
        DaemonLog {
            ticks: 0,
            tick_ms: Vec::new(),
            warnings: 0,
            first_warnings: Vec::new(),
            tail: VecDeque::from([format!("(log unreadable: {why})")]),
        }
    }
}

/// Reads the daemon's stderr to its end, counting ticks and warnings.
fn read_daemon_log(stderr: impl Read) -> DaemonLog {
    let mut log = DaemonLog {
        ticks: 0,
        tick_ms: Vec::new(),
        warnings: 0,
        first_warnings: Vec::new(),
        tail: VecDeque::new(),
    };
    let mut reader = BufReader::new(stderr);
    let mut bytes = Vec::new();
    loop {
        bytes.clear();
        match reader.read_until(b'\n', &mut bytes) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                log.tail.push_back(format!("(log unreadable: {e})"));
                break;
            }
        }
        let line = String::from_utf8_lossy(&bytes).trim_end().to_string();
        if line.contains("poll complete") {
            log.ticks += 1;
        }
        if let Some(ms) = tick_ms_of(&line) {
            log.tick_ms.push(ms);
        }
        if line.contains(" WARN ") || line.contains(" ERROR ") {
            log.warnings += 1;
            if log.first_warnings.len() < FIRST_WARNINGS_KEPT {
                log.first_warnings.push(line.clone());
            }
        }
        if log.tail.len() == LOG_TAIL_LINES {
            log.tail.pop_front();
        }
        log.tail.push_back(line);
    }
    log
}

/// The `tick_ms=N` field of a log line in the daemon's text format, if it has one.
fn tick_ms_of(line: &str) -> Option<u64> {
    let (_, rest) = line.split_once(TICK_MS_FIELD)?;
    let digits = rest.split(|c: char| !c.is_ascii_digit()).next()?;
    digits.parse().ok()
}

/// The nearest-rank `percentile` (0 to 1) of `values`: the smallest value that at least
/// that share of them do not exceed. `None` for no values.
fn nearest_rank(values: &[u64], percentile: f64) -> Option<u64> {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = (percentile * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied()
}

/// The GitHub App's key, in a file only this user can read, removed on drop: the daemon
/// takes the key from `GITHUB_APP_PRIVATE_KEY_FILE`, as a deployment gives it.
struct AppKeyFile(PathBuf);

impl AppKeyFile {
    fn write(pem: &str) -> Result<AppKeyFile, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "runner-scaler-bench-{}-{nanos}-app-key.pem",
            std::process::id()
        ));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("create the App key file {}: {e}", path.display()))?;
        let key_file = AppKeyFile(path);
        file.write_all(pem.as_bytes())
            .map_err(|e| format!("write the App key file {}: {e}", key_file.0.display()))?;
        Ok(key_file)
    }
}

impl Drop for AppKeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_poll_interval_gives_about_twenty_ticks_within_half_a_second_and_five() {
        assert_eq!(
            poll_interval_for(Duration::from_secs(60)),
            Duration::from_secs(3)
        );
        assert_eq!(
            poll_interval_for(Duration::from_secs(4)),
            Duration::from_millis(500)
        );
        assert_eq!(
            poll_interval_for(Duration::from_secs(3600)),
            Duration::from_secs(5)
        );
        assert_eq!(
            poll_interval_for(Duration::from_secs(45)),
            Duration::from_millis(2200)
        );
    }

    #[test]
    fn the_log_counts_ticks_and_warnings_and_keeps_its_tail() {
        let mut text = String::new();
        for i in 0..30 {
            text.push_str(&format!(
                "2025-01-01T00:00:{i:02}Z  INFO runner_scaler::report: poll complete queued=1 active=0 started=1\n"
            ));
        }
        text.push_str("2025-01-01T00:00:31Z  WARN runner_scaler::act: dispatch ci-runner: 500\n");
        text.push_str("not utf-8 \u{fffd}\n");
        let log = read_daemon_log(text.as_bytes());
        assert_eq!(log.ticks, 30);
        assert_eq!(log.warnings, 1);
        assert_eq!(log.first_warnings.len(), 1);
        assert!(log.first_warnings[0].contains("dispatch ci-runner: 500"));
        assert_eq!(log.tail.len(), LOG_TAIL_LINES);
        assert!(log.tail.back().unwrap().starts_with("not utf-8"));
    }

    fn report() -> ProcessBenchReport {
        ProcessBenchReport {
            version: "0",
            scenario: "demo",
            repos: 3,
            window_s: 4.0,
            poll_interval_s: 0.5,
            github_latency_ms: 0.0,
            idle_poll_interval_s: 2.0,
            max_concurrent_polls: 8,
            cpu_s: 0.1,
            user_cpu_s: 0.08,
            system_cpu_s: 0.02,
            peak_rss_mib: 20.0,
            ticks: 7,
            tick_wall_ms_p50: Some(4),
            tick_wall_ms_p99: Some(30),
            tick_wall_ms_max: Some(30),
            tick_wall_ms_first: Some(30),
            dispatches: 3,
            purges: 2,
            jobs_queued: 6,
            jobs_served: 3,
            daemon_warnings: 0,
            daemon_first_warnings: Vec::new(),
            daemon_exit_code: Some(0),
            daemon_signal: None,
            daemon_stopped_early: false,
            daemon_log_tail: vec!["last line".into()],
        }
    }

    #[test]
    fn a_run_counts_only_if_the_daemon_lasted_exited_cleanly_and_dispatched() {
        assert!(report().ok(), "{}", report().render_text());
        let idle = ProcessBenchReport {
            dispatches: 0,
            ..report()
        };
        assert!(!idle.ok());
        assert!(idle.render_text().contains("dispatched nothing"));
        assert!(idle.render_text().contains("last line"));
        let early = ProcessBenchReport {
            daemon_stopped_early: true,
            daemon_exit_code: Some(64),
            ..report()
        };
        assert_eq!(early.problems().len(), 2, "{:?}", early.problems());
        let killed = ProcessBenchReport {
            daemon_exit_code: None,
            daemon_signal: Some(9),
            ..report()
        };
        assert!(killed.render_text().contains("signal 9"));
        let untimed = ProcessBenchReport {
            tick_wall_ms_p50: None,
            tick_wall_ms_p99: None,
            tick_wall_ms_max: None,
            tick_wall_ms_first: None,
            ..report()
        };
        assert!(!untimed.ok());
        assert!(untimed.render_text().contains("no tick's length"));
        assert!(!report().render_text().contains("issue 9"));
        let fleet = ProcessBenchReport {
            scenario: "fleet-500",
            repos: 500,
            peak_rss_mib: 27.0,
            tick_wall_ms_p99: Some(2_000),
            ..report()
        };
        assert!(
            fleet
                .render_text()
                .contains("under 64 MiB (met), p99 tick under 2000 ms (NOT met)"),
            "{}",
            fleet.render_text()
        );
    }

    #[test]
    fn tick_wall_times_are_read_from_the_daemons_tick_recorded_lines() {
        let text = "\
2025-01-01T00:00:01Z  INFO runner_scaler::report: poll complete queued=0 active=0 started=0
2025-01-01T00:00:01Z DEBUG runner_scaler::report::record: tick recorded tick_ms=1834
2025-01-01T00:00:16Z  INFO runner_scaler::report: poll complete queued=1 active=0 started=1
2025-01-01T00:00:16Z DEBUG runner_scaler::report::record: tick recorded tick_ms=12
2025-01-01T00:00:31Z DEBUG runner_scaler::report::record: tick recorded tick_ms=
2025-01-01T00:00:31Z DEBUG runner_scaler::report::record: tick recorded tick_ms=7 more=1
";
        let log = read_daemon_log(text.as_bytes());
        assert_eq!(log.ticks, 2);
        assert_eq!(log.tick_ms, vec![1834, 12, 7]);
    }

    #[test]
    fn the_percentiles_are_nearest_rank() {
        let hundred: Vec<u64> = (1..=100).rev().collect();
        assert_eq!(nearest_rank(&hundred, 0.50), Some(50));
        assert_eq!(nearest_rank(&hundred, 0.99), Some(99));
        assert_eq!(nearest_rank(&[5, 1, 3], 0.50), Some(3));
        // Fewer than a hundred ticks: the p99 is the slowest.
        assert_eq!(nearest_rank(&[5, 1, 3], 0.99), Some(5));
        assert_eq!(nearest_rank(&[], 0.99), None);
    }

    #[test]
    fn the_fleet_polls_every_15_s_unless_its_window_is_too_short() {
        let fleet = ProcessScenario::Fleet500;
        assert_eq!(fleet.default_window(), Duration::from_secs(300));
        assert_eq!(
            fleet.poll_interval(fleet.default_window()),
            Duration::from_secs(15)
        );
        assert_eq!(
            fleet.poll_interval(Duration::from_secs(5)),
            Duration::from_millis(500)
        );
        assert_eq!(
            idle_poll_interval(Duration::from_secs(15)),
            Duration::from_secs(60)
        );
        assert_eq!(ProcessScenario::parse("fleet-500"), Some(fleet));
        assert_eq!(ProcessScenario::parse("idle"), None);
        assert_eq!(
            ProcessScenario::Demo.poll_interval(Duration::from_secs(60)),
            Duration::from_secs(3)
        );
    }
}
