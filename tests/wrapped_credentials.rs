//! Nothing usable in Nomad: with Vault configured, what the daemon puts in a child's
//! `runner_token` meta is a single-use Vault wrapping token of the runner's JIT config, not
//! the config. Everything Nomad answers about the child is read back over HTTP and searched
//! for the credential. `runner-scaler run` runs as its own process against the twins, on
//! real time; every wait polls the twins against a deadline.

mod support;

use std::time::Duration;

use runner_scaler::sim::twins::github::TEST_APP_PRIVATE_KEY_PEM;
use runner_scaler::sim::twins::vault::WRAPPING_TOKEN_INVALID;
use serde_json::Value;
use support::daemon_process::{Daemon, wait_until};
use support::twins::{NOMAD_TOKEN, TempFile, Twins};

const PARENT: &str = "ci-runner";
const REPO: &str = "acme/api";
const DEADLINE: Duration = Duration::from_secs(15);

/// `GET` on the Nomad twin, as anyone with `read-job` in the namespace would.
fn http() -> reqwest::Client {
    runner_scaler::clients::http::install_crypto_provider();
    reqwest::Client::new()
}

async fn nomad_get(twins: &Twins, path: &str) -> String {
    http()
        .get(format!("{}{path}", twins.nomad_server.base_url()))
        .header("X-Nomad-Token", NOMAD_TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nomad_holds_only_a_single_use_wrapping_token() {
    let twins = Twins::start().await;
    twins.provision_one_queued_job(REPO, PARENT);
    let key_file = TempFile::with_contents("app-key.pem", TEST_APP_PRIVATE_KEY_PEM);
    let daemon = Daemon::start(&twins, &key_file, &["run", "--poll-interval", "1s"]);
    let child = wait_until(DEADLINE, || twins.our_children(PARENT).into_iter().next()).await;
    let stderr = daemon.stop();
    let child = child.unwrap_or_else(|| panic!("no child dispatched; stderr:\n{stderr}"));

    // The JIT config GitHub issued for this runner.
    let jit_configs: Vec<String> = twins
        .github
        .issued_secrets()
        .into_iter()
        .filter(|s| !s.starts_with("ghs_"))
        .collect();
    assert_eq!(jit_configs.len(), 1, "one JIT config for one runner");
    let jit_config = &jit_configs[0];

    // Everything Nomad shows about the child: the listing with meta, and the job itself.
    let prefix = format!("{PARENT}/dispatch-");
    let listing = nomad_get(&twins, &format!("/v1/jobs?prefix={prefix}&meta=true")).await;
    let job = nomad_get(&twins, &format!("/v1/job/{}", child.id.replace('/', "%2F"))).await;
    for (what, text) in [("the listing", &listing), ("the job", &job)] {
        assert!(
            text.contains(&child.id),
            "{what} does not show the child: {text}"
        );
        assert!(
            !text.contains(jit_config.as_str()),
            "{what} shows the runner's JIT config"
        );
    }
    let job: Value = serde_json::from_str(&job).unwrap();
    let meta_token = job["Meta"]["runner_token"]
        .as_str()
        .expect("runner_token meta");
    assert!(
        twins
            .vault
            .wrapping_tokens()
            .contains(&meta_token.to_string()),
        "runner_token is not a wrapping token the daemon got from Vault"
    );
    assert!(
        !stderr.contains(meta_token),
        "the wrapping token reached the log"
    );

    // The runner unwraps it once and gets its JIT config; nobody can after that.
    let (status, first) = twins.unwrap_as_runner(meta_token).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["data"]["jitconfig"], jit_config.as_str());
    assert_eq!(first["data"].as_object().unwrap().len(), 1);
    let (status, second) = twins.unwrap_as_runner(meta_token).await;
    assert_eq!(status, 400);
    assert_eq!(second["errors"][0], WRAPPING_TOKEN_INVALID);
}
