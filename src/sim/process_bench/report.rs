//! What one run of the process bench measured, when it counts (the daemon lasted the window,
//! exited cleanly on SIGTERM, dispatched and logged its ticks' lengths), and the text
//! `simulate --bench-process` prints of it.

use serde::Serialize;

use super::ProcessScenario;
use super::daemon_log::TICK_MS_FIELD;

/// What issue 9 asks of the daemon at 500 repos: peak RSS and p99 tick wall time.
const FLEET_RSS_TARGET_MIB: u32 = 64;
const FLEET_TICK_P99_TARGET_MS: u64 = 2_000;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
