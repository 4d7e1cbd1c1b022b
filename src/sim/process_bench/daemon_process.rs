//! The daemon as a child process: reaped with `wait4` by a thread of its own (which is what
//! gives its CPU time and peak RSS), signalled while it lives, killed if dropped unreaped;
//! and the GitHub App key file it reads, removed afterwards.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What `wait4` returned for the daemon.
pub(super) struct Reaped {
    pub(super) status: libc::c_int,
    pub(super) usage: libc::rusage,
}

/// The daemon's process, reaped by a thread of its own. Dropped before it is reaped (an
/// error or a panic on the way), it kills the daemon rather than leave it running.
pub(super) struct RunningDaemon {
    pub(super) pid: libc::pid_t,
    reaped: Arc<AtomicBool>,
}

impl RunningDaemon {
    /// Starts the reaper; the receiver gets what `wait4` returned once the daemon exits.
    pub(super) fn watch(
        pid: u32,
    ) -> (
        RunningDaemon,
        tokio::sync::oneshot::Receiver<std::io::Result<Reaped>>,
    ) {
        let pid = pid as libc::pid_t;
        let reaped = Arc::new(AtomicBool::new(false));
        let (tx, exited) = tokio::sync::oneshot::channel();
        std::thread::spawn({
            let reaped = reaped.clone();
            move || {
                let result = wait_for_exit(pid);
                reaped.store(true, Ordering::SeqCst);
                let _ = tx.send(result);
            }
        });
        (RunningDaemon { pid, reaped }, exited)
    }

    pub(super) fn signal(&self, signal: libc::c_int) {
        if !self.reaped.load(Ordering::SeqCst) {
            // SAFETY: kill has no memory effects; the pid is our unreaped child, so it
            // cannot name another process.
            unsafe {
                libc::kill(self.pid, signal);
            }
        }
    }
}

impl Drop for RunningDaemon {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}

/// Blocks until the child `pid` exits, and returns its status and resource usage.
fn wait_for_exit(pid: libc::pid_t) -> std::io::Result<Reaped> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain integers, for which all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: both pointers are to live locals of the right types.
        let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if waited == pid {
            return Ok(Reaped { status, usage });
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// The GitHub App's key, in a file only this user can read, removed on drop: the daemon
/// takes the key from `GITHUB_APP_PRIVATE_KEY_FILE`, as a deployment gives it.
pub(super) struct AppKeyFile(pub(super) PathBuf);

impl AppKeyFile {
    pub(super) fn write(pem: &str) -> Result<AppKeyFile, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "runner-scaler-bench-{}-{nanos}-app-key.pem",
            std::process::id()
        ));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("create the App key file {}: {e}", path.display()))?;
        let key_file = AppKeyFile(path);
        file.write_all(pem.as_bytes())
            .map_err(|e| format!("write the App key file {}: {e}", key_file.0.display()))?;
        Ok(key_file)
    }
}

impl Drop for AppKeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
