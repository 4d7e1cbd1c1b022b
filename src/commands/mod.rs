//! The commands, one file each: `run`, `once`, `status`, `config check` and `simulate`.
//! Each builds what it needs through [`crate::wiring`] and runs it; this module holds what
//! they share: logging, the runtime, and how a bad process setting ends (exit 64).

pub mod config_check;
pub mod once;
pub mod run;
#[cfg(feature = "sim")]
pub mod simulate;
pub mod status;

use std::process::ExitCode;

use tracing_subscriber::EnvFilter;

use crate::cli::{Command, ConfigCommand, EXIT_BAD_SETTINGS, LogFormat};

/// Crates whose own logging is noise next to ours (every 404 at ERROR, every request at
/// INFO); our clients log what matters with context.
const QUIET_CRATES: &str = "consulrs=off,rustify=off,vaultrs=off";

/// Logs go to stderr, so `--json` output on stdout stays clean. `RUST_LOG` overrides.
pub fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("info,{QUIET_CRATES}")));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        // One JSON object per line, the event's fields flattened beside `message`.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}

pub(crate) fn bad_settings(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("runner-scaler: {message}");
    ExitCode::from(EXIT_BAD_SETTINGS as u8)
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("start the tokio runtime")
}

/// Runs one parsed command line; what the process exits with. `config check` starts no
/// logging: its findings are its output, plain lines on stdout and stderr.
pub fn run_command(command: Command, log_format: LogFormat) -> ExitCode {
    match command {
        Command::Config {
            command: ConfigCommand::Check { file, live, daemon },
        } => config_check::config_check(&file, live, &daemon),
        Command::Run {
            daemon: args,
            dry_run,
        } => {
            init_tracing(log_format);
            runtime().block_on(run::run(*args, dry_run))
        }
        Command::Once {
            daemon,
            dry_run,
            json,
        } => {
            init_tracing(log_format);
            runtime().block_on(once::once(*daemon, dry_run, json))
        }
        Command::Status { daemon, json, addr } => {
            init_tracing(log_format);
            runtime().block_on(status::status(*daemon, json, addr))
        }
        Command::Simulate(args) => {
            init_tracing(log_format);
            simulate_command(args)
        }
    }
}

#[cfg(feature = "sim")]
fn simulate_command(args: crate::cli::SimulateArgs) -> ExitCode {
    simulate::simulate(args)
}

/// The image builds the daemon without the simulator: say so rather than pretend.
#[cfg(not(feature = "sim"))]
fn simulate_command(_args: crate::cli::SimulateArgs) -> ExitCode {
    bad_settings(
        "simulate: this build has no simulator (it was built without the `sim` cargo feature); \
         run `cargo run --release -- simulate` from a checkout",
    )
}
