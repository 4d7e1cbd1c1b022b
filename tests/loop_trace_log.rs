//! The seed's trace, replayed: the tick lines an operator sees for one job.
//!
//! Alone in its binary: a thread-scoped subscriber must not race other tests' callsites.

mod support;

use chrono::Duration;
use runner_scaler::sim::memory::MemoryWorld;
use support::LogCapture;
use support::memory_loop::{SH, app_config as config, controller, repo, t0};
#[tokio::test]
async fn a_queued_job_is_served_once_and_its_child_purged() {
    let logs = LogCapture::default();
    let _guard = tracing::subscriber::set_default(logs.subscriber(tracing::Level::INFO));
    let world = MemoryWorld::new(t0());
    let config = config(&[("afreidah/munchbox", 3)]);
    let mut ctl = controller(&world);
    let job = world.queue_job(&repo("afreidah/munchbox"), SH);

    // Tick 1: one job queued, one runner dispatched.
    ctl.tick(&config, 1, t0(), false).await;
    // Tick 2: the runner has not claimed it yet; it already counts as active.
    world.set_now(t0() + Duration::seconds(30));
    ctl.tick(&config, 1, t0() + Duration::seconds(30), false)
        .await;
    // The runner boots, takes the job and finishes it.
    let child = world.children()[0].child.id.clone();
    world.place(&child);
    world.take_job(&child, job);
    world.finish_job(job);
    ctl.tick(&config, 1, t0() + Duration::seconds(60), false)
        .await;

    assert_eq!(
        logs.tick_lines(),
        vec![
            "poll complete queued=1 active=0 started=1",
            "poll complete queued=1 active=1 started=0",
            "poll complete queued=0 active=0 started=0",
        ]
    );
    let text = logs.text();
    assert!(text.contains("dispatched ephemeral runner"), "{text}");
    assert!(text.contains("minted=true"), "{text}");
    assert!(
        text.contains(&format!("purged finished runner child={child}")),
        "{text}"
    );
    assert!(
        world.children().is_empty(),
        "the finished child was not purged"
    );
    assert_eq!(world.dispatch_count(), 1);
}
