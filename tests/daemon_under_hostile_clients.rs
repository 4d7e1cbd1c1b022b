//! The daemon under hostile clients, as its own process (issue 17, item 2): `runner-scaler
//! run` against the twins with both listeners open on 127.0.0.1:0, while 300 clients hold
//! `--listen` with half a request head, 50 more hold `--webhook-listen` the same way, and
//! others stay connected after one answered request without reading or sending. The daemon
//! keeps dispatching, its resident set stays within a few MiB of its peak in normal
//! operation, the half-open clients are dropped within the header deadline (wave by wave of
//! the connection cap), the answered ones right after their answer, and SIGTERM with
//! half-open clients connected ends the process at once.
//!
//! `tests/hostile_clients.rs` holds the listener to the same limits in-process on a paused
//! clock; this is the evidence from the real process, read off `/proc/<pid>` and the clients'
//! own sockets. It runs on real time; every wait polls for an event against a deadline.

#![cfg(target_os = "linux")]

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use runner_scaler::serve::listener::{CONNECTIONS_MAX, HEADER_READ_TIMEOUT};
use runner_scaler::sim::twins::github::TEST_APP_PRIVATE_KEY_PEM;
use support::daemon_process::{Daemon, wait_until};
use support::twins::{TempFile, Twins};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

const PARENT: &str = "ci-runner";
const REPO: &str = "acme/api";
const WEBHOOK_SECRET: &str = "hostile-clients-webhook-secret";

/// How long a wait on the daemon's own progress (its start, a tick, a dispatch) may take: it
/// polls every second, and a first tick waits on every twin once.
const DEADLINE: Duration = Duration::from_secs(15);

/// Slack on every deadline of the listener: CI runs all test binaries at once on two cores,
/// and a wave of the cap starts only once the previous one has been dropped and accepted.
const SLACK: Duration = Duration::from_secs(5);

/// Half-open clients on `--listen`: the 300, more than twice the cap. The daemon takes
/// 128; its kernel's accept queue holds 129 more (the listener is bound with the backlog of
/// 128 that std and mio use); the last 43 find the queue full, their SYNs are dropped, and
/// their connects complete only on a retransmission once the first wave has been dropped
/// (about 5 s; measured as `connect_took`).
const HALF_OPEN_STATUS: usize = 300;
/// Half-open clients on `--webhook-listen`: fewer than its cap, all taken at once.
const HALF_OPEN_WEBHOOK: usize = 50;
/// Clients that send one whole request each, then neither read nor send.
const ANSWERED_STATUS: usize = 16;
const ANSWERED_WEBHOOK: usize = 4;
/// Half-open clients connected when SIGTERM comes.
const AT_SIGTERM_STATUS: usize = 100;
const AT_SIGTERM_WEBHOOK: usize = 20;

/// Request heads cut off inside a header line: nothing to answer, nothing malformed to refuse.
const HALF_HEAD_STATUS: &[u8] = b"GET /livez HTTP/1.1\r\nHost: scal";
const HALF_HEAD_WEBHOOK: &[u8] = b"POST /webhook/github HTTP/1.1\r\nHost: scaler\r\nX-GitHub-Ev";
const LIVEZ: &[u8] = b"GET /livez HTTP/1.1\r\nHost: scaler\r\n\r\n";
/// A ping whose signature is wrong: answered (401) without a hint reaching the loop.
const BAD_PING: &[u8] = b"POST /webhook/github HTTP/1.1\r\nHost: scaler\r\n\
    X-GitHub-Event: ping\r\nX-GitHub-Delivery: 72d3162e-cc78-11e3-81ab-4c9367dc0958\r\n\
    X-Hub-Signature-256: sha256=0000000000000000000000000000000000000000000000000000000000000000\r\n\
    Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";

/// How far the resident set may rise, while the clients are connected, above its peak over
/// two ticks of normal operation just before. The "a few MiB": before the listener
/// rework, 60 half-sent bodies alone took the daemon from 21 to 82 MB. Now the cap admits
/// 128 + 50 connections at a time here, each with hyper's read buffer and a task; measured
/// over ten runs (three beside a CPU-bound test binary), the peak rose 3.7 to 5.2 MiB above
/// a 34 MiB baseline, which includes the two dispatches of the attack and the allocator
/// keeping what it freed. 8 MiB leaves about 3 MiB of margin for a loaded machine, and is
/// still an order below what the issue saw.
const RSS_GROWTH_MAX_KIB: u64 = 8 * 1024;

/// How long the process may take from SIGTERM to its exit with half-open clients connected:
/// the issue saw 40 s for one such client. Half-open clients are dropped at once and the tick
/// in progress against loopback twins takes milliseconds; what is left is slack for a loaded
/// machine. (Whether the clients were dropped by the shutdown or by their own header
/// deadline is told apart by how long each was held, not by this bound.)
const EXIT_AFTER_SIGTERM_MAX: Duration = Duration::from_secs(5);

/// `state` in `struct tcp_info` for a socket whose peer has closed its end (Linux's
/// include/net/tcp_states.h: `TCP_CLOSE_WAIT = 8`); libc names no constant for it.
const TCP_CLOSE_WAIT: u8 = 8;

/// The address the daemon logged for `field` (`listen`, `webhook_listen`): it binds port 0.
/// A field name must start at a word boundary, since `webhook_listen=` ends in `listen=`.
fn logged_addr(stderr: &str, field: &str) -> Option<SocketAddr> {
    let needle = format!("{field}=");
    stderr.match_indices(&needle).find_map(|(at, _)| {
        let starts_a_word = stderr[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        let value: String = stderr[at + needle.len()..]
            .chars()
            .take_while(|c| !c.is_whitespace())
            .collect();
        starts_a_word.then(|| value.parse().ok()).flatten()
    })
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`).
fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the daemon runs");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// The daemon's resident set: its current size, and its peak since the last [`Rss::reset`].
/// The peak is the kernel's own high-water mark (`VmHWM`, reset through `clear_refs`), so a
/// spike between two looks is not missed; where `clear_refs` cannot be written, it is the
/// largest `VmRSS` seen at the looks this test takes.
struct Rss {
    pid: u32,
    kernel_peak: bool,
    seen_peak_kib: u64,
}

impl Rss {
    fn of(pid: u32) -> Rss {
        let mut rss = Rss {
            pid,
            kernel_peak: true,
            seen_peak_kib: 0,
        };
        rss.reset();
        rss
    }

    fn now_kib(&self) -> u64 {
        proc_status_kib(self.pid, "VmRSS")
    }

    /// Starts a new peak from the current size.
    fn reset(&mut self) {
        // "5": reset the peak resident set size to the current one (proc(5), Linux ≥ 4.0).
        if let Err(e) = std::fs::write(format!("/proc/{}/clear_refs", self.pid), "5") {
            eprintln!("cannot reset VmHWM ({e}): the peak is the largest VmRSS looked at");
            self.kernel_peak = false;
        }
        self.seen_peak_kib = self.now_kib();
    }

    fn look(&mut self) {
        self.seen_peak_kib = self.seen_peak_kib.max(self.now_kib());
    }

    fn peak_kib(&mut self) -> u64 {
        self.look();
        if self.kernel_peak {
            self.seen_peak_kib.max(proc_status_kib(self.pid, "VmHWM"))
        } else {
            self.seen_peak_kib
        }
    }
}

/// Connections the daemon has accepted on `port` and still holds: its socket descriptors
/// (`/proc/<pid>/fd`) that `/proc/net/tcp` shows on that local port, listener excepted. Those
/// still in the kernel's accept queue are not the daemon's yet and are not counted.
fn held_connections(pid: u32, port: u16) -> usize {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    let inodes: BTreeSet<String> = fds
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let local = format!(":{port:04X}");
    // Counted once per inode: the kernel writes the table a page at a time and finds its
    // place again by position, so while connections come and go a row may be read twice.
    let held: BTreeSet<&str> = table
        .lines()
        .skip(1)
        .filter_map(|row| {
            let fields: Vec<&str> = row.split_whitespace().collect();
            // local_address, st (0A: LISTEN), inode.
            (fields.len() > 9
                && fields[1].ends_with(&local)
                && fields[3] != "0A"
                && inodes.contains(fields[9]))
            .then_some(fields[9])
        })
        .collect();
    held.len()
}

/// The TCP state of this end of `stream`, as the kernel keeps it.
fn tcp_state(stream: &TcpStream) -> u8 {
    // SAFETY: `tcp_info` is plain integers, for which all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the descriptor is open for as long as `stream` is borrowed, and `info` and
    // `len` describe a buffer of the size given.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    assert_eq!(
        rc,
        0,
        "getsockopt(TCP_INFO): {}",
        std::io::Error::last_os_error()
    );
    info.tcpi_state
}

/// A connection to `addr` that has sent `bytes`, and when it had.
async fn sent(addr: SocketAddr, bytes: &[u8]) -> (TcpStream, Instant) {
    let mut stream = TcpStream::connect(addr)
        .await
        .expect("the kernel takes the connection");
    stream.write_all(bytes).await.expect("send");
    (stream, Instant::now())
}

/// How a half-open client's connection ended.
struct Closed {
    /// From the start of its connect to the kernel's handshake done: beyond the cap and the
    /// accept queue behind it, the daemon's kernel drops SYNs and the client retries.
    connect_took: Duration,
    /// From its last byte sent to the daemon's close.
    after: Duration,
    /// What the daemon sent before closing, if anything.
    answer: Vec<u8>,
}

/// How many clients of a batch have connected, and how many of those have been closed.
#[derive(Default)]
struct Batch {
    connected: AtomicUsize,
    closed: AtomicUsize,
}

impl Batch {
    fn connected(&self) -> usize {
        self.connected.load(Ordering::SeqCst)
    }

    fn open(&self) -> usize {
        self.connected() - self.closed.load(Ordering::SeqCst)
    }
}

/// `count` clients, each in a task of its own, that connect, send `head` and then only wait
/// for the daemon to close.
fn half_open(
    addr: SocketAddr,
    head: &'static [u8],
    count: usize,
    batch: &Arc<Batch>,
) -> Vec<JoinHandle<Closed>> {
    let mut clients = Vec::with_capacity(count);
    for _ in 0..count {
        let batch = batch.clone();
        clients.push(tokio::spawn(async move {
            let connecting = Instant::now();
            let mut stream = TcpStream::connect(addr)
                .await
                .expect("the kernel takes the connection");
            let connect_took = connecting.elapsed();
            stream.write_all(head).await.expect("send");
            let since = Instant::now();
            batch.connected.fetch_add(1, Ordering::SeqCst);
            let mut answer = Vec::new();
            let mut buffer = [0u8; 1024];
            // Reading sends nothing: to the daemon this client is still half a request.
            while let Ok(n) = stream.read(&mut buffer).await {
                if n == 0 {
                    break;
                }
                answer.extend_from_slice(&buffer[..n]);
            }
            let after = since.elapsed();
            batch.closed.fetch_add(1, Ordering::SeqCst);
            Closed {
                connect_took,
                after,
                answer,
            }
        }));
    }
    clients
}

/// Waits for every client of `clients` to be closed; a guard only, far beyond any bound
/// asserted on what it returns.
async fn closes(clients: Vec<JoinHandle<Closed>>) -> Vec<Closed> {
    let guard = Duration::from_secs(40);
    let mut closed = Vec::with_capacity(clients.len());
    for client in clients {
        match tokio::time::timeout(guard, client).await {
            Ok(done) => closed.push(done.expect("the client task")),
            Err(_) => panic!("a half-open client is still connected after {guard:?}"),
        }
    }
    closed
}

/// One whole request on a fresh connection, read to the end: the time to the daemon's close.
async fn answered_once(addr: SocketAddr, request: &[u8]) -> (Duration, String) {
    let (mut stream, since) = sent(addr, request).await;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .expect("read the answer");
    (
        since.elapsed(),
        String::from_utf8_lossy(&answer).into_owned(),
    )
}

fn status_line(answer: &str) -> &str {
    answer.lines().next().unwrap_or("")
}

/// Closing times, first to last, in chunks of the cap (the waves the daemon takes them in).
fn waves(closed: &[Closed]) -> String {
    let mut times: Vec<Duration> = closed.iter().map(|c| c.after).collect();
    times.sort();
    times
        .chunks(CONNECTIONS_MAX)
        .map(|wave| {
            format!(
                "{} closed {:.2}..{:.2} s",
                wave.len(),
                wave[0].as_secs_f64(),
                wave[wave.len() - 1].as_secs_f64()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_300_half_open_clients_the_daemon_dispatches_stays_small_and_exits_at_once() {
    let twins = Twins::start().await;
    let (repo, _) = twins.provision_one_queued_job(REPO, PARENT);
    let key_file = TempFile::with_contents("app-key.pem", TEST_APP_PRIVATE_KEY_PEM);
    let mut daemon = Daemon::start_with_env(
        &twins,
        &key_file,
        &[
            "run",
            "--poll-interval",
            "1s",
            "--listen",
            "127.0.0.1:0",
            "--webhook-listen",
            "127.0.0.1:0",
        ],
        &[("GITHUB_WEBHOOK_SECRET", WEBHOOK_SECRET)],
    );
    let pid = daemon.pid();

    // 1. Serving on both ports, and a first tick done: the queued job has its child.
    let started = wait_until(DEADLINE, || {
        let stderr = daemon.stderr();
        let status = logged_addr(&stderr, "listen")?;
        let webhooks = logged_addr(&stderr, "webhook_listen")?;
        (!twins.our_children(PARENT).is_empty()).then_some((status, webhooks))
    })
    .await;
    let (status_addr, webhook_addr) = started.unwrap_or_else(|| {
        panic!(
            "the daemon did not serve and dispatch; stderr:\n{}",
            daemon.stderr()
        )
    });
    // One request served on each port first, so that the baseline holds what serving needs.
    let (_, answer) = answered_once(status_addr, LIVEZ).await;
    assert_eq!(status_line(&answer), "HTTP/1.1 200 OK", "{answer}");
    let (_, answer) = answered_once(webhook_addr, BAD_PING).await;
    assert_eq!(
        status_line(&answer),
        "HTTP/1.1 401 Unauthorized",
        "{answer}"
    );

    // 2. The baseline: the peak resident set over two more ticks of normal operation.
    let mut rss = Rss::of(pid);
    let ticks = twins.listings_of_children(PARENT);
    let ticked = wait_until(DEADLINE, || {
        rss.look();
        (twins.listings_of_children(PARENT) >= ticks + 2).then_some(())
    })
    .await;
    assert!(
        ticked.is_some(),
        "the daemon stopped ticking; stderr:\n{}",
        daemon.stderr()
    );
    let baseline_kib = rss.peak_kib();
    let baseline_now_kib = rss.now_kib();
    rss.reset();

    // 3. Clients that send one whole request and then neither read nor send, first, so that
    // they are among the connections the daemon takes before its cap is full; then the
    // half-open clients, each connecting in a task of its own.
    let mut answered = Vec::new();
    for (addr, request, count) in [
        (status_addr, LIVEZ, ANSWERED_STATUS),
        (webhook_addr, BAD_PING, ANSWERED_WEBHOOK),
    ] {
        for _ in 0..count {
            answered.push(sent(addr, request).await);
        }
    }
    let status_batch = Arc::new(Batch::default());
    let webhook_batch = Arc::new(Batch::default());
    let attack = Instant::now();
    let status_clients = half_open(
        status_addr,
        HALF_HEAD_STATUS,
        HALF_OPEN_STATUS,
        &status_batch,
    );
    let webhook_clients = half_open(
        webhook_addr,
        HALF_HEAD_WEBHOOK,
        HALF_OPEN_WEBHOOK,
        &webhook_batch,
    );

    // 4. New jobs as the clients come: the daemon must still dispatch for them (up to the
    // repo's cap of 3).
    twins
        .github
        .add_run(&repo, vec![vec!["self-hosted"], vec!["self-hosted"]]);
    let queued = Instant::now();

    // Three events, watched together, and at every look the daemon's resident set and the
    // connections it holds on each port: the answered clients closed by the daemon, the new
    // jobs' children dispatched, every half-open client connected.
    let mut held_max = (0, 0);
    let mut answered_closed_in = None;
    let mut dispatched = None;
    let mut connected_in = None;
    let watched = wait_until(DEADLINE, || {
        rss.look();
        held_max.0 = held_max.0.max(held_connections(pid, status_addr.port()));
        held_max.1 = held_max.1.max(held_connections(pid, webhook_addr.port()));
        if answered_closed_in.is_none()
            && answered
                .iter()
                .all(|(stream, _)| tcp_state(stream) == TCP_CLOSE_WAIT)
        {
            answered_closed_in = answered.iter().map(|(_, since)| since.elapsed()).max();
        }
        if dispatched.is_none() && twins.our_children(PARENT).len() >= 3 {
            dispatched = Some((queued.elapsed(), status_batch.open(), webhook_batch.open()));
        }
        if connected_in.is_none()
            && status_batch.connected() == HALF_OPEN_STATUS
            && webhook_batch.connected() == HALF_OPEN_WEBHOOK
        {
            connected_in = Some(attack.elapsed());
        }
        (answered_closed_in.is_some() && dispatched.is_some() && connected_in.is_some())
            .then_some(())
    })
    .await;
    if watched.is_none() {
        let still_open = answered
            .iter()
            .filter(|(stream, _)| tcp_state(stream) != TCP_CLOSE_WAIT)
            .count();
        panic!(
            "within {DEADLINE:?}: {still_open} of {} answered clients still open; {} children \
             (3 expected); {} + {} half-open clients connected; stderr:\n{}",
            answered.len(),
            twins.our_children(PARENT).len(),
            status_batch.connected(),
            webhook_batch.connected(),
            daemon.stderr()
        );
    }
    let (answered_closed_in, (dispatched_in, held_status, held_webhook), connected_in) = (
        answered_closed_in.unwrap(),
        dispatched.unwrap(),
        connected_in.unwrap(),
    );
    // A health check like Nomad's, behind every half-open client of --listen.
    let health_check = tokio::spawn(answered_once(status_addr, LIVEZ));

    // The answered clients were closed right after the answer (keep-alive is off): sooner
    // than the header deadline, the first deadline that could have dropped them.
    assert!(
        answered_closed_in < HEADER_READ_TIMEOUT,
        "the answered clients were closed only {answered_closed_in:?} after their request"
    );
    for (i, (mut stream, _)) in answered.into_iter().enumerate() {
        let mut answer = Vec::new();
        stream
            .read_to_end(&mut answer)
            .await
            .expect("read the answer");
        let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
        let expected = if i < ANSWERED_STATUS {
            "http/1.1 200 ok"
        } else {
            "http/1.1 401 unauthorized"
        };
        assert_eq!(status_line(&answer), expected, "{answer}");
        assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
    }
    assert!(
        held_status > 0,
        "every half-open client was gone before the dispatch: it proves nothing"
    );

    // 5 and 6. Every half-open client is dropped: the look goes on until they all are.
    let all_closed = wait_until(Duration::from_secs(40), || {
        rss.look();
        held_max.0 = held_max.0.max(held_connections(pid, status_addr.port()));
        held_max.1 = held_max.1.max(held_connections(pid, webhook_addr.port()));
        (status_batch.open() == 0 && webhook_batch.open() == 0).then_some(())
    })
    .await;
    assert!(
        all_closed.is_some(),
        "{} + {} half-open clients still connected after 40 s",
        status_batch.open(),
        webhook_batch.open()
    );
    let peak_kib = rss.peak_kib();
    let after_kib = rss.now_kib();
    let (closed_status, closed_webhook) =
        tokio::join!(closes(status_clients), closes(webhook_clients));
    let (health_check_in, health_answer) = tokio::time::timeout(DEADLINE, health_check)
        .await
        .expect("the health check behind the half-open clients is answered")
        .unwrap();

    // Each is dropped within the header deadline of its accept: the first wave (as many as
    // the cap) within the deadline of connecting, and those that waited in the accept queue
    // within one deadline more per wave in front of them.
    let waves_status = HALF_OPEN_STATUS.div_ceil(CONNECTIONS_MAX) as u32;
    let status_within = HEADER_READ_TIMEOUT * waves_status;
    let mut held_for: Vec<Duration> = closed_status.iter().map(|c| c.after).collect();
    held_for.sort();
    let first_wave_last = held_for[CONNECTIONS_MAX - 1];
    let status_last = held_for[held_for.len() - 1];
    let webhook_last = closed_webhook.iter().map(|c| c.after).max().unwrap();
    let connect_longest = closed_status
        .iter()
        .chain(&closed_webhook)
        .map(|c| c.connect_took)
        .max()
        .unwrap();
    let answers: BTreeSet<String> = closed_status
        .iter()
        .chain(&closed_webhook)
        .map(|c| status_line(&String::from_utf8_lossy(&c.answer)).to_string())
        .collect();

    eprintln!(
        "RSS: baseline peak {baseline_kib} KiB (VmRSS {baseline_now_kib} KiB), peak with the \
         clients {peak_kib} KiB (+{} KiB; kernel high-water mark: {}), VmRSS after they were \
         dropped {after_kib} KiB",
        peak_kib.saturating_sub(baseline_kib),
        rss.kernel_peak,
    );
    eprintln!(
        "{HALF_OPEN_STATUS} + {HALF_OPEN_WEBHOOK} half-open clients all connected after {:.3} \
         s (the longest connect {:.3} s); the daemon held at most {} on --listen and {} on \
         --webhook-listen (cap {CONNECTIONS_MAX})",
        connected_in.as_secs_f64(),
        connect_longest.as_secs_f64(),
        held_max.0,
        held_max.1
    );
    eprintln!(
        "answered clients closed by the daemon within {:.3} s of their request",
        answered_closed_in.as_secs_f64()
    );
    eprintln!(
        "new jobs dispatched {:.3} s after queueing, with {held_status} + {held_webhook} \
         half-open clients connected",
        dispatched_in.as_secs_f64()
    );
    eprintln!("--listen half-open, held for: {}", waves(&closed_status));
    eprintln!(
        "--webhook-listen half-open, held for: {}",
        waves(&closed_webhook)
    );
    eprintln!("what half-open clients were sent before the close: {answers:?}");
    eprintln!(
        "a health check behind the {HALF_OPEN_STATUS} was answered after {:.3} s ({})",
        health_check_in.as_secs_f64(),
        status_line(&health_answer)
    );

    assert!(
        peak_kib <= baseline_kib + RSS_GROWTH_MAX_KIB,
        "the resident set rose from {baseline_kib} KiB to {peak_kib} KiB"
    );
    assert!(
        held_max.0 <= CONNECTIONS_MAX && held_max.1 <= CONNECTIONS_MAX,
        "the daemon held {held_max:?} connections, beyond its cap of {CONNECTIONS_MAX}"
    );
    assert!(
        first_wave_last <= HEADER_READ_TIMEOUT + SLACK,
        "the first {CONNECTIONS_MAX} half-open clients were held until {first_wave_last:?}"
    );
    assert!(
        status_last <= status_within + SLACK,
        "the last half-open client of --listen was held {status_last:?}"
    );
    assert!(
        webhook_last <= HEADER_READ_TIMEOUT + SLACK,
        "the last half-open client of --webhook-listen was held {webhook_last:?}"
    );
    assert_eq!(
        status_line(&health_answer),
        "HTTP/1.1 200 OK",
        "{health_answer}"
    );

    // 7. A fresh batch of half-open clients, all taken by the daemon; then SIGTERM.
    let at_sigterm_batch = Arc::new(Batch::default());
    let mut at_sigterm = half_open(
        status_addr,
        HALF_HEAD_STATUS,
        AT_SIGTERM_STATUS,
        &at_sigterm_batch,
    );
    at_sigterm.extend(half_open(
        webhook_addr,
        HALF_HEAD_WEBHOOK,
        AT_SIGTERM_WEBHOOK,
        &at_sigterm_batch,
    ));
    let taken = wait_until(DEADLINE, || {
        (held_connections(pid, status_addr.port()) == AT_SIGTERM_STATUS
            && held_connections(pid, webhook_addr.port()) == AT_SIGTERM_WEBHOOK)
            .then_some(())
    })
    .await;
    assert!(
        taken.is_some(),
        "the daemon did not take the fresh clients: it holds {} and {}",
        held_connections(pid, status_addr.port()),
        held_connections(pid, webhook_addr.port())
    );
    // SAFETY: a signal to this test's own child, by the pid of its handle; it has not been
    // waited for, so the pid is still its own.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) }, 0);
    let signalled = Instant::now();
    let exit = loop {
        if let Some(exit) = daemon.try_wait() {
            break Some((exit, signalled.elapsed()));
        }
        if signalled.elapsed() > EXIT_AFTER_SIGTERM_MAX {
            break None;
        }
        // Only the resolution of the measurement: the exit is an event polled for.
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let still_open = at_sigterm_batch.open();
    let stderr = daemon.stop();
    let (exit, exited_in) = exit.unwrap_or_else(|| {
        panic!(
            "the daemon did not exit within {EXIT_AFTER_SIGTERM_MAX:?} of SIGTERM with \
             {still_open} half-open clients connected; stderr:\n{stderr}"
        )
    });
    eprintln!(
        "SIGTERM with {AT_SIGTERM_STATUS} + {AT_SIGTERM_WEBHOOK} half-open clients connected: \
         exited after {:.3} s ({exit})",
        exited_in.as_secs_f64()
    );
    assert!(exit.success(), "{exit}; stderr:\n{stderr}");
    // It ended by its own shutdown, both listeners done (not by a forced exit)...
    for listener in ["/metrics, /livez, /healthz and /status", "webhooks"] {
        assert!(
            stderr.contains(&format!("serve {listener}: every connection ended")),
            "{listener} did not end its connections; stderr:\n{stderr}"
        );
    }
    assert!(
        stderr.contains("runner-scaler stopped"),
        "stderr:\n{stderr}"
    );
    // ...and dropped the half-open clients before their own header deadline could: a
    // shutdown that waited for them would pass the exit bound alone, since they were taken
    // only just before the signal.
    let closed_at_sigterm = closes(at_sigterm).await;
    let held_longest = closed_at_sigterm.iter().map(|c| c.after).max().unwrap();
    eprintln!(
        "the clients connected at SIGTERM were held {:.3} s at most",
        held_longest.as_secs_f64()
    );
    assert!(
        held_longest < HEADER_READ_TIMEOUT,
        "a client connected at SIGTERM was held {held_longest:?}, until its header deadline"
    );
}
