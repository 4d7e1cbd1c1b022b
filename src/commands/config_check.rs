//! `config check [--live] FILE|-`: the document's own rules, and with `--live` the document
//! against the services it names ([`live`]).

pub mod live;

use std::io::Read;
use std::process::ExitCode;

use crate::cli::{DaemonArgs, EXIT_INVALID};
use crate::config::{ConfigDefaults, parse_document};

/// `config check [--live] FILE|-`: exit 0 when valid (and, with `--live`, right against the
/// live services), else one line per problem and exit 1.
pub fn config_check(file: &str, live: bool, daemon: &DaemonArgs) -> ExitCode {
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
                return live::run_live_check(&config, daemon);
            }
            for note in crate::config::credential_notes(&config) {
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
