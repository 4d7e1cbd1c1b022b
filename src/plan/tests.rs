//! The planner as tables: each case states a claim about one situation.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, TimeZone, Utc};

use super::*;
use crate::config::{Mode, Profile, RepoConfig};
use crate::model::ErrorClass;
use crate::observe::{Child, ChildStatus, ForgeJob, Gap, JobState, Placement, RepoJobs};

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()
}

fn repo(name: &str) -> RepoName {
    RepoName::parse(name).unwrap()
}

fn url(name: &str) -> String {
    format!("https://github.com/{name}")
}

fn labels(list: &[&str]) -> LabelSet {
    LabelSet::parse(list).unwrap()
}

/// An app-mode repo routing everything to `ci-runner`, capped at `cap`.
fn app_repo(name: &str, cap: u32) -> RepoConfig {
    RepoConfig {
        repo: repo(name),
        mode: Mode::App,
        max_concurrent: cap,
        profiles: vec![],
        default_job: Some("ci-runner".into()),
        labels: None,
        search_labels_as_written: Default::default(),
        credential: Default::default(),
        nomad_namespace: None,
    }
}

fn with_profile(mut r: RepoConfig, job: &str, label: &str, cap: Option<u32>) -> RepoConfig {
    r.profiles.push(Profile {
        job: job.into(),
        label: label.into(),
        max_concurrent: cap,
        hard_bound: None,
    });
    r
}

struct World {
    config: Config,
    snapshot: Snapshot,
    holds: Holds,
    settings: PlanSettings,
    next_id: u64,
}

impl World {
    fn new(repos: Vec<RepoConfig>) -> World {
        let mut snapshot = Snapshot::default();
        let mut config = Config::default();
        for r in repos {
            snapshot
                .repos
                .insert(r.repo.clone(), Ok(RepoJobs::default()));
            snapshot
                .repo_urls
                .insert(url(&r.repo.to_string()), r.repo.clone());
            for parent in r.parents() {
                snapshot.parents.insert(parent, Ok(vec![]));
            }
            config.repos.insert(r.repo.clone(), r);
        }
        World {
            config,
            snapshot,
            holds: Holds::default(),
            settings: PlanSettings::default(),
            next_id: 1,
        }
    }

    fn job(&mut self, name: &str, job_labels: &[&str], state: JobState, age_s: i64) -> &mut Self {
        self.next_id += 1;
        let job = ForgeJob {
            id: self.next_id,
            labels: job_labels.iter().map(|s| s.to_string()).collect(),
            state,
            queued_at: Some(t0() - Duration::seconds(age_s)),
        };
        self.snapshot
            .repos
            .get_mut(&repo(name))
            .unwrap()
            .as_mut()
            .unwrap()
            .jobs
            .push(job);
        self
    }

    fn queued(&mut self, name: &str, job_labels: &[&str], age_s: i64) -> &mut Self {
        self.job(name, job_labels, JobState::Queued, age_s)
    }

    fn child(
        &mut self,
        parent: &str,
        name: &str,
        child_labels: &[&str],
        runner: &str,
        status: ChildStatus,
        placement: Placement,
    ) -> &mut Self {
        self.next_id += 1;
        let child = Child {
            id: ChildId::new(
                format!("{parent}/dispatch-1789592462-{:08x}", self.next_id),
                "default",
            ),
            parent: parent.into(),
            status,
            placement,
            ours: true,
            repo_url: Some(url(name)),
            labels: Some(labels(child_labels).to_meta()),
            runner_name: Some(RunnerName(runner.into())),
            submitted_at: None,
            placed_at: None,
        };
        self.snapshot
            .parents
            .entry(parent.into())
            .or_insert_with(|| Ok(vec![]))
            .as_mut()
            .unwrap()
            .push(child);
        self
    }

    /// The listed children of `parent`, to edit.
    fn children_of(&mut self, parent: &str) -> &mut Vec<Child> {
        self.snapshot
            .parents
            .get_mut(parent)
            .and_then(|listing| listing.as_mut().ok())
            .expect("a listed parent")
    }

    /// `parent`'s children could not be listed this tick.
    fn unlisted(&mut self, parent: &str, message: &str) -> &mut Self {
        self.snapshot.parents.insert(
            parent.into(),
            Err(Gap {
                class: ErrorClass::Transient,
                message: message.into(),
            }),
        );
        self
    }

    fn plan(&self) -> Plan {
        plan(PlanInput {
            config: &self.config,
            snapshot: &self.snapshot,
            settings: self.settings,
            holds: &self.holds,
            now: t0(),
        })
    }
}

fn bucket<'a>(plan: &'a Plan, name: &str, bucket_labels: &[&str]) -> &'a BucketPlan {
    let key = BucketKey {
        repo: repo(name),
        labels: labels(bucket_labels),
    };
    plan.buckets
        .iter()
        .find(|b| b.key == key)
        .unwrap_or_else(|| panic!("no bucket {key} in {:#?}", plan.buckets))
}

const SH: &[&str] = &["self-hosted"];

#[test]
fn one_queued_job_gets_one_runner() {
    let mut w = World::new(vec![app_repo("acme/api", 3)]);
    w.queued("acme/api", SH, 10);
    let p = w.plan();
    assert_eq!(p.dispatches.len(), 1);
    assert_eq!(p.dispatches[0].parent, "ci-runner");
    assert_eq!((p.queued_total, p.in_flight_total), (1, 0));
}

#[test]
fn a_pending_child_without_allocation_is_supply() {
    // The cluster is full: the child cannot be placed, yet it occupies the slot and serves
    // the job once placed. Dispatching again every tick is the seed's bug (lesson 5).
    let mut w = World::new(vec![app_repo("acme/api", 3)]);
    w.queued("acme/api", SH, 10).child(
        "ci-runner",
        "acme/api",
        SH,
        "r1",
        ChildStatus::Pending,
        Placement::Unplaced,
    );
    let p = w.plan();
    assert!(p.dispatches.is_empty());
    assert_eq!(
        bucket(&p, "acme/api", SH).reason,
        Some(HoldReason::Satisfied)
    );
    assert_eq!(p.in_flight_total, 1);
}

#[test]
fn a_busy_runner_is_not_supply_for_a_new_queued_job() {
    // Cap 3, one child busy on an in-progress job, one new queued job → dispatch 1: the
    // second push must not wait for the first build.
    let mut w = World::new(vec![app_repo("acme/api", 3)]);
    w.child(
        "ci-runner",
        "acme/api",
        SH,
        "r1",
        ChildStatus::Running,
        Placement::Placed,
    )
    .job(
        "acme/api",
        SH,
        JobState::InProgress {
            runner: Some(RunnerName("r1".into())),
        },
        60,
    )
    .queued("acme/api", SH, 5);
    let p = w.plan();
    assert_eq!(p.dispatches.len(), 1);
    let b = bucket(&p, "acme/api", SH);
    assert_eq!(
        (b.queued, b.in_progress, b.in_flight, b.to_dispatch),
        (1, 1, 1, 1)
    );
}

#[test]
fn a_job_counts_in_the_bucket_of_the_runner_that_took_it() {
    // A runner with labels {go, self-hosted} took a {self-hosted} job: the go bucket is busy
    // and its own go job is still queued, so go needs a runner; the plain job is served.
    let mut w = World::new(vec![with_profile(
        app_repo("acme/api", 5),
        "go-ci-runner",
        "go",
        Some(3),
    )]);
    let go = &["self-hosted", "go"];
    w.child(
        "go-ci-runner",
        "acme/api",
        go,
        "go1",
        ChildStatus::Running,
        Placement::Placed,
    )
    .child(
        "ci-runner",
        "acme/api",
        SH,
        "plain1",
        ChildStatus::Running,
        Placement::Placed,
    )
    .job(
        "acme/api",
        SH,
        JobState::InProgress {
            runner: Some(RunnerName("go1".into())),
        },
        60,
    )
    .queued("acme/api", go, 50);
    let p = w.plan();
    let go_bucket = bucket(&p, "acme/api", go);
    assert_eq!(
        (go_bucket.queued, go_bucket.in_progress, go_bucket.in_flight),
        (1, 1, 1)
    );
    assert_eq!(go_bucket.to_dispatch, 1);
    assert_eq!(p.dispatches.len(), 1);
    assert_eq!(p.dispatches[0].parent, "go-ci-runner");
    // The plain bucket's idle runner is left alone: nothing queued there, nothing dispatched.
    assert_eq!(bucket(&p, "acme/api", SH).to_dispatch, 0);
}

#[test]
fn in_progress_jobs_on_someone_elses_runner_are_not_demand() {
    let mut w = World::new(vec![app_repo("acme/api", 3)]);
    w.job(
        "acme/api",
        SH,
        JobState::InProgress {
            runner: Some(RunnerName("somebody-elses".into())),
        },
        60,
    );
    let p = w.plan();
    assert!(p.dispatches.is_empty());
    assert!(p.buckets.is_empty());
}

#[test]
fn caps_count_every_in_flight_child_busy_or_idle() {
    let mut w = World::new(vec![app_repo("acme/api", 2)]);
    w.child(
        "ci-runner",
        "acme/api",
        SH,
        "r1",
        ChildStatus::Running,
        Placement::Placed,
    )
    .job(
        "acme/api",
        SH,
        JobState::InProgress {
            runner: Some(RunnerName("r1".into())),
        },
        60,
    );
    for age in [30, 20, 10] {
        w.queued("acme/api", SH, age);
    }
    let p = w.plan();
    let b = bucket(&p, "acme/api", SH);
    assert_eq!((b.missing, b.to_dispatch), (3, 1));
    assert_eq!(b.reason, Some(HoldReason::RepoCap));
}

#[test]
fn profile_caps_bind_before_repo_caps() {
    let mut w = World::new(vec![with_profile(
        app_repo("acme/api", 10),
        "vm-runner",
        "vm",
        Some(1),
    )]);
    let vm = &["self-hosted", "vm"];
    w.queued("acme/api", vm, 30).queued("acme/api", vm, 20);
    let p = w.plan();
    let b = bucket(&p, "acme/api", vm);
    assert_eq!(b.to_dispatch, 1);
    assert_eq!(b.reason, Some(HoldReason::ProfileCap));
    assert_eq!(b.cap, Some(1));
}

#[test]
fn buckets_sharing_a_cap_are_served_oldest_job_first() {
    let mut w = World::new(vec![with_profile(
        app_repo("acme/api", 2),
        "go-ci-runner",
        "go",
        None,
    )]);
    let go = &["self-hosted", "go"];
    w.queued("acme/api", SH, 100)
        .queued("acme/api", go, 300)
        .queued("acme/api", go, 50)
        .queued("acme/api", SH, 10);
    let p = w.plan();
    // Oldest two: go (300 s) and plain (100 s).
    assert_eq!(bucket(&p, "acme/api", go).to_dispatch, 1);
    assert_eq!(bucket(&p, "acme/api", SH).to_dispatch, 1);
    assert_eq!(p.dispatches[0].parent, "go-ci-runner");
    assert_eq!(p.dispatches[1].parent, "ci-runner");
}

#[test]
fn the_global_cap_counts_children_of_every_repo() {
    let mut w = World::new(vec![app_repo("acme/api", 5), app_repo("acme/web", 5)]);
    w.settings.max_in_flight = Some(2);
    w.child(
        "ci-runner",
        "acme/web",
        SH,
        "w1",
        ChildStatus::Pending,
        Placement::Unplaced,
    )
    .queued("acme/web", SH, 100)
    .queued("acme/web", SH, 90)
    .queued("acme/api", SH, 95)
    .queued("acme/api", SH, 5);
    let p = w.plan();
    assert_eq!(p.dispatches.len(), 1);
    assert_eq!(p.dispatches[0].bucket.repo, repo("acme/api"));
    assert_eq!(
        bucket(&p, "acme/web", SH).reason,
        Some(HoldReason::GlobalCap)
    );
}

#[test]
fn zero_pauses_a_repo() {
    let mut w = World::new(vec![app_repo("acme/api", 0)]);
    w.queued("acme/api", SH, 10);
    let p = w.plan();
    assert!(p.dispatches.is_empty());
    assert_eq!(bucket(&p, "acme/api", SH).reason, Some(HoldReason::Paused));
}

#[test]
fn hostile_labels_are_unroutable_and_never_dispatched() {
    let mut w = World::new(vec![app_repo("acme/api", 3)]);
    w.queued("acme/api", &["self-hosted", "$(id)"], 10);
    let p = w.plan();
    assert!(p.dispatches.is_empty());
    assert_eq!(p.unroutable.len(), 1);
    assert!(matches!(
        p.unroutable[0].reason,
        UnroutableReason::LabelRejected(_)
    ));
}

#[test]
fn a_job_without_a_profile_or_default_job_is_unroutable() {
    let mut r = with_profile(app_repo("acme/api", 3), "vm-runner", "vm", Some(1));
    r.default_job = None;
    let mut w = World::new(vec![r]);
    w.queued("acme/api", SH, 10);
    let p = w.plan();
    assert!(p.dispatches.is_empty());
    assert_eq!(
        p.unroutable[0].reason,
        UnroutableReason::NoRoute(Unroutable::NoParent)
    );
    assert!(matches!(
        bucket(&p, "acme/api", SH).reason,
        Some(HoldReason::Unroutable(_))
    ));
}

#[test]
fn labels_outside_the_allow_list_are_unroutable() {
    let mut r = app_repo("acme/api", 3);
    r.labels = Some(["linux".to_string()].into());
    let mut w = World::new(vec![r]);
    w.queued("acme/api", &["self-hosted", "linux"], 10).queued(
        "acme/api",
        &["self-hosted", "gpu"],
        10,
    );
    let p = w.plan();
    assert_eq!(p.dispatches.len(), 1);
    assert_eq!(
        p.unroutable[0].reason,
        UnroutableReason::NoRoute(Unroutable::LabelNotAllowed("gpu".into()))
    );
}

#[test]
fn no_dispatch_without_a_fresh_in_flight_count() {
    let mut w = World::new(vec![app_repo("acme/api", 3)]);
    w.queued("acme/api", SH, 10);
    w.unlisted("ci-runner", "connection refused");
    let p = w.plan();
    assert!(p.dispatches.is_empty());
    assert!(matches!(
        bucket(&p, "acme/api", SH).reason,
        Some(HoldReason::InFlightUnknown(_))
    ));
}

#[test]
fn a_failed_parent_listing_holds_everything_under_a_global_cap() {
    let mut w = World::new(vec![
        app_repo("acme/api", 3),
        with_profile(app_repo("acme/web", 3), "vm-runner", "vm", None),
    ]);
    w.settings.max_in_flight = Some(10);
    w.queued("acme/api", SH, 10);
    w.unlisted("vm-runner", "timeout");
    assert!(w.plan().dispatches.is_empty());
    w.settings.max_in_flight = None;
    assert_eq!(w.plan().dispatches.len(), 1);
}

#[test]
fn a_failed_listing_of_a_parent_the_document_no_longer_names_holds_every_repo() {
    // An edit moved acme/api from ci-runner to new-runner while a child of it still ran under
    // ci-runner; this tick ci-runner cannot be listed. Its children may be any repo's.
    let mut api = app_repo("acme/api", 1);
    api.default_job = Some("new-runner".into());
    let mut w = World::new(vec![api, app_repo("acme/web", 1)]);
    w.config
        .repos
        .get_mut(&repo("acme/web"))
        .unwrap()
        .default_job = Some("new-runner".into());
    w.snapshot.parents.remove("ci-runner");
    w.queued("acme/api", SH, 10).queued("acme/web", SH, 10);
    w.unlisted("ci-runner", "502");
    let p = w.plan();
    assert!(p.dispatches.is_empty(), "{:#?}", p.dispatches);
    for name in ["acme/api", "acme/web"] {
        assert!(
            matches!(
                bucket(&p, name, SH).reason,
                Some(HoldReason::InFlightUnknown(ref why)) if why.contains("ci-runner")
            ),
            "{name}: {:?}",
            bucket(&p, name, SH).reason
        );
    }
    // Listed again (its child of acme/api counted), both repos dispatch within their caps.
    w.snapshot.parents.insert("ci-runner".into(), Ok(vec![]));
    w.child(
        "ci-runner",
        "acme/api",
        SH,
        "ci-runner-0123456789ab",
        ChildStatus::Running,
        Placement::Placed,
    );
    let p = w.plan();
    let repos: Vec<String> = p
        .dispatches
        .iter()
        .map(|d| d.bucket.repo.to_string())
        .collect();
    assert_eq!(repos, ["acme/web"]);
}

#[test]
fn the_hard_bound_counts_from_placement_not_from_submission() {
    // Submitted 5 days and 40 minutes ago, placed 45 minutes later: its job has run at most
    // 4 days 23 hours 55 minutes, inside GitHub's 5 days, and it is busy.
    let mut w = World::new(vec![app_repo("acme/api", 3)]);
    let runner = "ci-runner-0123456789ab";
    w.child(
        "ci-runner",
        "acme/api",
        SH,
        runner,
        ChildStatus::Running,
        Placement::Placed,
    );
    w.job(
        "acme/api",
        SH,
        JobState::InProgress {
            runner: Some(RunnerName(runner.into())),
        },
        5 * 86_400,
    );
    let submitted = t0() - Duration::minutes(5 * 24 * 60 + 40);
    let set_times = |w: &mut World, placed_at: DateTime<Utc>| {
        let children = w.children_of("ci-runner");
        children[0].submitted_at = Some(submitted);
        children[0].placed_at = Some(placed_at);
    };
    set_times(&mut w, submitted + Duration::minutes(45));
    let p = w.plan();
    assert!(p.nominations.is_empty(), "{:#?}", p.nominations);
    // Placed 5 days and 31 minutes ago: past the bound (5 days and 30 minutes), wedged.
    set_times(&mut w, t0() - Duration::minutes(5 * 24 * 60 + 31));
    let p = w.plan();
    assert_eq!(p.nominations.len(), 1);
    assert_eq!(p.nominations[0].nomination, Nomination::Wedged);
}

#[test]
fn an_unreadable_queue_holds_only_its_repo() {
    let mut w = World::new(vec![app_repo("acme/api", 3), app_repo("acme/web", 3)]);
    w.queued("acme/web", SH, 10);
    w.child(
        "ci-runner",
        "acme/api",
        SH,
        "r1",
        ChildStatus::Pending,
        Placement::Unplaced,
    );
    w.snapshot.repos.insert(
        repo("acme/api"),
        Err(Gap {
            class: ErrorClass::Transient,
            message: "502".into(),
        }),
    );
    let p = w.plan();
    assert_eq!(p.dispatches.len(), 1);
    assert_eq!(p.dispatches[0].bucket.repo, repo("acme/web"));
    assert!(matches!(
        bucket(&p, "acme/api", SH).reason,
        Some(HoldReason::QueueUnknown(_))
    ));
}

#[test]
fn dead_children_of_ours_are_purged_and_foreign_ones_never() {
    let mut w = World::new(vec![app_repo("acme/api", 3)]);
    w.child(
        "ci-runner",
        "acme/api",
        SH,
        "r1",
        ChildStatus::Dead,
        Placement::Finished,
    )
    .child(
        "ci-runner",
        "acme/api",
        SH,
        "r2",
        ChildStatus::Dead,
        Placement::Unplaced,
    )
    .child(
        "ci-runner",
        "acme/api",
        SH,
        "r3",
        ChildStatus::Running,
        Placement::Placed,
    );
    let listing = w.children_of("ci-runner");
    listing[2].ours = false;
    listing.push(Child {
        ours: false,
        status: ChildStatus::Dead,
        id: ChildId::new("ci-runner/dispatch-1-deadbeef", "default"),
        ..listing[0].clone()
    });
    let p = w.plan();
    assert_eq!(p.purges.len(), 2);
    assert!(
        !p.purges
            .contains(&ChildId::new("ci-runner/dispatch-1-deadbeef", "default"))
    );
    // The foreign running child is not counted.
    assert_eq!(p.in_flight_total, 0);
}

#[test]
fn forgejo_claimed_jobs_count_only_up_to_the_buckets_children() {
    let mut r = app_repo("alex/s3", 3);
    r.mode = Mode::Forgejo {
        url: url::Url::parse("http://forgejo:3000").unwrap(),
        vault_path: "forgejo/scaler".into(),
        allow_shared_token: false,
    };
    let mut w = World::new(vec![r]);
    let build = &["build"];
    // Two jobs claimed (one possibly by someone else's runner), one child of ours, one new job.
    w.job("alex/s3", build, JobState::Claimed, 60)
        .job("alex/s3", build, JobState::Claimed, 50)
        .queued("alex/s3", build, 5)
        .child(
            "ci-runner",
            "alex/s3",
            build,
            "f1",
            ChildStatus::Running,
            Placement::Placed,
        );
    let p = w.plan();
    let b = bucket(&p, "alex/s3", build);
    assert_eq!((b.in_progress, b.in_flight, b.to_dispatch), (1, 1, 1));
}

#[test]
fn children_of_a_repo_that_left_the_document_count_globally_but_never_dispatch() {
    let mut w = World::new(vec![app_repo("acme/api", 3)]);
    w.settings.max_in_flight = Some(1);
    w.snapshot
        .repo_urls
        .insert(url("acme/gone"), repo("acme/gone"));
    w.child(
        "ci-runner",
        "acme/gone",
        SH,
        "g1",
        ChildStatus::Running,
        Placement::Placed,
    )
    .queued("acme/api", SH, 10);
    let p = w.plan();
    assert!(p.dispatches.is_empty());
    assert_eq!(
        bucket(&p, "acme/gone", SH).reason,
        Some(HoldReason::NotConfigured)
    );
    assert_eq!(
        bucket(&p, "acme/api", SH).reason,
        Some(HoldReason::GlobalCap)
    );
}

#[test]
fn holds_stop_only_their_parent_and_repo() {
    let mut w = World::new(vec![app_repo("acme/api", 3), app_repo("acme/web", 3)]);
    w.queued("acme/api", SH, 10).queued("acme/web", SH, 10);
    w.holds.parents.insert(
        ("ci-runner".into(), repo("acme/api")),
        "Dispatch request included unpermitted metadata keys".into(),
    );
    let p = w.plan();
    assert_eq!(p.dispatches.len(), 1);
    assert_eq!(p.dispatches[0].bucket.repo, repo("acme/web"));
}

#[test]
fn the_plan_is_deterministic() {
    let mut w = World::new(vec![app_repo("acme/api", 4), app_repo("acme/web", 4)]);
    for age in 0..6 {
        w.queued("acme/api", SH, age * 7)
            .queued("acme/web", SH, age * 7);
    }
    assert_eq!(w.plan(), w.plan());
    let order: BTreeMap<_, _> = w
        .plan()
        .dispatches
        .iter()
        .enumerate()
        .map(|(i, d)| (i, d.bucket.repo.to_string()))
        .collect();
    assert_eq!(order.len(), 8);
}

#[test]
fn jobs_naming_one_runner_twice_count_it_once_and_never_panic() {
    // A forge's listing is untrusted: two in-progress jobs naming the same runner must not
    // make a bucket miss more runners than it has queued jobs to give them.
    let mut w = World::new(vec![app_repo("acme/api", 5)]);
    let on_r1 = || JobState::InProgress {
        runner: Some(RunnerName("r1".into())),
    };
    w.child(
        "ci-runner",
        "acme/api",
        SH,
        "r1",
        ChildStatus::Running,
        Placement::Placed,
    )
    .job("acme/api", SH, on_r1(), 60)
    .job("acme/api", SH, on_r1(), 50)
    .queued("acme/api", SH, 5);
    let p = w.plan();
    let b = bucket(&p, "acme/api", SH);
    assert_eq!(
        (b.in_progress, b.in_flight, b.missing, b.to_dispatch),
        (1, 1, 1, 1)
    );
}

/// The repo of the wider-runner cases: `self-hosted` jobs go to `ci-runner`, `gpu` ones to
/// `gpu-runner`.
fn gpu_repo() -> RepoConfig {
    with_profile(app_repo("acme/api", 4), "gpu-runner", "gpu", None)
}

const GPU: &[&str] = &["self-hosted", "gpu"];

/// A wider runner of `gpu` whose own job went away, placed or not, busy or not, and one
/// queued `self-hosted` job: is a runner dispatched for it?
#[test]
fn a_spare_placed_runner_of_a_wider_label_set_takes_a_narrower_job() {
    struct Case {
        name: &'static str,
        placement: Placement,
        /// The wide runner runs a job of its own.
        busy: bool,
        /// The wide runner is in another repo.
        other_repo: bool,
        dispatches: usize,
    }
    let cases = [
        Case {
            name: "placed and idle: it takes the job",
            placement: Placement::Placed,
            busy: false,
            other_repo: false,
            dispatches: 0,
        },
        Case {
            name: "unplaced: it may never be placed, so it is not counted",
            placement: Placement::Unplaced,
            busy: false,
            other_repo: false,
            dispatches: 1,
        },
        Case {
            name: "busy: it has no room",
            placement: Placement::Placed,
            busy: true,
            other_repo: false,
            dispatches: 1,
        },
        Case {
            name: "another repo's runner never takes this repo's job",
            placement: Placement::Placed,
            busy: false,
            other_repo: true,
            dispatches: 1,
        },
    ];
    for case in cases {
        let mut other = with_profile(app_repo("acme/web", 4), "gpu-runner", "gpu", None);
        other.default_job = Some("ci-runner".into());
        let mut w = World::new(vec![gpu_repo(), other]);
        let wide_repo = if case.other_repo {
            "acme/web"
        } else {
            "acme/api"
        };
        w.child(
            "gpu-runner",
            wide_repo,
            GPU,
            "g1",
            ChildStatus::Running,
            case.placement,
        )
        .queued("acme/api", SH, 5);
        if case.busy {
            w.job(
                wide_repo,
                GPU,
                JobState::InProgress {
                    runner: Some(RunnerName("g1".into())),
                },
                60,
            );
        }
        let p = w.plan();
        assert_eq!(p.dispatches.len(), case.dispatches, "{}", case.name);
        let b = bucket(&p, "acme/api", SH);
        if case.dispatches == 0 {
            assert_eq!(b.covered_by_wider, 1, "{}", case.name);
            assert_eq!(
                b.reason,
                Some(HoldReason::CoveredByWider { runners: 1 }),
                "{}",
                case.name
            );
        } else {
            assert_eq!(b.covered_by_wider, 0, "{}", case.name);
        }
    }
}

#[test]
fn a_narrower_runner_never_covers_a_wider_job() {
    let mut w = World::new(vec![gpu_repo()]);
    w.child(
        "ci-runner",
        "acme/api",
        SH,
        "r1",
        ChildStatus::Running,
        Placement::Placed,
    )
    .queued("acme/api", GPU, 5);
    let p = w.plan();
    assert_eq!(p.dispatches.len(), 1);
    assert_eq!(p.dispatches[0].parent, "gpu-runner");
}

#[test]
fn one_spare_wider_runner_covers_one_narrower_job() {
    let mut w = World::new(vec![gpu_repo()]);
    w.child(
        "gpu-runner",
        "acme/api",
        GPU,
        "g1",
        ChildStatus::Running,
        Placement::Placed,
    )
    .queued("acme/api", SH, 9)
    .queued("acme/api", SH, 5);
    let p = w.plan();
    let b = bucket(&p, "acme/api", SH);
    assert_eq!((b.covered_by_wider, b.missing, b.to_dispatch), (1, 1, 1));
}

#[test]
fn a_forgejo_claim_no_child_of_its_bucket_explains_withholds_a_wider_runner() {
    // Forgejo names no runner on a claimed job. A `build` job claimed while the bucket has
    // no child of ours may be running on our wider `build,docker` runner, which then only
    // looks idle: counting it for the next `build` job would leave that job waiting for a
    // whole build.
    let mut r = app_repo("alex/s3", 4);
    r.mode = Mode::Forgejo {
        url: url::Url::parse("http://forgejo:3000").unwrap(),
        vault_path: "forgejo/scaler".into(),
        allow_shared_token: false,
    };
    let build: &[&str] = &["build"];
    let docker: &[&str] = &["build", "docker"];
    for claimed in [false, true] {
        let mut w = World::new(vec![r.clone()]);
        w.child(
            "ci-runner",
            "alex/s3",
            docker,
            "f1",
            ChildStatus::Running,
            Placement::Placed,
        )
        .queued("alex/s3", build, 5);
        if claimed {
            w.job("alex/s3", build, JobState::Claimed, 60);
        }
        let p = w.plan();
        assert_eq!(
            p.dispatches.len(),
            usize::from(claimed),
            "claimed elsewhere: {claimed}"
        );
    }
}

#[test]
fn a_wider_runner_counted_for_a_narrower_job_is_not_surplus() {
    let mut w = World::new(vec![gpu_repo()]);
    w.settings.reap = ReapPolicy::default();
    w.child(
        "gpu-runner",
        "acme/api",
        GPU,
        "g1",
        ChildStatus::Running,
        Placement::Placed,
    );
    // Old enough to be nominated when nothing needs it.
    let grace = w.settings.reap.orphan_grace;
    for child in w.snapshot.parents.values_mut().flatten().flatten() {
        child.submitted_at = Some(t0() - Duration::from_std(grace * 2).unwrap());
    }
    let idle = w.plan();
    assert_eq!(idle.nominations.len(), 1, "nothing to take: surplus");
    assert_eq!(idle.nominations[0].nomination, Nomination::Surplus);

    w.queued("acme/api", SH, 5);
    let needed = w.plan();
    assert!(needed.dispatches.is_empty());
    assert!(
        needed.nominations.is_empty(),
        "counted for the queued job, so not surplus: {:?}",
        needed.nominations
    );
}

#[test]
fn the_operators_pause_stops_every_dispatch_and_nothing_else() {
    let mut w = World::new(vec![app_repo("acme/api", 3), app_repo("acme/web", 3)]);
    w.queued("acme/api", SH, 10)
        .queued("acme/web", SH, 5)
        .child(
            "ci-runner",
            "acme/api",
            SH,
            "r1",
            ChildStatus::Dead,
            Placement::Finished,
        );
    assert_eq!(
        w.plan().dispatches.len(),
        2,
        "unpaused, both repos get a runner"
    );
    w.holds.paused = Some("runners/paused is set: incident 123".into());
    let p = w.plan();
    assert!(p.dispatches.is_empty());
    for repo in ["acme/api", "acme/web"] {
        assert_eq!(
            bucket(&p, repo, SH).reason,
            Some(HoldReason::PausedByOperator(
                "runners/paused is set: incident 123".into()
            ))
        );
    }
    assert_eq!(p.purges.len(), 1, "dead children are still purged");
}

/// A repo whose queue was not polled this tick carries its last reading: it is shown, but
/// nothing is dispatched on it (a job it shows queued may have been taken since) and no
/// runner is taken back on it (a job may have arrived since).
#[test]
fn a_queue_reading_carried_from_an_earlier_tick_neither_dispatches_nor_reaps() {
    for carried in [false, true] {
        let mut w = World::new(vec![app_repo("acme/api", 3), app_repo("acme/web", 3)]);
        w.queued("acme/api", SH, 10).child(
            "ci-runner",
            "acme/web",
            SH,
            "r1",
            ChildStatus::Running,
            Placement::Placed,
        );
        if carried {
            for name in ["acme/api", "acme/web"] {
                w.snapshot
                    .unpolled
                    .insert(repo(name), t0() - Duration::seconds(40));
            }
        }
        let p = w.plan();
        let api = bucket(&p, "acme/api", SH);
        assert_eq!(
            api.queued, 1,
            "carried: {carried}: the reading is still shown"
        );
        if carried {
            assert!(p.dispatches.is_empty(), "dispatched on an old reading");
            assert_eq!(
                api.reason,
                Some(HoldReason::NotPolled {
                    read_at: t0() - Duration::seconds(40)
                })
            );
            assert!(p.nominations.is_empty(), "reaped on an old reading");
        } else {
            assert_eq!(p.dispatches.len(), 1);
            assert_eq!(
                p.nominations.len(),
                1,
                "the idle runner of acme/web is surplus"
            );
        }
    }
}

/// An `app` repo capped at `cap` with one queued job and one running child, placed
/// `placed_min_ago` minutes ago, whose runner no job names.
fn placed_runner_with_a_queued_job(cap: u32, placed_min_ago: i64) -> World {
    let mut w = World::new(vec![app_repo("acme/api", cap)]);
    w.queued("acme/api", SH, 5).child(
        "ci-runner",
        "acme/api",
        SH,
        "r1",
        ChildStatus::Running,
        Placement::Placed,
    );
    let child = &mut w.children_of("ci-runner")[0];
    child.placed_at = Some(t0() - Duration::minutes(placed_min_ago));
    child.submitted_at = Some(t0() - Duration::minutes(placed_min_ago + 1));
    w
}

/// Defect 1 of issue 19: a runner whose registration the daemon deleted can take no job, so
/// it is no supply (a replacement goes out if a cap has room) though its allocation still
/// holds its slot; it is stopped on the first fresh reading taken the listing lag after the
/// delete that names it in no job, and counts as supply again if a job names it.
#[test]
fn a_deregistered_runner_is_no_supply_but_holds_its_slot_until_a_fresh_reading_stops_it() {
    let deleted = |w: &mut World, ago_s: i64| {
        let id = w.children_of("ci-runner")[0].id.clone();
        w.snapshot
            .deregistered
            .insert(id, t0() - Duration::seconds(ago_s));
    };
    let world = |cap: u32| placed_runner_with_a_queued_job(cap, 20);

    let mut w = world(2);
    let counted = w.plan();
    assert!(
        counted.dispatches.is_empty(),
        "registered, it takes the job"
    );
    deleted(&mut w, 60);
    let p = w.plan();
    let b = bucket(&p, "acme/api", SH);
    assert_eq!((b.in_flight, b.deregistered, b.missing), (1, 1, 1), "{b:?}");
    assert_eq!(p.dispatches.len(), 1, "a replacement goes out beside it");
    assert_eq!(p.nominations.len(), 1);
    assert_eq!(p.nominations[0].nomination, Nomination::Deregistered);

    let mut w = world(1);
    deleted(&mut w, 60);
    let p = w.plan();
    assert!(p.dispatches.is_empty());
    assert_eq!(
        bucket(&p, "acme/api", SH).reason,
        Some(HoldReason::RepoCap),
        "its allocation still holds the slot"
    );
    assert_eq!(p.nominations[0].nomination, Nomination::Deregistered);

    // Too soon after the delete for a job it took to show: kept, not stopped.
    let mut w = world(1);
    deleted(&mut w, 10);
    assert!(w.plan().nominations.is_empty(), "stopped inside the lag");
    // A reading carried from an earlier tick proves nothing about now.
    let mut w = world(1);
    deleted(&mut w, 60);
    w.snapshot
        .unpolled
        .insert(repo("acme/api"), t0() - Duration::seconds(15));
    assert!(w.plan().nominations.is_empty(), "stopped on an old reading");

    // A job in progress names it: it took the job before the delete landed, and serves it.
    let mut w = world(2);
    deleted(&mut w, 60);
    w.job(
        "acme/api",
        SH,
        JobState::InProgress {
            runner: Some(RunnerName("r1".into())),
        },
        30,
    );
    let p = w.plan();
    let b = bucket(&p, "acme/api", SH);
    assert_eq!(
        (b.in_progress, b.deregistered, b.missing),
        (1, 0, 1),
        "{b:?}"
    );
    assert!(p.nominations.is_empty(), "a busy runner is never nominated");
}

/// Issue 19, defect 2: a placed `app` runner named by no job is nominated as unregistered
/// only on a queue reading of this tick. A runner whose registration was deleted as it took a
/// job has one busy signal left, the job naming it; with the repo's reading failed or carried
/// from an earlier tick, that signal is missing, not negative.
#[test]
fn an_unregistered_runner_is_nominated_only_on_a_fresh_queue_reading() {
    let world = |reading: &str| {
        let mut w = placed_runner_with_a_queued_job(3, 30);
        match reading {
            "failed" => {
                w.snapshot.repos.insert(
                    repo("acme/api"),
                    Err(Gap {
                        class: ErrorClass::Transient,
                        message: "list runs: 502".into(),
                    }),
                );
            }
            "carried" => {
                w.snapshot
                    .unpolled
                    .insert(repo("acme/api"), t0() - Duration::seconds(40));
            }
            _ => {}
        }
        w.plan()
    };
    let fresh = world("fresh");
    assert_eq!(fresh.nominations.len(), 1);
    assert_eq!(fresh.nominations[0].nomination, Nomination::Unregistered);
    for reading in ["failed", "carried"] {
        assert!(
            world(reading).nominations.is_empty(),
            "{reading}: nominated without a fresh reading"
        );
    }
}

/// Defect 7 of issue 19: Nomad reads a stopped child `dead` at once, while its task still
/// winds down inside `kill_timeout` and the job summary counts its allocation running. Until
/// that allocation ends it holds its slot under every cap, supplies nothing, and is neither
/// purged nor nominated again.
#[test]
fn a_stopped_child_whose_allocation_still_runs_holds_its_slot_and_is_not_purged_yet() {
    let stopping = |w: &mut World| {
        w.children_of("ci-runner")[0].status = ChildStatus::Dead;
    };

    let mut w = placed_runner_with_a_queued_job(1, 20);
    stopping(&mut w);
    let p = w.plan();
    assert!(
        p.dispatches.is_empty(),
        "its allocation still holds the slot"
    );
    let b = bucket(&p, "acme/api", SH);
    assert_eq!((b.in_flight, b.stopping, b.missing), (1, 1, 1), "{b:?}");
    assert_eq!(b.reason, Some(HoldReason::RepoCap));
    assert!(p.purges.is_empty(), "purged while its task runs");
    assert!(p.nominations.is_empty(), "nominated once stopped");
    assert_eq!(p.in_flight_total, 1);

    // With room under the cap, a replacement goes out beside it: it takes no job.
    let mut w = placed_runner_with_a_queued_job(2, 20);
    stopping(&mut w);
    assert_eq!(w.plan().dispatches.len(), 1);

    // Once the allocation ended, the slot is free and the child is purged.
    let mut w = placed_runner_with_a_queued_job(1, 20);
    stopping(&mut w);
    w.children_of("ci-runner")[0].placement = Placement::Finished;
    let p = w.plan();
    assert_eq!(p.purges.len(), 1);
    assert_eq!(p.dispatches.len(), 1);
}
