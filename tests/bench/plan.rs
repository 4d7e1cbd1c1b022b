//! Planner micro-benchmark: 1,000 repos × 10,000 queued jobs × 2,000 in-flight children, and
//! the same world ten times over (10,000 × 100,000 × 20,000), so that a part of the planner
//! growing faster than its input shows as a ratio between the two well above ten.
//!
//! Run with `cargo bench --bench plan`. It measures; it asserts nothing about time.

use std::collections::BTreeMap;

use chrono::{Duration, TimeZone, Utc};
use criterion::{Criterion, criterion_group, criterion_main};
use runner_scaler::config::{Config, Mode, Profile, RepoConfig};
use runner_scaler::model::{ChildId, LabelSet, RepoName, RunnerName};
use runner_scaler::observe::{
    Child, ChildStatus, ForgeJob, JobState, Placement, RepoJobs, Snapshot,
};
use runner_scaler::plan::{Holds, PlanInput, PlanSettings, plan};

const JOBS_PER_REPO: usize = 10;
const CHILDREN_PER_REPO: usize = 2;

/// Repos per world: the usual size, and ten times it.
const SIZES: &[usize] = &[1_000, 10_000];

/// Label sets a repo's jobs cycle through: the default job and two profiles.
const LABEL_SETS: &[&[&str]] = &[
    &["self-hosted"],
    &["self-hosted", "linux", "go"],
    &["self-hosted", "vm"],
];

fn world(repos: usize) -> (Config, Snapshot) {
    let now = Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap();
    let mut config = Config::default();
    let mut snapshot = Snapshot::default();
    let mut parents: BTreeMap<String, Vec<Child>> = BTreeMap::new();
    let mut id = 0u64;
    for r in 0..repos {
        let name = RepoName::parse(&format!("owner{}/repo{r}", r % 37)).unwrap();
        let url = format!("https://github.com/{name}");
        config.repos.insert(
            name.clone(),
            RepoConfig {
                repo: name.clone(),
                mode: Mode::App,
                max_concurrent: 8,
                profiles: vec![
                    Profile {
                        job: "go-ci-runner".into(),
                        label: "go".into(),
                        max_concurrent: Some(4),
                        hard_bound: None,
                    },
                    Profile {
                        job: "vm-runner".into(),
                        label: "vm".into(),
                        max_concurrent: Some(1),
                        hard_bound: None,
                    },
                ],
                default_job: Some("ci-runner".into()),
                labels: None,
                search_labels_as_written: Default::default(),
                credential: Default::default(),
                nomad_namespace: None,
            },
        );
        snapshot.repo_urls.insert(url.clone(), name.clone());
        let jobs = (0..JOBS_PER_REPO)
            .map(|j| {
                id += 1;
                ForgeJob {
                    id,
                    labels: LABEL_SETS[j % LABEL_SETS.len()]
                        .iter()
                        .map(|s| s.to_string())
                        .collect(),
                    state: JobState::Queued,
                    queued_at: Some(now - Duration::seconds((id % 900) as i64)),
                }
            })
            .collect();
        snapshot.repos.insert(
            name.clone(),
            Ok(RepoJobs {
                jobs,
                truncated: false,
            }),
        );
        for c in 0..CHILDREN_PER_REPO {
            id += 1;
            let labels = LabelSet::parse(LABEL_SETS[c % LABEL_SETS.len()]).unwrap();
            let parent = if c % 2 == 0 {
                "ci-runner"
            } else {
                "go-ci-runner"
            };
            parents.entry(parent.to_string()).or_default().push(Child {
                id: ChildId::new(format!("{parent}/dispatch-1789592462-{id:08x}"), "default"),
                parent: parent.to_string(),
                status: if c % 2 == 0 {
                    ChildStatus::Pending
                } else {
                    ChildStatus::Running
                },
                placement: if c % 2 == 0 {
                    Placement::Unplaced
                } else {
                    Placement::Placed
                },
                ours: true,
                repo_url: Some(url.clone()),
                labels: Some(labels.to_meta()),
                runner_name: Some(RunnerName(format!("{parent}-{id:012x}"))),
                submitted_at: None,
                placed_at: None,
            });
        }
    }
    for parent in config.parents() {
        let children = parents.remove(&parent).unwrap_or_default();
        snapshot.parents.insert(parent, Ok(children));
    }
    (config, snapshot)
}

fn bench_plan(c: &mut Criterion) {
    let now = Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap();
    let holds = Holds::default();
    let mut group = c.benchmark_group("plan");
    for &repos in SIZES {
        let (config, snapshot) = world(repos);
        let input = PlanInput {
            config: &config,
            snapshot: &snapshot,
            settings: PlanSettings {
                // Five per repo: the global cap binds some buckets at every size.
                max_in_flight: Some(5 * repos as u32),
                ..PlanSettings::default()
            },
            holds: &holds,
            now,
        };
        // The world is what its name says.
        let sample = plan(input);
        assert_eq!(sample.queued_total as usize, repos * JOBS_PER_REPO);
        assert_eq!(sample.in_flight_total as usize, repos * CHILDREN_PER_REPO);
        let name = format!(
            "{repos} repos x {} jobs x {} children",
            repos * JOBS_PER_REPO,
            repos * CHILDREN_PER_REPO
        );
        group.bench_function(name, |b| b.iter(|| plan(std::hint::black_box(input))));
    }
    group.finish();
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
