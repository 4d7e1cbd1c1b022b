//! Hostile clients against both listeners (`--listen`'s status routes and
//! `--webhook-listen`'s), over real TCP on 127.0.0.1:0 (issue 17, item 2): clients that send
//! nothing, half a request head, half a body, a body too large, an HTTP/2 preface, or that
//! hold hundreds of connections open, and a shutdown with such clients connected.
//!
//! The listeners run with the limits that ship ([`Limits::default`]) under tokio's paused
//! clock: both ends of every connection are in the test's one runtime, so the clock moves
//! only when both have done all they can, and a deadline is read off as the virtual time at
//! which the server closed. Nothing sleeps in real time; a test waits for an expected event
//! (a close, an answer, the server's end) under a generous virtual timeout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use runner_scaler::clock::SystemClock;
use runner_scaler::metrics::Metrics;
use runner_scaler::report::live::Role;
use runner_scaler::serve::Endpoints;
use runner_scaler::serve::listener::{
    CONNECTIONS_MAX, HEADER_READ_TIMEOUT, Limits, REQUEST_TIMEOUT, SHUTDOWN_GRACE, spawn,
};
use runner_scaler::webhook::{Hints, Receiver, WEBHOOK_BODY_MAX_BYTES, WebhookSecrets};
use secrecy::SecretString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long a test waits (in virtual time) for an event it expects: far beyond every limit.
const PATIENCE: Duration = Duration::from_secs(120);

/// The two listeners' routers.
#[derive(Clone, Copy, Debug)]
enum Routes {
    Status,
    Webhooks,
}

const BOTH: [Routes; 2] = [Routes::Status, Routes::Webhooks];

impl Routes {
    fn router(self) -> axum::Router {
        let metrics = Arc::new(Metrics::default());
        match self {
            Routes::Status => runner_scaler::serve::router(Endpoints {
                metrics,
                clock: Arc::new(SystemClock),
                last_tick: tokio::sync::watch::channel(None).1,
                role: tokio::sync::watch::channel(Role::Shadow).1,
                read_token: None,
            }),
            Routes::Webhooks => runner_scaler::webhook::router(Receiver::new(
                WebhookSecrets {
                    github: Some(SecretString::from("hostile-clients-secret")),
                    forgejo: None,
                },
                Hints::new(),
                metrics,
                Arc::new(SystemClock),
            )),
        }
    }

    /// A complete, well-formed request of these routes.
    fn request(self) -> &'static [u8] {
        match self {
            Routes::Status => b"GET /livez HTTP/1.1\r\nHost: scaler\r\n\r\n",
            Routes::Webhooks => {
                b"POST /webhook/github HTTP/1.1\r\nHost: scaler\r\nX-GitHub-Event: ping\r\n\
                  X-GitHub-Delivery: d-1\r\nX-Hub-Signature-256: sha256=00\r\n\
                  Content-Length: 2\r\n\r\n{}"
            }
        }
    }
}

/// One listener on a free loopback port, and the means to stop it.
struct Served {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    server: JoinHandle<()>,
}

async fn serve(routes: Routes, limits: Limits) -> Served {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = spawn("test", listener, routes.router(), limits, async move {
        let _ = stopped.await;
    });
    Served {
        addr,
        stop: Some(stop),
        server,
    }
}

impl Served {
    async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.addr)
            .await
            .expect("the listener takes the connection")
    }

    /// A connection that has sent `bytes` and nothing more.
    async fn sent(&self, bytes: &[u8]) -> TcpStream {
        let mut stream = self.connect().await;
        stream.write_all(bytes).await.unwrap();
        stream
    }

    /// Signals shutdown and waits for the server to end; the virtual time it took.
    async fn shut_down(mut self) -> Duration {
        let signalled = Instant::now();
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(PATIENCE, &mut self.server)
            .await
            .expect("the server ends after its shutdown signal")
            .unwrap();
        signalled.elapsed()
    }
}

/// Reads until the server closes the connection (a reset counts as a close): what it sent,
/// and when it closed, counted from `since`.
async fn until_closed(stream: &mut TcpStream, since: Instant) -> (Vec<u8>, Duration) {
    let read = async {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return got,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    let got = tokio::time::timeout(PATIENCE, read)
        .await
        .expect("the server closes the connection");
    (got, since.elapsed())
}

fn status_line(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply)
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

/// Descriptors this process holds open (Linux).
fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd lists this process's descriptors")
        .count()
}

#[tokio::test(start_paused = true)]
async fn a_client_that_sends_nothing_or_half_a_request_head_is_dropped_at_the_header_read_timeout()
{
    for routes in BOTH {
        let served = serve(routes, Limits::default()).await;
        let start = Instant::now();
        let head = routes.request();
        let mut silent = served.connect().await;
        let mut half_head = served.sent(&head[..head.len() / 3]).await;
        for (client, stream) in [("silent", &mut silent), ("half a head", &mut half_head)] {
            let (reply, closed_at) = until_closed(stream, start).await;
            assert!(
                closed_at >= HEADER_READ_TIMEOUT && closed_at < REQUEST_TIMEOUT,
                "{routes:?}, {client}: closed after {closed_at:?}, not at the header read \
                 timeout ({HEADER_READ_TIMEOUT:?})"
            );
            assert!(
                reply.is_empty() || status_line(&reply).starts_with("HTTP/1.1 "),
                "{routes:?}, {client}: {reply:?}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_webhook_body_sent_in_part_or_a_byte_at_a_time_is_dropped_at_the_request_timeout() {
    let served = serve(Routes::Webhooks, Limits::default()).await;
    let head = "POST /webhook/github HTTP/1.1\r\nHost: scaler\r\nX-GitHub-Event: workflow_job\r\n\
                X-GitHub-Delivery: d-1\r\nX-Hub-Signature-256: sha256=00\r\n\
                Content-Length: 4000\r\n\r\n";
    let start = Instant::now();
    let mut half_body = served
        .sent(format!("{head}{}", "x".repeat(2000)).as_bytes())
        .await;
    let (reply, closed_at) = until_closed(&mut half_body, start).await;
    assert!(
        closed_at >= REQUEST_TIMEOUT && closed_at < REQUEST_TIMEOUT + Duration::from_secs(1),
        "half a body: closed after {closed_at:?}, not at the request timeout ({REQUEST_TIMEOUT:?})"
    );
    assert!(reply.is_empty(), "{reply:?}");

    // A byte a second keeps every read short: the deadline is the whole request's.
    let start = Instant::now();
    let mut trickle = served.sent(head.as_bytes()).await;
    let trickling = async {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if trickle.write_all(b"x").await.is_err() {
                break;
            }
        }
    };
    tokio::time::timeout(PATIENCE, trickling)
        .await
        .expect("the server stops taking the trickle");
    let closed_at = start.elapsed();
    assert!(
        closed_at <= REQUEST_TIMEOUT + Duration::from_secs(2),
        "a byte a second: still taken after {closed_at:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_connection_is_closed_once_its_one_request_is_answered() {
    for routes in BOTH {
        let served = serve(routes, Limits::default()).await;
        let start = Instant::now();
        // Even when the client asks to keep it, and says no more.
        let request = String::from_utf8(routes.request().to_vec())
            .unwrap()
            .replacen("\r\n", "\r\nConnection: keep-alive\r\n", 1);
        let mut spent = served.sent(request.as_bytes()).await;
        let (reply, closed_at) = until_closed(&mut spent, start).await;
        assert!(
            status_line(&reply).starts_with("HTTP/1.1 "),
            "{routes:?}: {reply:?}"
        );
        assert!(
            closed_at < HEADER_READ_TIMEOUT,
            "{routes:?}: the spent connection stayed open {closed_at:?}"
        );
    }
    // A status route reads no body: a GET that announces one is answered without it.
    let served = serve(Routes::Status, Limits::default()).await;
    let start = Instant::now();
    let mut with_body = served
        .sent(b"GET /livez HTTP/1.1\r\nHost: scaler\r\nContent-Length: 100000000\r\n\r\nxx")
        .await;
    let (reply, closed_at) = until_closed(&mut with_body, start).await;
    assert!(status_line(&reply).starts_with("HTTP/1.1 "), "{reply:?}");
    assert!(closed_at < HEADER_READ_TIMEOUT, "{closed_at:?}");
}

#[tokio::test(start_paused = true)]
async fn idle_connections_below_the_cap_leave_room_for_a_well_formed_request() {
    let served = serve(Routes::Status, Limits::default()).await;
    let mut idle = Vec::new();
    for _ in 0..CONNECTIONS_MAX - 1 {
        idle.push(served.connect().await);
    }
    let start = Instant::now();
    let mut request = served.sent(Routes::Status.request()).await;
    let (reply, answered_at) = until_closed(&mut request, start).await;
    assert!(status_line(&reply).starts_with("HTTP/1.1 "), "{reply:?}");
    assert!(
        answered_at < HEADER_READ_TIMEOUT,
        "answered only after {answered_at:?}"
    );
}

impl Routes {
    /// A request of these routes cut off half-way through its body.
    fn half_a_body(self) -> &'static [u8] {
        match self {
            Routes::Status => {
                b"GET /livez HTTP/1.1\r\nHost: scaler\r\nContent-Length: 100\r\n\r\nxx"
            }
            Routes::Webhooks => {
                b"POST /webhook/github HTTP/1.1\r\nHost: scaler\r\nX-GitHub-Event: ping\r\n\
                  X-GitHub-Delivery: d-1\r\nX-Hub-Signature-256: sha256=00\r\n\
                  Content-Length: 100\r\n\r\nxx"
            }
        }
    }
}

/// Beyond the cap, connections wait in the kernel's accept queue (the first of them in a
/// descriptor of the server's, while it makes room): the daemon spends no descriptor on the
/// rest, and serves them in turn.
#[cfg(target_os = "linux")]
#[tokio::test(start_paused = true)]
async fn three_hundred_hostile_clients_hold_at_most_the_cap_and_a_request_is_served_in_turn() {
    const HOSTILE: usize = 300;
    for routes in BOTH {
        let served = serve(routes, Limits::default()).await;
        let before = open_descriptors();
        let start = Instant::now();
        let head = routes.request();
        let mut hostile = Vec::new();
        for i in 0..HOSTILE {
            hostile.push(match i % 3 {
                0 => served.connect().await,
                1 => served.sent(&head[..head.len() / 3]).await,
                _ => served.sent(routes.half_a_body()).await,
            });
        }
        // Half-way to the first header read timeout, the server has taken all it will take.
        tokio::time::sleep_until(start + HEADER_READ_TIMEOUT / 2).await;
        let opened = open_descriptors() - before;
        assert!(
            opened <= HOSTILE + CONNECTIONS_MAX + 1,
            "{routes:?}: {opened} descriptors for {HOSTILE} clients: the server holds {} \
             connections, over its cap of {CONNECTIONS_MAX}",
            opened - HOSTILE
        );

        let mut request = served.sent(routes.request()).await;
        let (reply, answered_at) = until_closed(&mut request, start).await;
        assert!(
            status_line(&reply).starts_with("HTTP/1.1 "),
            "{routes:?}: {reply:?}"
        );
        // Those ahead of it hold a slot for a request timeout at most.
        let rounds = u32::try_from(HOSTILE / CONNECTIONS_MAX + 1).unwrap();
        assert!(
            answered_at <= REQUEST_TIMEOUT * rounds,
            "{routes:?}: answered only after {answered_at:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_with_idle_and_half_open_clients_connected_ends_at_once() {
    for routes in BOTH {
        let served = serve(routes, Limits::default()).await;
        let start = Instant::now();
        let head = routes.request();
        let mut clients = Vec::new();
        for _ in 0..10 {
            clients.push(served.connect().await);
            clients.push(served.sent(&head[..head.len() / 3]).await);
        }
        // Every client is taken, and none has timed out yet.
        tokio::time::sleep_until(start + HEADER_READ_TIMEOUT / 2).await;
        let addr = served.addr;
        let took = served.shut_down().await;
        assert!(
            took < SHUTDOWN_GRACE,
            "{routes:?}: the shutdown waited {took:?} for clients with no request in flight"
        );
        let signalled = Instant::now();
        for client in &mut clients {
            let (_, closed_at) = until_closed(client, signalled).await;
            assert_eq!(closed_at, Duration::ZERO, "{routes:?}");
        }
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "{routes:?}: a stopped listener still takes connections"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_in_flight_at_shutdown_is_answered_within_the_grace_and_a_stalled_one_dropped() {
    let served = serve(Routes::Webhooks, Limits::default()).await;
    let head = "POST /webhook/github HTTP/1.1\r\nHost: scaler\r\nX-GitHub-Event: ping\r\n\
                X-GitHub-Delivery: d-1\r\nX-Hub-Signature-256: sha256=00\r\n\
                Content-Length: 4\r\n\r\n";
    let mut finishing = served.sent(format!("{head}{{}}").as_bytes()).await;
    let mut stalled = served.sent(format!("{head}{{}}").as_bytes()).await;
    // The heads are in and the handlers wait for the bodies' last two bytes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let shutting_down = tokio::spawn(served.shut_down());
    // Half-way through the grace, the client finishes its body.
    tokio::time::sleep(SHUTDOWN_GRACE / 2).await;
    let signalled = Instant::now() - SHUTDOWN_GRACE / 2;
    finishing.write_all(b"  ").await.unwrap();
    let (reply, answered_at) = until_closed(&mut finishing, signalled).await;
    assert_eq!(answered_at, SHUTDOWN_GRACE / 2);
    // Answered: refused for its signature, which is what an answer to this request is.
    assert_eq!(
        status_line(&reply),
        "HTTP/1.1 401 Unauthorized",
        "{reply:?}"
    );
    let (reply, closed_at) = until_closed(&mut stalled, signalled).await;
    assert!(reply.is_empty(), "{reply:?}");
    assert!(closed_at <= SHUTDOWN_GRACE, "{closed_at:?}");
    let took = shutting_down.await.unwrap();
    assert!(
        took >= SHUTDOWN_GRACE - Duration::from_millis(1) && took <= SHUTDOWN_GRACE,
        "the shutdown took {took:?}, not the grace ({SHUTDOWN_GRACE:?})"
    );
}

/// An h2c client (HTTP/2 over cleartext, by prior knowledge) would multiplex streams past
/// the connection cap and the per-connection deadlines; it is refused as a malformed HTTP/1
/// request.
#[tokio::test(start_paused = true)]
async fn an_http2_prior_knowledge_preface_is_not_served_as_http2() {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    // An empty SETTINGS frame: length 0, type 4, no flags, stream 0.
    const SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];
    for routes in BOTH {
        let served = serve(routes, Limits::default()).await;
        let start = Instant::now();
        let mut h2c = served.sent(&[PREFACE, SETTINGS].concat()).await;
        let (reply, closed_at) = until_closed(&mut h2c, start).await;
        assert!(
            reply.is_empty() || status_line(&reply).starts_with("HTTP/1.1 "),
            "{routes:?}: answered in HTTP/2: {reply:?}"
        );
        assert!(closed_at < HEADER_READ_TIMEOUT, "{routes:?}: {closed_at:?}");
    }
}

/// The body's declared length is checked before a byte of it is read, and before the
/// signature: the client sends the head only, and a bad signature.
#[tokio::test(start_paused = true)]
async fn a_webhook_body_declared_over_the_cap_is_refused_with_413_before_it_is_read() {
    let served = serve(Routes::Webhooks, Limits::default()).await;
    let start = Instant::now();
    let mut oversize = served
        .sent(
            format!(
                "POST /webhook/github HTTP/1.1\r\nHost: scaler\r\nX-GitHub-Event: workflow_job\r\n\
                 X-GitHub-Delivery: d-1\r\nX-Hub-Signature-256: sha256=00\r\n\
                 Content-Length: {}\r\n\r\n",
                WEBHOOK_BODY_MAX_BYTES + 1
            )
            .as_bytes(),
        )
        .await;
    let (reply, closed_at) = until_closed(&mut oversize, start).await;
    assert_eq!(
        status_line(&reply),
        "HTTP/1.1 413 Payload Too Large",
        "{}",
        String::from_utf8_lossy(&reply)
    );
    assert!(
        String::from_utf8_lossy(&reply).contains(r#""outcome":"too_large""#),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    assert!(
        closed_at < HEADER_READ_TIMEOUT,
        "answered only after {closed_at:?}: the body was waited for"
    );
}

/// A chunked body declares no length: it is read up to the cap and refused there, without
/// waiting for the rest.
#[tokio::test(start_paused = true)]
async fn a_streamed_webhook_body_is_refused_with_413_as_it_passes_the_cap() {
    let served = serve(Routes::Webhooks, Limits::default()).await;
    let start = Instant::now();
    let chunk = WEBHOOK_BODY_MAX_BYTES + 1;
    let mut streamed = served
        .sent(
            format!(
                "POST /webhook/github HTTP/1.1\r\nHost: scaler\r\nX-GitHub-Event: workflow_job\r\n\
                 X-GitHub-Delivery: d-1\r\nX-Hub-Signature-256: sha256=00\r\n\
                 Transfer-Encoding: chunked\r\n\r\n{chunk:x}\r\n{}\r\n",
                "x".repeat(chunk)
            )
            .as_bytes(),
        )
        .await;
    let (reply, closed_at) = until_closed(&mut streamed, start).await;
    assert_eq!(
        status_line(&reply),
        "HTTP/1.1 413 Payload Too Large",
        "{}",
        String::from_utf8_lossy(&reply)
    );
    assert!(closed_at < HEADER_READ_TIMEOUT, "{closed_at:?}");
}

/// Nomad's check of `/livez` gives up after 2 s and restarts the daemon after three failures
/// in a row: with every slot held by clients that never finish a request head, a health check
/// must still be answered at once, not after their 5 s header deadline.
#[tokio::test(start_paused = true)]
async fn a_health_check_is_answered_at_once_while_half_open_clients_hold_every_slot() {
    let served = serve(Routes::Status, Limits::default()).await;
    let head = Routes::Status.request();
    let mut half_open = Vec::new();
    for i in 0..CONNECTIONS_MAX * 2 {
        half_open.push(if i % 2 == 0 {
            served.connect().await
        } else {
            served.sent(&head[..head.len() / 3]).await
        });
    }
    let start = Instant::now();
    let mut check = served.sent(Routes::Status.request()).await;
    let (reply, answered_at) = until_closed(&mut check, start).await;
    assert!(status_line(&reply).starts_with("HTTP/1.1 200"), "{reply:?}");
    assert!(
        answered_at < Duration::from_millis(100),
        "answered only after {answered_at:?}"
    );
    // Room was made by dropping the oldest of them, not by serving past the cap.
    let first = half_open.first_mut().unwrap();
    let (sent, closed_at) = until_closed(first, start).await;
    assert!(sent.is_empty(), "{sent:?}");
    assert!(closed_at < HEADER_READ_TIMEOUT, "{closed_at:?}");
}

/// A request already being answered is never dropped to make room: with every slot holding
/// one, the next client waits its turn.
#[tokio::test(start_paused = true)]
async fn requests_being_answered_are_not_dropped_to_make_room() {
    let served = serve(Routes::Webhooks, Limits::default()).await;
    let mut in_flight = Vec::new();
    for _ in 0..CONNECTIONS_MAX {
        in_flight.push(served.sent(Routes::Webhooks.half_a_body()).await);
    }
    // Let the server take them all and start on each request's body.
    tokio::time::sleep(HEADER_READ_TIMEOUT / 10).await;
    let start = Instant::now();
    let mut next = served.sent(Routes::Webhooks.request()).await;
    let (_reply, answered_at) = until_closed(&mut next, start).await;
    let first = in_flight.first_mut().unwrap();
    let (sent, _) = until_closed(first, start).await;
    // The first one ran to its request deadline (and was dropped unanswered) before the next
    // could be taken.
    assert!(sent.is_empty(), "{sent:?}");
    assert!(
        answered_at >= REQUEST_TIMEOUT - HEADER_READ_TIMEOUT / 10,
        "served after {answered_at:?}: a request in flight was dropped to make room"
    );
}
