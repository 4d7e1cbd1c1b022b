//! `simulate --bench-process`: the daemon's own CPU time and peak RSS.
//!
//! The demo world measures behaviour with the daemon in-process, where its cost cannot be
//! told apart from the twins' and the world's. Here the daemon is `runner-scaler run` in its
//! own process, configured through its environment exactly as a deployment configures it,
//! against the twins on loopback, while the world keeps queuing jobs at a steady pace and its
//! runners take and finish them. After a fixed real-time window the daemon gets SIGTERM, and
//! `wait4` reports what the kernel accounted to it.
//!
//! # Layout
//!
//! This file holds the scenarios, the options and the run itself ([`run_process_bench`]).
//! `workload`: the world the daemon runs against; `daemon_process`: the daemon's process
//! and how it is reaped; `daemon_log`: what its log says; `report`: what a run measured.

mod daemon_log;
mod daemon_process;
mod report;
mod workload;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::sim::world::{SIM_CREDENTIALS, World};
use daemon_log::{DaemonLog, nearest_rank, read_daemon_log};
use daemon_process::{AppKeyFile, RunningDaemon};
pub use report::ProcessBenchReport;
use workload::{Arrivals, provision, world_options};

/// How long the daemon may take to finish its tick and exit after SIGTERM before it is
/// killed (and the run reported as failed).
const STOP_GRACE: Duration = Duration::from_secs(30);
/// `ru_maxrss` is in KiB on Linux and the BSDs, in bytes on macOS.
#[cfg(target_os = "macos")]
const MAXRSS_UNIT_BYTES: f64 = 1.0;
#[cfg(not(target_os = "macos"))]
const MAXRSS_UNIT_BYTES: f64 = 1024.0;

/// Repos of the `fleet-500` world.
pub const FLEET_REPOS: usize = 500;
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
/// The daemon's default log filter plus the per-tick line that gives the tick's length.
const DAEMON_LOG_FILTER: &str =
    "info,consulrs=off,rustify=off,vaultrs=off,runner_scaler::report::record=debug";

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

/// About twenty ticks in the window, between half a second (so a few-second window still
/// sees dispatches and purges) and five seconds, in whole tenths.
pub fn poll_interval_for(window: Duration) -> Duration {
    let millis = (window / 20).as_millis().clamp(500, 5_000) as u64;
    Duration::from_millis(millis / 100 * 100)
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
