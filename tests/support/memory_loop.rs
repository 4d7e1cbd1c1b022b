//! A controller over the in-memory world, and app-mode documents, for loop tests.

use chrono::{DateTime, TimeZone, Utc};
use rand::SeedableRng;
use runner_scaler::config::{Config, Mode, RepoConfig};
use runner_scaler::control_loop::{Controller, LoopSettings};
use runner_scaler::model::RepoName;
use runner_scaler::sim::memory::MemoryWorld;

pub const SH: &[&str] = &["self-hosted"];

/// The moment of the seed's trace.
pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 21, 1, 1).unwrap()
}

pub fn repo(name: &str) -> RepoName {
    RepoName::parse(name).unwrap()
}

/// App-mode repos routing everything to `ci-runner`, each with its cap.
pub fn app_config(repos: &[(&str, u32)]) -> Config {
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
                search_labels_as_written: Default::default(),
                credential: Default::default(),
                nomad_namespace: None,
            },
        );
    }
    config
}

pub fn controller(world: &MemoryWorld) -> Controller {
    Controller::new(
        world.services(),
        LoopSettings::default(),
        Box::new(rand::rngs::StdRng::seed_from_u64(7)),
    )
}
