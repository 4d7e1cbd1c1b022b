//! Rate-limit budgets. GitHub's primary limit belongs to the installation (app mode) or to the
//! token's user (vault mode), not to one token (BRIEF lesson 10): every repo of an
//! installation spends the same budget, so when it runs out the loop skips all of them until
//! it resets instead of spending requests on refusals.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use super::transport::RateHeaders;
use crate::model::RATE_LIMIT_WAIT_MAX_S;

/// `now` plus a wait of `wait_s` seconds, clamped to [`RATE_LIMIT_WAIT_MAX_S`]; never panics.
pub fn wait_until(now: DateTime<Utc>, wait_s: u64) -> DateTime<Utc> {
    crate::clock::after(
        now,
        std::time::Duration::from_secs(wait_s.min(RATE_LIMIT_WAIT_MAX_S)),
    )
}

/// `at`, or the end of the longest wait a service may impose if `at` is later.
fn no_later_than_the_longest_wait(at: DateTime<Utc>, now: DateTime<Utc>) -> DateTime<Utc> {
    at.min(wait_until(now, RATE_LIMIT_WAIT_MAX_S))
}

/// Who a request's primary rate limit is charged to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BudgetHolder {
    /// Requests signed with the App's JWT (installation lookups, token minting).
    App,
    /// Requests with an installation token of this installation.
    Installation(u64),
    /// Requests with the polling token read from this Vault path. The budget really belongs
    /// to the token's user, whom the daemon does not know; one path is one token.
    PollingToken { vault_path: String },
}

impl fmt::Display for BudgetHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetHolder::App => f.write_str("the GitHub App"),
            BudgetHolder::Installation(id) => write!(f, "installation {id}"),
            BudgetHolder::PollingToken { vault_path } => {
                write!(f, "the polling token at {vault_path}")
            }
        }
    }
}

impl BudgetHolder {
    /// The `owner` label of the rate-limit metric: which budget, never a credential.
    pub fn metric_label(&self) -> String {
        match self {
            BudgetHolder::App => "app".into(),
            BudgetHolder::Installation(id) => format!("installation-{id}"),
            BudgetHolder::PollingToken { vault_path } => format!("polling-token:{vault_path}"),
        }
    }
}

/// The last word GitHub gave on one budget.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    pub limit: Option<u64>,
    pub remaining: Option<u64>,
    /// When the primary window resets (`x-ratelimit-reset`).
    pub reset_at: Option<DateTime<Utc>>,
    /// Set by a rate-limit refusal: no request on this budget before then.
    pub paused_until: Option<DateTime<Utc>>,
}

impl Budget {
    /// The moment before which a request on this budget would only be refused.
    pub fn paused_until(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let exhausted_until = match (self.remaining, self.reset_at) {
            (Some(0), Some(reset)) => Some(reset),
            _ => None,
        };
        [self.paused_until, exhausted_until]
            .into_iter()
            .flatten()
            .filter(|until| *until > now)
            .max()
    }
}

/// Budgets by holder, shared by every call of one client.
#[derive(Debug, Default)]
pub struct RateBudgets {
    budgets: Mutex<BTreeMap<BudgetHolder, Budget>>,
}

impl RateBudgets {
    /// Keeps what GitHub said about `holder`'s budget at `now`. A reset further away than the
    /// longest wait is kept as that wait's end: an exhausted budget is then asked again after
    /// an hour instead of never.
    pub fn record(&self, holder: &BudgetHolder, rate: RateHeaders, now: DateTime<Utc>) {
        let mut budgets = self.budgets.lock().expect("budgets lock");
        let budget = budgets.entry(holder.clone()).or_default();
        budget.limit = rate.limit.or(budget.limit);
        budget.remaining = rate.remaining.or(budget.remaining);
        budget.reset_at = rate
            .reset_at
            .map(|reset| no_later_than_the_longest_wait(reset, now))
            .or(budget.reset_at);
    }

    /// No request on `holder`'s budget before `until` (at most the longest wait from `now`).
    pub fn pause(&self, holder: &BudgetHolder, until: DateTime<Utc>, now: DateTime<Utc>) {
        let until = no_later_than_the_longest_wait(until, now);
        let mut budgets = self.budgets.lock().expect("budgets lock");
        let budget = budgets.entry(holder.clone()).or_default();
        budget.paused_until = Some(budget.paused_until.map_or(until, |p| p.max(until)));
    }

    /// `Some(t)` while `holder`'s budget is exhausted or paused: skip its repos until `t`.
    pub fn paused_until(&self, holder: &BudgetHolder, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let budgets = self.budgets.lock().expect("budgets lock");
        budgets.get(holder)?.paused_until(now)
    }

    /// Every budget seen so far, for status output and metrics.
    pub fn snapshot(&self) -> Vec<(BudgetHolder, Budget)> {
        let budgets = self.budgets.lock().expect("budgets lock");
        budgets
            .iter()
            .map(|(h, b)| (h.clone(), b.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(s, 0).unwrap()
    }

    #[test]
    fn an_exhausted_budget_pauses_until_its_reset_only() {
        let budgets = RateBudgets::default();
        let holder = BudgetHolder::Installation(7);
        budgets.record(
            &holder,
            RateHeaders {
                limit: Some(5000),
                remaining: Some(0),
                reset_at: Some(at(200)),
            },
            at(100),
        );
        assert_eq!(budgets.paused_until(&holder, at(100)), Some(at(200)));
        assert_eq!(budgets.paused_until(&holder, at(200)), None);
        assert_eq!(
            budgets.paused_until(&BudgetHolder::Installation(8), at(100)),
            None
        );
    }

    #[test]
    fn a_refusal_pauses_even_with_requests_left() {
        let budgets = RateBudgets::default();
        let holder = BudgetHolder::App;
        budgets.record(
            &holder,
            RateHeaders {
                limit: Some(5000),
                remaining: Some(4000),
                reset_at: Some(at(3600)),
            },
            at(100),
        );
        budgets.pause(&holder, at(160), at(100));
        assert_eq!(budgets.paused_until(&holder, at(100)), Some(at(160)));
        assert_eq!(budgets.paused_until(&holder, at(161)), None);
    }

    #[test]
    fn a_reset_or_a_pause_beyond_an_hour_is_held_to_an_hour() {
        let budgets = RateBudgets::default();
        let now = at(1_700_000_000);
        let an_hour_later = at(1_700_000_000 + 3600);
        let exhausted = BudgetHolder::Installation(1);
        budgets.record(
            &exhausted,
            RateHeaders {
                limit: Some(5000),
                remaining: Some(0),
                reset_at: Some(DateTime::<Utc>::MAX_UTC),
            },
            now,
        );
        assert_eq!(budgets.paused_until(&exhausted, now), Some(an_hour_later));
        assert_eq!(budgets.paused_until(&exhausted, an_hour_later), None);

        let refused = BudgetHolder::App;
        budgets.pause(&refused, DateTime::<Utc>::MAX_UTC, now);
        assert_eq!(budgets.paused_until(&refused, now), Some(an_hour_later));
    }

    #[test]
    fn waits_are_clamped_without_overflow() {
        let now = at(1_700_000_000);
        assert_eq!(wait_until(now, 30), at(1_700_000_030));
        assert_eq!(wait_until(now, u64::MAX), at(1_700_000_000 + 3600));
        assert_eq!(
            wait_until(DateTime::<Utc>::MAX_UTC, 60),
            DateTime::<Utc>::MAX_UTC
        );
    }
}

/// GitHub's secondary limits on requests that create content: "generally" no more than 80 a
/// minute and 500 an hour. Which endpoints count is not documented; the daemon counts every
/// `POST` (installation tokens, JIT configs, registration tokens) and holds none back: a
/// dispatch waits on its mint, and GitHub's own refusal (403 or 429 with `retry-after`) already
/// pauses the owner. The counts are there for operators to see the wall coming.
pub const CONTENT_REQUESTS_PER_MINUTE: u32 = 80;
pub const CONTENT_REQUESTS_PER_HOUR: u32 = 500;
const CONTENT_WINDOW_HOUR: chrono::Duration = chrono::Duration::hours(1);

/// Whether GitHub's content-creation limit may count a request of `method`.
pub fn creates_content(method: &http::Method) -> bool {
    *method == http::Method::POST
}

/// An owner's content-creating requests in the last minute and the last hour.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContentCount {
    pub last_minute: u32,
    pub last_hour: u32,
}

impl ContentCount {
    /// Whether either of GitHub's content-creation limits is reached.
    pub fn at_limit(&self) -> bool {
        self.last_minute >= CONTENT_REQUESTS_PER_MINUTE
            || self.last_hour >= CONTENT_REQUESTS_PER_HOUR
    }
}

/// When each holder sent its content-creating requests of the last hour, oldest first.
#[derive(Default)]
pub struct ContentRequests {
    sent: Mutex<BTreeMap<BudgetHolder, Window>>,
}

impl ContentRequests {
    /// Counts a content-creating request of `holder` sent now; its counts with it.
    pub fn record(&self, holder: &BudgetHolder, now: DateTime<Utc>) -> ContentCount {
        let mut sent = self.sent.lock().expect("content requests lock");
        let window = sent.entry(holder.clone()).or_default();
        window.push_back((now, 1));
        ContentCount {
            last_hour: trim(window, CONTENT_WINDOW_HOUR, now),
            last_minute: sum_since(window, SECONDARY_WINDOW, now),
        }
    }
}

/// Requests of one holder in a window: when each was sent and what it costs, oldest first.
type Window = std::collections::VecDeque<(DateTime<Utc>, u32)>;

/// Drops from `window` what is `span` old or older; the cost of what is left.
fn trim(window: &mut Window, span: chrono::Duration, now: DateTime<Utc>) -> u32 {
    while window.front().is_some_and(|(at, _)| now - *at >= span) {
        window.pop_front();
    }
    window.iter().map(|(_, cost)| cost).sum()
}

/// The cost of what `window` holds from the last `span`.
fn sum_since(window: &Window, span: chrono::Duration, now: DateTime<Utc>) -> u32 {
    window
        .iter()
        .rev()
        .take_while(|(at, _)| now - *at < span)
        .map(|(_, cost)| cost)
        .sum()
}

/// GitHub's secondary limit on REST points per minute (a `GET`, `HEAD` or `OPTIONS` is one
/// point, anything else five; a `304` counts).
pub const SECONDARY_POINTS_PER_MINUTE: u32 = 900;
/// The points of one holder in any 60 seconds up to which the loop reads idle repos: the
/// rest of GitHub's 900 is left for the reads of busy and hinted repos, which estimates of a
/// tick's cost can miss by a few listings, and for the writes that serve jobs.
pub const READ_POINTS_PER_MINUTE_MAX: u32 = 750;
/// Points above [`READ_POINTS_PER_MINUTE_MAX`] that reads of busy and hinted repos, and the
/// registration listings of taking runners back, may still spend before the client refuses
/// any read: the last 50 of GitHub's 900 stay for writes (mints, deletions), which are never
/// held back.
pub const URGENT_READ_POINTS_HEADROOM: u32 = 100;
const SECONDARY_WINDOW: chrono::Duration = chrono::Duration::seconds(60);

/// Points a request costs against the secondary limit.
pub fn secondary_points(method: &http::Method) -> u32 {
    if matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    ) {
        1
    } else {
        5
    }
}

/// The secondary-limit points each holder spent in the last 60 seconds, counted as requests
/// are sent.
#[derive(Default)]
pub struct SecondaryPoints {
    spent: Mutex<BTreeMap<BudgetHolder, Window>>,
}

impl SecondaryPoints {
    /// Counts a request of `method` sent now; returns the holder's points in the last minute.
    pub fn spend(&self, holder: &BudgetHolder, method: &http::Method, now: DateTime<Utc>) -> u32 {
        let mut spent = self.spent.lock().expect("secondary points lock");
        let window = spent.entry(holder.clone()).or_default();
        window.push_back((now, secondary_points(method)));
        trim(window, SECONDARY_WINDOW, now)
    }

    /// The holder's points in the last minute.
    pub fn spent(&self, holder: &BudgetHolder, now: DateTime<Utc>) -> u32 {
        let mut spent = self.spent.lock().expect("secondary points lock");
        spent
            .get_mut(holder)
            .map_or(0, |window| trim(window, SECONDARY_WINDOW, now))
    }

    /// When a read may go out without the holder's reads passing `limit` points in a minute:
    /// `None` if now.
    pub fn read_refused_until(
        &self,
        holder: &BudgetHolder,
        limit: u32,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let mut spent = self.spent.lock().expect("secondary points lock");
        let window = spent.get_mut(holder)?;
        let mut points = trim(window, SECONDARY_WINDOW, now);
        if points < limit {
            return None;
        }
        // The moment enough of the oldest points leave the window.
        for (at, cost) in window.iter() {
            points = points.saturating_sub(*cost);
            if points < limit {
                return Some(*at + SECONDARY_WINDOW);
            }
        }
        Some(now + SECONDARY_WINDOW)
    }
}

#[cfg(test)]
mod secondary_tests {
    use super::*;

    #[test]
    fn reads_are_refused_while_a_minute_holds_the_limit_and_writes_cost_five() {
        let points = SecondaryPoints::default();
        let holder = BudgetHolder::Installation(7);
        let t0 = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let s = |n: i64| t0 + chrono::Duration::seconds(n);
        assert_eq!(points.read_refused_until(&holder, 10, t0), None);
        for n in 0..5 {
            points.spend(&holder, &http::Method::GET, s(n));
        }
        assert_eq!(points.spend(&holder, &http::Method::POST, s(10)), 10);
        // 10 points in the minute: the next read waits until the first GET is a minute old.
        assert_eq!(points.read_refused_until(&holder, 10, s(20)), Some(s(60)));
        assert_eq!(points.read_refused_until(&holder, 10, s(60)), None);
        // Another holder is not held back.
        assert_eq!(
            points.read_refused_until(&BudgetHolder::App, 10, s(20)),
            None
        );
        // Once the POST leaves the window too, 0.
        assert_eq!(points.spend(&holder, &http::Method::GET, s(71)), 1);
    }
}

#[cfg(test)]
mod content_tests {
    use super::*;

    #[test]
    fn content_requests_are_counted_per_holder_over_a_minute_and_an_hour() {
        let content = ContentRequests::default();
        let holder = BudgetHolder::Installation(7);
        let t0 = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let s = |n: i64| t0 + chrono::Duration::seconds(n);
        assert!(creates_content(&http::Method::POST));
        assert!(!creates_content(&http::Method::GET));
        assert!(!creates_content(&http::Method::DELETE));
        for n in 0..3 {
            content.record(&holder, s(n));
        }
        assert_eq!(
            content.record(&holder, s(30)),
            ContentCount {
                last_minute: 4,
                last_hour: 4
            }
        );
        // A minute on, the first three left the minute but not the hour.
        assert_eq!(
            content.record(&holder, s(62)),
            ContentCount {
                last_minute: 2,
                last_hour: 5
            }
        );
        assert_eq!(
            content.record(&BudgetHolder::App, s(62)),
            ContentCount {
                last_minute: 1,
                last_hour: 1
            }
        );
        // An hour after the first, it left the hour.
        assert_eq!(content.record(&holder, s(3600)).last_hour, 5);
        assert!(!content.record(&holder, s(3601)).at_limit());
        assert!(
            ContentCount {
                last_minute: 80,
                last_hour: 80
            }
            .at_limit()
        );
        assert!(
            ContentCount {
                last_minute: 1,
                last_hour: 500
            }
            .at_limit()
        );
    }
}
