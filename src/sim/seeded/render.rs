//! What `simulate` prints as text: a sweep's summary (failures with their replay commands,
//! totals) and one seed's replay (the trace's tail, every invariant's verdict, the I6 bound
//! and the trace hash). Only formatting: the runs themselves are in `run.rs` and
//! `sweep.rs`.

use super::sweep::SweepReport;
use super::{Scenario, SeedOutcome};

impl SweepReport {
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "scenario {}: seeds {}..={} ({} seeds on {} threads)\n",
            self.scenario, self.first_seed, self.last_seed, self.seeds, self.threads
        );
        for failure in &self.failures {
            if let Some(line) = failure.failure_line() {
                out.push_str(&format!("FAIL {line}\n"));
            }
        }
        if self.scenario == Scenario::Mixed {
            let picks: Vec<String> = self
                .picked
                .iter()
                .map(|(s, n)| format!("{s} {n}"))
                .collect();
            out.push_str(&format!("  picked: {}\n", picks.join(", ")));
        }
        let c = &self.totals;
        out.push_str(&format!(
            "  passed {} of {}; {} failed\n  jobs {}, dispatches {}, failed starts {}, cancelled {}, cross-bucket takes {}, idle exits {}, purges {}\n  {} ticks over {} simulated hours\n",
            self.passed,
            self.seeds,
            self.failures.len(),
            c.jobs,
            c.dispatches,
            c.failed_starts,
            c.jobs_cancelled,
            c.cross_bucket_takes,
            c.idle_exits,
            c.purges,
            self.ticks,
            self.simulated_s / 3600
        ));
        out.push_str(&format!(
            "  take-backs {}: jobs killed by a delete inside the window no signal closes {} ({} per 1,000 take-backs), outside it {}\n",
            c.deregistrations,
            c.kills_in_window,
            per_thousand(c.kills_in_window, c.deregistrations),
            c.kills_outside_window,
        ));
        for pending in self.pending {
            out.push_str(&format!("  {pending}\n"));
        }
        out.push_str(&format!(
            "  wall time {:.1} s\n",
            self.wall_ms as f64 / 1000.0
        ));
        out
    }
}

/// Events of the trace a replay shows (the last ones: where a violation happened).
pub const REPLAY_EVENTS_SHOWN: usize = 400;

/// What `simulate --seed S` prints: the trace's tail, every invariant's result, the I6 bound
/// and the trace hash.
pub fn render_replay(outcome: &SeedOutcome) -> String {
    let mut out = format!(
        "scenario {} (options drawn as {}), seed {}: {} simulated s, {} ticks, {} trace events\n",
        outcome.scenario,
        outcome.picked,
        outcome.seed,
        outcome.simulated_s,
        outcome.ticks,
        outcome.trace_events
    );
    // Ticks of an empty world say nothing; they stay in the hash, not on the screen.
    let telling: Vec<&String> = outcome
        .trace
        .iter()
        .filter(|e| !e.contains("tick queued=0 active=0 started=0 gaps=0 "))
        .collect();
    let skipped = telling.len().saturating_sub(REPLAY_EVENTS_SHOWN);
    if skipped > 0 {
        out.push_str(&format!("  ... {skipped} earlier events\n"));
    }
    for event in &telling[skipped..] {
        out.push_str(&format!("  {event}\n"));
    }
    let c = &outcome.counts;
    out.push_str(&format!(
        "counts: jobs {}, completed {}, cancelled {}, dispatches {} (+{} deduplicated), failed starts {}, cross-bucket takes {}, idle exits {}, purges {}, faults injected {}, log lines {}\n",
        c.jobs,
        c.jobs_completed,
        c.jobs_cancelled,
        c.dispatches,
        c.dispatches_deduplicated,
        c.failed_starts,
        c.cross_bucket_takes,
        c.idle_exits,
        c.purges,
        outcome.faults_injected,
        outcome.log_lines
    ));
    out.push_str(&format!(
        "take-backs {}: jobs killed by a delete inside the window {}, outside it {}\n",
        c.deregistrations, c.kills_in_window, c.kills_outside_window
    ));
    let failed = outcome.violation.as_ref().map(|v| v.invariant);
    for invariant in ["I1", "I2", "I3", "I4", "I5", "I6", "I7", "config"] {
        let verdict = match failed {
            Some(f) if f == invariant => "VIOLATED",
            // Checks stop at the first violation; I6 is judged only at the end.
            Some(_) => "not reached",
            None => "held",
        };
        out.push_str(&format!("  {invariant}: {verdict}\n"));
    }
    for pending in outcome.pending {
        out.push_str(&format!("  {pending}\n"));
    }
    match &outcome.convergence {
        Some(b) => out.push_str(&format!(
            "I6 bound: converge by t={}s = faults and arrivals off at t={}s + backoff {}s + {} rounds at the binding cap ({}s) + {} rounds x {}s (poll, lag, placement, boot, longer of a job and a surplus runner's hold) + two polls of {}s\n",
            b.bound_s,
            b.from_s,
            b.backoff_s,
            b.waves,
            b.binding_s,
            b.extra_waves,
            b.wave_s,
            outcome.poll_interval_s
        )),
        None => out.push_str("I6 bound: not reached\n"),
    }
    if let Some(line) = outcome.failure_line() {
        out.push_str(&format!("FAIL {line}\n"));
    }
    out.push_str(&format!("trace hash {}\n", outcome.trace_hash));
    out
}

/// `part` per 1,000 of `whole`, to one decimal.
pub fn per_thousand(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0.0".into();
    }
    format!("{:.1}", part as f64 * 1000.0 / whole as f64)
}
