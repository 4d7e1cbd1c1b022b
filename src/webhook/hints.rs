//! Hints: "look at repo R now", from a verified webhook to the control loop.
//!
//! A hint decides nothing. It asks for a re-poll of its repo at once and again
//! [`FOLLOW_UPS`] later, because the forge's API can lag its own webhook (a job announced
//! `queued` may not be listed yet); whatever the poll finds is what the loop acts on. A repo
//! is re-polled for hints at most once per [`POLL_SPACING`], however many hints arrive.
//!
//! [`HintSchedule`] is the pure schedule (time is an input). [`Hints`] is the port between the
//! receiver and the loop: the receiver [`offers`](Hints::offer) hints, the loop
//! [`follows`](Hints::follow) the document it runs on, waits on
//! [`next_hinted`](Hints::next_hinted) and [`takes`](Hints::take_due) what is due.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use crate::clock::{Clock, after};
use crate::config::Config;
use crate::model::RepoName;

/// Re-polls after the first, measured from the hint.
pub const FOLLOW_UPS: [Duration; 2] = [Duration::from_secs(2), Duration::from_secs(5)];

/// At most one hint-poll per repo in this span.
pub const POLL_SPACING: Duration = Duration::from_secs(2);

/// Follow-up times are rounded up to this grid, so that a burst of hints for one repo keeps
/// at most `5 s / 100 ms` pending times instead of three per hint.
const GRID_MS: i64 = 100;

/// Which forge a webhook came from, and which repos of the document it may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WebhookForge {
    /// `app` and `vault` repos.
    GitHub,
    /// `forgejo` repos.
    Forgejo,
}

impl WebhookForge {
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookForge::GitHub => "github",
            WebhookForge::Forgejo => "forgejo",
        }
    }
}

#[derive(Debug, Default)]
struct RepoHints {
    /// Times at which a poll was asked for and has not happened since.
    pending: BTreeSet<DateTime<Utc>>,
    /// The last hint-poll.
    last_poll: Option<DateTime<Utc>>,
}

impl RepoHints {
    /// When this repo is next due: its earliest pending time, held back until
    /// [`POLL_SPACING`] after its last poll.
    fn next_due(&self) -> Option<DateTime<Utc>> {
        let first = *self.pending.first()?;
        Some(match self.last_poll {
            Some(last) => first.max(after(last, POLL_SPACING)),
            None => first,
        })
    }
}

/// The hint schedule: pure, every `now` is an input.
#[derive(Debug, Default)]
pub struct HintSchedule {
    repos: BTreeMap<RepoName, RepoHints>,
}

impl HintSchedule {
    /// A hint for `repo` at `now`: polls at `now`, and again at each of [`FOLLOW_UPS`].
    pub fn hint(&mut self, repo: RepoName, now: DateTime<Utc>) {
        let entry = self.repos.entry(repo).or_default();
        // Every pending time at or before `now` is due already; the earliest stands for all
        // of them (a poll satisfies every request made before it).
        let later = entry
            .pending
            .split_off(&(now + chrono::Duration::nanoseconds(1)));
        let earliest = entry.pending.first().copied().unwrap_or(now);
        entry.pending = later;
        entry.pending.insert(earliest);
        for follow_up in FOLLOW_UPS {
            entry.pending.insert(round_up(after(now, follow_up)));
        }
    }

    /// The repos due at `now`, each counted as polled at `now`: what was asked for up to
    /// `now` is satisfied, and the repo is not due again before [`POLL_SPACING`] has passed.
    pub fn due(&mut self, now: DateTime<Utc>) -> Vec<RepoName> {
        let mut due = Vec::new();
        for (repo, entry) in &mut self.repos {
            if entry.next_due().is_some_and(|at| at <= now) {
                entry.pending = entry
                    .pending
                    .split_off(&(now + chrono::Duration::nanoseconds(1)));
                entry.last_poll = Some(now);
                due.push(repo.clone());
            }
        }
        // A repo with nothing pending and no spacing left to keep is forgotten.
        self.repos.retain(|_, entry| {
            !entry.pending.is_empty()
                || entry
                    .last_poll
                    .is_some_and(|last| after(last, POLL_SPACING) > now)
        });
        due
    }

    /// The earliest moment a repo is due, if any is pending.
    pub fn next_due(&self) -> Option<DateTime<Utc>> {
        self.repos.values().filter_map(RepoHints::next_due).min()
    }

    /// Keeps only the repos in `keep` (the document changed).
    pub fn retain(&mut self, keep: impl Fn(&RepoName) -> bool) {
        self.repos.retain(|repo, _| keep(repo));
    }

    /// Pending times of `repo`, for tests of the bound on memory.
    pub fn pending_len(&self, repo: &RepoName) -> usize {
        self.repos.get(repo).map_or(0, |e| e.pending.len())
    }
}

/// `at`, rounded up to the next multiple of [`GRID_MS`] milliseconds.
fn round_up(at: DateTime<Utc>) -> DateTime<Utc> {
    let ms = at.timestamp_millis();
    let exact =
        at.timestamp_subsec_nanos().is_multiple_of(1_000_000) && ms.rem_euclid(GRID_MS) == 0;
    if exact {
        return at;
    }
    let up = (ms.div_euclid(GRID_MS) + 1) * GRID_MS;
    DateTime::from_timestamp_millis(up).unwrap_or(at)
}

/// What became of an offered hint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offered {
    /// Scheduled: the loop will re-poll the repo.
    Accepted,
    /// The document the loop runs on has no such repo for that forge.
    UnconfiguredRepo,
    /// No loop is running here (a standby, or before the first document): nothing to hint.
    NotLeading,
}

#[derive(Default)]
struct State {
    schedule: HintSchedule,
    /// The repos of the document the loop runs on, by forge; `None` while no loop runs.
    followed: Option<BTreeMap<RepoName, WebhookForge>>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Woken on every accepted hint, so that a waiting loop looks at the schedule again.
    offered: Notify,
}

/// The port between the webhook receiver and the control loop. Cheap to clone; every clone
/// is the same board.
#[derive(Clone, Default)]
pub struct Hints(Arc<Shared>);

impl std::fmt::Debug for Hints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hints").finish_non_exhaustive()
    }
}

impl Hints {
    pub fn new() -> Hints {
        Hints::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The lock guards plain data with no invariant a panic could break halfway.
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The receiver's side: a verified delivery from `forge` names `repo`. Never blocks on
    /// anything but this board's lock.
    pub fn offer(&self, forge: WebhookForge, repo: RepoName, now: DateTime<Utc>) -> Offered {
        let mut state = self.state();
        let Some(followed) = &state.followed else {
            return Offered::NotLeading;
        };
        if followed.get(&repo) != Some(&forge) {
            return Offered::UnconfiguredRepo;
        }
        state.schedule.hint(repo, now);
        drop(state);
        self.0.offered.notify_one();
        Offered::Accepted
    }

    /// The loop's side: it runs on `config` now; hints for its repos are taken, others refused.
    pub fn follow(&self, config: &Config) {
        let followed: BTreeMap<RepoName, WebhookForge> = config
            .repos
            .iter()
            .map(|(name, repo)| {
                let forge = if repo.mode.is_github() {
                    WebhookForge::GitHub
                } else {
                    WebhookForge::Forgejo
                };
                (name.clone(), forge)
            })
            .collect();
        let mut state = self.state();
        state.schedule.retain(|repo| followed.contains_key(repo));
        state.followed = Some(followed);
    }

    /// The loop stopped (its leadership term ended): hints are refused and pending ones
    /// forgotten until it follows a document again.
    pub fn stop_following(&self) {
        let mut state = self.state();
        state.followed = None;
        state.schedule = HintSchedule::default();
    }

    /// The repos due at `now`, counted as polled. The loop calls this before every tick, so
    /// that a tick it runs anyway satisfies the hints due by then.
    pub fn take_due(&self, now: DateTime<Utc>) -> Vec<RepoName> {
        self.state().schedule.due(now)
    }

    /// The earliest moment a hinted repo is due.
    pub fn next_due(&self) -> Option<DateTime<Utc>> {
        self.state().schedule.next_due()
    }

    /// Completes with the repos due as soon as some are (by `clock`), taking them. Cancel
    /// safe: the repos are taken in the same poll that returns them.
    pub async fn next_hinted(&self, clock: &dyn Clock) -> Vec<RepoName> {
        loop {
            // Registered before the schedule is read, so a hint offered in between wakes us.
            let offered = self.0.offered.notified();
            let now = clock.now();
            let due = self.take_due(now);
            if !due.is_empty() {
                return due;
            }
            match self.next_due() {
                Some(at) => {
                    let wait = (at - now).to_std().unwrap_or_default();
                    // Rounded up to whole milliseconds, tokio's timer grain, so that the wake
                    // is not a hair early and spins.
                    let wait = Duration::from_millis(wait.as_nanos().div_ceil(1_000_000) as u64);
                    tokio::select! {
                        biased;
                        () = tokio::time::sleep(wait) => {}
                        () = offered => {}
                    }
                }
                None => offered.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_700_000_000_000 + ms).unwrap()
    }

    fn r(name: &str) -> RepoName {
        RepoName::parse(name).unwrap()
    }

    /// One hint: polls at once, at +2 s and at +5 s, and nothing between.
    #[test]
    fn a_hint_asks_for_a_poll_at_once_then_at_two_and_five_seconds() {
        let mut s = HintSchedule::default();
        s.hint(r("acme/api"), t(0));
        // (now, due then, next due after)
        let table: &[(i64, &[&str], Option<i64>)] = &[
            (0, &["acme/api"], Some(2_000)),
            (1_000, &[], Some(2_000)),
            (1_999, &[], Some(2_000)),
            (2_000, &["acme/api"], Some(5_000)),
            (4_999, &[], Some(5_000)),
            (5_000, &["acme/api"], None),
            (9_000, &[], None),
        ];
        for (now, due, next) in table {
            let got = s.due(t(*now));
            let want: Vec<RepoName> = due.iter().map(|n| r(n)).collect();
            assert_eq!(got, want, "due at {now} ms");
            assert_eq!(s.next_due(), next.map(t), "next due after {now} ms");
        }
    }

    /// A burst of hints is polled every 2 s until 5 s after the last, never closer.
    #[test]
    fn a_burst_of_hints_is_spaced_two_seconds_apart() {
        let mut s = HintSchedule::default();
        s.hint(r("acme/api"), t(0));
        assert_eq!(s.due(t(0)).len(), 1);
        s.hint(r("acme/api"), t(500));
        s.hint(r("acme/api"), t(1_000));
        // Asked for at once, but the last poll was 0.5 s and 1 s ago.
        assert!(s.due(t(1_000)).is_empty());
        let mut polls = vec![0];
        while let Some(at) = s.next_due() {
            assert_eq!(s.due(at).len(), 1);
            polls.push((at - t(0)).num_milliseconds());
        }
        assert_eq!(polls, vec![0, 2_000, 4_000, 6_000]);
    }

    #[test]
    fn repos_are_spaced_independently() {
        let mut s = HintSchedule::default();
        s.hint(r("acme/api"), t(0));
        s.hint(r("acme/web"), t(300));
        assert_eq!(s.due(t(0)), vec![r("acme/api")]);
        assert_eq!(s.next_due(), Some(t(300)));
        assert_eq!(s.due(t(300)), vec![r("acme/web")]);
        assert_eq!(s.due(t(2_300)), vec![r("acme/api"), r("acme/web")]);
    }

    #[test]
    fn a_late_poll_satisfies_everything_asked_before_it() {
        let mut s = HintSchedule::default();
        s.hint(r("acme/api"), t(0));
        // The loop was busy: its next look is at 6 s; one poll covers 0, 2 and 5.
        assert_eq!(s.due(t(6_000)), vec![r("acme/api")]);
        assert_eq!(s.next_due(), None);
        assert_eq!(s.pending_len(&r("acme/api")), 0);
    }

    #[test]
    fn pending_times_stay_bounded_under_a_flood_of_hints() {
        let mut s = HintSchedule::default();
        for ms in 0..10_000 {
            s.hint(r("acme/api"), t(ms));
        }
        // At most one "now", and follow-ups on a 100 ms grid within the next 5 s.
        assert!(
            s.pending_len(&r("acme/api")) <= 52,
            "{}",
            s.pending_len(&r("acme/api"))
        );
    }

    #[test]
    fn forgotten_repos_leave_the_schedule() {
        let mut s = HintSchedule::default();
        s.hint(r("acme/api"), t(0));
        s.retain(|repo| repo != &r("acme/api"));
        assert_eq!(s.next_due(), None);
    }

    /// The promises, over arbitrary hint times: polls of a repo are never closer than 2 s;
    /// every hint is followed by a poll no later than 2 s after it (at once, or held back
    /// by the spacing) and by one at 5 s or later.
    #[test]
    fn every_hint_is_served_and_polls_are_spaced() {
        use proptest::prelude::*;
        proptest!(|(mut hints in proptest::collection::vec(0i64..20_000, 1..40))| {
            hints.sort();
            let mut s = HintSchedule::default();
            let mut polls: Vec<i64> = Vec::new();
            let mut next_hint = 0;
            loop {
                // The loop looks at every hint's arrival and at every due time.
                let due_at = s.next_due().map(|at| (at - t(0)).num_milliseconds());
                let hint_at = hints.get(next_hint).copied();
                let now = match (due_at, hint_at) {
                    (None, None) => break,
                    (Some(d), Some(h)) => d.min(h),
                    (Some(d), None) => d,
                    (None, Some(h)) => h,
                };
                while hints.get(next_hint) == Some(&now) {
                    s.hint(r("acme/api"), t(now));
                    next_hint += 1;
                }
                if !s.due(t(now)).is_empty() {
                    polls.push(now);
                }
            }
            for pair in polls.windows(2) {
                prop_assert!(pair[1] - pair[0] >= 2_000, "{polls:?}");
            }
            for h in &hints {
                prop_assert!(polls.iter().any(|p| *p >= *h && *p <= h + 2_000), "{h}: {polls:?}");
                prop_assert!(polls.iter().any(|p| *p >= h + 5_000), "{h}: {polls:?}");
            }
        });
    }
}
