//! The truth of GitHub, Forgejo and Nomad, and how it moves one simulated second at a time.
//!
//! GitHub as it behaves: work arrives in runs of several jobs, some gated by `needs:` (a gated
//! job is created queued only when the job before it completes); queued jobs get cancelled,
//! runs get re-run with new job ids, a job queued for 24 hours is cancelled; an idle registered
//! runner is offered a random queued job whose labels are all among its own, not the one it was
//! dispatched for; status changes reach the API 0–3 s late (each job keeps a *visible* copy
//! that catches up); in runs with webhooks, each change of a job (queued, in progress,
//! completed) sends a `workflow_job` delivery, lost or due 0–1 s later. Forgejo reports
//! claims at once.
//!
//! Nomad as it behaves: a dispatched child is pending without an allocation; it is placed after
//! a delay only while the cluster has room; its runner boots in 5–60 s and registers, or
//! crashes (a failed start); a runner exits after its one job, or after an idle timeout; dead
//! children stay listed until purged.
//!
//! # Layout
//!
//! This file holds the [`World`], the order one second moves it in ([`World::advance`]) and
//! what the invariants read of it. `entities`: the jobs, children, registrations and crash
//! streaks it holds; how they move, as methods of the world: `jobs` (the forges' jobs and the
//! webhooks they send), `arrivals` (runs arriving and re-run), `cluster` (Nomad's children
//! and their runners), `registrations` (GitHub's registrations API); `counts` and
//! `latencies`: what a run counts and how long its work waited.

mod arrivals;
mod cluster;
mod counts;
mod entities;
mod jobs;
mod latencies;
mod registrations;

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

use super::options::Options;
use super::trace::Trace;
use crate::model::{ChildId, LabelSet, NOMAD_DEFAULT_NAMESPACE, RepoName};
use crate::observe::{ChildStatus, Placement};
use arrivals::{RunTemplate, draw_run};
pub use counts::Counts;
pub use entities::{CrashStreak, Job, Phase, Registration, SimChild, Truth, Visible};
pub use latencies::Latencies;

/// GitHub cancels a self-hosted job that has been queued this long (BRIEF lesson 11).
pub const QUEUED_JOB_CANCEL_S: i64 = 24 * 3600;

/// The world's truth.
pub struct World {
    pub jobs: BTreeMap<u64, Job>,
    pub children: BTreeMap<ChildId, SimChild>,
    /// Allocations of children purged while they were still stopping: Nomad forgot the job,
    /// the client still runs the task until it ends, and the slot stays taken.
    pub lingering: BTreeMap<ChildId, SimChild>,
    /// Idempotency token → the child it created.
    pub idempotency: BTreeMap<String, ChildId>,
    runs: BTreeMap<u64, RunTemplate>,
    next_id: u64,
    pub counts: Counts,
    /// `repo_url` meta → repo.
    pub repo_urls: BTreeMap<String, RepoName>,
    repo_names: Vec<RepoName>,
    pub latencies: Latencies,
    /// Children of ours whose runner never took a job, counted as they are purged.
    pub wasted_purged: u64,
    /// GitHub's runner registrations by id.
    pub registrations: BTreeMap<u64, Registration>,
    /// Crash streaks by bucket.
    pub crash_streaks: BTreeMap<(RepoName, LabelSet), CrashStreak>,
    /// When the daemon last stopped an in-flight child of each repo.
    pub last_stop_s: BTreeMap<RepoName, u64>,
    /// When a runner of each bucket last left after its job.
    pub last_left_s: BTreeMap<(RepoName, LabelSet), u64>,
    /// Draws the runs that arrive (see [`World::advance`]).
    arrivals: StdRng,
    /// Draws which webhooks are lost and how late the others arrive.
    webhook_rng: StdRng,
    /// Webhooks on their way: when each arrives, for which repo.
    webhooks_due: BTreeMap<u64, Vec<RepoName>>,
    /// Draws the search lag and the busy flag's lag of each change.
    lag_rng: StdRng,
    /// When a daemon sent the delete of each registration (by id), judged when it lands.
    deletes_sent: BTreeMap<u64, u64>,
    /// The first job a registration delete killed outside the window no signal closes (I1).
    pub kill_outside: Option<String>,
}

/// Unix time of simulated second 0 (a Monday morning), the base of child ids.
pub const EPOCH_UNIX: i64 = 1_736_150_400;

impl World {
    pub fn new(options: &Options, repo_urls: BTreeMap<String, RepoName>) -> World {
        let repo_names = options
            .repos
            .iter()
            .map(|r| RepoName::parse(r.name).expect("scenario repo names are valid"))
            .collect();
        World {
            jobs: BTreeMap::new(),
            children: BTreeMap::new(),
            lingering: BTreeMap::new(),
            idempotency: BTreeMap::new(),
            runs: BTreeMap::new(),
            next_id: 1000,
            counts: Counts::default(),
            repo_urls,
            repo_names,
            latencies: Latencies::default(),
            wasted_purged: 0,
            registrations: BTreeMap::new(),
            crash_streaks: BTreeMap::new(),
            last_stop_s: BTreeMap::new(),
            last_left_s: BTreeMap::new(),
            arrivals: StdRng::seed_from_u64(0),
            webhook_rng: StdRng::seed_from_u64(0),
            webhooks_due: BTreeMap::new(),
            lag_rng: StdRng::seed_from_u64(0),
            deletes_sent: BTreeMap::new(),
            kill_outside: None,
        }
    }

    /// Draws arrivals from `arrivals` (a stream of the run's seed) instead of a fixed one.
    pub fn with_arrivals(mut self, arrivals: StdRng) -> World {
        // Webhooks draw from a stream of their own (drawn from a copy, so the arrivals are
        // the same whether the run has webhooks or not).
        self.webhook_rng = StdRng::seed_from_u64(arrivals.clone().next_u64() ^ 0x776562686f6f6b);
        self.arrivals = arrivals;
        self
    }

    pub fn with_lags(mut self, lags: StdRng) -> World {
        self.lag_rng = lags;
        self
    }

    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A hand-dispatched child, running: shown by Nomad, never ours to count or purge.
    pub fn add_foreign_child(&mut self, parent: &str) {
        let id = ChildId(
            format!("{parent}/dispatch-{EPOCH_UNIX}-{:08x}", self.next_id()),
            NOMAD_DEFAULT_NAMESPACE.to_string(),
        );
        self.children.insert(
            id,
            SimChild {
                parent: parent.to_string(),
                repo: None,
                repo_url: None,
                labels: LabelSet::default(),
                runner: None,
                submitted_s: 0,
                status: ChildStatus::Running,
                placement: Placement::Placed,
                phase: Phase::Exited,
                token: None,
                ran_job: false,
                stopped: false,
                registration: None,
                deregistered_s: None,
            },
        );
    }

    /// Moves the world to second `t`.
    pub fn advance(&mut self, t: u64, o: &Options, rng: &mut StdRng, trace: &mut Trace) {
        // Arrivals come from their own stream, so every strategy of the benchmark meets the
        // same runs at the same times whatever it does to the rest of the world.
        if t == 0 {
            for _ in 0..o.burst_runs {
                let template = draw_run(o, &mut self.arrivals);
                self.start_run(t, o, template, trace, rng);
            }
            for _ in 0..o.stale_jobs {
                self.stale_job(o, trace, rng);
            }
        } else if t < o.arrivals_end_s
            && self
                .arrivals
                .random_bool((o.runs_per_hour / 3600.0).min(1.0))
        {
            let template = draw_run(o, &mut self.arrivals);
            self.start_run(t, o, template, trace, rng);
        }
        self.cancel_queued(t, o, rng, trace);
        self.end_stopping(t, trace);
        self.place(t, o, rng, trace);
        self.boot(t, o, rng, trace);
        self.finish_jobs(t, o, rng, trace);
        self.offer_jobs(t, o, rng, trace);
        self.catch_up(t);
    }

    /// Children of ours that hold a slot: pending, running, or stopped with their task still
    /// winding down (purged or not).
    pub fn in_flight(&self) -> impl Iterator<Item = (&ChildId, &SimChild)> {
        self.children
            .iter()
            .filter(|(_, c)| {
                c.repo.is_some()
                    && (c.status.is_in_flight() || matches!(c.phase, Phase::Stopping { .. }))
            })
            .chain(self.lingering.iter().filter(|(_, c)| c.repo.is_some()))
    }

    /// Jobs not yet completed or cancelled (gated ones included).
    pub fn open_jobs(&self) -> usize {
        self.jobs.values().filter(|j| !j.is_terminal()).count()
    }

    /// Jobs the forges still list as queued or in progress.
    pub fn visible_jobs(&self) -> usize {
        self.jobs
            .values()
            .filter(|j| j.visible != Visible::Hidden)
            .count()
    }

    /// The longest chain of `needs:` among open jobs.
    pub fn needs_depth(&self) -> u64 {
        let mut deepest = 0;
        for job in self.jobs.values() {
            let mut depth = 0;
            let mut truth = job.truth.clone();
            while let Truth::Gated { after } = truth {
                depth += 1;
                truth = self
                    .jobs
                    .get(&after)
                    .map(|j| j.truth.clone())
                    .unwrap_or(Truth::Completed);
            }
            deepest = deepest.max(depth);
        }
        deepest
    }

    /// Dispatches whose runner never took a job: purged ones, and ones still listed.
    pub fn wasted_dispatches(&self) -> u64 {
        let listed = self
            .children
            .values()
            .filter(|c| c.repo.is_some() && !c.ran_job)
            .count() as u64;
        self.wasted_purged + listed
    }

    /// Jobs that never got a runner: still queued now, or cancelled by GitHub after 24 hours.
    pub fn stranded_jobs(&self) -> u64 {
        let queued = self
            .jobs
            .values()
            .filter(|j| j.truth == Truth::Queued)
            .count() as u64;
        queued + self.counts.jobs_expired
    }

    pub fn repos(&self) -> &[RepoName] {
        &self.repo_names
    }

    /// Open jobs per repo and label set, for the convergence bound.
    pub fn open_jobs_by_bucket(&self) -> BTreeMap<(RepoName, LabelSet), u64> {
        let mut out = BTreeMap::new();
        for job in self.jobs.values().filter(|j| !j.is_terminal()) {
            *out.entry((job.repo.clone(), job.labels.clone()))
                .or_default() += 1;
        }
        out
    }

    /// Ids of the children of `parent`.
    pub fn children_of<'a>(
        &'a self,
        parent: &'a str,
    ) -> impl Iterator<Item = (&'a ChildId, &'a SimChild)> {
        self.children
            .iter()
            .filter(move |(_, c)| c.parent == parent)
    }

    /// Every parent any child was dispatched to.
    pub fn parents(&self) -> BTreeSet<String> {
        self.children.values().map(|c| c.parent.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RunnerName;
    use crate::sim::seeded::options::ForgeKind;
    use crate::sim::seeded::scenarios::Scenario;

    fn job(repo: &RepoName) -> Job {
        Job {
            repo: repo.clone(),
            forge: ForgeKind::GitHub,
            labels: LabelSet::from_meta("self-hosted").expect("a label set"),
            raw_labels: vec!["self-hosted".into()],
            run: 1,
            truth: Truth::Gated { after: 0 },
            queued_at_s: 0,
            visible: Visible::Hidden,
            catching_up: None,
            searched: Visible::Hidden,
            searched_catching_up: None,
            flag_at: None,
            told_at: None,
        }
    }

    #[test]
    fn every_change_of_a_listed_job_sends_a_webhook_and_a_gated_one_none() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut options = Scenario::Steady.options(&mut rng);
        options.webhooks = Some(super::super::options::Webhooks {
            lost: 0.0,
            delay_s: (1, 1),
        });
        let mut world = World::new(&options, BTreeMap::new());
        let mut trace = Trace::new(false);
        let repo = RepoName::parse("afreidah/munchbox").expect("a repo name");
        for id in [1, 2, 3] {
            world.jobs.insert(id, job(&repo));
        }
        // Queued: its delivery arrives a second later, once.
        world.set_queued(1, 10, &options, &mut rng);
        assert_eq!(world.webhooks_arriving(10), Vec::<RepoName>::new());
        assert_eq!(world.webhooks_arriving(11), std::slice::from_ref(&repo));
        assert_eq!(world.webhooks_arriving(12), Vec::<RepoName>::new());
        // Completed.
        world.jobs.get_mut(&1).unwrap().truth = Truth::Running {
            runner: RunnerName("ci-runner-1".into()),
            done_at: 20,
        };
        world.finish_jobs(20, &options, &mut rng, &mut trace);
        assert_eq!(world.webhooks_arriving(21), std::slice::from_ref(&repo));
        // Cancelled while queued.
        world.set_queued(2, 30, &options, &mut rng);
        world.cancel(2, 30, "test", &options, &mut rng, &mut trace);
        assert_eq!(world.webhooks_arriving(31), [repo.clone(), repo.clone()]);
        // A gated job GitHub has not listed yet sends nothing when cancelled.
        world.cancel(3, 40, "test", &options, &mut rng, &mut trace);
        assert_eq!(world.webhooks_arriving(41), Vec::<RepoName>::new());
    }

    #[test]
    fn a_delete_slips_through_while_the_busy_flag_lags_and_is_refused_once_it_shows() {
        let mut rng = StdRng::seed_from_u64(1);
        let options = Scenario::Steady.options(&mut rng);
        let mut world = World::new(&options, BTreeMap::new());
        let mut trace = Trace::new(false);
        let repo = RepoName::parse("afreidah/munchbox").expect("a repo name");
        let name = RunnerName("ci-runner-0123456789ab".into());
        let child = ChildId("ci-runner/dispatch-1-00000001".into(), "default".into());
        world.jobs.insert(7, job(&repo));
        world.children.insert(
            child.clone(),
            SimChild {
                parent: "ci-runner".into(),
                repo: Some(repo.clone()),
                repo_url: None,
                labels: job(&repo).labels,
                runner: Some(name.clone()),
                submitted_s: 0,
                status: ChildStatus::Running,
                placement: Placement::Placed,
                phase: Phase::Busy { job: 7 },
                token: None,
                ran_job: true,
                stopped: false,
                registration: None,
                deregistered_s: None,
            },
        );
        for id in [1, 2] {
            world.registrations.insert(
                id,
                Registration {
                    repo: repo.clone(),
                    name: name.clone(),
                    child: Some(child.clone()),
                    read_s: None,
                },
            );
        }
        // The runner's busy flag lags its job: GitHub lets the delete through, and on this
        // seed the job goes on.
        let mut options = options;
        options.delete_kills_job = false;
        world.jobs.get_mut(&7).expect("the job").flag_at = Some(6);
        assert_eq!(
            world.delete_registration(5, &repo, 1, &options, &mut trace),
            Some(true)
        );
        assert_eq!(
            world.counts.kills_in_window + world.counts.kills_outside_window,
            0
        );
        // The flag shows: refused (422), whoever asks.
        assert_eq!(
            world.delete_registration(6, &repo, 2, &options, &mut trace),
            Some(false)
        );
    }

    #[test]
    fn dispatch_lag_counts_from_cap_room_not_from_queueing() {
        let mut rng = StdRng::seed_from_u64(1);
        let options = Scenario::Steady.options(&mut rng);
        let mut world = World::new(&options, BTreeMap::new());
        let repo = RepoName::parse("afreidah/munchbox").expect("a repo name");
        let bucket = (repo.clone(), job(&repo).labels);
        for id in [1, 2] {
            world.jobs.insert(id, job(&repo));
        }
        // Both queued at 10; the caps leave room for one until 40.
        world.set_queued(1, 10, &options, &mut rng);
        world.set_queued(2, 10, &options, &mut rng);
        for t in 10..40 {
            let mut room = 1;
            world.note_cap_room(t, &mut |_| {
                room -= 1;
                room >= 0
            });
        }
        world.latencies.dispatched(&bucket, 13, &world.jobs);
        for t in 40..45 {
            world.note_cap_room(t, &mut |_| true);
        }
        world.latencies.dispatched(&bucket, 45, &world.jobs);
        // The oldest had room from 10 and was dispatched at 13; the other waited for the
        // cap until 40 (that is the cap's doing) and was dispatched 5 s later.
        assert_eq!(world.latencies.queue_to_dispatch_s, [3, 35]);
        assert_eq!(world.latencies.dispatch_lag_s, [(3, None), (5, None)]);
    }

    #[test]
    fn the_visible_lag_counts_from_when_the_api_shows_the_job() {
        let mut rng = StdRng::seed_from_u64(1);
        let options = Scenario::Steady.options(&mut rng);
        let mut world = World::new(&options, BTreeMap::new());
        let repo = RepoName::parse("afreidah/munchbox").expect("a repo name");
        let bucket = (repo.clone(), job(&repo).labels);
        world.jobs.insert(1, job(&repo));
        world.set_queued(1, 10, &options, &mut rng);
        // Queued at 10 with room all along; the API shows it at 12.
        for t in 10..14 {
            if t == 12 {
                world.jobs.get_mut(&1).expect("queued").visible = Visible::Queued;
            }
            world.note_cap_room(t, &mut |_| true);
        }
        world.latencies.dispatched(&bucket, 13, &world.jobs);
        assert_eq!(world.latencies.dispatch_lag_s, [(3, None)]);
        assert_eq!(world.latencies.dispatch_lag_visible_s, [(1, None)]);
    }
}
