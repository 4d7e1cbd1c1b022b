//! The indexed planner agrees with the plain one (`reference.rs`) on random small worlds.
//!
//! The worlds are drawn from small pools of repos, parents, labels and runner names so that
//! collisions happen often: shared buckets, runners named twice, repos that left the
//! document, hostile labels, failed listings, holds and every cap.

use chrono::{DateTime, Duration, TimeZone, Utc};
use proptest::prelude::*;

use super::*;
use crate::config::{Mode, Profile, RepoConfig};
use crate::model::{ErrorClass, RunnerName};
use crate::observe::{Child, ChildStatus, ForgeJob, Gap, Placement, RepoJobs};

const REPOS: &[&str] = &["acme/api", "acme/web", "other/x", "acme/gone"];
const PARENTS: &[&str] = &["ci-runner", "go-ci-runner", "vm-runner"];
const PROFILE_LABELS: &[&str] = &["go", "vm", "linux"];
/// Labels a job may carry besides `self-hosted`; " Go" normalises to "go".
const JOB_LABELS: &[&str] = &["go", "vm", "linux", "build", " Go"];
const META_LABELS: &[&str] = &[
    "self-hosted",
    "go,self-hosted",
    "go,self-hosted",
    "self-hosted,vm",
    "linux,self-hosted",
    "build,self-hosted",
    "bad label",
    "",
];
const RUNNERS: &[&str] = &["r0", "r1", "r2", "r3"];

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()
}

fn repo_name(i: usize) -> RepoName {
    RepoName::parse(REPOS[i]).unwrap()
}

fn url(i: usize) -> String {
    format!("https://github.com/{}", REPOS[i])
}

fn gap(message: &str) -> Gap {
    Gap {
        class: ErrorClass::Transient,
        message: message.into(),
    }
}

fn profile() -> impl Strategy<Value = Profile> {
    (
        0..PARENTS.len(),
        0..PROFILE_LABELS.len(),
        prop::option::of(0u32..3),
    )
        .prop_map(|(job, label, cap)| Profile {
            job: PARENTS[job].into(),
            label: PROFILE_LABELS[label].into(),
            max_concurrent: cap,
            hard_bound: None,
        })
}

/// A repo of the document, by index into `REPOS`.
fn repo_config(i: usize) -> impl Strategy<Value = RepoConfig> {
    (
        any::<bool>(),
        0u32..6,
        prop::collection::vec(profile(), 0..3),
        prop::option::weighted(0.8, 0..PARENTS.len()),
        prop::option::weighted(
            0.3,
            prop::collection::btree_set(
                prop::sample::select(&["linux", "go", "vm", "build"][..]),
                0..3,
            ),
        ),
    )
        .prop_map(
            move |(forgejo, max_concurrent, profiles, default_job, labels)| RepoConfig {
                repo: repo_name(i),
                mode: if forgejo {
                    Mode::Forgejo {
                        url: url::Url::parse("http://forgejo:3000").unwrap(),
                        vault_path: "forgejo/scaler".into(),
                        allow_shared_token: false,
                    }
                } else {
                    Mode::App
                },
                max_concurrent,
                profiles,
                default_job: default_job.map(|p| PARENTS[p].to_string()),
                labels: labels.map(|set| set.into_iter().map(String::from).collect()),
                search_labels_as_written: Default::default(),
                credential: Default::default(),
                nomad_namespace: None,
            },
        )
}

fn job() -> impl Strategy<Value = ForgeJob> {
    (
        0u64..12,
        prop_oneof![
            8 => prop::collection::vec(prop::sample::select(JOB_LABELS), 0..3).prop_map(|mut l| {
                l.insert(0, "self-hosted");
                l
            }),
            1 => Just(vec![]),
            1 => Just(vec!["self-hosted", "$(id)"]),
        ],
        prop_oneof![
            4 => Just(JobState::Queued),
            2 => prop::sample::select(RUNNERS)
                .prop_map(|r| JobState::InProgress { runner: Some(RunnerName(r.into())) }),
            1 => Just(JobState::InProgress { runner: None }),
            1 => Just(JobState::Claimed),
        ],
        prop::option::of(0i64..100),
    )
        .prop_map(|(id, labels, state, age)| ForgeJob {
            id,
            labels: labels.into_iter().map(String::from).collect(),
            state,
            queued_at: age.map(|s| t0() - Duration::seconds(s)),
        })
}

fn queue() -> impl Strategy<Value = Option<Result<RepoJobs, Gap>>> {
    prop_oneof![
        1 => Just(None),
        1 => Just(Some(Err(gap("502 Bad Gateway")))),
        10 => prop::collection::vec(job(), 0..10)
            .prop_map(|jobs| Some(Ok(RepoJobs { jobs, truncated: false }))),
    ]
}

fn child() -> impl Strategy<Value = Child> {
    (
        0u32..1000,
        prop::bool::weighted(0.8),
        prop::sample::select(
            &[
                ChildStatus::Pending,
                ChildStatus::Running,
                ChildStatus::Dead,
            ][..],
        ),
        0..REPOS.len() + 2,
        prop::option::of(prop::sample::select(META_LABELS)),
        prop::option::of(prop::sample::select(RUNNERS)),
        // Only a placed runner of a wider label set is counted for a narrower job.
        prop::bool::weighted(0.8),
    )
        .prop_map(|(id, ours, status, repo, labels, runner, placed)| Child {
            id: ChildId::new(format!("dispatch-{id:08x}"), "default"),
            parent: String::new(),
            status,
            // A dead child still placed is stopping (inside `kill_timeout`); the reference is
            // fed none, as none deregistered: their rules are tabled in `tests.rs`.
            placement: if placed && status != ChildStatus::Dead {
                Placement::Placed
            } else {
                Placement::Unplaced
            },
            ours,
            // One past the pool is a repo we never configured; two past is no `repo_url`.
            repo_url: match repo {
                r if r < REPOS.len() && id % 2 == 0 => Some(format!("{}/", url(r))),
                r if r < REPOS.len() => Some(url(r)),
                r if r == REPOS.len() => Some("https://github.com/nobody/else".into()),
                _ => None,
            },
            labels: labels.map(String::from),
            runner_name: runner.map(|r| RunnerName(r.into())),
            submitted_at: None,
            placed_at: None,
        })
}

fn listing() -> impl Strategy<Value = Option<Result<Vec<Child>, Gap>>> {
    prop_oneof![
        1 => Just(None),
        1 => Just(Some(Err(gap("connection refused")))),
        12 => prop::collection::vec(child(), 0..8).prop_map(|c| Some(Ok(c))),
    ]
}

#[derive(Debug)]
struct World {
    config: Config,
    snapshot: Snapshot,
    holds: Holds,
    settings: PlanSettings,
}

fn world() -> impl Strategy<Value = World> {
    (
        // Which of the first three repos are in the document ("acme/gone" never is).
        prop::collection::vec(prop::bool::weighted(0.85), 3),
        (repo_config(0), repo_config(1), repo_config(2)),
        prop::collection::vec(queue(), REPOS.len()),
        prop::collection::vec(any::<bool>(), REPOS.len()),
        prop::collection::vec(listing(), PARENTS.len()),
        prop::option::weighted(0.2, (0..PARENTS.len(), 0..REPOS.len())),
        prop::option::weighted(0.2, 0..REPOS.len()),
        prop::option::of(0u32..8),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(
                in_doc,
                configs,
                queues,
                known_urls,
                listings,
                parent_holds,
                repo_holds,
                cap,
                paused,
            )| {
                let mut config = Config::default();
                let configs = [configs.0, configs.1, configs.2];
                for (present, repo) in in_doc.into_iter().zip(configs) {
                    if present {
                        config.repos.insert(repo.repo.clone(), repo);
                    }
                }
                let mut snapshot = Snapshot::default();
                for (i, queue) in queues.into_iter().enumerate() {
                    if let Some(queue) = queue {
                        snapshot.repos.insert(repo_name(i), queue);
                    }
                }
                for (i, known) in known_urls.into_iter().enumerate() {
                    if known {
                        snapshot.repo_urls.insert(url(i), repo_name(i));
                    }
                }
                for (p, listing) in listings.into_iter().enumerate() {
                    if let Some(listing) = listing {
                        let listing = listing.map(|children| {
                            children
                                .into_iter()
                                .map(|c| Child {
                                    id: ChildId::new(
                                        format!("{}/{}", PARENTS[p], c.id.0),
                                        c.id.1.clone(),
                                    ),
                                    parent: PARENTS[p].into(),
                                    ..c
                                })
                                .collect()
                        });
                        snapshot.parents.insert(PARENTS[p].into(), listing);
                    }
                }
                let mut holds = Holds::default();
                if let Some((p, r)) = parent_holds {
                    holds
                        .parents
                        .insert((PARENTS[p].into(), repo_name(r)), "refused".into());
                }
                if let Some(r) = repo_holds {
                    holds.repos.insert(repo_name(r), "minting refused".into());
                }
                if paused {
                    holds.paused = Some("runners/paused is set".into());
                }
                World {
                    config,
                    snapshot,
                    holds,
                    settings: PlanSettings {
                        max_in_flight: cap,
                        ..PlanSettings::default()
                    },
                }
            },
        )
}

proptest! {
    // Failures are printed, shrunk, with the case that reproduces them; nothing is written
    // next to the sources (the top level holds only what the project ships).
    #![proptest_config(ProptestConfig {
        cases: 2_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_indexed_planner_agrees_with_the_plain_one(w in world()) {
        let input = PlanInput {
            config: &w.config,
            snapshot: &w.snapshot,
            settings: w.settings,
            holds: &w.holds,
            now: t0(),
        };
        // Nominations are a pass of their own over the same supply and demand, checked by the
        // nomination tests; the plain formulation stops at dispatches and purges.
        let mut indexed = plan(input);
        indexed.nominations.clear();
        prop_assert_eq!(indexed, reference::plan(input));
    }
}
