//! `/metrics`, `/livez` and `/healthz` over real HTTP, fed by the real controller and clients
//! ticking against the HTTP twins. Ticks are driven one by one with explicit times, and the
//! server reads a clock the test sets: nothing sleeps, and no paused clock meets a socket.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus_parse::{Sample, Scrape};
use runner_scaler::clock::Clock;
use runner_scaler::control_loop::Controller;
use runner_scaler::metrics::Metrics;
use runner_scaler::serve::{Endpoints, bind, router, spawn};
use support::twins::{
    CONSUL_TOKEN, FORGEJO_TOKEN, NOMAD_TOKEN, POLL_TOKEN, Twins, VAULT_TOKEN, config,
};

/// Short enough that a stuck job shows within a few ticks.
const STUCK_AFTER: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_secs(15);

/// The time the server's handlers read, set by the test.
struct TestClock(Mutex<DateTime<Utc>>);

impl Clock for TestClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap()
    }
}

struct Served {
    base: String,
    clock: Arc<TestClock>,
    metrics: Arc<Metrics>,
    http: reqwest::Client,
}

impl Served {
    /// The daemon's server on a free loopback port, over `metrics`, as `run` starts it.
    async fn start(started_at: DateTime<Utc>) -> Served {
        let metrics = Arc::new(Metrics::new(POLL, STUCK_AFTER, started_at));
        // What `run` (and later the leader lock) says of the copy that ticks.
        metrics.set_leader(true);
        let clock = Arc::new(TestClock(Mutex::new(started_at)));
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        spawn(
            "/metrics, /livez and /healthz",
            listener,
            router(Endpoints {
                metrics: metrics.clone(),
                clock: clock.clone(),
                last_tick: tokio::sync::watch::channel(None).1,
                role: tokio::sync::watch::channel(runner_scaler::report::live::Role::Leader).1,
                read_token: None,
            }),
            std::future::pending(),
        );
        runner_scaler::clients::http::install_crypto_provider();
        Served {
            base,
            clock,
            metrics,
            http: reqwest::Client::new(),
        }
    }

    fn set_now(&self, now: DateTime<Utc>) {
        *self.clock.0.lock().unwrap() = now;
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    async fn scrape(&self) -> (String, Vec<Sample>) {
        let (status, text) = self.get("/metrics").await;
        assert_eq!(status, 200);
        let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
        (text, scrape.samples)
    }

    /// Ticks at `now` with the served metrics, as `run` would; the server's clock is then
    /// a second later.
    async fn tick(
        &self,
        ctl: &mut Controller,
        config: &runner_scaler::config::Config,
        now: DateTime<Utc>,
    ) -> runner_scaler::report::TickView {
        ctl.settings.metrics = self.metrics.clone();
        let view = ctl.tick(config, 1, now, false).await;
        self.set_now(now + chrono::Duration::seconds(1));
        view
    }
}

fn at(t0: DateTime<Utc>, n: i64) -> DateTime<Utc> {
    t0 + chrono::Duration::seconds(15 * n)
}

fn labels_of(sample: &Sample) -> BTreeMap<String, String> {
    sample
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn value(samples: &[Sample], metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            prometheus_parse::Value::Histogram(buckets) => {
                buckets.iter().map(|b| b.count).fold(0.0, f64::max)
            }
            prometheus_parse::Value::Summary(_) => f64::NAN,
        })
}

#[tokio::test]
async fn healthz_fails_while_a_job_waits_past_stuck_after_with_room_and_recovers_when_it_starts() {
    let twins = Twins::start().await;
    let acme = twins.add_app_repo("acme/api");
    twins.register_token_parent("ci-runner");
    let config = config(r#"{ "acme/api": { "mode": "app", "maxConcurrent": 3 } }"#);
    let t0 = Utc::now();
    let job = twins
        .github
        .add_run(&acme, vec![vec!["self-hosted"]])
        .job_ids[0];
    let served = Served::start(t0).await;
    let mut ctl = twins.controller();

    // The runner goes out at once but is never placed: the job keeps waiting, and the cap
    // (3) has room. GitHub stamps the job to the second, so it may be up to 1 s older.
    for n in 0..=7 {
        let view = served.tick(&mut ctl, &config, at(t0, n)).await;
        assert_eq!(view.queued, 1, "tick {n}");
        let (status, body) = served.get("/healthz").await;
        assert_eq!(status, 200, "tick {n}: {body}");
        assert_eq!(served.get("/livez").await.0, 200, "tick {n}");
    }
    for n in 8..=9 {
        served.tick(&mut ctl, &config, at(t0, n)).await;
    }
    let (status, body) = served.get("/healthz").await;
    assert_eq!(status, 503, "{body}");
    let reasons: serde_json::Value = serde_json::from_str(&body).unwrap();
    let reasons = reasons["reasons"].as_array().unwrap();
    assert_eq!(reasons.len(), 1, "{body}");
    assert!(
        reasons[0]
            .as_str()
            .unwrap()
            .starts_with("acme/api [self-hosted]: a job has been queued"),
        "{body}"
    );
    assert_eq!(served.get("/livez").await.0, 200, "a stuck queue is alive");

    // The runner boots and takes the job: the queue drains.
    let child = twins.our_children("ci-runner").remove(0);
    let runner_name = child.meta["runner_name"].clone();
    twins.nomad.place(&child.id).unwrap();
    twins
        .github
        .register_runner(&acme, &runner_name, &["self-hosted"]);
    twins.github.start_job(&acme, job, &runner_name).unwrap();
    let view = served.tick(&mut ctl, &config, at(t0, 10)).await;
    assert_eq!(view.queued, 0);
    let (status, body) = served.get("/healthz").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(served.get("/livez").await.0, 200);

    let (_, samples) = served.scrape().await;
    let started = value(
        &samples,
        "runner_scaler_queue_wait_started_seconds_count",
        &[("repo", "acme/api")],
    );
    assert_eq!(started, Some(1.0), "one job seen queued, then started");
}

#[tokio::test]
async fn a_burst_that_drains_in_time_keeps_healthz_and_livez_at_200() {
    let twins = Twins::start().await;
    let acme = twins.add_app_repo("acme/api");
    twins.register_token_parent("ci-runner");
    let config = config(r#"{ "acme/api": { "mode": "app", "maxConcurrent": 4 } }"#);
    let t0 = Utc::now();
    let jobs = twins
        .github
        .add_run(&acme, vec![vec!["self-hosted"]; 4])
        .job_ids;
    let served = Served::start(t0).await;
    let mut ctl = twins.controller();

    assert_eq!(served.tick(&mut ctl, &config, at(t0, 0)).await.started, 4);
    let children = twins.our_children("ci-runner");
    for (n, pair) in (1..).zip(jobs.chunks(2)) {
        for (job, child) in pair.iter().zip(&children[(n as usize - 1) * 2..]) {
            let runner_name = child.meta["runner_name"].clone();
            twins.nomad.place(&child.id).unwrap();
            twins
                .github
                .register_runner(&acme, &runner_name, &["self-hosted"]);
            twins.github.start_job(&acme, *job, &runner_name).unwrap();
        }
        served.tick(&mut ctl, &config, at(t0, n)).await;
        assert_eq!(served.get("/healthz").await.0, 200, "tick {n}");
        assert_eq!(served.get("/livez").await.0, 200, "tick {n}");
    }
    for job in &jobs {
        twins.github.complete_job(&acme, *job, "success").unwrap();
    }
    // Well past stuck-after: nothing is queued, so nothing is stuck.
    for n in 3..=12 {
        let view = served.tick(&mut ctl, &config, at(t0, n)).await;
        assert_eq!(view.queued, 0);
        let (status, body) = served.get("/healthz").await;
        assert_eq!(status, 200, "tick {n}: {body}");
        assert_eq!(served.get("/livez").await.0, 200, "tick {n}");
    }
}

#[tokio::test]
async fn livez_and_healthz_fail_when_the_loop_stops_turning() {
    let t0 = Utc::now();
    let served = Served::start(t0).await;
    served.set_now(at(t0, 2));
    assert_eq!(served.get("/livez").await.0, 200, "still starting");
    served.set_now(at(t0, 4));
    assert_eq!(served.get("/livez").await.0, 503, "no turn in four polls");
    let (status, body) = served.get("/healthz").await;
    assert_eq!(status, 503);
    assert!(body.contains("no valid configuration"), "{body}");
    assert!(
        body.contains("no tick has read Nomad and a forge"),
        "{body}"
    );
    // A standby does not turn the loop and is both alive and healthy.
    served.metrics.set_leader(false);
    assert_eq!(served.get("/livez").await.0, 200);
    assert_eq!(served.get("/healthz").await.0, 200);
}

#[tokio::test]
async fn metrics_are_scraped_with_their_label_sets_and_no_label_carries_an_id_or_a_secret() {
    let twins = Twins::start().await;
    let acme = twins.add_app_repo("acme/api");
    twins.register_token_parent("ci-runner");
    let config = config(r#"{ "acme/api": { "mode": "app", "maxConcurrent": 3 } }"#);
    let t0 = Utc::now();
    let jobs = twins
        .github
        .add_run(&acme, vec![vec!["self-hosted"]; 2])
        .job_ids;
    let served = Served::start(t0).await;
    let mut ctl = twins.controller();
    served.tick(&mut ctl, &config, at(t0, 0)).await;
    let children = twins.our_children("ci-runner");
    assert_eq!(children.len(), 2);
    let child = &children[0];
    let runner_name = child.meta["runner_name"].clone();
    twins.nomad.place(&child.id).unwrap();
    twins
        .github
        .register_runner(&acme, &runner_name, &["self-hosted"]);
    twins
        .github
        .start_job(&acme, jobs[0], &runner_name)
        .unwrap();
    served.tick(&mut ctl, &config, at(t0, 1)).await;
    twins
        .github
        .complete_job(&acme, jobs[0], "success")
        .unwrap();
    twins.nomad.finish(&child.id, true).unwrap();
    served.tick(&mut ctl, &config, at(t0, 2)).await;
    served.tick(&mut ctl, &config, at(t0, 3)).await;

    let (text, samples) = served.scrape().await;
    let bucket = [
        ("repo", "acme/api"),
        ("parent", "ci-runner"),
        ("labels", "self-hosted"),
    ];
    assert_eq!(
        value(&samples, "runner_scaler_queued_jobs", &bucket),
        Some(1.0)
    );
    assert_eq!(
        value(&samples, "runner_scaler_in_flight_runners", &bucket),
        Some(1.0)
    );
    assert_eq!(
        value(&samples, "runner_scaler_in_progress_jobs", &bucket),
        Some(0.0)
    );
    let parent = [("repo", "acme/api"), ("parent", "ci-runner")];
    assert_eq!(
        value(&samples, "runner_scaler_dispatches_total", &parent),
        Some(2.0)
    );
    assert_eq!(
        value(
            &samples,
            "runner_scaler_credential_mints_total",
            &[("repo", "acme/api"), ("result", "ok")]
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &samples,
            "runner_scaler_purges_total",
            &[("outcome", "purged")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &samples,
            "runner_scaler_queue_wait_dispatched_seconds_count",
            &[("repo", "acme/api")]
        ),
        Some(2.0)
    );
    assert_eq!(value(&samples, "runner_scaler_ticks_total", &[]), Some(4.0));
    assert_eq!(value(&samples, "runner_scaler_leader", &[]), Some(1.0));
    assert_eq!(
        value(&samples, "runner_scaler_config_valid", &[]),
        Some(1.0)
    );
    assert!(
        value(
            &samples,
            "runner_scaler_oldest_queued_age_seconds",
            &[("repo", "acme/api")]
        )
        .is_some()
    );
    assert!(value(&samples, "runner_scaler_tick_duration_seconds_count", &[]).unwrap() >= 4.0);
    for service in ["github", "nomad"] {
        let ok = value(
            &samples,
            "runner_scaler_api_requests_total",
            &[("service", service), ("class", "2xx")],
        );
        assert!(ok.unwrap_or(0.0) > 0.0, "{service}: {ok:?}");
    }
    assert!(
        value(&samples, "runner_scaler_github_conditional_hits_total", &[]).unwrap_or(0.0) > 0.0,
        "an unchanged listing is answered 304 on a later tick"
    );
    assert!(
        value(&samples, "runner_scaler_github_rate_limit_remaining", &[]).is_some(),
        "the twin sends x-ratelimit-remaining"
    );
    // Two JIT configs, each a POST of the installation, in the last hour.
    let content_last_hour: f64 = samples
        .iter()
        .filter(|s| s.metric == "runner_scaler_github_content_requests_last_hour")
        .filter(|s| {
            labels_of(s)
                .get("owner")
                .is_some_and(|o| o.starts_with("installation-"))
        })
        .map(|s| match s.value {
            prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum();
    assert!(content_last_hour >= 2.0, "{text}");

    // Every series of a metric has exactly the label names it is documented with.
    let expected: &[(&str, &[&str])] = &[
        ("runner_scaler_queued_jobs", &["labels", "parent", "repo"]),
        (
            "runner_scaler_in_progress_jobs",
            &["labels", "parent", "repo"],
        ),
        (
            "runner_scaler_in_flight_runners",
            &["labels", "parent", "repo"],
        ),
        ("runner_scaler_oldest_queued_age_seconds", &["repo"]),
        ("runner_scaler_queue_wait_dispatched_seconds", &["repo"]),
        ("runner_scaler_dispatches_total", &["parent", "repo"]),
        ("runner_scaler_credential_mints_total", &["repo", "result"]),
        ("runner_scaler_purges_total", &["outcome"]),
        ("runner_scaler_api_requests_total", &["class", "service"]),
        ("runner_scaler_github_rate_limit_remaining", &["owner"]),
        (
            "runner_scaler_github_secondary_points_last_minute",
            &["owner"],
        ),
        (
            "runner_scaler_github_content_requests_last_minute",
            &["owner"],
        ),
        (
            "runner_scaler_github_content_requests_last_hour",
            &["owner"],
        ),
        ("runner_scaler_ticks_total", &[]),
        ("runner_scaler_leader", &[]),
    ];
    for (metric, names) in expected {
        let series: Vec<&Sample> = samples.iter().filter(|s| s.metric == *metric).collect();
        assert!(!series.is_empty(), "no {metric} in\n{text}");
        for s in series {
            let keys: Vec<String> = labels_of(s).into_keys().collect();
            assert_eq!(keys, *names, "{metric}");
        }
    }

    // No label value is, or holds, an id or a secret of this test.
    let mut ids: BTreeSet<String> = BTreeSet::new();
    for child in twins.our_children("ci-runner") {
        ids.insert(child.id.clone());
        ids.insert(child.meta["runner_name"].clone());
    }
    let mut secrets: Vec<String> = twins.github.issued_secrets();
    secrets.extend(
        [
            NOMAD_TOKEN,
            VAULT_TOKEN,
            CONSUL_TOKEN,
            POLL_TOKEN,
            FORGEJO_TOKEN,
        ]
        .map(String::from),
    );
    secrets.push(
        support::twins::CREDENTIALS
            .github_app_private_key_pem
            .trim()
            .to_string(),
    );
    assert!(!secrets.is_empty());
    let job_ids: BTreeSet<String> = jobs.iter().map(u64::to_string).collect();
    for s in &samples {
        for (name, label) in labels_of(s) {
            assert!(
                !job_ids.contains(&label),
                "{}: {name}={label} is a job id",
                s.metric
            );
            for forbidden in ids.iter().chain(&secrets) {
                assert!(
                    !label.contains(forbidden.as_str()),
                    "{}: {name}={label} carries {forbidden}",
                    s.metric
                );
            }
        }
    }
    for forbidden in ids.iter().chain(&secrets) {
        assert!(
            !text.contains(forbidden.as_str()),
            "the scrape carries {forbidden}"
        );
    }
}

/// Every metric name the daemon exports, from the registry's own encoding: a counter's
/// samples end in `_total`, a histogram's in `_bucket`, `_sum` and `_count`.
fn exported_names() -> BTreeSet<String> {
    let text = Metrics::specimen().encode();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

#[test]
fn every_alert_rule_names_only_metrics_the_daemon_exports() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/nomad/alerts/runner-scaler.rules.yml"
    );
    let rules: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let exported = exported_names();
    assert!(exported.contains("runner_scaler_leader"), "{exported:?}");
    let mut alerts = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let alert = rule["alert"].as_str().expect("an alert name");
            let expr = rule["expr"].as_str().expect("an expression");
            let used: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|word| word.starts_with("runner_scaler_"))
                .collect();
            assert!(!used.is_empty(), "{alert} names no metric of ours: {expr}");
            for name in used {
                assert!(exported.contains(name), "{alert}: {name} is not exported");
            }
            alerts.push(alert.to_string());
        }
    }
    for expected in [
        "RunnerScalerQueueStuck",
        "RunnerScalerNoTickProgress",
        "RunnerScalerCrashLoop",
        "RunnerScalerEscapedRunners",
        "RunnerScalerGitHubRateLimitLow",
        "RunnerScalerNotLeaderAnywhere",
    ] {
        assert!(alerts.iter().any(|a| a == expected), "no {expected}");
    }
}

/// Virtual wall time: `t0` plus the paused tokio clock's progress.
struct VirtualClock {
    t0: DateTime<Utc>,
    start: tokio::time::Instant,
}

impl Clock for VirtualClock {
    fn now(&self) -> DateTime<Utc> {
        self.t0 + chrono::Duration::from_std(self.start.elapsed()).unwrap()
    }
}

/// The loop itself over the in-memory world (no sockets, so the paused clock is exact):
/// without a valid document it keeps turning (alive) but is not healthy, and it counts the
/// rejection; with one it ticks, and is both.
#[tokio::test(start_paused = true)]
async fn the_loop_marks_itself_leader_and_a_rejected_document_fails_healthz_not_livez() {
    use runner_scaler::config::watch::ConfigState;
    use runner_scaler::config::{ConfigDefaults, parse_document};
    use runner_scaler::serve::health::{healthz, livez};
    use support::memory_loop::{SH, app_config, repo};

    let t0 = Utc::now();
    let clock = Arc::new(VirtualClock {
        t0,
        start: tokio::time::Instant::now(),
    });
    let world = runner_scaler::sim::memory::MemoryWorld::new(t0);
    world.queue_job(&repo("acme/api"), SH);
    let metrics = Arc::new(Metrics::new(POLL, STUCK_AFTER, t0));
    let mut ctl = support::memory_loop::controller(&world);
    ctl.settings.metrics = metrics.clone();
    let errors = parse_document(
        br#"{"acme/api": {"mode": "nope"}}"#,
        &ConfigDefaults::default(),
    )
    .unwrap_err();
    let (tx, rx) = tokio::sync::watch::channel(ConfigState {
        errors,
        ..ConfigState::default()
    });
    tokio::spawn(runner_scaler::report::record::count_config_rejections(
        metrics.clone(),
        rx.clone(),
    ));
    let scenario = {
        let (metrics, clock, world) = (metrics.clone(), clock.clone(), world.clone());
        async move {
            tokio::time::sleep(POLL * 5).await;
            let facts = metrics.health_facts();
            assert!(facts.leader, "run marks the copy that ticks as leader");
            assert!(livez(&facts, clock.now()).ok, "idle turns are turns");
            let health = healthz(&facts, clock.now());
            assert!(!health.ok);
            assert!(
                health
                    .reasons
                    .iter()
                    .any(|r| r.starts_with("no valid configuration")),
                "{health:?}"
            );
            assert_eq!(world.dispatch_count(), 0);

            tx.send_replace(ConfigState {
                config: Some(Arc::new(app_config(&[("acme/api", 3)]))),
                applied_index: Some(2),
                ..ConfigState::default()
            });
            tokio::time::sleep(POLL * 2).await;
            assert_eq!(world.dispatch_count(), 1);
            let facts = metrics.health_facts();
            assert!(livez(&facts, clock.now()).ok);
            let health = healthz(&facts, clock.now());
            assert!(health.ok, "{health:?}");
        }
    };
    runner_scaler::control_loop::run(ctl, rx, clock.as_ref(), false, scenario).await;
    let text = metrics.encode();
    assert!(
        text.contains("runner_scaler_config_reload_errors_total 1\n"),
        "{text}"
    );
    assert!(text.contains("runner_scaler_config_valid 1\n"), "{text}");
    assert!(text.contains("runner_scaler_leader 1\n"), "{text}");
}
