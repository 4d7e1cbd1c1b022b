//! The seed's trace, replayed: the tick lines an operator sees for one job.
//!
//! Alone in its binary: a thread-scoped subscriber must not race other tests' callsites.

mod support;

use std::sync::Arc;

use chrono::{DateTime, Duration, TimeZone, Utc};
use rand::SeedableRng;
use runner_scaler::config::{Config, Mode, RepoConfig};
use runner_scaler::control_loop::{Controller, Forge, LoopSettings, Services};
use runner_scaler::model::RepoName;
use runner_scaler::sim::memory::MemoryWorld;
use support::LogCapture;

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 21, 1, 1).unwrap()
}

fn repo(name: &str) -> RepoName {
    RepoName::parse(name).unwrap()
}

fn config(repos: &[(&str, u32)]) -> Config {
    let mut config = Config::default();
    for (name, cap) in repos {
        config.repos.insert(
            repo(name),
            RepoConfig {
                repo: repo(name),
                mode: Mode::App,
                max_concurrent: *cap,
                profiles: vec![],
                default_job: Some("ci-runner".into()),
                labels: None,
            },
        );
    }
    config
}

fn controller(world: &MemoryWorld) -> Controller {
    let forge = || Forge {
        queue: Arc::new(world.clone()),
        registrar: Arc::new(world.clone()),
    };
    Controller::new(
        Services {
            github: Some(forge()),
            forgejo: Some(forge()),
            children: Arc::new(world.clone()),
            control: Arc::new(world.clone()),
        },
        LoopSettings::default(),
        Box::new(rand::rngs::StdRng::seed_from_u64(7)),
    )
}

const SH: &[&str] = &["self-hosted"];

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
