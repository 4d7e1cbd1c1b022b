//! The control loop over in-memory ports: the traces every operator should see.

mod support;

use chrono::Duration;
use runner_scaler::config::Profile;
use runner_scaler::observe::ChildStatus;
use runner_scaler::sim::memory::MemoryWorld;
use support::memory_loop::{SH, app_config as config, controller, repo, t0};
#[tokio::test]
async fn a_full_cluster_causes_no_extra_dispatches_tick_after_tick() {
    let world = MemoryWorld::new(t0());
    let config = config(&[("acme/api", 5)]);
    let mut ctl = controller(&world);
    for _ in 0..3 {
        world.queue_job(&repo("acme/api"), SH);
    }
    for tick in 0..10 {
        let now = t0() + Duration::seconds(15 * tick);
        let view = ctl.tick(&config, 1, now, false).await;
        if tick > 0 {
            assert_eq!(view.started, 0, "tick {tick} dispatched again");
            assert_eq!(view.active, 3);
        }
    }
    assert_eq!(world.dispatch_count(), 3);
    assert!(
        world
            .children()
            .iter()
            .all(|c| c.child.status == ChildStatus::Pending)
    );
}

#[tokio::test]
async fn a_second_push_does_not_wait_for_the_first_build() {
    let world = MemoryWorld::new(t0());
    let config = config(&[("acme/api", 3)]);
    let mut ctl = controller(&world);
    let first = world.queue_job(&repo("acme/api"), SH);
    ctl.tick(&config, 1, t0(), false).await;
    let child = world.children()[0].child.id.clone();
    world.place(&child);
    world.take_job(&child, first);
    world.queue_job(&repo("acme/api"), SH);
    let view = ctl
        .tick(&config, 1, t0() + Duration::seconds(15), false)
        .await;
    assert_eq!(view.started, 1);
    assert_eq!(world.dispatch_count(), 2);
}

#[tokio::test]
async fn nomad_down_dispatches_nothing_and_the_next_tick_recovers() {
    let world = MemoryWorld::new(t0());
    let config = config(&[("acme/api", 3)]);
    let mut ctl = controller(&world);
    world.queue_job(&repo("acme/api"), SH);
    world.set_nomad_down(true);
    let view = ctl.tick(&config, 1, t0(), false).await;
    assert_eq!(view.started, 0);
    assert!(!view.gaps.is_empty());
    world.set_nomad_down(false);
    let view = ctl
        .tick(&config, 1, t0() + Duration::seconds(15), false)
        .await;
    assert_eq!(view.started, 1);
}

#[tokio::test]
async fn a_dry_run_acts_on_nothing() {
    let world = MemoryWorld::new(t0());
    let config = config(&[("acme/api", 3)]);
    let mut ctl = controller(&world);
    world.queue_job(&repo("acme/api"), SH);
    world.add_foreign_child("ci-runner", ChildStatus::Dead);
    let view = ctl.tick(&config, 1, t0(), true).await;
    assert!(view.dry_run);
    assert_eq!(view.dispatches.len(), 1);
    assert_eq!(view.dispatches[0].outcome, "planned");
    assert_eq!(world.dispatch_count(), 0);
    // The hand-dispatched child is neither counted nor purged.
    assert_eq!(view.active, 0);
    assert!(view.purges.is_empty());
    assert_eq!(world.children().len(), 1);
}

#[tokio::test]
async fn a_parent_that_left_the_document_is_listed_until_its_children_are_gone() {
    let world = MemoryWorld::new(t0());
    let mut with_vm = config(&[("acme/api", 3)]);
    with_vm
        .repos
        .get_mut(&repo("acme/api"))
        .unwrap()
        .profiles
        .push(Profile {
            job: "vm-runner".into(),
            label: "vm".into(),
            max_concurrent: Some(1),
            hard_bound: None,
        });
    let mut ctl = controller(&world);
    let job = world.queue_job(&repo("acme/api"), &["self-hosted", "vm"]);
    ctl.tick(&with_vm, 1, t0(), false).await;
    let child = world.children()[0].child.id.clone();
    assert!(child.0.starts_with("vm-runner/"));
    // The profile is removed while its runner works.
    let without_vm = config(&[("acme/api", 3)]);
    world.place(&child);
    world.take_job(&child, job);
    world.finish_job(job);
    ctl.tick(&without_vm, 2, t0() + Duration::seconds(15), false)
        .await;
    assert!(
        world.children().is_empty(),
        "the dead vm-runner child was not purged"
    );
}

/// A queue source whose first call panics, as a bug met by some input would.
struct PanicsOnce {
    inner: MemoryWorld,
    panicked: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl runner_scaler::observe::QueueSource for PanicsOnce {
    async fn list_jobs(
        &self,
        repo: &runner_scaler::config::RepoConfig,
    ) -> Result<runner_scaler::observe::RepoJobs, runner_scaler::observe::PortError> {
        if !self
            .panicked
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            panic!("a bug met by some input");
        }
        self.inner.list_jobs(repo).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_tick_costs_only_that_tick() {
    use runner_scaler::config::watch::ConfigState;
    use std::sync::Arc;

    let world = MemoryWorld::new(t0());
    world.queue_job(&repo("acme/api"), SH);
    let mut services = world.services();
    services.github = Some(runner_scaler::control_loop::Forge {
        queue: Arc::new(PanicsOnce {
            inner: world.clone(),
            panicked: Default::default(),
        }),
        registrar: Arc::new(world.clone()),
        runners: None,
        registered: None,
    });
    let settings = runner_scaler::control_loop::LoopSettings::default();
    let poll = settings.poll_interval;
    let controller = runner_scaler::control_loop::Controller::new(
        services,
        settings,
        Box::new(<rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1)),
    );
    let (_tx, rx) = tokio::sync::watch::channel(ConfigState {
        config: Some(Arc::new(config(&[("acme/api", 3)]))),
        applied_index: Some(1),
        ..ConfigState::default()
    });
    let dispatched = {
        let world = world.clone();
        async move {
            // Virtual time: each wait is one poll interval of the paused clock.
            while world.dispatch_count() == 0 {
                tokio::time::sleep(poll).await;
            }
        }
    };
    let ran = tokio::time::timeout(
        poll * 10,
        runner_scaler::control_loop::run(
            controller,
            rx,
            &runner_scaler::clock::SystemClock,
            false,
            dispatched,
        ),
    )
    .await;
    assert!(ran.is_ok(), "the loop did not survive the panicking tick");
    assert_eq!(world.dispatch_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_first_tick_follows_the_first_document_not_the_next_interval() {
    use runner_scaler::config::watch::ConfigState;
    use std::sync::Arc;

    let world = MemoryWorld::new(t0());
    world.queue_job(&repo("acme/api"), SH);
    let settings = runner_scaler::control_loop::LoopSettings::default();
    let poll = settings.poll_interval;
    let controller = runner_scaler::control_loop::Controller::new(
        world.services(),
        settings,
        Box::new(<rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1)),
    );
    // The watcher has not answered when the loop starts; it does a moment later.
    let (tx, rx) = tokio::sync::watch::channel(ConfigState::default());
    let started = tokio::time::Instant::now();
    let dispatched = {
        let world = world.clone();
        async move {
            tokio::time::sleep(poll / 10).await;
            tx.send_replace(ConfigState {
                config: Some(Arc::new(config(&[("acme/api", 3)]))),
                applied_index: Some(1),
                ..ConfigState::default()
            });
            while world.dispatch_count() == 0 {
                tokio::time::sleep(poll / 100).await;
            }
        }
    };
    runner_scaler::control_loop::run(
        controller,
        rx,
        &runner_scaler::clock::SystemClock,
        false,
        dispatched,
    )
    .await;
    assert_eq!(world.dispatch_count(), 1);
    assert!(
        started.elapsed() < poll,
        "the first dispatch waited {:?}, a whole poll interval",
        started.elapsed()
    );
}
