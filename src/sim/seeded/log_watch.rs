//! The log sink of one seed: everything the daemon logs during a run passes through it, so
//! that a registration token in any log line is caught (invariant I5) and the lines counted,
//! without the report itself repeating the token.

use std::io;
use std::sync::{Arc, Mutex};

use super::ports::CANARY;

/// The log sink of one seed: counts lines and remembers the first that carries a token
/// (with the token masked, so the report itself leaks nothing). The fmt layer writes each
/// event in one call, so a token is never split across writes.
#[derive(Clone, Default)]
pub(super) struct LogWatch(Arc<Mutex<LogState>>);

#[derive(Default)]
struct LogState {
    lines: u64,
    leak: Option<String>,
    /// Lines at these levels are also written to stderr (`RUNNER_SCALER_SIM_LOG`, e.g.
    /// `warn` or `info`: what a replay's daemon said), tokens masked.
    echo: Vec<&'static str>,
}

impl LogWatch {
    /// A sink that also echoes the daemon's lines at the level `RUNNER_SCALER_SIM_LOG` names
    /// and above to stderr.
    pub(super) fn from_env() -> LogWatch {
        let levels = ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"];
        let echo = std::env::var("RUNNER_SCALER_SIM_LOG")
            .ok()
            .and_then(|level| {
                let level = level.to_ascii_uppercase();
                levels.iter().position(|l| *l == level)
            })
            .map(|upto| levels[..=upto].to_vec())
            .unwrap_or_default();
        let watch = LogWatch::default();
        watch.state().echo = echo;
        watch
    }

    fn state(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn leak(&self) -> Option<String> {
        self.state().leak.clone()
    }

    pub(super) fn lines(&self) -> u64 {
        self.state().lines
    }
}

impl io::Write for LogWatch {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let mut state = self.state();
        state.lines += text.matches('\n').count() as u64;
        if state.leak.is_none() && text.contains(CANARY) {
            state.leak = Some(text.replace(CANARY, "<TOKEN>").trim_end().to_string());
        }
        if state
            .echo
            .iter()
            .any(|level| text.contains(&format!(" {level} ")))
        {
            eprint!("{}", text.replace(CANARY, "<TOKEN>"));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_in_a_log_line_is_caught_and_masked_in_the_report() {
        let logs = LogWatch::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer({
                let logs = logs.clone();
                move || logs.clone()
            })
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::trace!("nothing secret here");
            assert_eq!(logs.leak(), None);
            tracing::debug!(token = %format!("{CANARY}000001"), "minted");
        });
        let leak = logs.leak().expect("the token was seen");
        assert!(!leak.contains(CANARY), "{leak}");
        assert!(leak.contains("<TOKEN>000001"), "{leak}");
        assert_eq!(logs.lines(), 2);
    }
}
