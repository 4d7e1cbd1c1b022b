//! The one way both listeners (`--listen` and `--webhook-listen`) serve a router: HTTP/1.1
//! only, one request per connection, every stage of it under a deadline, a cap on open
//! connections, and a shutdown that waits for nobody idle.
//!
//! Both ports answer unauthenticated clients, so a client must not be able to hold more of
//! the daemon than one request's worth, nor for longer than one request takes (issue 17: 60
//! half-sent bodies took the daemon from 21 to 82 MB; at the descriptor limit its own Consul
//! renewals failed, a leader that stops acting; SIGTERM waited 40 s for one client). axum's
//! `serve` sets no header read timeout (hyper skips its own without a timer), no body
//! timeout, no cap, and speaks h2c, so connections are served here with hyper's HTTP/1
//! builder directly:
//!
//! - **Headers** must arrive within [`HEADER_READ_TIMEOUT`] of the accept, and fit in
//!   [`HEADERS_MAX_BYTES`] (more: 431).
//! - **The whole request** (headers, body, handler, answer written) must be done within
//!   [`REQUEST_TIMEOUT`] of the accept, or the connection is dropped. Keep-alive is off, so a
//!   connection is one request and this deadline is the request's: nothing waits on an idle
//!   keep-alive connection. Our callers (a scrape every few seconds, a health check, a forge
//!   delivering one event) send one request per connection anyway, or lose one handshake
//!   on reconnecting.
//! - **Connections** are capped at [`CONNECTIONS_MAX`] by a semaphore taken *before*
//!   `accept`. At the cap, the oldest connection that has not yet sent its whole request head
//!   is dropped to make room for the next: a client that sends its request at once (a health
//!   check, a scrape) is served within milliseconds however many half-open clients are
//!   connected, instead of after their header deadline (5 s, while Nomad's check of
//!   `/livez` gives up after 2 s and restarts the daemon after three). Only when every slot
//!   holds a request already being answered do new connections wait (at most
//!   [`REQUEST_TIMEOUT`]): the first in a descriptor of ours, the rest in the kernel's accept
//!   queue, costing the daemon no descriptor and no memory.
//! - **HTTP/1.1 only.** hyper-util's auto builder turns h2 back on whenever the `http2`
//!   feature is in the tree (reqwest's is), and an h2c connection multiplexes streams past
//!   the cap; an HTTP/2 preface is refused as a malformed HTTP/1 request.
//! - **Bodies** are the router's to cap: only the webhook routes read one
//!   (`WEBHOOK_BODY_MAX_BYTES`, checked against the declared length before a byte is read);
//!   the status routes never poll theirs, and with keep-alive off an unread body is never
//!   read.
//! - **Shutdown** stops accepting at once (new connections are refused), drops connections
//!   that have not yet sent a whole request head (idle and half-open clients), and gives a
//!   request in flight [`SHUTDOWN_GRACE`] to finish.
//!
//! The limits are a [`Limits`] value so tests can shorten them; [`Limits::default`] is what
//! ships.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tracing::{debug, info, warn};

/// How long a client has, from the accept, to send its request line and headers. A forge or
/// a scraper sends them in one packet, well within a second; a slowloris client holds a slot
/// no longer than this. (hyper's own default, 30 s, is not applied without a timer.)
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one connection (one request: headers, body, handler, answer) may take from the
/// accept. GitHub gives up on a delivery after 10 s, and Prometheus's default scrape timeout
/// is 10 s: a request still running after that has no one waiting for its answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections open at once on one listener. Both listeners together stay far below the 1024
/// descriptors a process commonly gets, leaving the rest to the daemon's own clients (Consul,
/// Nomad, the forges); far above what scrapes, health checks and deliveries need at once,
/// each of which is done in milliseconds.
pub const CONNECTIONS_MAX: usize = 128;

/// How long a request in flight at shutdown has to finish: the handlers do no I/O, so a
/// request that is not done by then is a client that stopped sending.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Largest request head (request line and headers): a forge's delivery headers are about
/// 2 KiB, a scrape's a few hundred bytes.
pub const HEADERS_MAX_BYTES: usize = 16 * 1024;

/// Largest read buffer of one connection (hyper's default is about 400 KiB). It holds the
/// head and the body's bytes not yet read by the handler; at the cap a client sending faster
/// simply waits.
pub const READ_BUFFER_MAX_BYTES: usize = 64 * 1024;

/// How long the accept loop waits after an error of its own (descriptors or memory
/// exhausted) before accepting again, rather than spinning on it; axum's `serve` waits as
/// long.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_secs(1);

/// Where one connection is: still reading its request head (and so the first to make room
/// at the cap), answering its request, or told to make room.
struct Stage {
    stage: AtomicU8,
    evict: Notify,
}

const AWAITING_HEAD: u8 = 0;
const IN_FLIGHT: u8 = 1;
const EVICTED: u8 = 2;

impl Stage {
    fn new() -> Arc<Stage> {
        Arc::new(Stage {
            stage: AtomicU8::new(AWAITING_HEAD),
            evict: Notify::new(),
        })
    }

    /// The head is in and the router has it. A connection evicted a moment before stays
    /// evicted: its close drops this answer.
    fn start_request(&self) {
        let _ = self.stage.compare_exchange(
            AWAITING_HEAD,
            IN_FLIGHT,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    fn in_flight(&self) -> bool {
        self.stage.load(Ordering::Acquire) == IN_FLIGHT
    }

    /// Tells the connection to close if it has not sent its request head yet; whether it did.
    fn evict(&self) -> bool {
        let evicted = self
            .stage
            .compare_exchange(AWAITING_HEAD, EVICTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if evicted {
            self.evict.notify_one();
        }
        evicted
    }
}

/// The connections of one listener in the order they were accepted, oldest first, held weakly:
/// an ended connection simply fails to upgrade.
#[derive(Default)]
struct Accepted {
    order: VecDeque<Weak<Stage>>,
}

impl Accepted {
    fn push(&mut self, stage: &Arc<Stage>, connections_max: usize) {
        // Ended connections leave the front as it is searched; those ending in the middle
        // are swept once they outnumber the live ones.
        if self.order.len() >= 2 * connections_max {
            self.order.retain(|stage| stage.strong_count() > 0);
        }
        self.order.push_back(Arc::downgrade(stage));
    }

    /// Evicts the oldest connection still waiting for its request head; whether there was one.
    fn evict_oldest_awaiting_head(&mut self) -> bool {
        while let Some(oldest) = self.order.pop_front() {
            let Some(stage) = oldest.upgrade() else {
                continue;
            };
            if stage.evict() {
                return true;
            }
            // Answering a request: it never waits for a head again, and ends by its deadline.
        }
        false
    }
}

/// The limits one listener serves under; [`Limits::default`] is what ships.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// From the accept to the end of the request head ([`HEADER_READ_TIMEOUT`]).
    pub header_read_timeout: Duration,
    /// From the accept to the answer's last byte ([`REQUEST_TIMEOUT`]).
    pub request_timeout: Duration,
    /// Connections open at once ([`CONNECTIONS_MAX`]).
    pub connections_max: usize,
    /// Time a request in flight at shutdown gets to finish ([`SHUTDOWN_GRACE`]).
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            header_read_timeout: HEADER_READ_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
            connections_max: CONNECTIONS_MAX,
            shutdown_grace: SHUTDOWN_GRACE,
        }
    }
}

/// Serves `router` on `listener` under `limits` until `shutdown` completes, then until every
/// connection has ended (at once for idle ones, within the grace for a request in flight);
/// `what` names the listener in log lines.
pub fn spawn(
    what: &'static str,
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(serve(what, listener, router, limits, shutdown))
}

/// [`spawn`], in the caller's task.
pub async fn serve(
    what: &'static str,
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    // A cap of zero would serve nothing; the shutdown takes the slots back as one `u32`.
    let connections_max = limits.connections_max.clamp(1, u32::MAX as usize);
    let slots = Arc::new(Semaphore::new(connections_max));
    let (closing_tx, closing) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut accepted_order = Accepted::default();
    let mut saturated = false;
    loop {
        // A slot first, then the accept: beyond the cap a client waits in the kernel's
        // accept queue rather than in a descriptor of ours. At the cap, a client that is
        // actually waiting is taken (one descriptor over the cap, for as long as it takes the
        // oldest client without a request head to close) and room made for it.
        let (slot, accepted) = match slots.clone().try_acquire_owned() {
            Ok(slot) => (slot, None),
            Err(_) => {
                let accepted = tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    slot = slots.clone().acquire_owned() => match slot {
                        Ok(slot) => (slot, None),
                        // Never closed; if it were, nothing more could be served.
                        Err(_) => break,
                    },
                    accepted = listener.accept() => {
                        let evicted = accepted_order.evict_oldest_awaiting_head();
                        if !saturated {
                            saturated = true;
                            warn_saturated(what, connections_max, evicted, limits);
                        }
                        let slot = tokio::select! {
                            biased;
                            () = &mut shutdown => break,
                            slot = slots.clone().acquire_owned() => match slot {
                                Ok(slot) => slot,
                                Err(_) => break,
                            },
                        };
                        (slot, Some(accepted))
                    }
                };
                accepted
            }
        };
        // Said once per episode: only when half the slots are free again is the next
        // saturation news.
        if saturated && slots.available_permits() >= connections_max / 2 {
            saturated = false;
            info!("serve {what}: connection slots free again");
        }
        let accepted = match accepted {
            Some(accepted) => accepted,
            None => tokio::select! {
                biased;
                () = &mut shutdown => break,
                accepted = listener.accept() => accepted,
            },
        };
        match accepted {
            Ok((stream, _peer)) => {
                let stage = Stage::new();
                accepted_order.push(&stage, connections_max);
                tokio::spawn(connection(
                    what,
                    stream,
                    router.clone(),
                    limits,
                    closing.clone(),
                    stage,
                    slot,
                ));
            }
            // The client left before we took it: nothing of ours is at fault.
            Err(e) if is_connection_error(&e) => {}
            Err(e) => {
                warn!(
                    "serve {what}: accept a connection: {e}; accepting again in \
                     {ACCEPT_ERROR_BACKOFF:?}"
                );
                drop(slot);
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => {}
                }
            }
        }
    }
    // Closing the socket refuses new connections at once, and those waiting in the accept
    // queue are reset rather than left hanging.
    drop(listener);
    let _ = closing_tx.send(true);
    // Every connection holds its slot until it ends: all slots back means all ended.
    let _ = slots
        .acquire_many(u32::try_from(connections_max).unwrap_or(u32::MAX))
        .await;
    debug!("serve {what}: every connection ended");
}

fn warn_saturated(what: &str, connections_max: usize, evicted: bool, limits: Limits) {
    if evicted {
        warn!(
            connections_max,
            "serve {what}: every connection slot is taken; the oldest clients that have not \
             sent a request head are dropped to make room"
        );
    } else {
        warn!(
            connections_max,
            "serve {what}: every connection slot is answering a request; new connections wait \
             until one ends (at the latest after {:?})",
            limits.request_timeout
        );
    }
}

/// Errors of one connection's accept that say nothing about the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    )
}

/// One connection, one request, from accept to close; the slot is given back when it ends.
async fn connection(
    what: &'static str,
    stream: TcpStream,
    router: Router,
    limits: Limits,
    mut closing: watch::Receiver<bool>,
    stage: Arc<Stage>,
    _slot: OwnedSemaphorePermit,
) {
    let deadline = tokio::time::sleep(limits.request_timeout);
    let mut deadline = std::pin::pin!(deadline);
    // Once the request head is in and the router has it, the connection carries a request in
    // flight: no longer evicted at the cap, and let finish within the grace at shutdown.
    let service = {
        let stage = stage.clone();
        let router = TowerToHyperService::new(router);
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            stage.start_request();
            router.call(request)
        })
    };
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(HEADERS_MAX_BYTES)
        .max_buf_size(READ_BUFFER_MAX_BYTES)
        .keep_alive(false);
    let mut served = std::pin::pin!(builder.serve_connection(TokioIo::new(stream), service));
    tokio::select! {
        done = served.as_mut() => {
            if let Err(e) = done {
                debug!("serve {what}: connection closed: {e}");
            }
            return;
        }
        () = deadline.as_mut() => {
            debug!(
                "serve {what}: dropped a connection whose request was not done within {:?}",
                limits.request_timeout
            );
            return;
        }
        () = stage.evict.notified() => {
            debug!("serve {what}: dropped a connection without a request head to make room");
            return;
        }
        // A closed sender (the accept loop is gone) is a shutdown too.
        _ = closing.wait_for(|closing| *closing) => {}
    }
    if !stage.in_flight() {
        // Idle, or half a request head: nothing to finish. Dropping `served` closes it.
        return;
    }
    served.as_mut().graceful_shutdown();
    tokio::select! {
        _ = served.as_mut() => {}
        () = deadline.as_mut() => {}
        () = tokio::time::sleep(limits.shutdown_grace) => {
            debug!(
                "serve {what}: dropped a request still in flight {:?} after shutdown",
                limits.shutdown_grace
            );
        }
    }
}
