//! `/status` and `/metrics` name private repos, parent jobs and child ids: off loopback they
//! require the bearer token of `RUNNER_SCALER_LISTEN_TOKEN(_FILE)`, while `/livez` and
//! `/healthz` stay open for health checks. The router over real HTTP, and the daemon as its
//! own process against the twins.

mod support;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use runner_scaler::clock::SystemClock;
use runner_scaler::metrics::Metrics;
use runner_scaler::report::live::Role;
use runner_scaler::serve::{Endpoints, ReadToken, bind, exposure_problem, router, spawn};
use runner_scaler::sim::twins::github::TEST_APP_PRIVATE_KEY_PEM;
use secrecy::SecretString;
use support::daemon_process::{Daemon, status_at, wait_until};
use support::twins::{TempFile, Twins};

const BIN: &str = env!("CARGO_BIN_EXE_runner-scaler");
const TOKEN: &str = "listen-token-canary-5e21c9";
const DEADLINE: Duration = Duration::from_secs(15);

async fn serve_guarded(token: Option<&str>) -> String {
    let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    spawn(
        "/metrics, /livez, /healthz and /status",
        listener,
        router(Endpoints {
            metrics: Arc::new(Metrics::default()),
            clock: Arc::new(SystemClock),
            last_tick: tokio::sync::watch::channel(None).1,
            role: tokio::sync::watch::channel(Role::Leader).1,
            read_token: token.map(|t| ReadToken::new(&SecretString::from(t))),
        }),
        std::future::pending(),
    );
    base
}

async fn get(base: &str, path: &str, authorization: Option<&str>) -> (u16, String) {
    runner_scaler::clients::http::install_crypto_provider();
    let mut request = reqwest::Client::new().get(format!("{base}{path}"));
    if let Some(value) = authorization {
        request = request.header("Authorization", value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let challenge = response
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    if status == 401 {
        assert_eq!(
            challenge.as_deref(),
            Some(r#"Bearer realm="runner-scaler""#)
        );
    }
    (status, response.text().await.unwrap())
}

#[tokio::test]
async fn status_and_metrics_need_the_token_and_health_checks_do_not() {
    let base = serve_guarded(Some(TOKEN)).await;
    let bearer = format!("Bearer {TOKEN}");
    for path in ["/status", "/metrics"] {
        for refused in [
            None,
            Some("Bearer wrong-token"),
            Some(&format!("Bearer {TOKEN}x")),
            Some(&format!("Basic {TOKEN}")),
            Some(TOKEN),
            Some("Bearer "),
        ] {
            let (status, body) = get(&base, path, refused).await;
            assert_eq!(status, 401, "{path} with {refused:?}");
            assert!(!body.contains(TOKEN), "{body}");
        }
        let (status, _) = get(&base, path, Some(&bearer)).await;
        assert_eq!(status, 200, "{path} with the token");
        // The scheme's case does not matter (RFC 9110 11.1).
        let (status, _) = get(&base, path, Some(&format!("bearer {TOKEN}"))).await;
        assert_eq!(status, 200, "{path} with a lower-case scheme");
    }
    for path in ["/livez", "/healthz"] {
        let (status, _) = get(&base, path, None).await;
        assert_ne!(status, 401, "{path} must stay open for health checks");
    }
}

#[tokio::test]
async fn without_a_token_everything_is_served_as_before() {
    let base = serve_guarded(None).await;
    for path in ["/status", "/metrics"] {
        assert_eq!(get(&base, path, None).await.0, 200, "{path}");
    }
}

#[test]
fn only_loopback_may_serve_without_a_token() {
    let token = ReadToken::new(&SecretString::from(TOKEN));
    for (addr, allowed_without) in [
        ("127.0.0.1:9464", true),
        ("127.0.0.2:9464", true),
        ("[::1]:9464", true),
        ("0.0.0.0:9464", false),
        ("10.0.0.5:9464", false),
        ("[::]:9464", false),
        ("[fd00::5]:9464", false),
    ] {
        let addr = addr.parse().unwrap();
        assert_eq!(
            exposure_problem(addr, None).is_none(),
            allowed_without,
            "{addr}"
        );
        assert!(exposure_problem(addr, Some(&token)).is_none(), "{addr}");
    }
    let problem = exposure_problem("0.0.0.0:9464".parse().unwrap(), None).unwrap();
    assert!(
        problem.contains("RUNNER_SCALER_LISTEN_TOKEN_FILE"),
        "{problem}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_off_loopback_without_a_token_refuses_to_start() {
    let twins = Twins::start().await;
    let key_file = TempFile::with_contents("app-key.pem", TEST_APP_PRIVATE_KEY_PEM);
    let mut command = tokio::process::Command::new(BIN);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(twins.daemon_env(key_file.path()))
        .args(["run", "--listen", "0.0.0.0:0"])
        .stdin(Stdio::null())
        // A daemon that wrongly starts is killed when the timeout drops it.
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .expect("the daemon started serving instead of refusing to")
        .expect("run runner-scaler");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("RUNNER_SCALER_LISTEN_TOKEN_FILE") && stderr.contains("0.0.0.0:0"),
        "{stderr}"
    );
}

/// `runner-scaler status --addr ADDR`, with the listen token in its environment or not:
/// (stdout, stderr).
fn status(twins: &Twins, key_file: &TempFile, addr: &str, token: Option<&str>) -> (String, String) {
    let env: Vec<(&str, &str)> = token
        .map(|t| ("RUNNER_SCALER_LISTEN_TOKEN", t))
        .into_iter()
        .collect();
    let output = status_at(twins, key_file, addr, &env);
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_on_every_interface_serves_status_only_to_its_token() {
    let twins = Twins::start().await;
    twins.provision_one_queued_job("acme/api", "ci-runner");
    let key_file = TempFile::with_contents("app-key.pem", TEST_APP_PRIVATE_KEY_PEM);
    let token_file = TempFile::with_contents("listen-token", &format!("{TOKEN}\n"));
    let token_path = token_file.path().display().to_string();
    let daemon = Daemon::start_with_env(
        &twins,
        &key_file,
        &["run", "--poll-interval", "1s", "--listen", "0.0.0.0:0"],
        &[("RUNNER_SCALER_LISTEN_TOKEN_FILE", &token_path)],
    );
    let port = wait_until(DEADLINE, || {
        let stderr = daemon.stderr();
        let at = stderr.find("listen=0.0.0.0:")? + "listen=0.0.0.0:".len();
        let port: String = stderr[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        (!port.is_empty()).then_some(port)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the daemon did not say where it listens:\n{}",
            daemon.stderr()
        )
    });
    let base = format!("http://127.0.0.1:{port}");

    assert_eq!(get(&base, "/status", None).await.0, 401);
    assert_eq!(get(&base, "/metrics", None).await.0, 401);
    assert_ne!(get(&base, "/livez", None).await.0, 401);

    let live = wait_until(DEADLINE, || {
        let (out, err) = status(&twins, &key_file, &base, Some(TOKEN));
        (out.contains("acme/api") && !err.contains("no daemon answered")).then_some(out)
    })
    .await;
    assert!(
        live.is_some(),
        "status with the token never showed the daemon's view"
    );
    // Without it, `status` says why and falls back to a dry-run tick.
    let (_, err) = status(&twins, &key_file, &base, None);
    assert!(
        err.contains("401") && err.contains("RUNNER_SCALER_LISTEN_TOKEN_FILE"),
        "{err}"
    );

    let stderr = daemon.stop();
    assert!(
        !stderr.contains(TOKEN),
        "the token reached the daemon's log"
    );
}
