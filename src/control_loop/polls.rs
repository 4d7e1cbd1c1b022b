//! Adaptive polling: which repos' queues a tick reads.
//!
//! A repo with work (a job queued or running at its last read, or a child of ours in flight)
//! or a webhook hint in the last [`HINT_KEEPS_BUSY`] is read every poll interval; an idle one
//! every idle poll interval. A hint asks for a read at the next tick whatever the schedule
//! says. Most repos of a fleet are idle most of the time, so this is what keeps hundreds of
//! repos inside GitHub's per-minute limits. A repo not read in a tick keeps its last reading,
//! which the planner shows but neither dispatches nor reaps on.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::clock::after;
use crate::model::RepoName;
use crate::observe::{BudgetReading, ReadPoints};

/// `--idle-poll-interval` when it is not set and no webhook is received.
pub const IDLE_POLL_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);
/// `--idle-poll-interval` when it is not set and webhooks are received: a job whose webhook
/// was lost waits at most this long.
pub const IDLE_POLL_INTERVAL_WITH_WEBHOOKS: Duration = Duration::from_secs(300);

/// How long a webhook hint keeps its repo on the busy schedule: a push usually brings more
/// jobs (later `needs:` levels, re-runs) within minutes.
pub const HINT_KEEPS_BUSY: Duration = Duration::from_secs(300);

/// The most a low budget stretches read intervals: an idle repo is still read every 20
/// minutes, a busy one every 5 at a 15-second poll.
pub const BUDGET_STRETCH_MAX: f64 = 20.0;

/// GitHub's primary rate-limit window.
const BUDGET_WINDOW: Duration = Duration::from_secs(3600);

/// How much to stretch the read intervals of the repos that share `budget` so that it lasts
/// until it resets instead of running out: what was spent so far in this window, projected
/// at the same rate to the reset, against nine tenths of what remains (the rest is left for
/// mints and registrations). 1 while a quarter or more of the budget remains, and once none
/// does: an exhausted budget pauses its repos until the reset anyway (the GitHub client's
/// pause), and a stretch would only delay the first read after it.
pub fn budget_stretch(budget: &BudgetReading, now: DateTime<Utc>) -> f64 {
    if budget.limit == 0 || budget.remaining == 0 || budget.remaining * 4 >= budget.limit {
        return 1.0;
    }
    let to_reset = (budget.reset_at - now)
        .to_std()
        .unwrap_or_default()
        .min(BUDGET_WINDOW);
    if to_reset.is_zero() {
        return 1.0;
    }
    // A window that started moments ago says little about the rate: at least a minute.
    let elapsed = (BUDGET_WINDOW - to_reset).max(Duration::from_secs(60));
    let spent = budget.limit.saturating_sub(budget.remaining) as f64;
    let projected = spent * to_reset.as_secs_f64() / elapsed.as_secs_f64();
    let affordable = budget.remaining as f64 * 0.9;
    if affordable < 1.0 {
        return BUDGET_STRETCH_MAX;
    }
    (projected / affordable).clamp(1.0, BUDGET_STRETCH_MAX)
}

/// How much earlier than a poll interval after the last tick of the cadence a tick may come
/// and still be one of the cadence (the timer's jitter).
const CADENCE_JITTER: Duration = Duration::from_secs(1);

/// First reads per tick at the least: a fleet of a few dozen repos is read at once.
pub const FIRST_READS_PER_TICK_MIN: usize = 16;

/// How many never-read repos a tick reads: enough that `repos` are all read within one idle
/// interval, as idle repos are later. After a start, a fleet of hundreds would otherwise be
/// read within the first minute, over GitHub's 900 points a minute.
pub fn first_reads_per_tick(repos: usize, intervals: PollIntervals) -> usize {
    let ticks = (intervals.idle.as_secs_f64() / intervals.busy.as_secs_f64().max(1e-3)).max(1.0);
    ((repos as f64 / ticks).ceil() as usize).max(FIRST_READS_PER_TICK_MIN)
}

/// A repo due a read this tick.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DueRead {
    /// Busy, or a webhook hinted at it: read whatever the minute's points say.
    pub urgent: bool,
    /// Its last read; `None` if never read.
    pub read_at: Option<DateTime<Utc>>,
    /// Whose secondary-limit points it spends, how many that owner may still spend on reads
    /// this minute, and what this read will likely cost; `None` where nothing is known.
    pub points: Option<ReadPoints>,
}

/// Which of `due` a tick reads (indices, in the order given) and which wait for a later tick:
/// urgent reads all go, counted first at what each will likely cost (a repo with ten active
/// runs lists five statuses and ten runs' jobs); then idle ones, longest unread first, while
/// their owner's points for the minute last. The client would refuse a read past its owner's points
/// anyway, with a warning per repo; here the idle ones simply keep their turn, and a fleet
/// too large for its idle interval is read round the fleet as the minute allows.
pub fn within_read_points(due: &[DueRead]) -> (Vec<usize>, Vec<usize>) {
    let mut order: Vec<usize> = (0..due.len()).collect();
    order.sort_by_key(|&i| (!due[i].urgent, due[i].read_at));
    let mut spent: BTreeMap<&str, u32> = BTreeMap::new();
    let (mut read, mut wait) = (Vec::new(), Vec::new());
    for i in order {
        let d = &due[i];
        let Some(points) = &d.points else {
            read.push(i);
            continue;
        };
        let spent = spent.entry(points.owner.as_str()).or_default();
        if d.urgent || *spent + points.next_read <= points.left {
            *spent += points.next_read;
            read.push(i);
        } else {
            wait.push(i);
        }
    }
    read.sort_unstable();
    wait.sort_unstable();
    (read, wait)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollIntervals {
    /// Repos with work.
    pub busy: Duration,
    /// Idle repos; at most the busy interval means every repo is read every tick.
    pub idle: Duration,
}

impl PollIntervals {
    /// Ticks land a poll interval apart, give or take the time a tick takes: a repo due
    /// within this much of a tick is read at that tick rather than a whole interval later.
    fn slack(&self) -> Duration {
        self.busy / 5
    }
}

#[derive(Clone, Debug, Default)]
struct RepoPolls {
    /// The last successful read of its queue.
    read_at: Option<DateTime<Utc>>,
    /// The last read the schedule asked for, which the next is due an interval after. A read a
    /// hint asked for between two ticks does not move it: the repo's next read stays at the
    /// tick it was due at, instead of an interval after the hint, which ticks a poll interval
    /// apart would reach only one tick later.
    scheduled_at: Option<DateTime<Utc>>,
    /// Work was seen at the last tick: jobs at the last read, or children of ours.
    busy: bool,
    hinted_at: Option<DateTime<Utc>>,
    /// A hint asked for a read that has not happened yet.
    asked: bool,
}

/// When each repo was read and when it is next due.
#[derive(Clone, Debug, Default)]
pub struct PollSchedule {
    repos: BTreeMap<RepoName, RepoPolls>,
    /// The last tick on the poll cadence.
    cadence_at: Option<DateTime<Utc>>,
    /// This tick was woken by a webhook between two ticks of the cadence.
    off_cadence: bool,
}

impl PollSchedule {
    /// A tick begins at `now`. It is on the poll cadence when a poll interval (less a second)
    /// has passed since the last tick that was; ticks in between are woken by webhook hints,
    /// and read a repo early only if a hint asked for it. Read early there, a busy repo would
    /// skip the next tick of the cadence and wait almost two intervals.
    pub fn begin_tick(&mut self, now: DateTime<Utc>, intervals: PollIntervals) {
        // The loop's timer ticks a poll interval apart or later, never earlier by more than
        // its jitter; a tick sooner than that was woken by a hint.
        let jitter = intervals.slack().min(CADENCE_JITTER);
        let cadence = intervals.busy.saturating_sub(jitter);
        self.off_cadence = self.cadence_at.is_some_and(|at| now < after(at, cadence));
        if !self.off_cadence {
            self.cadence_at = Some(now);
        }
    }

    /// A webhook said something happened in `repo`: read it at the next tick.
    pub fn hint(&mut self, repo: &RepoName, now: DateTime<Utc>) {
        let polls = self.repos.entry(repo.clone()).or_default();
        polls.asked = true;
        polls.hinted_at = Some(now);
    }

    /// `repo` is on the busy cadence: work at its last read, children of ours, or a fresh
    /// hint; or a hint asked for a read not made yet.
    pub fn urgent(&self, repo: &RepoName, now: DateTime<Utc>) -> bool {
        self.repos.get(repo).is_some_and(|p| {
            p.busy
                || p.asked
                || p.hinted_at
                    .is_some_and(|at| now < after(at, HINT_KEEPS_BUSY))
        })
    }

    /// The interval `repo` is read at now: busy or idle, stretched by `stretch` (≥ 1) when
    /// the API budget it draws on runs low.
    pub fn interval(
        &self,
        repo: &RepoName,
        now: DateTime<Utc>,
        intervals: PollIntervals,
        stretch: f64,
    ) -> Duration {
        let polls = self.repos.get(repo);
        let hinted = polls
            .and_then(|p| p.hinted_at)
            .is_some_and(|at| now < after(at, HINT_KEEPS_BUSY));
        let busy = polls.is_some_and(|p| p.busy) || hinted;
        let base = if busy {
            intervals.busy
        } else {
            intervals.idle.max(intervals.busy)
        };
        base.mul_f64(stretch.max(1.0))
    }

    /// When `repo` is next due: `None` when it is due now (never read, or a hint asked).
    pub fn next_read_at(
        &self,
        repo: &RepoName,
        now: DateTime<Utc>,
        intervals: PollIntervals,
        stretch: f64,
    ) -> Option<DateTime<Utc>> {
        let polls = self.repos.get(repo)?;
        if polls.asked {
            return None;
        }
        let read_at = polls.scheduled_at.or(polls.read_at)?;
        let due = after(read_at, self.interval(repo, now, intervals, stretch));
        let slack = if self.off_cadence {
            Duration::ZERO
        } else {
            intervals.slack()
        };
        let early = due - chrono::Duration::from_std(slack).unwrap_or_default();
        (now < early).then_some(due)
    }

    /// `repo` was never read and no webhook asked for it: its first read may wait its turn.
    pub fn first_read_pending(&self, repo: &RepoName) -> bool {
        self.repos
            .get(repo)
            .is_none_or(|p| p.read_at.is_none() && !p.asked)
    }

    /// When `repo` was last read, if it was.
    pub fn read_at(&self, repo: &RepoName) -> Option<DateTime<Utc>> {
        self.repos.get(repo).and_then(|p| p.read_at)
    }

    /// `repo` was read at `now`; `busy` when the reading showed a job queued or running.
    pub fn read(&mut self, repo: &RepoName, now: DateTime<Utc>, busy: bool) {
        let polls = self.repos.entry(repo.clone()).or_default();
        if !polls.asked || polls.scheduled_at.is_none() {
            polls.scheduled_at = Some(now);
        }
        polls.read_at = Some(now);
        polls.asked = false;
        polls.busy = busy;
    }

    /// Children of ours run for `repo`: it is busy whatever its last reading said, so it is
    /// read every poll interval while they do.
    pub fn children_in_flight(&mut self, repo: &RepoName) {
        self.repos.entry(repo.clone()).or_default().busy = true;
    }

    /// Forgets repos that left the document.
    pub fn retain(&mut self, repos: &BTreeSet<&RepoName>) {
        self.repos.retain(|repo, _| repos.contains(repo));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).unwrap() + chrono::Duration::seconds(s)
    }

    const INTERVALS: PollIntervals = PollIntervals {
        busy: Duration::from_secs(15),
        idle: Duration::from_secs(60),
    };

    fn repo() -> RepoName {
        RepoName::parse("acme/api").unwrap()
    }

    /// Ticks every 15 s from `from` for `until` seconds: the ticks at which `repo` is read.
    fn reads(schedule: &mut PollSchedule, from: i64, until: i64, busy: bool) -> Vec<i64> {
        let mut at = Vec::new();
        for s in (from..from + until).step_by(15) {
            if schedule
                .next_read_at(&repo(), t(s), INTERVALS, 1.0)
                .is_none()
            {
                schedule.read(&repo(), t(s), busy);
                at.push(s);
            }
        }
        at
    }

    #[test]
    fn first_reads_are_spread_over_one_idle_interval() {
        let webhooks = PollIntervals {
            busy: Duration::from_secs(15),
            idle: Duration::from_secs(300),
        };
        // 500 repos at 25 a tick: all read within the 20 ticks of one idle interval.
        assert_eq!(first_reads_per_tick(500, webhooks), 25);
        assert_eq!(first_reads_per_tick(500, INTERVALS), 125);
        assert_eq!(first_reads_per_tick(40, webhooks), FIRST_READS_PER_TICK_MIN);
        let every_tick = PollIntervals {
            busy: Duration::from_secs(15),
            idle: Duration::from_secs(15),
        };
        assert_eq!(first_reads_per_tick(500, every_tick), 500);
    }

    #[test]
    fn a_hinted_read_between_ticks_keeps_the_repo_on_its_tick_cadence() {
        let mut schedule = PollSchedule::default();
        schedule.read(&repo(), t(0), true);
        // A hint between ticks: read at 11 s.
        schedule.hint(&repo(), t(11));
        assert_eq!(schedule.next_read_at(&repo(), t(11), INTERVALS, 1.0), None);
        schedule.read(&repo(), t(11), true);
        // Still due at the tick of 15 s, not at 26 s (which ticks reach only at 30 s).
        assert_eq!(schedule.next_read_at(&repo(), t(15), INTERVALS, 1.0), None);
        schedule.read(&repo(), t(15), true);
        assert_eq!(
            schedule.next_read_at(&repo(), t(20), INTERVALS, 1.0),
            Some(t(30))
        );
    }

    #[test]
    fn a_tick_woken_between_ticks_reads_early_only_what_a_hint_asked_for() {
        let mut schedule = PollSchedule::default();
        let other = RepoName::parse("acme/web").unwrap();
        schedule.begin_tick(t(0), INTERVALS);
        schedule.read(&repo(), t(0), true);
        schedule.read(&other, t(0), true);
        // A webhook for acme/web wakes a tick at 13 s, 2 s before the cadence's next.
        schedule.hint(&other, t(13));
        schedule.begin_tick(t(13), INTERVALS);
        assert_eq!(schedule.next_read_at(&other, t(13), INTERVALS, 1.0), None);
        schedule.read(&other, t(13), true);
        // acme/api is due at 15 s: not read at 13 s, though within the slack of a tick.
        assert_eq!(
            schedule.next_read_at(&repo(), t(13), INTERVALS, 1.0),
            Some(t(15))
        );
        // The tick of the cadence reads both: acme/web's hinted read did not move its turn.
        schedule.begin_tick(t(15), INTERVALS);
        assert_eq!(schedule.next_read_at(&repo(), t(15), INTERVALS, 1.0), None);
        assert_eq!(schedule.next_read_at(&other, t(15), INTERVALS, 1.0), None);
    }

    #[test]
    fn idle_reads_wait_while_the_minutes_points_are_spent_and_urgent_ones_never_do() {
        let due = |urgent: bool, read_at: Option<i64>, left: Option<u32>| DueRead {
            urgent,
            read_at: read_at.map(t),
            points: left.map(|left| ReadPoints {
                owner: "installation-1".to_string(),
                left,
                next_read: if urgent { 6 } else { 1 },
            }),
        };
        // 8 points left: the busy repo (6) first, then the two idle repos read longest ago.
        let reads = [
            due(false, Some(30), Some(8)),
            due(false, None, Some(8)),
            due(true, Some(45), Some(8)),
            due(false, Some(0), Some(8)),
            due(false, Some(10), Some(8)),
        ];
        assert_eq!(within_read_points(&reads), (vec![1, 2, 3], vec![0, 4]));
        // Each read is counted at its own cost: a busy repo with many active runs leaves no
        // room, and an idle repo due its hourly deep read costs two.
        let mut costly = due(true, Some(45), Some(8));
        costly.points.as_mut().unwrap().next_read = 8;
        let mut deep = due(false, Some(0), Some(8));
        deep.points.as_mut().unwrap().next_read = 2;
        assert_eq!(
            within_read_points(&[due(false, Some(30), Some(8)), costly.clone()]),
            (vec![1], vec![0])
        );
        costly.points.as_mut().unwrap().next_read = 6;
        assert_eq!(
            within_read_points(&[deep, costly, due(false, Some(10), Some(8))]),
            (vec![0, 1], vec![2])
        );
        // No points left: urgent reads still go; unknown owners are not held back.
        let reads = [
            due(true, Some(0), Some(0)),
            due(false, Some(0), Some(0)),
            due(false, Some(0), None),
        ];
        assert_eq!(within_read_points(&reads), (vec![0, 2], vec![1]));
        // Owners are counted apart.
        let mut other = due(false, Some(0), Some(1));
        other.points.as_mut().unwrap().owner = "installation-2".into();
        let reads = [
            due(false, Some(0), Some(1)),
            other,
            due(false, Some(5), Some(1)),
        ];
        assert_eq!(within_read_points(&reads), (vec![0, 1], vec![2]));
    }

    #[test]
    fn a_never_read_repo_is_due_at_once() {
        assert_eq!(
            PollSchedule::default().next_read_at(&repo(), t(0), INTERVALS, 1.0),
            None
        );
    }

    #[test]
    fn a_busy_repo_is_read_every_tick_and_an_idle_one_every_idle_interval() {
        let mut schedule = PollSchedule::default();
        assert_eq!(reads(&mut schedule, 0, 60, true), [0, 15, 30, 45]);
        // The read at 45 found nothing: from then on, once a minute.
        assert_eq!(reads(&mut schedule, 60, 180, false), [60, 120, 180]);
    }

    #[test]
    fn ticks_a_little_early_or_late_keep_the_cadence() {
        let mut schedule = PollSchedule::default();
        schedule.read(&repo(), t(0), true);
        // A tick that lands 200 ms before the interval is up still reads.
        let early = t(15) - chrono::Duration::milliseconds(200);
        assert_eq!(schedule.next_read_at(&repo(), early, INTERVALS, 1.0), None);
        // Halfway through the interval it does not.
        assert_eq!(
            schedule.next_read_at(&repo(), t(7), INTERVALS, 1.0),
            Some(t(15))
        );
    }

    #[test]
    fn a_hint_asks_for_a_read_now_and_keeps_the_repo_busy_for_five_minutes() {
        let mut schedule = PollSchedule::default();
        schedule.read(&repo(), t(0), false);
        assert_eq!(
            schedule.next_read_at(&repo(), t(20), INTERVALS, 1.0),
            Some(t(60))
        );
        schedule.hint(&repo(), t(20));
        assert_eq!(schedule.next_read_at(&repo(), t(21), INTERVALS, 1.0), None);
        schedule.read(&repo(), t(21), false);
        // Busy cadence while the hint is fresh, although the reading was empty: read at the
        // next tick (30 s; the cadence runs from the scheduled read of 0 s), then every 15 s.
        assert_eq!(schedule.next_read_at(&repo(), t(30), INTERVALS, 1.0), None);
        schedule.read(&repo(), t(30), false);
        assert_eq!(
            schedule.next_read_at(&repo(), t(35), INTERVALS, 1.0),
            Some(t(45))
        );
        // Idle again once the hint is five minutes old.
        schedule.read(&repo(), t(320), false);
        assert_eq!(
            schedule.next_read_at(&repo(), t(325), INTERVALS, 1.0),
            Some(t(380))
        );
    }

    #[test]
    fn children_in_flight_keep_an_empty_queue_on_the_busy_cadence() {
        let mut schedule = PollSchedule::default();
        schedule.read(&repo(), t(0), false);
        schedule.children_in_flight(&repo());
        assert_eq!(
            schedule.next_read_at(&repo(), t(5), INTERVALS, 1.0),
            Some(t(15))
        );
    }

    #[test]
    fn a_low_budget_stretches_the_interval_and_never_shortens_it() {
        let schedule = PollSchedule::default();
        assert_eq!(
            schedule.interval(&repo(), t(0), INTERVALS, 3.0),
            Duration::from_secs(180)
        );
        assert_eq!(
            schedule.interval(&repo(), t(0), INTERVALS, 0.5),
            Duration::from_secs(60)
        );
    }

    fn budget(limit: u64, remaining: u64, reset_in_s: i64) -> BudgetReading {
        BudgetReading {
            owner: "installation-7".into(),
            limit,
            remaining,
            reset_at: t(reset_in_s),
        }
    }

    #[test]
    fn a_budget_is_stretched_to_last_until_its_reset() {
        struct Case {
            name: &'static str,
            remaining: u64,
            reset_in_s: i64,
            stretch: f64,
        }
        let cases = [
            Case {
                name: "plenty left",
                remaining: 4000,
                reset_in_s: 3000,
                stretch: 1.0,
            },
            Case {
                name: "a quarter left: not yet",
                remaining: 1250,
                reset_in_s: 3000,
                stretch: 1.0,
            },
            // 4,000 spent in 20 minutes; 40 minutes to go would spend 8,000 against 900.
            Case {
                name: "burning fast",
                remaining: 1000,
                reset_in_s: 2400,
                stretch: 8.0 / 0.9,
            },
            // 4,500 spent in 55 minutes; 5 minutes to go would spend ~409 against 450.
            Case {
                name: "low but the reset is near",
                remaining: 500,
                reset_in_s: 300,
                stretch: 1.0,
            },
            Case {
                name: "nothing left: paused until the reset instead",
                remaining: 0,
                reset_in_s: 600,
                stretch: 1.0,
            },
            Case {
                name: "one request left",
                remaining: 1,
                reset_in_s: 600,
                stretch: BUDGET_STRETCH_MAX,
            },
            Case {
                name: "reset passed",
                remaining: 10,
                reset_in_s: -5,
                stretch: 1.0,
            },
        ];
        for case in cases {
            let got = budget_stretch(&budget(5000, case.remaining, case.reset_in_s), t(0));
            assert!((got - case.stretch).abs() < 1e-9, "{}: {got}", case.name);
        }
    }

    #[test]
    fn an_idle_interval_below_the_poll_interval_reads_every_tick() {
        let intervals = PollIntervals {
            busy: Duration::from_secs(15),
            idle: Duration::from_secs(5),
        };
        let schedule = PollSchedule::default();
        assert_eq!(
            schedule.interval(&repo(), t(0), intervals, 1.0),
            Duration::from_secs(15)
        );
    }
}
