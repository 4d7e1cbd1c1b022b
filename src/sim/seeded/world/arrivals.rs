//! Work arriving: runs drawn from the run's arrivals stream (a burst at the start, then a
//! steady rate), the stale jobs queued almost 24 hours before the run began, and re-runs of a
//! finished or cancelled run. The stream is the run's own, so every strategy of the benchmark
//! meets the same runs at the same times.

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;

use super::entities::{Job, Truth, Visible};
use super::{QUEUED_JOB_CANCEL_S, World};
use crate::model::LabelSet;
use crate::sim::seeded::options::{ForgeKind, Options};
use crate::sim::seeded::trace::Trace;

/// A run as a workflow defines it, kept for re-runs: each job's labels and the index of the
/// job it needs.
#[derive(Clone, Debug)]
pub(super) struct RunTemplate {
    repo: usize,
    jobs: Vec<(Vec<&'static str>, Option<usize>)>,
}

/// A new run as a workflow defines it: which repo, its jobs' labels and `needs:`.
pub(super) fn draw_run(o: &Options, arrivals: &mut StdRng) -> RunTemplate {
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

impl World {
    pub(super) fn start_run(
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
                searched: Visible::Hidden,
                searched_catching_up: None,
                flag_at: None,
                told_at: None,
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
    pub(super) fn stale_job(&mut self, o: &Options, trace: &mut Trace, rng: &mut StdRng) {
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

    pub(super) fn maybe_rerun(
        &mut self,
        job: u64,
        t: u64,
        o: &Options,
        rng: &mut StdRng,
        trace: &mut Trace,
    ) {
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
}
