//! Shared by the integration tests: capturing what the daemon logs.
#![allow(dead_code)]

pub mod twins;

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing_subscriber::fmt::MakeWriter;

pub mod bystander;
pub mod daemon_process;
pub mod fixtures;
pub mod hcl_files;
pub mod memory_loop;
pub mod recording;

/// Everything written by a tracing subscriber, kept in memory.
#[derive(Clone, Default)]
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    pub fn clear(&self) {
        self.0.lock().unwrap().clear();
    }

    /// A subscriber that records every event of every crate at `level`, without colours.
    pub fn subscriber(&self, level: tracing::Level) -> impl tracing::Subscriber + Send + Sync {
        tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(self.clone())
            .finish()
    }

    /// The `poll complete …` lines, in order, without their prefix.
    pub fn tick_lines(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.find("poll complete").map(|i| l[i..].to_string()))
            .collect()
    }
}

pub struct CaptureWriter(Arc<Mutex<Vec<u8>>>);

impl Write for CaptureWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogCapture {
    type Writer = CaptureWriter;

    fn make_writer(&'a self) -> Self::Writer {
        CaptureWriter(self.0.clone())
    }
}

/// A runner to mint a credential for, as the act step names one.
pub struct TestRunner {
    pub name: runner_scaler::model::RunnerName,
    pub labels: runner_scaler::model::LabelSet,
}

impl TestRunner {
    pub fn new(name: &str, labels: &[&str]) -> TestRunner {
        TestRunner {
            name: runner_scaler::model::RunnerName(name.to_string()),
            labels: runner_scaler::model::LabelSet::parse(labels).expect("valid labels"),
        }
    }

    /// A runner of `ci-runner` with `self-hosted`, named like no other of this process (a
    /// JIT config is refused for a name already registered).
    pub fn any() -> TestRunner {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        TestRunner::new(&format!("ci-runner-{n:012x}"), &["self-hosted"])
    }

    pub fn identity(&self) -> runner_scaler::act::RunnerIdentity<'_> {
        runner_scaler::act::RunnerIdentity {
            name: &self.name,
            labels: &self.labels,
        }
    }
}
