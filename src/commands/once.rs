//! `once [--dry-run] [--json]`: one tick against the live services, acting only under the
//! leader lock (`--dry-run` looks without it), its view printed as text or JSON.

use std::process::ExitCode;
use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::bad_settings;
use crate::cli::{DaemonArgs, EXIT_INVALID};
use crate::config::watch::{DocumentSource, Fetched};
use crate::control_loop::Controller;
use crate::leader::{self, OneShot, OneShotRefused};
use crate::wiring::build;

/// `once` and `status`: read the document once, run one tick (acting unless `dry_run`).
pub async fn once(args: DaemonArgs, dry_run: bool, json: bool) -> ExitCode {
    let built = match build(&args).await {
        Ok(built) => built,
        Err(e) => return bad_settings(e),
    };
    let admin_token_probe = built.admin_token_probe();
    let document = match built.consul.fetch(0, std::time::Duration::ZERO).await {
        Ok(Fetched::Found { bytes, .. }) => bytes,
        Ok(Fetched::Missing { .. }) => {
            eprintln!(
                "the document {} does not exist in Consul: nothing to do",
                args.runner_scaler_config_key
            );
            return ExitCode::from(EXIT_INVALID as u8);
        }
        Err(e) => {
            eprintln!("read the document {}: {e}", args.runner_scaler_config_key);
            return ExitCode::from(EXIT_INVALID as u8);
        }
    };
    let config = match crate::config::parse_document(&document, &built.defaults) {
        Ok(config) => config,
        Err(problems) => {
            for p in problems {
                eprintln!("{p}");
            }
            return ExitCode::from(EXIT_INVALID as u8);
        }
    };
    // Acting needs the leader lock, as the daemon does; looking needs none.
    let lease = if dry_run {
        None
    } else {
        match OneShot::take(built.lock.clone(), built.leader.clone()).await {
            Ok(lease) => Some(lease),
            Err(refused @ OneShotRefused::Settings(_)) => return bad_settings(refused),
            Err(refused) => {
                eprintln!(
                    "runner-scaler once: {refused}; not acting (`once --dry-run` shows what a tick would do)"
                );
                return ExitCode::from(EXIT_INVALID as u8);
            }
        }
    };
    let (services, carried): (_, Arc<dyn crate::act::services::CarriedStore>) = match &lease {
        Some(lease) => (
            leader::fenced(&built.services, &lease.fence),
            leader::fenced_carried(built.state_key.clone(), &lease.fence),
        ),
        None => (built.services, built.state_key.clone()),
    };
    let pause_key = built.pause_key.key().to_string();
    let mut controller = Controller::new(
        services,
        built.loop_settings,
        Box::new(StdRng::from_os_rng()),
    )
    .with_carried(carried)
    .with_pause_key(pause_key, Arc::new(built.pause_key))
    .with_admin_token_guard(admin_token_probe);
    use crate::clock::Clock;
    let view = controller
        .tick(&config, 0, crate::clock::SystemClock.now(), dry_run)
        .await;
    if let Some(lease) = lease {
        lease.give_back().await;
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&view).expect("a tick view serialises")
        );
    } else {
        print!("{}", view.render_text());
    }
    ExitCode::SUCCESS
}
