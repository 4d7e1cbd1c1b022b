//! `runner-scaler` as its own process against the twins, and waiting on the twins' state.
#![allow(dead_code)]

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::twins::{TempFile, Twins};

const BIN: &str = env!("CARGO_BIN_EXE_runner-scaler");
/// How often the tests look at the twins.
const POLL: Duration = Duration::from_millis(100);

/// `runner-scaler run` against the twins, killed on drop; its stderr is collected as it goes
/// so the pipe never fills.
pub struct Daemon {
    process: Child,
    stderr: Arc<Mutex<String>>,
    reader: Option<JoinHandle<()>>,
}

impl Daemon {
    /// Starts `runner-scaler` with `args`, the twins' environment and the App key in
    /// `key_file`.
    pub fn start(twins: &Twins, key_file: &TempFile, args: &[&str]) -> Daemon {
        Daemon::start_with_env(twins, key_file, args, &[])
    }

    /// [`Daemon::start`], with `env` set on top of the twins' environment.
    pub fn start_with_env(
        twins: &Twins,
        key_file: &TempFile,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        let mut command = Command::new(BIN);
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            // The daemon's own debug lines too: more text that must not hold a token.
            .env("RUST_LOG", "info,runner_scaler=debug")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (key, value) in twins.daemon_env(key_file.path()) {
            command.env(key, value);
        }
        for (key, value) in env {
            command.env(key, value);
        }
        let mut process = command.spawn().expect("start runner-scaler");
        let mut pipe = process.stderr.take().expect("stderr is piped");
        let stderr = Arc::new(Mutex::new(String::new()));
        let reader = std::thread::spawn({
            let stderr = stderr.clone();
            move || {
                let mut buffer = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buffer) {
                    if n == 0 {
                        break;
                    }
                    stderr
                        .lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buffer[..n]));
                }
            }
        });
        Daemon {
            process,
            stderr,
            reader: Some(reader),
        }
    }

    /// Kills the daemon and returns everything it wrote to stderr.
    pub fn stop(mut self) -> String {
        self.kill();
        self.stderr.lock().unwrap().clone()
    }

    fn kill(&mut self) {
        // Only this test's own child, by its handle.
        let _ = self.process.kill();
        let _ = self.process.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `done` every [`POLL`] until it holds or `deadline` passes; the last value.
pub async fn wait_until<T>(deadline: Duration, mut done: impl FnMut() -> Option<T>) -> Option<T> {
    let until = Instant::now() + deadline;
    loop {
        if let Some(value) = done() {
            return Some(value);
        }
        if Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

impl Daemon {
    /// The daemon's process id: for `/proc/<pid>/…` and for signals.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// The daemon's exit status if it has exited, without waiting for it.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.process
            .try_wait()
            .expect("ask whether the daemon exited")
    }
}

/// `runner-scaler status --addr ADDR` with the twins' environment and `env` on top: the
/// process's output.
pub fn status_at(
    twins: &Twins,
    key_file: &TempFile,
    addr: &str,
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut command = Command::new(BIN);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["status", "--addr", addr])
        .stdin(Stdio::null());
    for (key, value) in twins.daemon_env(key_file.path()) {
        command.env(key, value);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run runner-scaler status")
}
