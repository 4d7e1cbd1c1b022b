//! The daemon's stderr as the bench reads it: ticks counted from its `poll complete` lines,
//! each tick's wall time from its `tick recorded tick_ms=` lines (and their nearest-rank
//! percentiles), its WARN and ERROR lines, and the tail shown when a run fails.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};

/// Lines of the daemon's log kept to show when the run fails.
const LOG_TAIL_LINES: usize = 20;
/// WARN and ERROR lines of the daemon kept in the report.
const FIRST_WARNINGS_KEPT: usize = 5;
/// The field of the daemon's `tick recorded` line that gives the tick's wall time.
pub(super) const TICK_MS_FIELD: &str = "tick_ms=";

/// What the daemon's log showed.
pub(super) struct DaemonLog {
    pub(super) ticks: usize,
    /// Each tick's wall time, in the order logged.
    pub(super) tick_ms: Vec<u64>,
    pub(super) warnings: usize,
    pub(super) first_warnings: Vec<String>,
    pub(super) tail: VecDeque<String>,
}

impl DaemonLog {
    pub(super) fn unreadable(why: &str) -> DaemonLog {
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
pub(super) fn read_daemon_log(stderr: impl Read) -> DaemonLog {
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
pub(super) fn nearest_rank(values: &[u64], percentile: f64) -> Option<u64> {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = (percentile * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
