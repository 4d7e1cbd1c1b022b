//! A measurement, not a test (issue 17, item 2): this process's resident memory while 300
//! hostile clients hold connections to the webhook listener, served as the daemon serves it
//! (`serve::spawn`, the shipped limits). Each attack runs in a process of its own, since
//! freed memory is not always handed back:
//!
//! ```sh
//! for attack in silent half_head body_64k_but_one body_1m_but_one; do
//!   cargo test --test listener_rss -- --ignored --exact "rss_under_300_${attack}_clients"
//! done
//! ```
//!
//! It prints the resident set before and with the clients connected. It waits in real time
//! for the server to take what it will (a measurement has nothing else to wait for), so it
//! is `#[ignore]`d.

#![cfg(target_os = "linux")]

use std::sync::Arc;
use std::time::Duration;

use runner_scaler::clock::SystemClock;
use runner_scaler::metrics::Metrics;
use runner_scaler::webhook::{Hints, Receiver, WebhookSecrets};
use secrecy::SecretString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CLIENTS: usize = 300;

/// Long enough for the server to have read what it will; well short of the header read
/// timeout, so no client has been dropped yet.
const SETTLE: Duration = Duration::from_secs(2);

/// `VmRSS` of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

fn head(content_length: usize) -> String {
    format!(
        "POST /webhook/github HTTP/1.1\r\nHost: scaler\r\nX-GitHub-Event: workflow_job\r\n\
         X-GitHub-Delivery: d-1\r\nX-Hub-Signature-256: sha256=00\r\n\
         Content-Length: {content_length}\r\n\r\n"
    )
}

/// Starts the webhook listener, then connects [`CLIENTS`] clients that each send `sent` and
/// stop; prints the resident set before and after.
async fn measure(attack: &str, sent: Vec<u8>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let receiver = Receiver::new(
        WebhookSecrets {
            github: Some(SecretString::from("listener-rss-secret")),
            forgejo: None,
        },
        Hints::new(),
        Arc::new(Metrics::default()),
        Arc::new(SystemClock),
    );
    runner_scaler::serve::spawn(
        "webhooks",
        listener,
        runner_scaler::webhook::router(receiver),
        std::future::pending(),
    );
    // One request served first, so the baseline holds what any served request needs.
    let mut warm = TcpStream::connect(addr).await.unwrap();
    // `Connection: close`: a server with keep-alive on (the one before the fix) would
    // otherwise keep it open.
    let warm_up = head(2).replacen("\r\n", "\r\nConnection: close\r\n", 1);
    warm.write_all(format!("{warm_up}{{}}").as_bytes())
        .await
        .unwrap();
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(SETTLE, warm.read_to_end(&mut reply)).await;
    let before = rss_kib();

    let sent = Arc::new(sent);
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let sent = sent.clone();
        clients.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            // A client beyond the cap, or refused, may not be able to send it all.
            let _ = tokio::time::timeout(SETTLE, stream.write_all(&sent)).await;
            stream
        }));
    }
    let mut held = Vec::new();
    for client in clients {
        held.push(client.await.unwrap());
    }
    tokio::time::sleep(SETTLE).await;
    let with_clients = rss_kib();
    println!(
        "{attack}: {CLIENTS} clients: RSS {:.1} MiB before, {:.1} MiB with them connected \
         (+{:.1} MiB)",
        before as f64 / 1024.0,
        with_clients as f64 / 1024.0,
        with_clients.saturating_sub(before) as f64 / 1024.0
    );
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run by hand, one attack per process"]
async fn rss_under_300_silent_clients() {
    measure("silent", Vec::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run by hand, one attack per process"]
async fn rss_under_300_half_head_clients() {
    let head = head(2);
    measure("half_head", head.as_bytes()[..head.len() / 2].to_vec()).await;
}

/// All but the last byte of a body at today's cap (64 KiB): the most a client can make the
/// receiver hold now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run by hand, one attack per process"]
async fn rss_under_300_body_64k_but_one_clients() {
    let length = 64 * 1024;
    let mut sent = head(length).into_bytes();
    sent.extend(std::iter::repeat_n(b'x', length - 1));
    measure("body_64k_but_one", sent).await;
}

/// Issue 17's attack: all but the last byte of a 1 MiB body (the cap before the fix).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run by hand, one attack per process"]
async fn rss_under_300_body_1m_but_one_clients() {
    let length = 1024 * 1024;
    let mut sent = head(length).into_bytes();
    sent.extend(std::iter::repeat_n(b'x', length - 1));
    measure("body_1m_but_one", sent).await;
}
