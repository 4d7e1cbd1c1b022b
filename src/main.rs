//! Wiring only: parse settings, set up tracing, build the clients, run a command.

use std::io::Read;
use std::process::ExitCode;

use clap::Parser;
use runner_scaler::cli::{
    Cli, Command, ConfigCommand, DaemonArgs, EXIT_BAD_SETTINGS, EXIT_INVALID,
};
use runner_scaler::config::{ConfigDefaults, parse_document};

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
    match cli.command {
        Command::Config {
            command: ConfigCommand::Check { file, live, daemon },
        } => config_check(&file, live, &daemon),
        other => runner_scaler::wiring::run_command(other, cli.log_format),
    }
}

/// `config check [--live] FILE|-`: exit 0 when valid (and, with `--live`, right against the
/// live services), else one line per problem and exit 1.
fn config_check(file: &str, live: bool, daemon: &DaemonArgs) -> ExitCode {
    let defaults = &ConfigDefaults {
        default_job: daemon.default_job.clone(),
        default_repo_max: daemon.default_repo_max,
    };
    let bytes = if file == "-" {
        let mut buf = Vec::new();
        if let Err(e) = std::io::stdin().read_to_end(&mut buf) {
            eprintln!("read the document from stdin: {e}");
            return ExitCode::from(EXIT_INVALID as u8);
        }
        buf
    } else {
        match std::fs::read(file) {
            Ok(bytes) => bytes,
            Err(e) => {
                eprintln!("read {file}: {e}");
                return ExitCode::from(EXIT_INVALID as u8);
            }
        }
    };
    match parse_document(&bytes, defaults) {
        Ok(config) => {
            println!("ok: {} repos", config.repos.len());
            if live {
                return runner_scaler::check::run_live_check(&config, daemon);
            }
            for note in runner_scaler::config::credential_notes(&config) {
                println!("note: {note}");
            }
            ExitCode::SUCCESS
        }
        Err(problems) => {
            for problem in &problems {
                eprintln!("{problem}");
            }
            ExitCode::from(EXIT_INVALID as u8)
        }
    }
}
