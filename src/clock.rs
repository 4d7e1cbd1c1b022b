//! The one place that reads a clock. Everything else takes `now` as an input, so that the
//! planner is pure and the simulated world can run on its own time.

use chrono::{DateTime, Utc};

pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
}

/// Wall-clock time.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// `now + delay`, saturating at the end of time: a delay chosen by a setting or a service
/// must not panic a tick.
pub fn after(now: DateTime<Utc>, delay: std::time::Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(delay)
        .ok()
        .and_then(|delay| now.checked_add_signed(delay))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_past_the_end_of_time_saturates_instead_of_panicking() {
        let now = Utc::now();
        assert_eq!(
            after(now, std::time::Duration::from_secs(30)),
            now + chrono::Duration::seconds(30)
        );
        assert_eq!(
            after(now, std::time::Duration::MAX),
            DateTime::<Utc>::MAX_UTC
        );
    }
}
