//! The entry point: parses the command line and hands it to [`runner_scaler::commands`].

use std::process::ExitCode;

use clap::Parser;
use runner_scaler::cli::{Cli, EXIT_BAD_SETTINGS};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_BAD_SETTINGS as u8)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    runner_scaler::commands::run_command(cli.command, cli.log_format)
}
