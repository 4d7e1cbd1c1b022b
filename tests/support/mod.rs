//! Shared by the integration tests: capturing what the daemon logs.
#![allow(dead_code)]

pub mod twins;

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing_subscriber::fmt::MakeWriter;

pub mod daemon_process;
pub mod fixtures;
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
