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

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, RngCore, SeedableRng};

use super::options::{ForgeKind, Options};
use super::trace::Trace;
use crate::model::{ChildId, LabelSet, NOMAD_DEFAULT_NAMESPACE, RepoName, RunnerName};
use crate::observe::{ChildStatus, Placement};

/// GitHub cancels a self-hosted job that has been queued this long (BRIEF lesson 11).
pub const QUEUED_JOB_CANCEL_S: i64 = 24 * 3600;

/// Where a job really stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Truth {
    /// Waits (`needs:`) for the job with this id to complete; not listed by the forge yet.
    Gated {
        after: u64,
    },
    Queued,
    Running {
        runner: RunnerName,
        done_at: u64,
    },
    Completed,
    Cancelled,
}

/// What the forge's API shows of a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Visible {
    Hidden,
    Queued,
    Running(RunnerName),
}

#[derive(Clone, Debug)]
pub struct Job {
    pub repo: RepoName,
    pub forge: ForgeKind,
    pub labels: LabelSet,
    /// `runs-on` as the workflow spells it.
    pub raw_labels: Vec<String>,
    pub run: u64,
    pub truth: Truth,
    /// When it was (last) queued; negative for jobs queued before the run began.
    pub queued_at_s: i64,
    pub visible: Visible,
    /// The next visible state and when it shows.
    pub catching_up: Option<(u64, Visible)>,
}

impl Job {
    fn is_terminal(&self) -> bool {
        matches!(self.truth, Truth::Completed | Truth::Cancelled)
    }
}

/// The runner inside a child, as far as it got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No allocation: placed from `eligible_at` on, when the cluster has room.
    Unplaced {
        eligible_at: u64,
    },
    Booting {
        ready_at: u64,
    },
    Idle {
        since: u64,
    },
    Busy {
        job: u64,
    },
    Exited,
}

#[derive(Clone, Debug)]
pub struct SimChild {
    pub parent: String,
    /// `None` for a child dispatched by hand (no `managed_by` marker).
    pub repo: Option<RepoName>,
    pub repo_url: Option<String>,
    pub labels: LabelSet,
    pub runner: Option<RunnerName>,
    pub submitted_s: u64,
    pub status: ChildStatus,
    pub placement: Placement,
    pub phase: Phase,
    /// The registration token as Nomad stores it in meta (a canary: it must never show).
    pub token: Option<String>,
    /// Its runner took a job at some point (a child that never did was a wasted dispatch).
    pub ran_job: bool,
    /// Stopped by the daemon (not a failed start, whatever its runner was doing).
    pub stopped: bool,
    /// The GitHub registration its runner holds, from boot until it leaves on its own (a
    /// runner killed with its allocation leaves it behind, offline).
    pub registration: Option<u64>,
}

impl SimChild {
    /// Its runner registers with GitHub (not Forgejo): GitHub hands jobs only to registered
    /// runners, and lists them.
    fn on_github(&self) -> bool {
        self.repo_url
            .as_deref()
            .is_some_and(|u| u.starts_with("https://github.com/"))
    }
}

/// A runner registration on GitHub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub repo: RepoName,
    pub name: RunnerName,
    /// The child whose runner holds it; `None` for a JIT registration whose child was never
    /// dispatched (GitHub registers a JIT runner when it makes its configuration).
    pub child: Option<ChildId>,
}

/// A bucket's run of failed starts, as the world sees it (for the per-bucket half of I7).
#[derive(Clone, Debug, Default)]
pub struct CrashStreak {
    /// Failed starts since a runner of the bucket last took a job.
    pub failed_starts: u32,
    /// When the last of them happened.
    pub last_failed_s: u64,
    /// Dispatches made for the bucket while the streak ran.
    pub dispatches_s: VecDeque<u64>,
    /// When a runner last ended a streak by taking a job.
    pub ended_s: Option<u64>,
}

/// A run as a workflow defines it, kept for re-runs: each job's labels and the index of the
/// job it needs.
#[derive(Clone, Debug)]
struct RunTemplate {
    repo: usize,
    jobs: Vec<(Vec<&'static str>, Option<usize>)>,
}

/// A new run as a workflow defines it: which repo, its jobs' labels and `needs:`.
fn draw_run(o: &Options, arrivals: &mut StdRng) -> RunTemplate {
    let repo = match o.hot_repos {
        Some((hot, share)) if arrivals.random_bool(share) => {
            arrivals.random_range(0..hot.min(o.repos.len()))
        }
        _ => arrivals.random_range(0..o.repos.len()),
    };
    let count = arrivals.random_range(o.jobs_per_run.0..=o.jobs_per_run.1);
    let jobs = (0..count as usize)
        .map(|i| {
            let labels = o.repos[repo]
                .label_sets
                .choose(arrivals)
                .expect("repos have label sets")
                .clone();
            let needs = (i > 0 && arrivals.random_bool(o.needs_probability)).then(|| i - 1);
            (labels, needs)
        })
        .collect();
    RunTemplate { repo, jobs }
}

/// Counts the invariants are judged by.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    /// Jobs that became queued at some point.
    pub jobs: u64,
    pub jobs_completed: u64,
    /// Jobs cancelled after being queued (by a user, or by GitHub after 24 hours).
    pub jobs_cancelled: u64,
    /// New children (deduplicated dispatches are not new).
    pub dispatches: u64,
    pub dispatches_deduplicated: u64,
    /// Runners that crashed at boot before registering.
    pub failed_starts: u64,
    /// A runner took a job of another bucket (its labels a superset of the job's).
    pub cross_bucket_takes: u64,
    /// Runners that exited on their idle timeout without a job.
    pub idle_exits: u64,
    pub purges: u64,
    /// Children purged while their runner was executing a job (I1).
    pub escaped_busy: u64,
    /// Children purged or stopped while their runner was alive but not busy.
    pub live_runners_purged: u64,
    /// In-flight children the daemon stopped (reaped, replaced or escaped).
    pub stops: u64,
    /// Runner registrations the daemon deleted.
    pub deregistrations: u64,
    /// Children stopped before they were placed (surplus, or past the placement timeout):
    /// each may be replaced by a dispatch for the same job.
    pub unplaced_stopped: u64,
    /// Foreign children purged (never allowed).
    pub foreign_purged: u64,
    /// Jobs GitHub cancelled after 24 hours in the queue: stranded for good.
    pub jobs_expired: u64,
}

impl Counts {
    /// Adds another run's counts (for a sweep's totals).
    pub fn add(&mut self, other: &Counts) {
        self.jobs += other.jobs;
        self.jobs_completed += other.jobs_completed;
        self.jobs_cancelled += other.jobs_cancelled;
        self.dispatches += other.dispatches;
        self.dispatches_deduplicated += other.dispatches_deduplicated;
        self.failed_starts += other.failed_starts;
        self.cross_bucket_takes += other.cross_bucket_takes;
        self.idle_exits += other.idle_exits;
        self.purges += other.purges;
        self.escaped_busy += other.escaped_busy;
        self.live_runners_purged += other.live_runners_purged;
        self.stops += other.stops;
        self.deregistrations += other.deregistrations;
        self.unplaced_stopped += other.unplaced_stopped;
        self.foreign_purged += other.foreign_purged;
        self.jobs_expired += other.jobs_expired;
    }
}

/// How long work waited, as the benchmark measures it, in simulated seconds from when a job
/// was queued (or from the start of the run, for jobs queued before it).
#[derive(Clone, Debug, Default)]
pub struct Latencies {
    /// Queued → the dispatch that served it. Runners are fungible, so dispatches of a bucket
    /// are matched to its queued jobs oldest first; a job a runner took before any dispatch was
    /// matched to it is served by that runner's dispatch.
    pub queue_to_dispatch_s: Vec<u64>,
    /// Queued → a runner took it.
    pub queue_to_start_s: Vec<u64>,
    /// What the loop adds: from the first second at which a job was queued *and* the caps
    /// left room for it (see [`World::note_cap_room`]) to the dispatch matched to it, with
    /// whether its webhook was delivered (`None`: no webhooks in the run). A job a runner
    /// took before any dispatch was matched to it counts from then to that runner's
    /// dispatch (0 when the runner was there first).
    pub dispatch_lag_s: Vec<(u64, Option<bool>)>,
    /// The same lag counted from the first second the job was also *visible* queued in the
    /// API (which shows a new job 0–3 s late): what the loop adds once it could have seen
    /// the job. Only jobs a dispatch was matched to while they were visible.
    pub dispatch_lag_visible_s: Vec<(u64, Option<bool>)>,
    /// Queued jobs of each bucket not yet matched to a dispatch, oldest first.
    unmatched: BTreeMap<(RepoName, LabelSet), VecDeque<u64>>,
    matched: BTreeSet<u64>,
    /// When each unmatched job first had cap room.
    room_since: BTreeMap<u64, u64>,
    /// When each unmatched job first had cap room while the API showed it queued.
    visible_room_since: BTreeMap<u64, u64>,
    /// Whether each job's webhook was delivered (runs with webhooks only).
    webhook: BTreeMap<u64, bool>,
}

impl Latencies {
    fn queued(&mut self, bucket: (RepoName, LabelSet), job: u64) {
        self.unmatched.entry(bucket).or_default().push_back(job);
    }

    /// `job` was matched to a dispatch made at `dispatched_s`, at `t`.
    fn lag(&mut self, job: u64, dispatched_s: u64, t: u64) {
        let room = self.room_since.remove(&job).unwrap_or(t.min(dispatched_s));
        let webhook = self.webhook.get(&job).copied();
        self.dispatch_lag_s
            .push((dispatched_s.saturating_sub(room), webhook));
        if let Some(visible) = self.visible_room_since.remove(&job) {
            self.dispatch_lag_visible_s
                .push((dispatched_s.saturating_sub(visible), webhook));
        }
    }

    /// A dispatch for `bucket` at `t` serves its oldest queued job that has none yet.
    fn dispatched(&mut self, bucket: &(RepoName, LabelSet), t: u64, jobs: &BTreeMap<u64, Job>) {
        let Some(waiting) = self.unmatched.get_mut(bucket) else {
            return;
        };
        while let Some(id) = waiting.pop_front() {
            let Some(job) = jobs.get(&id) else { continue };
            if job.truth != Truth::Queued || self.matched.contains(&id) {
                continue;
            }
            self.matched.insert(id);
            self.queue_to_dispatch_s
                .push(t.saturating_sub(job.queued_at_s.max(0) as u64));
            self.lag(id, t, t);
            return;
        }
    }

    fn started(&mut self, job: &Job, id: u64, t: u64, runner_submitted_s: u64) {
        let queued = job.queued_at_s.max(0) as u64;
        if self.matched.insert(id) {
            self.queue_to_dispatch_s
                .push(runner_submitted_s.saturating_sub(queued));
            self.lag(id, runner_submitted_s, t);
        }
        self.queue_to_start_s.push(t.saturating_sub(queued));
    }
}

/// The world's truth.
pub struct World {
    pub jobs: BTreeMap<u64, Job>,
    pub children: BTreeMap<ChildId, SimChild>,
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
    /// Draws the runs that arrive (see [`World::advance`]).
    arrivals: StdRng,
    /// Draws which webhooks are lost and how late the others arrive.
    webhook_rng: StdRng,
    /// Webhooks on their way: when each arrives, for which repo.
    webhooks_due: BTreeMap<u64, Vec<RepoName>>,
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
            arrivals: StdRng::seed_from_u64(0),
            webhook_rng: StdRng::seed_from_u64(0),
            webhooks_due: BTreeMap::new(),
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
        self.place(t, o, rng, trace);
        self.boot(t, o, rng, trace);
        self.finish_jobs(t, o, rng, trace);
        self.offer_jobs(t, o, rng, trace);
        self.catch_up(t);
    }

    fn start_run(
        &mut self,
        t: u64,
        o: &Options,
        template: RunTemplate,
        trace: &mut Trace,
        rng: &mut StdRng,
    ) {
        let run = self.next_id();
        let repo = self.repo_names[template.repo].clone();
        let forge = o.repos[template.repo].forge;
        let mut ids = Vec::new();
        for (labels, needs) in &template.jobs {
            let id = self.next_id();
            let truth = match needs {
                Some(i) => Truth::Gated { after: ids[*i] },
                None => Truth::Queued,
            };
            let job = Job {
                repo: repo.clone(),
                forge,
                labels: LabelSet::parse(labels).expect("scenario labels are valid"),
                raw_labels: labels.iter().map(|l| l.to_string()).collect(),
                run,
                truth: Truth::Cancelled,
                queued_at_s: t as i64,
                visible: Visible::Hidden,
                catching_up: None,
            };
            self.jobs.insert(id, job);
            if truth == Truth::Queued {
                self.set_queued(id, t, o, rng);
            } else {
                self.jobs.get_mut(&id).expect("just inserted").truth = truth;
            }
            ids.push(id);
        }
        trace.record(t, format!("run {run} in {repo}: jobs {ids:?}"));
        self.runs.insert(run, template);
    }

    /// A job queued almost 24 hours ago: GitHub cancels it during the run unless served.
    fn stale_job(&mut self, o: &Options, trace: &mut Trace, rng: &mut StdRng) {
        let github: Vec<usize> = (0..o.repos.len())
            .filter(|i| o.repos[*i].forge == ForgeKind::GitHub)
            .collect();
        let Some(&repo) = github.choose(&mut self.arrivals) else {
            return;
        };
        let labels = o.repos[repo].label_sets[0].clone();
        self.start_run(
            0,
            o,
            RunTemplate {
                repo,
                jobs: vec![(labels, None)],
            },
            trace,
            rng,
        );
        let id = self.next_id;
        let age = QUEUED_JOB_CANCEL_S - self.arrivals.random_range(60..=1800);
        if let Some(job) = self.jobs.get_mut(&id) {
            job.queued_at_s = -age;
        }
    }

    fn lag(&self, forge: ForgeKind, o: &Options, rng: &mut StdRng) -> u64 {
        match forge {
            ForgeKind::GitHub => rng.random_range(0..=o.status_lag_max_s),
            // Forgejo answers from its database: a claim shows at once (as `waiting` with a
            // task id, which the port reports as claimed).
            ForgeKind::Forgejo => 0,
        }
    }

    fn show(&mut self, id: u64, t: u64, visible: Visible, o: &Options, rng: &mut StdRng) {
        let Some(forge) = self.jobs.get(&id).map(|j| j.forge) else {
            return;
        };
        let at = t + self.lag(forge, o, rng);
        let job = self.jobs.get_mut(&id).expect("checked above");
        job.catching_up = Some((at, visible));
    }

    fn set_queued(&mut self, id: u64, t: u64, o: &Options, rng: &mut StdRng) {
        let job = self.jobs.get_mut(&id).expect("job exists");
        job.truth = Truth::Queued;
        job.queued_at_s = t as i64;
        self.counts.jobs += 1;
        let bucket = (job.repo.clone(), job.labels.clone());
        if let Some(delivered) = self.send_webhook(id, t, o) {
            self.latencies.webhook.insert(id, delivered);
        }
        self.latencies.queued(bucket, id);
        self.show(id, t, Visible::Queued, o, rng);
    }

    /// GitHub sends a `workflow_job` delivery for job `id` (queued, in progress or completed):
    /// lost, or due 0-1 s later. Whether it was delivered; `None` in a run without webhooks
    /// or for a Forgejo job.
    fn send_webhook(&mut self, id: u64, t: u64, o: &Options) -> Option<bool> {
        let webhooks = o.webhooks?;
        let job = self.jobs.get(&id)?;
        if job.forge != ForgeKind::GitHub {
            return None;
        }
        let delivered = !self.webhook_rng.random_bool(webhooks.lost);
        if delivered {
            let at = t + self
                .webhook_rng
                .random_range(webhooks.delay_s.0..=webhooks.delay_s.1);
            self.webhooks_due
                .entry(at)
                .or_default()
                .push(job.repo.clone());
        }
        Some(delivered)
    }

    /// The repos whose `workflow_job` webhooks arrive by `t`, once each delivery.
    pub fn webhooks_arriving(&mut self, t: u64) -> Vec<RepoName> {
        let later = self.webhooks_due.split_off(&(t + 1));
        std::mem::replace(&mut self.webhooks_due, later)
            .into_values()
            .flatten()
            .collect()
    }

    /// Stamps each queued job the caps leave room for with the first second they did, for
    /// the dispatch lag. Jobs not yet matched to a dispatch are taken oldest first, as the
    /// planner serves them, and each takes a unit of room under every cap it counts against
    /// (`has_room` says whether one is left, and takes it): so of three jobs under a cap with
    /// room for one, only the oldest is stamped, and buckets that share a cap share its room.
    pub fn note_cap_room(&mut self, t: u64, has_room: &mut dyn FnMut(&Job) -> bool) {
        let mut waiting: Vec<(i64, u64)> = self
            .latencies
            .unmatched
            .values()
            .flatten()
            .filter(|id| !self.latencies.matched.contains(id))
            .filter_map(|id| {
                let job = self.jobs.get(id)?;
                (job.truth == Truth::Queued).then_some((job.queued_at_s, *id))
            })
            .collect();
        waiting.sort_unstable();
        waiting.dedup();
        for (_, id) in waiting {
            if has_room(&self.jobs[&id]) {
                self.latencies.room_since.entry(id).or_insert(t);
                if self.jobs[&id].visible == Visible::Queued {
                    self.latencies.visible_room_since.entry(id).or_insert(t);
                }
            }
        }
    }

    fn cancel(
        &mut self,
        id: u64,
        t: u64,
        why: &str,
        o: &Options,
        rng: &mut StdRng,
        trace: &mut Trace,
    ) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let was_queued = job.truth == Truth::Queued;
        let was_listed = was_queued || matches!(job.truth, Truth::Running { .. });
        job.truth = Truth::Cancelled;
        if was_queued {
            self.counts.jobs_cancelled += 1;
            trace.record(t, format!("job {id} cancelled ({why})"));
        }
        if was_listed {
            self.send_webhook(id, t, o);
        }
        self.show(id, t, Visible::Hidden, o, rng);
        // Jobs that needed it never run.
        for g in self.gated_after(id) {
            self.cancel(g, t, why, o, rng, trace);
        }
    }

    /// Jobs whose `needs:` wait for job `id`.
    fn gated_after(&self, id: u64) -> Vec<u64> {
        self.jobs
            .iter()
            .filter(|(_, j)| j.truth == Truth::Gated { after: id })
            .map(|(i, _)| *i)
            .collect()
    }

    fn cancel_queued(&mut self, t: u64, o: &Options, rng: &mut StdRng, trace: &mut Trace) {
        let queued: Vec<(u64, i64)> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.truth == Truth::Queued)
            .map(|(id, j)| (*id, j.queued_at_s))
            .collect();
        for (id, queued_at_s) in queued {
            if t as i64 - queued_at_s >= QUEUED_JOB_CANCEL_S {
                self.counts.jobs_expired += 1;
                self.cancel(id, t, "queued for 24 hours", o, rng, trace);
            } else if o.cancel_per_s > 0.0 && rng.random_bool(o.cancel_per_s) {
                self.cancel(id, t, "by a user", o, rng, trace);
                self.maybe_rerun(id, t, o, rng, trace);
            }
        }
    }

    fn maybe_rerun(&mut self, job: u64, t: u64, o: &Options, rng: &mut StdRng, trace: &mut Trace) {
        if t >= o.arrivals_end_s || !rng.random_bool(o.rerun_probability) {
            return;
        }
        let Some(run) = self.jobs.get(&job).map(|j| j.run) else {
            return;
        };
        if let Some(template) = self.runs.remove(&run) {
            trace.record(t, format!("run {run} re-run"));
            self.start_run(t, o, template, trace, rng);
        }
    }

    /// Slots held by our placed, live children and by foreign work.
    fn slots_used(&self, t: u64, o: &Options) -> u32 {
        let ours = self
            .children
            .values()
            .filter(|c| {
                matches!(
                    c.phase,
                    Phase::Booting { .. } | Phase::Idle { .. } | Phase::Busy { .. }
                )
            })
            .count() as u32;
        ours + o.foreign_slots_at(t)
    }

    fn place(&mut self, t: u64, o: &Options, rng: &mut StdRng, trace: &mut Trace) {
        let free = o.cluster_slots.saturating_sub(self.slots_used(t, o));
        if free == 0 {
            return;
        }
        // Child ids sort by submission (unix time, then a counter): first come, first placed.
        let ids: Vec<ChildId> = self
            .children
            .iter()
            .filter(|(_, c)| {
                matches!(c.phase, Phase::Unplaced { eligible_at } if eligible_at <= t)
                    && c.status == ChildStatus::Pending
            })
            .take(free as usize)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            let child = self.children.get_mut(&id).expect("listed above");
            child.phase = Phase::Booting {
                ready_at: t + rng.random_range(o.boot_s.0..=o.boot_s.1),
            };
            child.status = ChildStatus::Running;
            child.placement = Placement::Placed;
            trace.record(t, format!("placed {id}"));
        }
    }

    fn boot(&mut self, t: u64, o: &Options, rng: &mut StdRng, trace: &mut Trace) {
        for (id, child) in &mut self.children {
            if let Phase::Booting { ready_at } = child.phase
                && ready_at <= t
            {
                // Boot crashes are a fault of the cluster: they stop with the other faults.
                if t < o.faults_end_s && rng.random_bool(o.crash_probability) {
                    exit(child);
                    child.placement = Placement::Failed;
                    self.counts.failed_starts += 1;
                    if let Some(repo) = &child.repo {
                        let streak = self
                            .crash_streaks
                            .entry((repo.clone(), child.labels.clone()))
                            .or_default();
                        streak.failed_starts += 1;
                        streak.last_failed_s = t;
                    }
                    trace.record(t, format!("runner of {id} crashed at boot"));
                } else {
                    child.phase = Phase::Idle { since: t };
                    if let (Some(repo), Some(runner)) = (&child.repo, &child.runner)
                        && child.on_github()
                    {
                        // A JIT runner connects under the registration its config names; a
                        // runner with a registration token registers now.
                        let jit = self
                            .registrations
                            .iter()
                            .find(|(_, r)| r.child.as_ref() == Some(id))
                            .map(|(reg, _)| *reg);
                        let registration = jit.unwrap_or_else(|| {
                            self.next_id += 1;
                            self.next_id
                        });
                        child.registration = Some(registration);
                        self.registrations.insert(
                            registration,
                            Registration {
                                repo: repo.clone(),
                                name: runner.clone(),
                                child: Some(id.clone()),
                            },
                        );
                    }
                    trace.record(t, format!("runner of {id} registered"));
                }
            }
        }
    }

    fn finish_jobs(&mut self, t: u64, o: &Options, rng: &mut StdRng, trace: &mut Trace) {
        let done: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(_, j)| matches!(j.truth, Truth::Running { done_at, .. } if done_at <= t))
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            let job = self.jobs.get_mut(&id).expect("listed above");
            let Truth::Running { runner, .. } = job.truth.clone() else {
                continue;
            };
            job.truth = Truth::Completed;
            self.counts.jobs_completed += 1;
            self.send_webhook(id, t, o);
            self.show(id, t, Visible::Hidden, o, rng);
            // The ephemeral runner deregisters and exits after its one job.
            if let Some(child) = self
                .children
                .values_mut()
                .find(|c| c.runner.as_ref() == Some(&runner))
            {
                exit(child);
                if let Some(registration) = child.registration.take() {
                    self.registrations.remove(&registration);
                }
            }
            trace.record(t, format!("job {id} completed on {runner}"));
            for g in self.gated_after(id) {
                self.set_queued(g, t, o, rng);
                trace.record(t, format!("job {g} queued after {id}"));
            }
            let run = self.jobs[&id].run;
            let run_over = self
                .jobs
                .values()
                .filter(|j| j.run == run)
                .all(Job::is_terminal);
            if run_over {
                self.maybe_rerun(id, t, o, rng, trace);
            }
        }
    }

    /// Every idle registered runner is offered a random queued job of its repo whose labels
    /// are all among its own; one with none gives up after the idle timeout.
    fn offer_jobs(&mut self, t: u64, o: &Options, rng: &mut StdRng, trace: &mut Trace) {
        let idle: Vec<ChildId> = self
            .children
            .iter()
            .filter(|(_, c)| matches!(c.phase, Phase::Idle { .. }))
            .map(|(id, _)| id.clone())
            .collect();
        for id in idle {
            let child = &self.children[&id];
            let (Some(repo), Some(runner)) = (child.repo.clone(), child.runner.clone()) else {
                continue;
            };
            // GitHub hands jobs only to a registered runner: one whose registration the daemon
            // deleted waits for nothing (and is stopped next).
            let github = child.on_github();
            if github && child.registration.is_none() {
                continue;
            }
            let offers: Vec<u64> = self
                .jobs
                .iter()
                .filter(|(_, j)| {
                    j.truth == Truth::Queued && j.repo == repo && j.labels.is_subset(&child.labels)
                })
                .map(|(id, _)| *id)
                .collect();
            let child_labels = child.labels.clone();
            let since = match child.phase {
                Phase::Idle { since } => since,
                _ => t,
            };
            match offers.choose(rng) {
                Some(&job_id) => {
                    let done_at = t + rng.random_range(o.job_s.0..=o.job_s.1);
                    let job = self.jobs.get_mut(&job_id).expect("offered");
                    job.truth = Truth::Running {
                        runner: runner.clone(),
                        done_at,
                    };
                    let cross = job.labels != child_labels;
                    if cross {
                        self.counts.cross_bucket_takes += 1;
                    }
                    // A working runner ends its bucket's crash streak. Forgejo names no
                    // runner, so there the daemon can only tell that one of the placed
                    // runners whose labels cover the job's took it: each of their buckets'
                    // streaks ends.
                    let ended: Vec<(RepoName, LabelSet)> = if github {
                        vec![(repo.clone(), child_labels.clone())]
                    } else {
                        let job_labels = job.labels.clone();
                        self.children
                            .values()
                            .filter(|c| {
                                c.repo.as_ref() == Some(&repo)
                                    && matches!(
                                        c.phase,
                                        Phase::Booting { .. }
                                            | Phase::Idle { .. }
                                            | Phase::Busy { .. }
                                    )
                                    && job_labels.is_subset(&c.labels)
                            })
                            .map(|c| (repo.clone(), c.labels.clone()))
                            .chain([(repo.clone(), child_labels.clone())])
                            .collect()
                    };
                    for bucket in ended {
                        self.end_crash_streak(&bucket, t);
                    }
                    let child = self.children.get_mut(&id).expect("listed");
                    child.phase = Phase::Busy { job: job_id };
                    child.ran_job = true;
                    let submitted_s = child.submitted_s;
                    self.latencies
                        .started(&self.jobs[&job_id], job_id, t, submitted_s);
                    self.send_webhook(job_id, t, o);
                    self.show(job_id, t, Visible::Running(runner.clone()), o, rng);
                    trace.record(
                        t,
                        format!(
                            "{runner} took job {job_id}{}",
                            if cross { " (another bucket's)" } else { "" }
                        ),
                    );
                }
                None if t.saturating_sub(since) >= o.idle_timeout_s => {
                    // A runner that gives up idle booted and registered: a working image
                    // ends its bucket's crash streak, as the daemon sees from its clean exit.
                    self.end_crash_streak(&(repo.clone(), child_labels.clone()), t);
                    let child = self.children.get_mut(&id).expect("listed");
                    exit(child);
                    // An idle runner that gives up deregisters on its way out.
                    if let Some(registration) = child.registration.take() {
                        self.registrations.remove(&registration);
                    }
                    self.counts.idle_exits += 1;
                    trace.record(t, format!("{runner} gave up idle"));
                }
                None => {}
            }
        }
    }

    fn catch_up(&mut self, t: u64) {
        for job in self.jobs.values_mut() {
            if let Some((at, _)) = &job.catching_up
                && *at <= t
            {
                job.visible = job.catching_up.take().expect("checked").1;
            }
        }
        self.jobs.retain(|_, j| {
            !(j.is_terminal() && j.visible == Visible::Hidden && j.catching_up.is_none())
        });
    }

    /// Nomad's dispatch: a new pending child without an allocation.
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch(
        &mut self,
        t: u64,
        o: &Options,
        rng: &mut StdRng,
        parent: &str,
        repo_url: &str,
        labels: &str,
        runner: &RunnerName,
        token: Option<String>,
    ) -> ChildId {
        let id = ChildId(
            format!(
                "{parent}/dispatch-{}-{:08x}",
                EPOCH_UNIX + t as i64,
                self.next_id()
            ),
            NOMAD_DEFAULT_NAMESPACE.to_string(),
        );
        let eligible_at = t + rng.random_range(o.place_delay_s.0..=o.place_delay_s.1);
        self.children.insert(
            id.clone(),
            SimChild {
                parent: parent.to_string(),
                repo: self.repo_urls.get(repo_url.trim_end_matches('/')).cloned(),
                repo_url: Some(repo_url.to_string()),
                labels: LabelSet::from_meta(labels).unwrap_or_default(),
                runner: Some(runner.clone()),
                submitted_s: t,
                status: ChildStatus::Pending,
                placement: Placement::Unplaced,
                phase: Phase::Unplaced { eligible_at },
                token,
                ran_job: false,
                stopped: false,
                registration: None,
            },
        );
        // A JIT runner's registration belongs to the child dispatched under its name.
        for registration in self.registrations.values_mut() {
            if registration.child.is_none() && registration.name == *runner {
                registration.child = Some(id.clone());
            }
        }
        self.counts.dispatches += 1;
        let child = &self.children[&id];
        if let Some(repo) = &child.repo
            && let Some(streak) = self
                .crash_streaks
                .get_mut(&(repo.clone(), child.labels.clone()))
            && streak.failed_starts > 0
        {
            streak.dispatches_s.push_back(t);
        }
        if let Some(repo) = child.repo.clone() {
            let bucket = (repo, child.labels.clone());
            self.latencies.dispatched(&bucket, t, &self.jobs);
        }
        id
    }

    /// Nomad's purge: the child disappears, its runner with it.
    pub fn purge(&mut self, t: u64, id: &ChildId, trace: &mut Trace) {
        let Some(mut child) = self.children.remove(id) else {
            return;
        };
        self.counts.purges += 1;
        if child.repo.is_none() && child.repo_url.is_none() {
            self.counts.foreign_purged += 1;
        } else if !child.ran_job {
            self.wasted_purged += 1;
        }
        self.kill_runner(t, id, &mut child, "purged", trace);
    }

    /// Nomad's stop (a deregistration without purge): the allocation is stopped, the runner
    /// with it, and the child stays listed as dead until purged.
    pub fn stop(&mut self, t: u64, id: &ChildId, trace: &mut Trace) {
        let Some(mut child) = self.children.remove(id) else {
            return;
        };
        if child.status.is_in_flight() {
            self.counts.stops += 1;
            if child.repo.is_none() && child.repo_url.is_none() {
                self.counts.foreign_purged += 1;
            }
            if matches!(child.phase, Phase::Unplaced { .. }) {
                self.counts.unplaced_stopped += 1;
            }
            if let Some(repo) = &child.repo {
                self.last_stop_s.insert(repo.clone(), t);
            }
        }
        self.kill_runner(t, id, &mut child, "stopped", trace);
        child.status = ChildStatus::Dead;
        child.stopped = true;
        if child.placement != Placement::Failed {
            child.placement = Placement::Finished;
        }
        self.children.insert(id.clone(), child);
    }

    /// The runner of `child` dies with its allocation. A registration it held stays behind,
    /// offline, as GitHub keeps a runner whose process was killed.
    fn kill_runner(
        &mut self,
        t: u64,
        id: &ChildId,
        child: &mut SimChild,
        how: &str,
        trace: &mut Trace,
    ) {
        match child.phase {
            Phase::Busy { job } => {
                self.counts.escaped_busy += 1;
                trace.record(t, format!("{how} {id} while it ran job {job}"));
                // The job dies with its runner.
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.truth = Truth::Cancelled;
                    j.visible = Visible::Hidden;
                    j.catching_up = None;
                }
            }
            Phase::Booting { .. } | Phase::Idle { .. } => {
                self.counts.live_runners_purged += 1;
                trace.record(t, format!("{how} {id} with a live runner"));
            }
            Phase::Unplaced { .. } | Phase::Exited => trace.record(t, format!("{how} {id}")),
        }
        child.phase = Phase::Exited;
    }

    /// A runner of `bucket` was seen at work at `t`: the bucket's run of failed starts ends.
    fn end_crash_streak(&mut self, bucket: &(RepoName, LabelSet), t: u64) {
        if let Some(streak) = self.crash_streaks.get_mut(bucket)
            && streak.failed_starts > 0
        {
            streak.failed_starts = 0;
            streak.dispatches_s.clear();
            streak.ended_s = Some(t);
        }
    }

    /// GitHub's view of a repo's registrations: (id, name, online, busy). A runner shows
    /// busy once its job shows in progress (the flag lags the truth as job statuses do).
    pub fn registrations_of(&self, repo: &RepoName) -> Vec<(u64, RunnerName, bool, bool)> {
        self.registrations
            .iter()
            .filter(|(_, r)| r.repo == *repo)
            .map(|(id, r)| {
                let child = r.child.as_ref().and_then(|c| self.children.get(c));
                let online = child
                    .is_some_and(|c| matches!(c.phase, Phase::Idle { .. } | Phase::Busy { .. }));
                let busy = child.is_some_and(|c| match c.phase {
                    Phase::Busy { job } => self
                        .jobs
                        .get(&job)
                        .is_some_and(|j| j.visible == Visible::Running(r.name.clone())),
                    _ => false,
                });
                (*id, r.name.clone(), online, busy)
            })
            .collect()
    }

    /// GitHub's `POST …/generate-jitconfig`: registers `name` offline before any runner
    /// exists; `None` when a runner of that name is registered already (409).
    pub fn register_jit(
        &mut self,
        t: u64,
        repo: &RepoName,
        name: &RunnerName,
        trace: &mut Trace,
    ) -> Option<u64> {
        if self
            .registrations
            .values()
            .any(|r| r.repo == *repo && r.name == *name)
        {
            return None;
        }
        self.next_id += 1;
        let id = self.next_id;
        self.registrations.insert(
            id,
            Registration {
                repo: repo.clone(),
                name: name.clone(),
                child: None,
            },
        );
        trace.record(t, format!("JIT runner {name} registered as {id}"));
        Some(id)
    }

    /// GitHub's `DELETE …/runners/{id}`: refused while the runner executes a job (GitHub
    /// knows whom it handed a job, whatever the listing's flag says); `None` when unknown.
    pub fn delete_registration(
        &mut self,
        t: u64,
        repo: &RepoName,
        id: u64,
        trace: &mut Trace,
    ) -> Option<bool> {
        let registration = self
            .registrations
            .get(&id)
            .filter(|r| r.repo == *repo)?
            .clone();
        if let Some(child) = registration
            .child
            .as_ref()
            .and_then(|c| self.children.get(c))
            && let Phase::Busy { job } = child.phase
        {
            // BRIEF lesson 2: a delete has been seen to succeed on a busy runner. Here it does
            // while the runner's `busy` flag still lags its job (the job not yet shown running
            // on it); the runner keeps its job, and only stopping its child would end it.
            let flag_shows = self
                .jobs
                .get(&job)
                .is_some_and(|j| j.visible == Visible::Running(registration.name.clone()));
            if flag_shows {
                trace.record(
                    t,
                    format!(
                        "deleting registration of {} refused: runs job {job}",
                        registration.name
                    ),
                );
                return Some(false);
            }
            trace.record(
                t,
                format!(
                    "registration of {} deleted while it runs job {job} (its busy flag lags)",
                    registration.name
                ),
            );
        }
        self.registrations.remove(&id);
        if let Some(child) = registration
            .child
            .as_ref()
            .and_then(|c| self.children.get_mut(c))
        {
            child.registration = None;
        }
        self.counts.deregistrations += 1;
        trace.record(t, format!("registration of {} deleted", registration.name));
        Some(true)
    }

    /// Children of ours that are pending or running.
    pub fn in_flight(&self) -> impl Iterator<Item = (&ChildId, &SimChild)> {
        self.children
            .iter()
            .filter(|(_, c)| c.repo.is_some() && c.status.is_in_flight())
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

fn exit(child: &mut SimChild) {
    child.phase = Phase::Exited;
    child.status = ChildStatus::Dead;
    child.placement = Placement::Finished;
}

#[cfg(test)]
mod tests {
    use super::*;
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
            },
        );
        for id in [1, 2] {
            world.registrations.insert(
                id,
                Registration {
                    repo: repo.clone(),
                    name: name.clone(),
                    child: Some(child.clone()),
                },
            );
        }
        // The job does not show running on the runner yet: GitHub lets the delete through.
        assert_eq!(
            world.delete_registration(5, &repo, 1, &mut trace),
            Some(true)
        );
        // It shows: refused (422), whoever asks.
        world.jobs.get_mut(&7).expect("the job").visible = Visible::Running(name);
        assert_eq!(
            world.delete_registration(6, &repo, 2, &mut trace),
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
