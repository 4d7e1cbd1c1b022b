//! The daemon's metrics, in the Prometheus text format written by `prometheus-client`, and
//! the facts `/livez` and `/healthz` judge by.
//!
//! Two writers, one direction each:
//!
//! - the report step ([`crate::report::record`]) records what a tick saw and did, from the
//!   plan, the [`crate::report::TickView`] and the act report;
//! - the clients count their own requests through [`count_request`] and friends, a
//!   process-wide recorder (see [`CLIENT_COUNTS`] for why it is global).
//!
//! Labels carry repos, parent jobs, label sets, services, status classes, outcomes and
//! verdicts: never a job id, a runner name, a child id or a secret, so the number of series
//! stays bounded by the document and no credential can leak through a scrape.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Every metric name starts with this.
pub const PREFIX: &str = "runner_scaler";

/// `--stuck-after`'s default: a queued job older than this, in a bucket whose cap had room,
/// makes `/healthz` fail. Long enough for a cold node to pull an image and boot a runner.
pub const STUCK_AFTER_DEFAULT: Duration = Duration::from_secs(15 * 60);

/// How many poll intervals without a loop turn (`/livez`) or without an observation of
/// Nomad and a forge (`/healthz`) are tolerated: one slow tick or one failed read is not an
/// outage, three in a row are.
pub const POLL_INTERVALS_TOLERATED: u32 = 3;

/// Upper bounds of the queue-wait buckets, in seconds: from one short poll to two hours,
/// with the steps an operator reasons in.
const WAIT_BUCKETS_S: [f64; 13] = [
    5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 5400.0, 7200.0,
];

/// Upper bounds of the tick-duration buckets, in seconds: a tick is a few requests; one
/// that nears the request timeout (15 s by default) waited on a slow service.
const TICK_BUCKETS_S: [f64; 12] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A service the daemon talks to, as a label value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    GitHub,
    Forgejo,
    Nomad,
    Consul,
    Vault,
}

impl Service {
    pub fn as_str(self) -> &'static str {
        match self {
            Service::GitHub => "github",
            Service::Forgejo => "forgejo",
            Service::Nomad => "nomad",
            Service::Consul => "consul",
            Service::Vault => "vault",
        }
    }
}

/// `2xx`…`5xx` for an HTTP status, `error` when no answer came back (a timeout, a refused
/// connection) or the status is outside 200–599.
pub fn status_class(status: Option<u16>) -> &'static str {
    match status {
        Some(200..=299) => "2xx",
        Some(300..=399) => "3xx",
        Some(400..=499) => "4xx",
        Some(500..=599) => "5xx",
        _ => "error",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ApiLabels {
    pub service: String,
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OwnerLabels {
    pub owner: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RepoLabels {
    pub repo: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BucketLabels {
    pub repo: String,
    pub parent: String,
    pub labels: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CrashLabels {
    pub repo: String,
    pub labels: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ParentLabels {
    pub repo: String,
    pub parent: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FailureLabels {
    pub repo: String,
    pub parent: String,
    pub stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabels {
    pub repo: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WebhookLabels {
    pub forge: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReapLabels {
    pub outcome: String,
    pub verdict: String,
}

/// What the clients count about their own requests.
pub(crate) struct ClientCounts {
    api_requests: Family<ApiLabels, Counter>,
    conditional_hits: Counter,
    rate_limit_remaining: Family<OwnerLabels, Gauge>,
    secondary_points: Family<OwnerLabels, Gauge>,
    content_requests_minute: Family<OwnerLabels, Gauge>,
    content_requests_hour: Family<OwnerLabels, Gauge>,
}

/// The clients' recorder. Global, unlike [`Metrics`], which is passed to the loop: a client
/// is built in a dozen places (the daemon, the simulators, the client tests against the
/// twins), and threading a recorder through every constructor and port would make each of
/// them know about metrics for no gain; a process has one set of clients, so their request
/// counts are process-wide facts. Every [`Metrics`] registry exposes these same counters.
pub(crate) static CLIENT_COUNTS: LazyLock<ClientCounts> = LazyLock::new(|| ClientCounts {
    api_requests: Family::default(),
    conditional_hits: Counter::default(),
    rate_limit_remaining: Family::default(),
    secondary_points: Family::default(),
    content_requests_minute: Family::default(),
    content_requests_hour: Family::default(),
});

/// Counts one request to `service`: its status, or `None` when no answer came back.
pub fn count_request(service: Service, status: Option<u16>) {
    CLIENT_COUNTS
        .api_requests
        .get_or_create(&ApiLabels {
            service: service.as_str().into(),
            class: status_class(status).into(),
        })
        .inc();
}

/// Counts a GitHub `304 Not Modified`: a listing answered from our cache, free of budget.
pub fn count_conditional_hit() {
    CLIENT_COUNTS.conditional_hits.inc();
}

/// What GitHub last said remains of `owner`'s primary rate limit. `owner` names a budget
/// (`app`, `installation-<id>`, `polling-token:<vault path>`), never a credential.
pub fn set_rate_limit_remaining(owner: &str, remaining: u64) {
    CLIENT_COUNTS
        .rate_limit_remaining
        .get_or_create(&OwnerLabels {
            owner: owner.to_string(),
        })
        .set(i64::try_from(remaining).unwrap_or(i64::MAX));
}

/// GitHub secondary-limit points `owner` spent in the last 60 seconds, as the client counts
/// them when it sends (a `GET` one, any other method five).
pub fn set_secondary_points(owner: &str, points: u32) {
    CLIENT_COUNTS
        .secondary_points
        .get_or_create(&OwnerLabels {
            owner: owner.to_string(),
        })
        .set(i64::from(points));
}

/// GitHub requests of `owner` that may count against its content-creation limits (every
/// `POST`: mints of tokens and JIT configs) in the last minute and the last hour.
pub fn set_content_requests(owner: &str, last_minute: u32, last_hour: u32) {
    let labels = OwnerLabels {
        owner: owner.to_string(),
    };
    CLIENT_COUNTS
        .content_requests_minute
        .get_or_create(&labels)
        .set(i64::from(last_minute));
    CLIENT_COUNTS
        .content_requests_hour
        .get_or_create(&labels)
        .set(i64::from(last_hour));
}

/// One bucket as `/healthz` judges it, from the last tick.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketFacts {
    pub repo: String,
    pub labels: String,
    /// When its oldest queued job was queued (or first seen), if any is queued.
    pub oldest_queued_at: Option<DateTime<Utc>>,
    /// Its dispatches were held by a cap (profile, repo, global, or a pause): a long wait
    /// there is the operator's choice, not a fault.
    pub held_by_cap: bool,
}

/// Everything `/livez` and `/healthz` decide from: plain data, kept up to date by the loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthFacts {
    /// This copy runs the ticks (holds the leader lock).
    pub leader: bool,
    /// Whether a standby holds its Consul session; `None` until the leader lock reports it.
    pub holds_session: Option<bool>,
    pub started_at: DateTime<Utc>,
    pub poll_interval: Duration,
    pub stuck_after: Duration,
    /// A valid document is applied.
    pub config_valid: bool,
    /// When the loop last finished a turn: a tick, or an idle turn without a valid document.
    pub last_turn_at: Option<DateTime<Utc>>,
    /// When a tick last read Nomad and at least one forge.
    pub last_observed_at: Option<DateTime<Utc>>,
    /// The buckets of the last tick.
    pub buckets: Vec<BucketFacts>,
}

/// The daemon's metrics registry and its health facts, shared by the loop (writer) and the
/// HTTP server (reader).
pub struct Metrics {
    registry: Registry,
    pub(crate) queued: Family<BucketLabels, Gauge>,
    pub(crate) in_progress: Family<BucketLabels, Gauge>,
    pub(crate) in_flight: Family<BucketLabels, Gauge>,
    pub(crate) wait_dispatched: Family<RepoLabels, Histogram>,
    pub(crate) wait_started: Family<RepoLabels, Histogram>,
    pub(crate) oldest_queued_age: Family<RepoLabels, Gauge>,
    pub(crate) dispatches: Family<ParentLabels, Counter>,
    pub(crate) dispatches_deduplicated: Family<ParentLabels, Counter>,
    pub(crate) dispatch_failures: Family<FailureLabels, Counter>,
    pub(crate) credential_mints: Family<ResultLabels, Counter>,
    pub(crate) purges: Family<OutcomeLabels, Counter>,
    pub(crate) reap_decisions: Family<ReapLabels, Counter>,
    pub(crate) failed_starts: Family<CrashLabels, Gauge>,
    pub(crate) crash_backoff: Family<CrashLabels, Gauge>,
    tick_duration: Histogram,
    ticks: Counter,
    last_tick: Gauge<f64, AtomicU64>,
    config_reload_errors: Counter,
    config_valid: Gauge,
    leader: Gauge,
    webhook_deliveries: Family<WebhookLabels, Counter>,
    facts: Mutex<HealthFacts>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        use crate::clock::Clock;
        Metrics::new(
            Duration::from_secs(15),
            STUCK_AFTER_DEFAULT,
            crate::clock::SystemClock.now(),
        )
    }
}

fn wait_histogram() -> Histogram {
    Histogram::new(WAIT_BUCKETS_S)
}

impl Metrics {
    /// A registry with every metric of the daemon. `started_at` starts the clocks of
    /// `/livez` and `/healthz` (no turn is expected before a few poll intervals have passed).
    pub fn new(poll_interval: Duration, stuck_after: Duration, started_at: DateTime<Utc>) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let metrics = Metrics {
            queued: Family::default(),
            in_progress: Family::default(),
            in_flight: Family::default(),
            wait_dispatched: Family::new_with_constructor(wait_histogram),
            wait_started: Family::new_with_constructor(wait_histogram),
            oldest_queued_age: Family::default(),
            dispatches: Family::default(),
            dispatches_deduplicated: Family::default(),
            dispatch_failures: Family::default(),
            credential_mints: Family::default(),
            purges: Family::default(),
            reap_decisions: Family::default(),
            failed_starts: Family::default(),
            crash_backoff: Family::default(),
            tick_duration: Histogram::new(TICK_BUCKETS_S),
            ticks: Counter::default(),
            last_tick: Gauge::default(),
            config_reload_errors: Counter::default(),
            config_valid: Gauge::default(),
            leader: Gauge::default(),
            webhook_deliveries: Family::default(),
            facts: Mutex::new(HealthFacts {
                leader: false,
                holds_session: None,
                started_at,
                poll_interval,
                stuck_after,
                config_valid: false,
                last_turn_at: None,
                last_observed_at: None,
                buckets: Vec::new(),
            }),
            registry: Registry::default(),
        };
        let m = &metrics;
        registry.register(
            "queued_jobs",
            "Jobs queued per bucket at the last tick",
            m.queued.clone(),
        );
        registry.register(
            "in_progress_jobs",
            "Jobs in progress on the bucket's runners at the last tick",
            m.in_progress.clone(),
        );
        registry.register(
            "in_flight_runners",
            "Our in-flight runner children per bucket at the last tick (pending or running)",
            m.in_flight.clone(),
        );
        registry.register(
            "queue_wait_dispatched_seconds",
            "Per runner dispatched: how long the oldest job queued in its bucket had waited",
            m.wait_dispatched.clone(),
        );
        registry.register(
            "queue_wait_started_seconds",
            "Per job seen queued and then in progress: its wait, to the tick it was first seen in progress",
            m.wait_started.clone(),
        );
        registry.register(
            "oldest_queued_age_seconds",
            "Age of the oldest queued job per repo at the last tick",
            m.oldest_queued_age.clone(),
        );
        registry.register(
            "dispatches",
            "Runners dispatched (new children)",
            m.dispatches.clone(),
        );
        registry.register(
            "dispatches_deduplicated",
            "Dispatches Nomad answered with an existing child (a replayed idempotency token)",
            m.dispatches_deduplicated.clone(),
        );
        registry.register(
            "dispatch_failures",
            "Planned dispatches that failed, by stage (mint or dispatch)",
            m.dispatch_failures.clone(),
        );
        registry.register(
            "credential_mints",
            "Registration credentials minted for runners, by result",
            m.credential_mints.clone(),
        );
        registry.register(
            "purges",
            "Finished children purged, by outcome",
            m.purges.clone(),
        );
        registry.register(
            "reap_decisions",
            "Decisions on runners nominated for teardown, by outcome and verdict",
            m.reap_decisions.clone(),
        );
        registry.register(
            "failed_starts",
            "Failed starts in a row per bucket backing off (0 when none)",
            m.failed_starts.clone(),
        );
        registry.register(
            "crash_backoff",
            "1 while a bucket's dispatches back off after failed starts",
            m.crash_backoff.clone(),
        );
        registry.register(
            "tick_duration_seconds",
            "Time one tick took, observe to report",
            m.tick_duration.clone(),
        );
        registry.register("ticks", "Ticks that acted and reported", m.ticks.clone());
        registry.register(
            "last_tick_timestamp_seconds",
            "Unix time at which the last tick ended",
            m.last_tick.clone(),
        );
        registry.register(
            "config_reload_errors",
            "Documents rejected by validation (the daemon keeps the last good one)",
            m.config_reload_errors.clone(),
        );
        registry.register(
            "config_valid",
            "1 while a valid document is applied",
            m.config_valid.clone(),
        );
        registry.register(
            "leader",
            "1 while this copy runs the ticks, 0 on a standby",
            m.leader.clone(),
        );
        registry.register(
            "webhook_deliveries",
            "Webhook deliveries received, by forge and outcome",
            m.webhook_deliveries.clone(),
        );
        let clients = &*CLIENT_COUNTS;
        registry.register(
            "api_requests",
            "Requests to each service by status class (error: no answer)",
            clients.api_requests.clone(),
        );
        registry.register(
            "github_conditional_hits",
            "GitHub listings answered 304 Not Modified from the cache",
            clients.conditional_hits.clone(),
        );
        registry.register(
            "github_rate_limit_remaining",
            "Requests left in each GitHub rate-limit budget, as last reported",
            clients.rate_limit_remaining.clone(),
        );
        registry.register(
            "github_secondary_points_last_minute",
            "GitHub secondary-limit points each budget owner spent in the last 60 seconds",
            clients.secondary_points.clone(),
        );
        registry.register(
            "github_content_requests_last_minute",
            "GitHub requests each budget owner sent in the last 60 seconds that may count against the content-creation limit (80 a minute)",
            clients.content_requests_minute.clone(),
        );
        registry.register(
            "github_content_requests_last_hour",
            "GitHub requests each budget owner sent in the last hour that may count against the content-creation limit (500 an hour)",
            clients.content_requests_hour.clone(),
        );
        Metrics {
            registry,
            ..metrics
        }
    }

    /// Shared, as the loop and the server hold it.
    pub fn shared(self) -> Arc<Metrics> {
        Arc::new(self)
    }

    /// The registry in the Prometheus (OpenMetrics) text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// Counts one webhook delivery from `forge` (`github`, `forgejo`) by its `outcome`.
    pub fn count_webhook_delivery(&self, forge: &str, outcome: &str) {
        self.webhook_deliveries
            .get_or_create(&WebhookLabels {
                forge: forge.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// The leader lock says whether this copy leads. Until it exists, the loop calls this
    /// with `true` when it starts ticking.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
        self.facts().leader = leader;
    }

    /// The leader lock says whether a standby holds its Consul session (for `/livez`).
    pub fn set_holds_session(&self, holds: bool) {
        self.facts().holds_session = Some(holds);
    }

    pub fn set_poll_interval(&self, poll_interval: Duration) {
        self.facts().poll_interval = poll_interval;
    }

    /// A document was rejected by validation.
    pub fn count_config_reload_error(&self) {
        self.config_reload_errors.inc();
    }

    pub fn set_config_valid(&self, valid: bool) {
        self.config_valid.set(i64::from(valid));
        self.facts().config_valid = valid;
    }

    /// The loop finished a turn at `now`, without a tick (no valid document).
    pub fn loop_turned(&self, now: DateTime<Utc>) {
        self.facts().last_turn_at = Some(now);
    }

    /// A tick ended at `now` after `took`.
    pub fn tick_ended(&self, now: DateTime<Utc>, took: Duration) {
        self.tick_duration.observe(took.as_secs_f64());
        self.ticks.inc();
        self.last_tick.set(now.timestamp_millis() as f64 / 1000.0);
        self.facts().last_turn_at = Some(now);
    }

    /// What a tick observed, for `/healthz`.
    pub(crate) fn observed(
        &self,
        now: DateTime<Utc>,
        nomad_and_forge: bool,
        buckets: Vec<BucketFacts>,
    ) {
        // A tick runs only on a valid document.
        self.config_valid.set(1);
        let mut facts = self.facts();
        facts.config_valid = true;
        if nomad_and_forge {
            facts.last_observed_at = Some(now);
        }
        facts.buckets = buckets;
    }

    /// A copy of the health facts, to judge.
    pub fn health_facts(&self) -> HealthFacts {
        self.facts().clone()
    }

    /// A registry in which every metric has one series (placeholder labels): the encoding
    /// then names every metric the daemon can export, which an empty family would not (it
    /// is left out of a scrape). For checking alert rules and dashboards against.
    pub fn specimen() -> Metrics {
        let metrics = Metrics::default();
        let bucket = BucketLabels {
            repo: "owner/repo".into(),
            parent: "parent".into(),
            labels: "label".into(),
        };
        let repo = RepoLabels {
            repo: "owner/repo".into(),
        };
        let parent = ParentLabels {
            repo: "owner/repo".into(),
            parent: "parent".into(),
        };
        let crash = CrashLabels {
            repo: "owner/repo".into(),
            labels: "label".into(),
        };
        let m = &metrics;
        m.count_webhook_delivery("github", "accepted");
        for family in [&m.queued, &m.in_progress, &m.in_flight] {
            family.get_or_create(&bucket).set(0);
        }
        for family in [&m.wait_dispatched, &m.wait_started] {
            family.get_or_create(&repo).observe(0.0);
        }
        m.oldest_queued_age.get_or_create(&repo).set(0);
        for family in [&m.dispatches, &m.dispatches_deduplicated] {
            family.get_or_create(&parent).inc_by(0);
        }
        m.dispatch_failures
            .get_or_create(&FailureLabels {
                repo: "owner/repo".into(),
                parent: "parent".into(),
                stage: "mint".into(),
            })
            .inc_by(0);
        m.credential_mints
            .get_or_create(&ResultLabels {
                repo: "owner/repo".into(),
                result: "ok".into(),
            })
            .inc_by(0);
        m.purges
            .get_or_create(&OutcomeLabels {
                outcome: "purged".into(),
            })
            .inc_by(0);
        m.reap_decisions
            .get_or_create(&ReapLabels {
                outcome: "kept".into(),
                verdict: "idle".into(),
            })
            .inc_by(0);
        for family in [&m.failed_starts, &m.crash_backoff] {
            family.get_or_create(&crash).set(0);
        }
        count_request(Service::GitHub, Some(200));
        CLIENT_COUNTS.conditional_hits.inc_by(0);
        set_rate_limit_remaining("app", 5000);
        set_secondary_points("app", 0);
        set_content_requests("app", 0, 0);
        metrics
    }

    fn facts(&self) -> std::sync::MutexGuard<'_, HealthFacts> {
        // A panic while holding this lock leaves plain data behind, still worth reading.
        self.facts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_classes_cover_every_answer_and_no_answer() {
        assert_eq!(status_class(Some(200)), "2xx");
        assert_eq!(status_class(Some(304)), "3xx");
        assert_eq!(status_class(Some(422)), "4xx");
        assert_eq!(status_class(Some(503)), "5xx");
        assert_eq!(status_class(None), "error");
        assert_eq!(status_class(Some(99)), "error");
    }

    #[test]
    fn every_name_carries_the_prefix_and_counters_end_in_total() {
        let metrics = Metrics::default();
        count_request(Service::Nomad, Some(200));
        let text = metrics.encode();
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let mut parts = line.split(' ').skip(2);
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            assert!(name.starts_with("runner_scaler_"), "{line}");
            if kind == "counter" {
                assert!(
                    text.contains(&format!("\n{name}_total")),
                    "{name} has no _total sample"
                );
            }
        }
        assert!(text.contains("runner_scaler_api_requests_total{service=\"nomad\",class=\"2xx\"}"));
    }

    #[test]
    fn the_specimen_shows_every_registered_metric() {
        let source = include_str!("metrics.rs");
        let registered = source.matches("registry.register(").count() - 1;
        let shown = Metrics::specimen().encode().matches("# TYPE ").count();
        assert_eq!(shown, registered, "a metric without a specimen series");
    }
}
