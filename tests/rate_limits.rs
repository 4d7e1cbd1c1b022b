//! Rate-limit waits come from the network: whatever `retry-after` or `x-ratelimit-reset` says,
//! a wait lasts at most an hour and computing it never panics a tick.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use axum::http::{HeaderValue, StatusCode};
use axum::response::IntoResponse;
use chrono::Utc;
use runner_scaler::clients::github::{GitHub, GitHubSettings};
use runner_scaler::config::{Config, Mode, RepoConfig};
use runner_scaler::control_loop::Forge;
use runner_scaler::model::{ErrorClass, RATE_LIMIT_WAIT_MAX_S};
use runner_scaler::observe::{PortError, QueueSource, RepoJobs};
use runner_scaler::secrets::{SecretSource, SecretString};
use runner_scaler::sim::memory::MemoryWorld;
use support::memory_loop::{SH, app_config, controller, repo, t0};
use support::recording::RecordingServer;

const POLL_TOKEN: &str = "rate-limit-test-poll-token";

struct PollingToken;

#[async_trait]
impl SecretSource for PollingToken {
    async fn read_field(&self, _path: &str, _field: &str) -> Result<SecretString, PortError> {
        Ok(SecretString::from(POLL_TOKEN))
    }
}

fn vault_repo() -> RepoConfig {
    RepoConfig {
        repo: repo("acme/api"),
        mode: Mode::Vault {
            vault_path: "github/acme-poll".into(),
            register_vault_path: "github/acme-admin".into(),
        },
        max_concurrent: 2,
        profiles: vec![],
        default_job: Some("ci-runner".into()),
        labels: None,
        search_labels_as_written: Default::default(),
        credential: Default::default(),
        nomad_namespace: None,
    }
}

/// GitHub refusing every request with `status` and `headers`.
async fn refusing_github(status: u16, headers: Vec<(&'static str, String)>) -> RecordingServer {
    RecordingServer::start(move |_| {
        let mut response = (
            StatusCode::from_u16(status).unwrap(),
            r#"{"message":"API rate limit exceeded for user ID 1."}"#,
        )
            .into_response();
        for (name, value) in &headers {
            response
                .headers_mut()
                .insert(*name, HeaderValue::from_str(value).unwrap());
        }
        response
    })
    .await
}

#[tokio::test]
async fn absurd_rate_limit_headers_make_the_client_wait_at_most_an_hour() {
    let ten_years_on = (Utc::now().timestamp() + 10 * 365 * 24 * 3600).to_string();
    let cases: Vec<(u16, Vec<(&'static str, String)>)> = vec![
        (429, vec![("retry-after", u64::MAX.to_string())]),
        (403, vec![("retry-after", i64::MAX.to_string())]),
        (429, vec![("retry-after", "864000".into())]),
        (
            403,
            vec![
                ("x-ratelimit-remaining", "0".into()),
                ("x-ratelimit-reset", ten_years_on),
            ],
        ),
        (
            429,
            vec![
                ("x-ratelimit-remaining", "0".into()),
                ("x-ratelimit-reset", u64::MAX.to_string()),
            ],
        ),
        (
            403,
            vec![
                ("x-ratelimit-remaining", "0".into()),
                ("x-ratelimit-reset", "-86400".into()),
            ],
        ),
        (429, vec![("retry-after", "-1".into())]),
        (429, vec![("retry-after", "a while".into())]),
    ];
    let longest = chrono::Duration::seconds(RATE_LIMIT_WAIT_MAX_S as i64);
    for (status, headers) in cases {
        let case = format!("{status} {headers:?}");
        let github = refusing_github(status, headers).await;
        let client = GitHub::new(
            GitHubSettings {
                api_url: github.base_url().parse().unwrap(),
                app: None,
                request_timeout: Duration::from_secs(10),
            },
            Arc::new(PollingToken),
        )
        .unwrap();
        let repo = vault_repo();

        let refused = client.list_jobs(&repo).await.expect_err(&case);
        assert_eq!(
            refused.class,
            ErrorClass::RateLimited,
            "{case}: {refused:?}"
        );
        let wait_s = refused.retry_after_s.expect(&case);
        assert!(
            (1..=RATE_LIMIT_WAIT_MAX_S).contains(&wait_s),
            "{case}: waits {wait_s}s"
        );
        assert!(!refused.message.contains(POLL_TOKEN), "{case}");

        // The budget is paused, for an hour at most, and the next call is refused without a
        // request.
        let asked = github.requests().len();
        let paused_until = client.paused_until(&repo).expect(&case);
        assert!(
            paused_until <= Utc::now() + longest,
            "{case}: {paused_until}"
        );
        let again = client.list_jobs(&repo).await.expect_err(&case);
        assert_eq!(again.class, ErrorClass::RateLimited, "{case}: {again:?}");
        assert!(
            again
                .retry_after_s
                .is_some_and(|s| (1..=RATE_LIMIT_WAIT_MAX_S).contains(&s)),
            "{case}: {again:?}"
        );
        assert_eq!(github.requests().len(), asked, "{case}: asked while paused");
    }
}

/// A forge queue that asks to be left alone for `u64::MAX` seconds, once.
struct RefusesForever {
    inner: MemoryWorld,
    calls: AtomicUsize,
}

#[async_trait]
impl QueueSource for RefusesForever {
    async fn list_jobs(&self, repo: &RepoConfig) -> Result<RepoJobs, PortError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(
                PortError::new(ErrorClass::RateLimited, "429 Too Many Requests")
                    .with_retry_after(Some(u64::MAX)),
            );
        }
        self.inner.list_jobs(repo).await
    }
}

#[tokio::test]
async fn the_loop_holds_a_repo_for_an_hour_at_most_whatever_the_service_asks() {
    let world = MemoryWorld::new(t0());
    world.queue_job(&repo("acme/api"), SH);
    let queue = Arc::new(RefusesForever {
        inner: world.clone(),
        calls: AtomicUsize::new(0),
    });
    let mut ctl = controller(&world);
    ctl.services.github = Some(Forge {
        queue: queue.clone(),
        registrar: Arc::new(world.clone()),
        runners: None,
        registered: None,
    });
    let config: Config = app_config(&[("acme/api", 2)]);
    let at = |s: i64| t0() + chrono::Duration::seconds(s);
    let last = RATE_LIMIT_WAIT_MAX_S as i64;

    let view = ctl.tick(&config, 1, at(0), false).await;
    assert_eq!(view.started, 0);
    for s in [15, last - 1] {
        ctl.tick(&config, 1, at(s), false).await;
    }
    assert_eq!(queue.calls.load(Ordering::SeqCst), 1, "asked while held");

    let view = ctl.tick(&config, 1, at(last), false).await;
    assert_eq!(
        queue.calls.load(Ordering::SeqCst),
        2,
        "not asked after an hour"
    );
    assert_eq!(view.started, 1);
}
