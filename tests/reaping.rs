//! Taking runners back, end to end through the real controller over the in-memory world:
//! the ephemerd incident replayed, the idle confirmation, crash-loop backoff, and a restart
//! after an edit of the document.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::SeedableRng;
use runner_scaler::config::Config;
use runner_scaler::control_loop::{Controller, LoopSettings};
use runner_scaler::model::ChildId;
use runner_scaler::observe::{ChildStatus, JobState, Placement};
use runner_scaler::plan::reap::ReapPolicy;
use runner_scaler::report::TickView;
use runner_scaler::sim::memory::MemoryWorld;
use support::memory_loop::{SH, app_config, repo, t0};

fn at(seconds: i64) -> DateTime<Utc> {
    t0() + chrono::Duration::seconds(seconds)
}

/// A controller that polls every `poll_s` and takes runners back after `grace_s`, an idle
/// reading confirmed after `confirm_s`.
fn reaping_controller(
    world: &MemoryWorld,
    poll_s: u64,
    grace_s: u64,
    confirm_s: u64,
) -> Controller {
    let mut settings = LoopSettings {
        poll_interval: Duration::from_secs(poll_s),
        ..LoopSettings::default()
    };
    settings.plan.reap = ReapPolicy {
        orphan_grace: Duration::from_secs(grace_s),
        idle_confirm: Duration::from_secs(confirm_s),
        ..ReapPolicy::default()
    };
    Controller::new(
        world.services(),
        settings,
        Box::new(rand::rngs::StdRng::seed_from_u64(7)),
    )
}

async fn tick(ctl: &mut Controller, world: &MemoryWorld, config: &Config, t: i64) -> TickView {
    world.set_now(at(t));
    ctl.tick(config, 1, at(t), false).await
}

fn child_ids(world: &MemoryWorld) -> Vec<ChildId> {
    world
        .children()
        .iter()
        .map(|c| c.child.id.clone())
        .collect()
}

fn is_busy(world: &MemoryWorld, child: &ChildId) -> bool {
    let runner = world
        .children()
        .into_iter()
        .find(|c| c.child.id == *child)
        .and_then(|c| c.child.runner_name);
    world.jobs().values().any(|j| {
        matches!(&j.state, JobState::InProgress { runner: Some(r) } if Some(r) == runner.as_ref())
    })
}

/// Seed 000, as its own proof ran it, with a 5-second grace: three jobs with identical labels
/// and three runners; GitHub hands the runners the jobs in another order than they were
/// dispatched for, and one runner's in_progress reaches the API three seconds after a
/// sibling's job completed. A fourth runner, whose job was cancelled, is genuinely idle.
#[tokio::test(start_paused = true)]
async fn the_seed_000_incident_replayed_destroys_no_runner_that_runs_a_job() {
    let world = MemoryWorld::new(at(0));
    let api = repo("acme/api");
    let config = app_config(&[("acme/api", 4)]);
    let mut ctl = reaping_controller(&world, 1, 5, 2);

    let jobs: Vec<u64> = (0..4).map(|_| world.queue_job(&api, SH)).collect();
    let view = tick(&mut ctl, &world, &config, 0).await;
    assert_eq!(view.started, 4, "{view:#?}");
    let children = child_ids(&world);
    world.cancel_job(jobs[3]);
    let registrations: Vec<u64> = children
        .iter()
        .map(|c| {
            world.place(c);
            world.register_runner(c)
        })
        .collect();
    // Another order than dispatched: runner 0 takes job 2, runner 2 takes job 0, and runner
    // 1 takes job 1, whose in_progress (and the runner's busy flag) has not reached the API:
    // the job is neither listed queued nor in progress.
    world.take_job(&children[0], jobs[2]);
    world.take_job(&children[2], jobs[0]);
    world.take_job(&children[1], jobs[1]);
    world.hide_job(jobs[1], true);
    world.set_runner_busy(registrations[0], true);
    world.set_runner_busy(registrations[2], true);

    let mut vetoed = BTreeSet::new();
    for t in 1..=12 {
        if t == 6 {
            // A sibling's job completes; its runner leaves.
            world.finish_job(jobs[0]);
        }
        if t == 9 {
            // Three seconds later, runner 1's in_progress reaches the API.
            world.hide_job(jobs[1], false);
            world.set_runner_busy(registrations[1], true);
        }
        let view = tick(&mut ctl, &world, &config, t).await;
        for reap in &view.reaps {
            if reap.outcome == "vetoed" {
                vetoed.insert(reap.child.clone());
            }
        }
        for stopped in world.stopped() {
            assert!(
                !is_busy(&world, &stopped),
                "t={t}: {stopped} was stopped while its runner ran a job"
            );
        }
    }
    world.finish_job(jobs[2]);
    world.finish_job(jobs[1]);
    // The idle runner's registration is deleted first; its child is stopped once a reading
    // the job listing's lag could not hide a job from names it in none.
    for t in 13..=50 {
        tick(&mut ctl, &world, &config, t).await;
    }

    assert!(
        vetoed.contains(&children[1].0),
        "runner 1's nomination was never vetoed: {vetoed:?}"
    );
    // All three jobs ran to the end on the runners GitHub gave them to.
    assert!(
        jobs[..3].iter().all(|j| !world.jobs().contains_key(j)),
        "{:?}",
        world.jobs()
    );
    // The genuinely idle runner was taken back, registration first; no other was.
    assert_eq!(world.stopped(), vec![children[3].clone()]);
    assert_eq!(world.deregistered(), vec![registrations[3]]);
    // And nothing is left in flight.
    assert!(
        world
            .children()
            .iter()
            .all(|c| c.child.status == ChildStatus::Dead || !c.child.ours)
            || world.children().is_empty()
    );
}

/// GitHub has been seen to delete a busy runner's registration (BRIEF lesson 2), so the 422
/// cannot be the only guard: an idle reading counts only once it held for the confirmation,
/// and a runner whose job shows in between is kept.
#[tokio::test(start_paused = true)]
async fn an_idle_reading_must_hold_for_the_confirmation_before_a_runner_is_taken_back() {
    let world = MemoryWorld::new(at(0));
    world.set_deletes_busy_runners(true);
    let api = repo("acme/api");
    let config = app_config(&[("acme/api", 2)]);
    let mut ctl = reaping_controller(&world, 1, 5, 3);

    let job = world.queue_job(&api, SH);
    tick(&mut ctl, &world, &config, 0).await;
    let child = child_ids(&world).remove(0);
    world.place(&child);
    world.register_runner(&child);
    // The runner takes the job; the API shows neither it nor the busy flag yet.
    world.take_job(&child, job);
    world.hide_job(job, true);
    for t in 1..=7 {
        if t == 7 {
            // Two seconds after the first idle reading, the job shows in progress.
            world.hide_job(job, false);
        }
        let view = tick(&mut ctl, &world, &config, t).await;
        assert!(world.stopped().is_empty(), "t={t}: {view:#?}");
        assert!(world.deregistered().is_empty(), "t={t}");
    }
    let view = tick(&mut ctl, &world, &config, 8).await;
    assert!(
        view.reaps.is_empty(),
        "a runner named busy is not nominated: {view:#?}"
    );
    assert!(world.stopped().is_empty());
}

/// A child dispatched at t=0 for a job of `repo` that was then cancelled, placed and its
/// runner registered: surplus, idle, and past the grace window from t=5 on.
async fn surplus_registered_runner(
    ctl: &mut Controller,
    world: &MemoryWorld,
    config: &Config,
    repo: &runner_scaler::model::RepoName,
) -> ChildId {
    let cancelled = world.queue_job(repo, SH);
    tick(ctl, world, config, 0).await;
    let child = child_ids(world).remove(0);
    world.place(&child);
    world.register_runner(&child);
    world.cancel_job(cancelled);
    child
}

/// The other side of the confirmation: a runner idle since long ago takes a job one second
/// before it is taken back, and neither the job nor the busy flag shows yet. GitHub lets the
/// delete through (it has been seen to on busy runners); the child is not stopped in that
/// tick, and once the job shows, never.
#[tokio::test(start_paused = true)]
async fn a_runner_confirmed_idle_that_takes_a_job_at_the_last_moment_is_not_stopped() {
    let world = MemoryWorld::new(at(0));
    world.set_deletes_busy_runners(true);
    let api = repo("acme/api");
    let config = app_config(&[("acme/api", 2)]);
    let mut ctl = reaping_controller(&world, 1, 5, 3);

    let child = surplus_registered_runner(&mut ctl, &world, &config, &api).await;
    // Surplus from t=5 (the grace window), idle since then, confirmed from t=8. At t=7 a new
    // job comes and the runner takes it before the API shows it.
    let mut job = None;
    for t in 1..=8 {
        if t == 7 {
            let taken = world.queue_job(&api, SH);
            world.take_job(&child, taken);
            world.hide_job(taken, true);
            job = Some(taken);
        }
        let view = tick(&mut ctl, &world, &config, t).await;
        assert!(world.stopped().is_empty(), "t={t}: {view:#?}");
    }
    assert_eq!(
        world.deregistered().len(),
        1,
        "GitHub let the delete through at t=8"
    );
    // The job shows a tick later: the runner that runs it is left to finish.
    world.hide_job(job.unwrap(), false);
    for t in 9..=30 {
        let view = tick(&mut ctl, &world, &config, t).await;
        assert!(world.stopped().is_empty(), "t={t}: {view:#?}");
    }
}

/// The reading that confirmed a runner idle is the tick's listing, taken before the tick's
/// dispatches; the runner takes a job after it, and the listing still says idle (its busy
/// flag lags). The registration is read once more, by id, as the last call before the delete:
/// it says busy, and nothing is deleted or stopped, though GitHub would let the delete through.
#[tokio::test(start_paused = true)]
async fn a_runner_idle_on_the_listing_but_busy_on_the_reading_just_before_the_delete_is_kept() {
    let world = MemoryWorld::new(at(0));
    world.set_deletes_busy_runners(true);
    let api = repo("acme/api");
    let config = app_config(&[("acme/api", 2)]);
    let mut ctl = reaping_controller(&world, 1, 5, 3);

    let cancelled = world.queue_job(&api, SH);
    tick(&mut ctl, &world, &config, 0).await;
    let child = child_ids(&world).remove(0);
    world.place(&child);
    let runner = world.register_runner(&child);
    world.cancel_job(cancelled);
    for t in 1..=7 {
        tick(&mut ctl, &world, &config, t).await;
    }
    // Confirmed idle from t=8. Just before, the runner takes a job no listing shows yet.
    world.freeze_runner_listing(true);
    let taken = world.queue_job(&api, SH);
    world.take_job(&child, taken);
    world.hide_job(taken, true);
    world.set_runner_busy(runner, true);
    for t in 8..=20 {
        let view = tick(&mut ctl, &world, &config, t).await;
        assert!(world.deregistered().is_empty(), "t={t}: {view:#?}");
        assert!(world.stopped().is_empty(), "t={t}: {view:#?}");
    }
}

/// Issue 19, defect 1: a runner whose registration the daemon deleted, and that stays (it
/// did not leave by itself), can take no job. It stops counting as supply at once (a job
/// queued after the delete gets a runner of its own in the next tick, the cap permitting),
/// and it is stopped at the first tick whose fresh queue reading comes the job listing's lag
/// after the delete and names it in no job: not after `--idle-confirm`, which is long here.
#[tokio::test(start_paused = true)]
async fn a_deregistered_runner_leaves_supply_at_once_and_is_stopped_after_the_listing_lag() {
    let world = MemoryWorld::new(at(0));
    let api = repo("acme/api");
    let config = app_config(&[("acme/api", 2)]);
    // Longer than the listing lag: the absence is not what it is stopped on.
    let confirm_s = 60;
    let mut ctl = reaping_controller(&world, 1, 5, confirm_s);

    let child = surplus_registered_runner(&mut ctl, &world, &config, &api).await;
    let mut deregistered_at = None;
    let mut dispatched_before = None;
    for t in 1..=200 {
        let view = tick(&mut ctl, &world, &config, t).await;
        if deregistered_at.is_none() && !world.deregistered().is_empty() {
            deregistered_at = Some(t);
            assert!(world.stopped().is_empty(), "stopped in the deleting tick");
            assert!(
                view.reaps
                    .iter()
                    .any(|r| r.outcome == "deregistered" && r.child == child.to_string()),
                "{view:#?}"
            );
            // Work arrives: the runner that can no longer take it does not stand for it.
            world.queue_job(&api, SH);
            dispatched_before = Some(world.dispatch_count());
            continue;
        }
        if let Some(before) = dispatched_before.take() {
            assert_eq!(
                world.dispatch_count(),
                before + 1,
                "the deregistered runner still counts as supply: {view:#?}"
            );
        }
        if !world.stopped().is_empty() {
            let deregistered_at = deregistered_at.expect("deregistered before it was stopped");
            let lag = runner_scaler::plan::reap::JOB_LISTING_LAG.as_secs() as i64;
            assert!(
                t - deregistered_at >= lag,
                "stopped at t={t}, deleted at {deregistered_at}: inside the listing lag"
            );
            assert!(
                t - deregistered_at <= lag + 2,
                "stopped at t={t}, deleted at {deregistered_at}: it held its slot past the lag"
            );
            assert_eq!(world.stopped(), [child]);
            return;
        }
    }
    panic!("never stopped: deregistered at {deregistered_at:?}");
}

/// A child without an allocation has no runner: past the grace window it is stopped at once,
/// after its allocations are read again at that moment.
#[tokio::test(start_paused = true)]
async fn an_unplaced_surplus_child_is_stopped_without_asking_github() {
    let world = MemoryWorld::new(at(0));
    let api = repo("acme/api");
    let config = app_config(&[("acme/api", 1)]);
    let mut ctl = reaping_controller(&world, 1, 5, 2);
    let job = world.queue_job(&api, SH);
    tick(&mut ctl, &world, &config, 0).await;
    world.cancel_job(job);
    let child = child_ids(&world).remove(0);
    world.set_runners_down(true);
    for t in 1..=4 {
        tick(&mut ctl, &world, &config, t).await;
        assert!(
            world.stopped().is_empty(),
            "t={t}: younger than the grace window"
        );
    }
    let view = tick(&mut ctl, &world, &config, 5).await;
    assert_eq!(world.stopped(), vec![child.clone()], "{view:#?}");
    assert_eq!(view.reaps[0].outcome, "reaped");
    assert_eq!(view.reaps[0].verdict, "not_asked");
    // The slot it held is free again: a new job gets a runner at the next tick.
    world.queue_job(&api, SH);
    let view = tick(&mut ctl, &world, &config, 6).await;
    assert_eq!(view.started, 1, "{view:#?}");
}

/// BRIEF lesson 7: a runner image that dies at boot gets at most six dispatches per bucket in
/// ten minutes, and the backoff says so; a runner that takes a job ends it.
#[tokio::test(start_paused = true)]
async fn a_runner_that_always_dies_at_boot_gets_at_most_six_dispatches_in_ten_minutes() {
    let world = MemoryWorld::new(at(0));
    let api = repo("acme/api");
    let config = app_config(&[("acme/api", 3)]);
    let mut ctl = reaping_controller(&world, 15, 600, 120);
    let jobs: Vec<u64> = (0..3).map(|_| world.queue_job(&api, SH)).collect();

    let mut backoff_shown = false;
    for t in (0..600).step_by(15) {
        let view = tick(&mut ctl, &world, &config, t).await;
        backoff_shown |= view.buckets.iter().any(|b| {
            b.reason
                .as_deref()
                .is_some_and(|r| r.starts_with("crash loop"))
        });
        // Every runner dispatched so far boots and dies before the next poll.
        for child in world.children() {
            if child.child.status != ChildStatus::Dead {
                world.place(&child.child.id);
                world.crash(&child.child.id);
            }
        }
    }
    let dispatched = world.dispatch_count();
    assert!(
        (4..=6).contains(&dispatched),
        "{dispatched} dispatches in ten minutes for a bucket whose runners all die at boot"
    );
    assert!(backoff_shown, "the backoff is shown as the bucket's reason");
    let failed = world
        .children()
        .iter()
        .filter(|c| c.child.placement == Placement::Failed)
        .count();
    assert!(failed <= dispatched);

    // The image is fixed: the next probe registers and takes a job, and the bucket's other
    // jobs get their runners at once.
    let mut t = 600;
    let before = world.dispatch_count();
    while world.dispatch_count() == before {
        tick(&mut ctl, &world, &config, t).await;
        t += 15;
        assert!(t < 600 + 900, "no probe within the longest backoff");
    }
    let probe = child_ids(&world)
        .into_iter()
        .find(|id| {
            world
                .children()
                .iter()
                .any(|c| c.child.id == *id && c.child.status != ChildStatus::Dead)
        })
        .expect("the probe is in flight");
    world.place(&probe);
    world.register_runner(&probe);
    world.take_job(&probe, jobs[0]);
    let view = tick(&mut ctl, &world, &config, t).await;
    assert_eq!(
        view.started, 2,
        "backoff over, both missing runners go out: {view:#?}"
    );
}

/// A daemon stopped mid-burst and started again after the document moved the repo to another
/// parent: the children of the old parent are found from Nomad alone, count against the cap,
/// and are purged when they finish; nothing is dispatched twice.
#[tokio::test(start_paused = true)]
async fn a_restart_after_an_edit_forgets_nothing() {
    let world = MemoryWorld::new(at(0));
    let api = repo("acme/api");
    let before = app_config(&[("acme/api", 3)]);
    let jobs: Vec<u64> = (0..6).map(|_| world.queue_job(&api, SH)).collect();

    let mut first = reaping_controller(&world, 15, 600, 120);
    let view = tick(&mut first, &world, &before, 0).await;
    assert_eq!(view.started, 3);
    drop(first);

    let mut after = before.clone();
    after
        .repos
        .get_mut(&api)
        .expect("in the document")
        .default_job = Some("other-runner".into());
    let mut second = reaping_controller(&world, 15, 600, 120);
    let mut t = 15;
    let mut done = BTreeSet::new();
    while done.len() < jobs.len() {
        let view = tick(&mut second, &world, &after, t).await;
        let in_flight = world
            .children()
            .iter()
            .filter(|c| c.child.ours && c.child.status.is_in_flight())
            .count();
        assert!(
            in_flight <= 3,
            "t={t}: {in_flight} in flight over the cap: {view:#?}"
        );
        // Runners boot and take the jobs GitHub gives them; a job runs for one poll.
        for job in world
            .jobs()
            .iter()
            .filter_map(|(id, j)| matches!(j.state, JobState::InProgress { .. }).then_some(*id))
        {
            world.finish_job(job);
            done.insert(job);
        }
        let queued: Vec<u64> = world
            .jobs()
            .iter()
            .filter(|(_, j)| j.state == JobState::Queued)
            .map(|(id, _)| *id)
            .collect();
        let idle: Vec<ChildId> = world
            .children()
            .iter()
            .filter(|c| c.child.status.is_in_flight() && !is_busy(&world, &c.child.id))
            .map(|c| c.child.id.clone())
            .collect();
        for (child, job) in idle.iter().zip(queued) {
            world.place(child);
            world.take_job(child, job);
        }
        t += 15;
        assert!(t < 3600, "the burst never drained");
    }
    for _ in 0..2 {
        tick(&mut second, &world, &after, t).await;
        t += 15;
    }
    assert_eq!(world.dispatch_count(), 6, "a job was dispatched for twice");
    let parents: BTreeSet<String> = world
        .children()
        .iter()
        .map(|c| c.child.parent.clone())
        .collect();
    assert!(
        world.children().is_empty(),
        "children left after the burst: {parents:?}"
    );
}

/// Nomad whose allocations, re-read at the moment of stopping, show one that appeared since
/// the listing: the child's runner may exist now.
struct AllocationAppeared(MemoryWorld);

#[async_trait::async_trait]
impl runner_scaler::act::ChildControl for AllocationAppeared {
    async fn dispatch(
        &self,
        request: &runner_scaler::act::DispatchRequest,
    ) -> Result<runner_scaler::act::Dispatched, runner_scaler::observe::PortError> {
        self.0.dispatch(request).await
    }

    async fn child_status(
        &self,
        child: &ChildId,
    ) -> Result<Option<ChildStatus>, runner_scaler::observe::PortError> {
        self.0.child_status(child).await
    }

    async fn purge(&self, child: &ChildId) -> Result<(), runner_scaler::observe::PortError> {
        self.0.purge(child).await
    }

    async fn has_live_allocation(
        &self,
        _child: &ChildId,
    ) -> Result<bool, runner_scaler::observe::PortError> {
        Ok(true)
    }

    async fn stop(&self, child: &ChildId) -> Result<(), runner_scaler::observe::PortError> {
        self.0.stop(child).await
    }
}

/// Rules nominate, reality vetoes: an unplaced child is stopped only if Nomad, asked at that
/// moment, still shows no allocation.
#[tokio::test(start_paused = true)]
async fn an_unplaced_child_whose_allocation_appeared_meanwhile_is_not_stopped() {
    use runner_scaler::act::ChildControl;
    let world = MemoryWorld::new(at(0));
    let api = repo("acme/api");
    let config = app_config(&[("acme/api", 1)]);
    let mut ctl = reaping_controller(&world, 1, 5, 2);
    ctl.services.control = std::sync::Arc::new(AllocationAppeared(world.clone()));
    let job = world.queue_job(&api, SH);
    tick(&mut ctl, &world, &config, 0).await;
    world.cancel_job(job);
    let child = child_ids(&world).remove(0);
    let view = tick(&mut ctl, &world, &config, 6).await;
    assert_eq!(view.reaps.len(), 1, "{view:#?}");
    assert_eq!(view.reaps[0].child, child.0);
    assert_eq!(view.reaps[0].outcome, "vetoed", "{view:#?}");
    assert!(world.stopped().is_empty());
    assert_eq!(
        world.child_status(&child).await.unwrap(),
        Some(ChildStatus::Pending)
    );
}

/// A runner killed with its allocation leaves its registration behind, offline. Offline
/// registrations named like ours with no child of ours are deleted; an operator's own runner,
/// an online one, or one whose children could not all be listed are left alone.
#[tokio::test(start_paused = true)]
async fn stale_registrations_of_our_runners_are_deleted_and_nothing_else() {
    let world = MemoryWorld::new(at(0));
    let api = repo("acme/api");
    let config = app_config(&[("acme/api", 2)]);
    let mut ctl = reaping_controller(&world, 15, 600, 120);
    let stale = world.register_orphan(&api, "ci-runner-3f9c2a1b7d04", false);
    let laptop = world.register_orphan(&api, "my-laptop", false);
    let online = world.register_orphan(&api, "ci-runner-aaaaaaaaaaaa", true);

    // Nomad cannot be listed: a registration may belong to a child nobody saw.
    world.set_nomad_down(true);
    tick(&mut ctl, &world, &config, 0).await;
    assert!(world.deregistered().is_empty());

    world.set_nomad_down(false);
    tick(&mut ctl, &world, &config, 15).await;
    assert_eq!(world.deregistered(), vec![stale]);
    let left: Vec<u64> = [laptop, online]
        .into_iter()
        .filter(|id| !world.deregistered().contains(id))
        .collect();
    assert_eq!(left, vec![laptop, online]);
}

/// A child Nomad could not place for the whole placement timeout is stopped (no runner
/// exists) and replaced before its registration token would expire; that is no failed start.
#[tokio::test(start_paused = true)]
async fn a_child_unplaced_past_the_placement_timeout_is_replaced() {
    let world = MemoryWorld::new(at(0));
    let api = repo("acme/api");
    let config = app_config(&[("acme/api", 1)]);
    let mut ctl = reaping_controller(&world, 15, 600, 120);
    world.queue_job(&api, SH);
    tick(&mut ctl, &world, &config, 0).await;
    let first = child_ids(&world).remove(0);
    let timeout = ReapPolicy::default().placement_timeout.as_secs() as i64;
    let view = tick(&mut ctl, &world, &config, timeout - 15).await;
    assert!(world.stopped().is_empty(), "{view:#?}");
    let view = tick(&mut ctl, &world, &config, timeout).await;
    assert_eq!(world.stopped(), vec![first.clone()], "{view:#?}");
    assert_eq!(view.reaps[0].outcome, "replaced");
    // The job is still queued: the next tick dispatches its replacement at once, with no
    // crash-loop backoff.
    let view = tick(&mut ctl, &world, &config, timeout + 15).await;
    assert_eq!(view.started, 1, "{view:#?}");
    assert_eq!(world.dispatch_count(), 2);
}

/// Registrations are swept once after a start, at most 8 repos a tick (a fleet's sweeps do
/// not land in one burst), and every 30 minutes after that only where runners of ours were:
/// an idle repo costs no listing of its runners.
#[tokio::test(start_paused = true)]
async fn registrations_are_swept_once_then_only_where_runners_of_ours_were() {
    let world = MemoryWorld::new(at(0));
    let names: Vec<String> = (0..12).map(|i| format!("acme/r{i:02}")).collect();
    let repos: Vec<(&str, u32)> = names.iter().map(|n| (n.as_str(), 2)).collect();
    let config = app_config(&repos);
    let mut ctl = reaping_controller(&world, 15, 600, 120);
    // acme/r05 gets a job, so a child of ours (never placed here).
    world.queue_job(&repo("acme/r05"), SH);

    tick(&mut ctl, &world, &config, 0).await;
    assert_eq!(world.runner_listings().len(), 8, "at most 8 sweeps a tick");
    tick(&mut ctl, &world, &config, 15).await;
    let swept: BTreeSet<String> = world
        .runner_listings()
        .iter()
        .map(|r| r.to_string())
        .collect();
    assert_eq!(swept, names.iter().cloned().collect(), "each repo once");
    assert_eq!(world.runner_listings().len(), 12);

    for t in (60..=2_100).step_by(60) {
        tick(&mut ctl, &world, &config, t).await;
    }
    let again: Vec<String> = world.runner_listings()[12..]
        .iter()
        .map(|r| r.to_string())
        .collect();
    assert_eq!(again, ["acme/r05"], "only the repo with a child of ours");
}

/// A credential minted for a dispatch Nomad then refused may have registered a runner no child
/// will ever run (a JIT registration exists from the moment it is minted). The repo has no
/// child of ours, yet its registrations are swept again, and the leftover is deleted.
#[tokio::test(start_paused = true)]
async fn a_registration_left_by_a_refused_dispatch_is_swept() {
    let world = MemoryWorld::new(at(0));
    let api = repo("acme/api");
    let config = app_config(&[("acme/api", 2)]);
    let mut ctl = reaping_controller(&world, 15, 600, 120);
    tick(&mut ctl, &world, &config, 0).await;
    assert_eq!(world.runner_listings().len(), 1, "the sweep after a start");

    // The parent was stopped: the mint succeeds, the dispatch is refused, and what the
    // credential registered stays behind, offline, named like one of ours.
    world.set_dispatch_refused(true);
    world.queue_job(&api, SH);
    tick(&mut ctl, &world, &config, 15).await;
    assert_eq!(world.dispatch_count(), 0);
    let leftover = world.register_orphan(&api, "ci-runner-5d1e0c9b2a77", false);

    for t in (30..=2_100).step_by(15) {
        tick(&mut ctl, &world, &config, t).await;
    }
    assert!(world.runner_listings().len() > 1, "never swept again");
    assert_eq!(world.deregistered(), vec![leftover]);
}

/// A state key the test reads: what a term hands on, kept in memory.
#[derive(Default)]
struct StateKey(std::sync::Mutex<Option<Vec<u8>>>);

#[async_trait::async_trait]
impl runner_scaler::act::services::CarriedStore for StateKey {
    async fn load(&self) -> Result<Option<Vec<u8>>, runner_scaler::observe::PortError> {
        Ok(self.0.lock().unwrap().clone())
    }

    async fn save(&self, value: Vec<u8>) -> Result<(), runner_scaler::observe::PortError> {
        *self.0.lock().unwrap() = Some(value);
        Ok(())
    }
}

/// Issue 19, defect 5: the crash-loop backoff outlives the daemon. A bucket whose runners
/// all died at boot is backing off when the daemon is killed; the daemon started again in its
/// place reads the state key and keeps backing off, where one without it would send the
/// bucket's whole missing count at once.
#[tokio::test(start_paused = true)]
async fn a_restarted_daemon_keeps_the_crash_loop_backoff_of_the_one_before() {
    let world = MemoryWorld::new(at(0));
    let api = repo("acme/api");
    let config = app_config(&[("acme/api", 3)]);
    let state = std::sync::Arc::new(StateKey::default());
    let mut before = reaping_controller(&world, 15, 600, 120).with_carried(state.clone());
    for _ in 0..3 {
        world.queue_job(&api, SH);
    }
    tick(&mut before, &world, &config, 0).await;
    assert_eq!(world.dispatch_count(), 3);
    for child in world.children() {
        world.place(&child.child.id);
        world.crash(&child.child.id);
    }
    let view = tick(&mut before, &world, &config, 15).await;
    assert_eq!(view.started, 0, "backing off: {view:#?}");
    drop(before);
    let written = state
        .0
        .lock()
        .unwrap()
        .clone()
        .expect("the state key is written");
    assert!(
        String::from_utf8_lossy(&written).contains("\"failedStarts\":3"),
        "{}",
        String::from_utf8_lossy(&written)
    );

    // Started again 15 s later, with its memory gone.
    let mut after = reaping_controller(&world, 15, 600, 120).with_carried(state.clone());
    let view = tick(&mut after, &world, &config, 30).await;
    assert_eq!(view.started, 0, "the restart forgot the backoff: {view:#?}");
    let bucket = &view.buckets[0];
    assert!(
        bucket
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("crash loop: 3 failed start(s)")),
        "{bucket:?}"
    );

    // Without the state key, the same restart sends every missing runner at once.
    let mut forgetful = reaping_controller(&world, 15, 600, 120);
    let view = tick(&mut forgetful, &world, &config, 45).await;
    assert_eq!(view.started, 3, "{view:#?}");
}
