//! The in-memory service the real client sends to: [`GitHubHttp`] as a `tower` service, the
//! bookkeeping it keeps between requests (primary windows, the tokens minted, what the loop
//! has in flight) and the three ways a request ends: an answer, a reset connection, or no
//! answer at all.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use futures::FutureExt;
use http::Response;
use http_body_util::BodyExt;
use octocrab::OctoBody;

use super::BUDGET_WINDOW_S;
use super::auth::Grant;
use crate::sim::seeded::options::Service;
use crate::sim::seeded::ports::{Shared, lock};

/// One primary-limit window of one holder.
#[derive(Clone, Copy, Debug)]
pub(super) struct Window {
    start_s: u64,
    pub(super) used: u64,
}

impl Window {
    pub(super) fn reset_s(&self) -> u64 {
        self.start_s + BUDGET_WINDOW_S
    }
}

#[derive(Default)]
pub(super) struct HttpState {
    budgets: BTreeMap<String, Window>,
    pub(super) tokens: BTreeMap<String, Grant>,
    pub(super) tokens_issued: u64,
    /// Mints in flight (the forge port says): an installation lookup then serves a mint.
    pub(super) minting: u32,
    /// Runner registration reads or deletions in flight: the token they mint serves them.
    pub(super) managing_runners: u32,
    /// Every request that reached the service, answered or not.
    pub(super) requests: u64,
    /// Requests entered and not yet answered (or given up by the client).
    pub(super) in_flight: u64,
}

impl HttpState {
    pub(super) fn window(&mut self, holder: &str, t: u64) -> &mut Window {
        let window = self.budgets.entry(holder.to_string()).or_insert(Window {
            start_s: t,
            used: 0,
        });
        if t >= window.reset_s() {
            *window = Window {
                start_s: t,
                used: 0,
            };
        }
        window
    }
}

/// GitHub's REST API over the shared world, as a `tower` service octocrab sends to.
#[derive(Clone)]
pub struct GitHubHttp {
    pub(super) shared: Shared,
    state: Arc<Mutex<HttpState>>,
}

/// How a request ends.
pub(super) enum Served {
    Answer(Response<String>),
    /// The connection drops before an answer.
    Reset,
    /// No answer ever comes: the client's own timeout has to end the wait.
    Hang,
}

impl GitHubHttp {
    pub fn new(shared: &Shared) -> GitHubHttp {
        GitHubHttp {
            shared: shared.clone(),
            state: Arc::default(),
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, HttpState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Requests that reached the service so far, answered or not.
    pub fn requests(&self) -> u64 {
        self.state().requests
    }

    /// Requests spent so far in `holder`'s current window.
    pub fn used(&self, holder: &str) -> u64 {
        self.state().budgets.get(holder).map_or(0, |w| w.used)
    }

    /// Sets how much of `holder`'s current window is spent (tests).
    pub fn spend(&self, holder: &str, used: u64) {
        let t = lock(&self.shared).t;
        self.state().window(holder, t).used = used;
    }
}

impl tower::Service<http::Request<OctoBody>> for GitHubHttp {
    type Response = Response<String>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<String>, io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<OctoBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        // octocrab's request bodies are whole strings in memory: complete at the first poll.
        let body = body
            .collect()
            .now_or_never()
            .and_then(Result::ok)
            .map(|collected| collected.to_bytes())
            .unwrap_or_default();
        // In flight from here until the client takes the answer or gives up waiting (a
        // hanging request counts until its timeout drops it).
        let entered = InFlight::enter(&self.state);
        // The request travels and meets the world as it is when it arrives, whether or not
        // the client is still waiting then (a request it timed out on may still land); the
        // answer travels back. The world moves meanwhile.
        let this = self.clone();
        let (answer_tx, answer_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let there = lock(&this.shared).transit(Service::GitHub);
            tokio::time::sleep(there).await;
            let served = this.serve(&parts, &body);
            lock(&this.shared).judge();
            let _ = answer_tx.send(served);
        });
        let shared = self.shared.clone();
        Box::pin(async move {
            let Ok(served) = answer_rx.await else {
                return Err(io::Error::other("the simulated GitHub dropped the request"));
            };
            let back = lock(&shared).transit(Service::GitHub);
            tokio::time::sleep(back).await;
            match served {
                Served::Answer(response) => {
                    drop(entered);
                    Ok(response)
                }
                Served::Reset => {
                    drop(entered);
                    Err(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "connection reset by peer",
                    ))
                }
                Served::Hang => {
                    let _entered = entered;
                    futures::future::pending().await
                }
            }
        })
    }
}

/// One request counted in flight for as long as it lives.
struct InFlight(Arc<Mutex<HttpState>>);

impl InFlight {
    fn enter(state: &Arc<Mutex<HttpState>>) -> InFlight {
        state.lock().unwrap_or_else(|p| p.into_inner()).in_flight += 1;
        InFlight(state.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).in_flight -= 1;
    }
}
