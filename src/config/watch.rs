//! The watcher task: follows the document in Consul with blocking queries and publishes the
//! newest [`ConfigState`] on a `tokio::sync::watch` channel, so that a tick never waits on
//! Consul and an edit applies as soon as it is written.
//!
//! A bad edit never replaces a good document: the state keeps the last good [`Config`] and
//! carries the problems of the newest one, which are logged once each.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, RngCore};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{Config, ConfigDefaults, ConfigError, parse_document};
use crate::model::PortError;

/// What one read of the document found. `index` is the source's change index (Consul's
/// `X-Consul-Index`); `0` means the source could not tell, and the watcher then polls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fetched {
    Found { bytes: Vec<u8>, index: u64 },
    Missing { index: u64 },
}

impl Fetched {
    pub fn index(&self) -> u64 {
        match self {
            Fetched::Found { index, .. } | Fetched::Missing { index } => *index,
        }
    }
}

/// Where the document comes from. Implemented by the Consul KV client.
#[async_trait]
pub trait DocumentSource: Send + Sync {
    /// Reads the document, blocking-query style: with `index > 0`, returns once the source's
    /// index has moved past `index`, or after about `wait` with the same index. With
    /// `index == 0`, returns at once.
    async fn fetch(&self, index: u64, wait: Duration) -> Result<Fetched, PortError>;
}

/// What the rest of the daemon knows about its configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigState {
    /// The last good document; `None` until one has been read.
    pub config: Option<Arc<Config>>,
    /// The source index at which `config` was read.
    pub applied_index: Option<u64>,
    /// Problems of the newest document when it was rejected; empty when it was applied.
    pub errors: Vec<ConfigError>,
    /// Why the source cannot be read right now (unreachable, forbidden); `None` when it can.
    pub source_error: Option<String>,
    /// True while the key does not exist.
    pub missing: bool,
}

impl ConfigState {
    /// One line per reason the running configuration is not the newest good document, for
    /// `/healthz` and `status`. Empty when all is well.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.config.is_none() {
            problems.push("no valid configuration has been read yet: nothing is dispatched".into());
        }
        if self.missing {
            problems.push("the configuration key does not exist".into());
        }
        if let Some(error) = &self.source_error {
            problems.push(format!("cannot read the configuration: {error}"));
        }
        if !self.errors.is_empty() {
            problems.push(format!(
                "the newest configuration was rejected ({} problems); running on the last good one",
                self.errors.len()
            ));
            problems.extend(self.errors.iter().map(ToString::to_string));
        }
        problems
    }
}

/// Timing of the watcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchSettings {
    /// How long one blocking query may wait for a change. Consul's default is 5 minutes and
    /// its maximum 10.
    pub wait: Duration,
    /// Pause between reads when the source reports no index (a missing key read through a
    /// client that drops the 404's headers), so that reads cannot spin.
    pub poll_interval: Duration,
    /// Least time between the starts of two reads. Consul asks clients to rate-limit blocking
    /// queries: an index can move without the key changing.
    pub fetch_interval_min: Duration,
    /// First pause after a failed read; it doubles per failure, with jitter, up to
    /// `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

impl Default for WatchSettings {
    fn default() -> Self {
        WatchSettings {
            wait: Duration::from_secs(5 * 60),
            poll_interval: Duration::from_secs(10),
            fetch_interval_min: Duration::from_secs(1),
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
        }
    }
}

/// Starts [`watch`] on its own task and returns the channel it publishes on. `jitter` draws
/// the backoff's jitter (the seeded world passes a stream of its seed, so a replay backs off
/// the same way).
pub fn spawn<S>(
    source: S,
    defaults: ConfigDefaults,
    settings: WatchSettings,
    jitter: StdRng,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> (watch::Receiver<ConfigState>, JoinHandle<()>)
where
    S: DocumentSource + 'static,
{
    let (tx, rx) = watch::channel(ConfigState::default());
    let task = tokio::spawn(watch(source, defaults, settings, jitter, tx, shutdown));
    (rx, task)
}

/// Follows the document until `shutdown` completes or every receiver is gone.
pub async fn watch<S, F>(
    source: S,
    defaults: ConfigDefaults,
    settings: WatchSettings,
    mut jitter: StdRng,
    tx: watch::Sender<ConfigState>,
    shutdown: F,
) where
    S: DocumentSource,
    F: Future,
{
    let mut shutdown = std::pin::pin!(shutdown);
    let stop = async {
        tokio::select! {
            biased;
            _ = &mut shutdown => {}
            _ = tx.closed() => {}
        }
    };
    let mut stop = std::pin::pin!(stop);
    let mut watcher = Watcher {
        defaults,
        settings,
        state: tx.borrow().clone(),
        index: None,
        newest_bytes: None,
        failures: 0,
    };
    loop {
        let started = Instant::now();
        let request_index = watcher.request_index();
        let result = tokio::select! {
            biased;
            _ = &mut stop => break,
            result = source.fetch(request_index, watcher.settings.wait) => result,
        };
        let pause = watcher.absorb(result, &mut jitter);
        tx.send_if_modified(|published| {
            let changed = *published != watcher.state;
            if changed {
                *published = watcher.state.clone();
            }
            changed
        });
        let resume_at = match pause {
            Pause::Backoff(delay) | Pause::Poll(delay) => Instant::now() + delay,
            Pause::RateLimit => started + watcher.settings.fetch_interval_min,
        };
        tokio::select! {
            biased;
            _ = &mut stop => break,
            _ = tokio::time::sleep_until(resume_at) => {}
        }
    }
    debug!("config watcher stopped");
}

enum Pause {
    Backoff(Duration),
    Poll(Duration),
    RateLimit,
}

struct Watcher {
    defaults: ConfigDefaults,
    settings: WatchSettings,
    state: ConfigState,
    /// The index to block on; `None` before the first answer and after an answer without
    /// an index, when the next read must not block (the poll pause keeps it from spinning).
    index: Option<u64>,
    /// The newest document read, so that an unchanged document is not parsed (nor its
    /// problems logged) again.
    newest_bytes: Option<Vec<u8>>,
    /// Consecutive failed reads.
    failures: u32,
}

impl Watcher {
    /// Consul's rules: the first read does not block (index 0); after it, never block with
    /// index 0, which would return at once and spin. Only a read after an answer without an
    /// index uses 0 again, after the poll pause: blocking on a guessed index could wait for
    /// the whole `wait` while the key appears.
    fn request_index(&self) -> u64 {
        match self.index {
            None => 0,
            Some(index) => index.max(1),
        }
    }

    fn absorb(&mut self, result: Result<Fetched, PortError>, jitter: &mut dyn RngCore) -> Pause {
        let fetched = match result {
            Ok(fetched) => fetched,
            Err(e) => return self.failed(e, jitter),
        };
        if self.state.source_error.take().is_some() {
            info!("config source readable again");
        }
        self.failures = 0;
        let new_index = fetched.index();
        // An index that goes backwards means the source's state was reset (a restored
        // snapshot, another cluster): start over from a non-blocking read.
        self.index = match self.index {
            _ if new_index == 0 => None,
            Some(previous) if new_index < previous => Some(0),
            _ => Some(new_index),
        };
        match fetched {
            Fetched::Missing { .. } => {
                if !self.state.missing {
                    warn!(
                        index = new_index,
                        "config key does not exist; keeping the last good config"
                    );
                }
                self.state.missing = true;
                self.state.errors.clear();
                self.newest_bytes = None;
            }
            Fetched::Found { bytes, .. } => {
                self.state.missing = false;
                if self.newest_bytes.as_deref() != Some(bytes.as_slice()) {
                    self.apply(&bytes, new_index);
                    self.newest_bytes = Some(bytes);
                }
            }
        }
        if new_index == 0 {
            Pause::Poll(self.settings.poll_interval)
        } else {
            Pause::RateLimit
        }
    }

    fn apply(&mut self, bytes: &[u8], index: u64) {
        match parse_document(bytes, &self.defaults) {
            Ok(config) => {
                info!(repos = config.repos.len(), index, "config applied");
                self.state.config = Some(Arc::new(config));
                self.state.applied_index = Some(index);
                self.state.errors.clear();
            }
            Err(errors) => {
                for error in &errors {
                    // Keys and fields are as written by a person: escape them so that a stray
                    // control character cannot forge log lines.
                    warn!(
                        index,
                        repo = %error.repo.as_deref().unwrap_or("-").escape_debug(),
                        field = %error.field.as_deref().unwrap_or("-").escape_debug(),
                        "config problem: {}",
                        error.message.escape_debug()
                    );
                }
                warn!(
                    problems = errors.len(),
                    index,
                    kept_index = ?self.state.applied_index,
                    "config rejected; keeping the last good config"
                );
                self.state.errors = errors;
            }
        }
    }

    fn failed(&mut self, error: PortError, jitter: &mut dyn RngCore) -> Pause {
        self.failures = self.failures.saturating_add(1);
        let delay = self.backoff(jitter);
        if self.state.source_error.as_deref() != Some(error.message.as_str()) {
            warn!(
                class = error.class.as_str(),
                retry_in_ms = delay.as_millis() as u64,
                "cannot read config: {}; keeping the last good config",
                error.message
            );
        } else {
            debug!(
                failures = self.failures,
                retry_in_ms = delay.as_millis() as u64,
                "config read still failing"
            );
        }
        self.state.source_error = Some(error.message);
        Pause::Backoff(delay)
    }

    /// Exponential in the number of consecutive failures, capped, with "equal jitter" (half
    /// fixed, half random) so that several daemons do not retry in step.
    fn backoff(&self, jitter: &mut dyn RngCore) -> Duration {
        let exponent = self.failures.saturating_sub(1).min(20);
        let full = self
            .settings
            .backoff_initial
            .saturating_mul(1u32 << exponent)
            .min(self.settings.backoff_max);
        let half = full / 2;
        let jitter_ms = jitter.random_range(0..=half.as_millis() as u64);
        half + Duration::from_millis(jitter_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ErrorClass, RepoName};
    use tokio::sync::{Mutex, mpsc, oneshot};

    /// A scripted source: each fetch is recorded, then waits for the test's next answer.
    struct ScriptedSource {
        calls: mpsc::UnboundedSender<Call>,
        answers: Mutex<mpsc::UnboundedReceiver<Result<Fetched, PortError>>>,
    }

    #[derive(Debug)]
    struct Call {
        index: u64,
        at: Instant,
    }

    #[async_trait]
    impl DocumentSource for ScriptedSource {
        async fn fetch(&self, index: u64, _wait: Duration) -> Result<Fetched, PortError> {
            let _ = self.calls.send(Call {
                index,
                at: Instant::now(),
            });
            match self.answers.lock().await.recv().await {
                Some(answer) => answer,
                None => std::future::pending().await,
            }
        }
    }

    struct Harness {
        answers: mpsc::UnboundedSender<Result<Fetched, PortError>>,
        calls: mpsc::UnboundedReceiver<Call>,
        state: watch::Receiver<ConfigState>,
        stop: Option<oneshot::Sender<()>>,
        task: JoinHandle<()>,
    }

    impl Harness {
        fn start() -> Harness {
            let (answers_tx, answers_rx) = mpsc::unbounded_channel();
            let (calls_tx, calls_rx) = mpsc::unbounded_channel();
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            let source = ScriptedSource {
                calls: calls_tx,
                answers: Mutex::new(answers_rx),
            };
            let (state, task) = spawn(
                source,
                ConfigDefaults::default(),
                WatchSettings::default(),
                rand::SeedableRng::seed_from_u64(1),
                async {
                    let _ = stop_rx.await;
                },
            );
            Harness {
                answers: answers_tx,
                calls: calls_rx,
                state,
                stop: Some(stop_tx),
                task,
            }
        }

        async fn next_call(&mut self) -> Call {
            self.calls.recv().await.expect("watcher stopped")
        }

        fn answer(&self, answer: Result<Fetched, PortError>) {
            self.answers.send(answer).unwrap();
        }

        fn found(&self, doc: &str, index: u64) {
            self.answer(Ok(Fetched::Found {
                bytes: doc.as_bytes().to_vec(),
                index,
            }));
        }

        /// Answers the pending call and waits until the watcher asks again, so the state
        /// published for the answer is settled.
        async fn settle(&mut self, answer: Result<Fetched, PortError>) -> (ConfigState, Call) {
            self.answer(answer);
            let call = self.next_call().await;
            (self.state.borrow().clone(), call)
        }
    }

    const GOOD: &str = r#"{"acme/api": {"mode": "app", "maxConcurrent": 2}}"#;
    const GOOD_TWO: &str =
        r#"{"acme/api": {"mode": "app"}, "acme/web": {"mode": "app", "maxConcurrent": 0}}"#;
    const BAD: &str = r#"{"acme/api": {"mode": "app", "maxConcurrent": -2, "extra": 1}}"#;

    fn found(doc: &str, index: u64) -> Result<Fetched, PortError> {
        Ok(Fetched::Found {
            bytes: doc.as_bytes().to_vec(),
            index,
        })
    }

    fn repos(state: &ConfigState) -> Vec<String> {
        state
            .config
            .as_ref()
            .map(|c| c.repos.keys().map(RepoName::to_string).collect())
            .unwrap_or_default()
    }

    #[tokio::test(start_paused = true)]
    async fn a_bad_edit_keeps_the_last_good_config_until_a_fixed_edit_applies() {
        let mut h = Harness::start();
        assert_eq!(
            h.next_call().await.index,
            0,
            "the first read must not block"
        );

        let (state, call) = h.settle(found(GOOD, 5)).await;
        assert_eq!(repos(&state), ["acme/api"]);
        assert_eq!(state.applied_index, Some(5));
        assert!(state.errors.is_empty() && state.problems().is_empty());
        assert_eq!(call.index, 5, "the next read blocks on the index seen");

        let (state, call) = h.settle(found(BAD, 6)).await;
        assert_eq!(repos(&state), ["acme/api"], "last good config kept");
        assert_eq!(state.applied_index, Some(5));
        let rendered: Vec<String> = state.errors.iter().map(ToString::to_string).collect();
        assert_eq!(rendered.len(), 2, "{rendered:?}");
        assert!(rendered[0].starts_with("acme/api: extra: unknown field"));
        assert!(rendered[1].starts_with("acme/api: maxConcurrent: -2 is negative"));
        assert_eq!(call.index, 6);

        let (state, _) = h.settle(found(GOOD_TWO, 9)).await;
        assert_eq!(repos(&state), ["acme/api", "acme/web"]);
        assert_eq!(state.applied_index, Some(9));
        assert!(state.errors.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_index_that_goes_backwards_restarts_without_blocking_on_zero() {
        let mut h = Harness::start();
        h.next_call().await;
        let (_, call) = h.settle(found(GOOD, 50)).await;
        assert_eq!(call.index, 50);
        let (state, call) = h.settle(found(GOOD_TWO, 7)).await;
        assert_eq!(call.index, 1, "reset to 0, but never block with index 0");
        assert_eq!(state.applied_index, Some(7));
        let (_, call) = h.settle(found(GOOD_TWO, 8)).await;
        assert_eq!(call.index, 8);
    }

    #[tokio::test(start_paused = true)]
    async fn reads_that_return_at_once_are_rate_limited() {
        let mut h = Harness::start();
        let first = h.next_call().await;
        let (_, second) = h.settle(found(GOOD, 5)).await;
        let (_, third) = h.settle(found(GOOD, 5)).await;
        let minimum = WatchSettings::default().fetch_interval_min;
        assert!(second.at - first.at >= minimum);
        assert!(third.at - second.at >= minimum);
    }

    #[tokio::test(start_paused = true)]
    async fn source_failures_back_off_exponentially_and_keep_the_last_good_config() {
        let settings = WatchSettings::default();
        let mut h = Harness::start();
        h.next_call().await;
        let (_, mut previous) = h.settle(found(GOOD, 5)).await;
        let mut ceilings = Vec::new();
        for failure in 1..=9u32 {
            let (state, call) = h
                .settle(Err(PortError::new(
                    ErrorClass::Transient,
                    "read runners/config: connection failed",
                )))
                .await;
            assert_eq!(repos(&state), ["acme/api"]);
            assert_eq!(
                state.source_error.as_deref(),
                Some("read runners/config: connection failed")
            );
            assert_eq!(call.index, 5, "the index survives failures");
            let waited = call.at - previous.at;
            let ceiling = settings
                .backoff_initial
                .saturating_mul(1 << (failure - 1))
                .min(settings.backoff_max);
            assert!(
                waited >= ceiling / 2 && waited <= ceiling,
                "failure {failure}: waited {waited:?}, ceiling {ceiling:?}"
            );
            ceilings.push(ceiling);
            previous = call;
        }
        assert_eq!(*ceilings.last().unwrap(), Duration::from_secs(60), "capped");

        let (state, call) = h.settle(found(GOOD, 5)).await;
        assert_eq!(state.source_error, None, "recovery clears the error");
        assert!(call.at - previous.at <= settings.fetch_interval_min);
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_key_without_an_index_is_polled_and_keeps_the_last_good_config() {
        let settings = WatchSettings::default();
        let mut h = Harness::start();
        let first = h.next_call().await;
        let (state, second) = h.settle(Ok(Fetched::Missing { index: 0 })).await;
        assert!(state.missing && state.config.is_none());
        assert_eq!(
            second.index, 0,
            "no index to block on: read at once, after a pause"
        );
        assert!(second.at - first.at >= settings.poll_interval);
        assert_eq!(state.problems().len(), 2, "{:?}", state.problems());

        let (state, _) = h.settle(found(GOOD, 12)).await;
        assert!(!state.missing);
        assert_eq!(state.applied_index, Some(12));

        let (state, call) = h.settle(Ok(Fetched::Missing { index: 13 })).await;
        assert!(state.missing);
        assert_eq!(
            repos(&state),
            ["acme/api"],
            "a deleted key keeps the last good config"
        );
        assert_eq!(
            call.index, 13,
            "a missing key with an index is still a blocking read"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_a_read_in_flight() {
        let mut h = Harness::start();
        h.next_call().await;
        h.stop.take().unwrap().send(()).unwrap();
        h.task.await.unwrap();
        assert!(h.calls.recv().await.is_none(), "no read after shutdown");
    }

    #[tokio::test(start_paused = true)]
    async fn an_unchanged_document_publishes_nothing() {
        let mut h = Harness::start();
        h.next_call().await;
        h.settle(found(BAD, 3)).await;
        let mut state = h.state.clone();
        state.mark_unchanged();
        // The same bad document at a new index: nothing to publish.
        h.found(BAD, 4);
        h.next_call().await;
        assert!(!state.has_changed().unwrap());
    }
}
