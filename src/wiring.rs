//! Builds the real clients from process settings and runs `run`, `once`, `status` and
//! `simulate`. (Being wired: see the clients.)

use std::process::ExitCode;

use crate::cli::Command;

pub fn run_command(command: Command) -> ExitCode {
    let _ = command;
    eprintln!("not wired yet");
    ExitCode::from(1)
}
