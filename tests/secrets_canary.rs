//! No secret reaches stdout, stderr, an error message or `--json` output, even with every
//! crate logging at TRACE.
//!
//! The real binary runs `once --json` (acting), `once --dry-run --json` and `status --json`
//! as a subprocess against twins of every service, seeded with a canary value for each kind
//! of secret: the Nomad, Consul and Vault tokens, the GitHub polling token, the Forgejo API
//! token, a `runner_token` that Nomad's own listing hands back in meta, and the tokens the
//! twins issue during the tick (installation and registration tokens). JWTs and the lines of
//! the App's private key are checked too. Failure paths (a Vault path that does not exist, a
//! revoked polling token) run in the same ticks so error messages are covered.

mod support;

use std::collections::BTreeMap;
use std::process::Output;

use runner_scaler::model::RepoName;
use runner_scaler::sim::twins::TwinServer;
use runner_scaler::sim::twins::consul::ConsulTwin;
use runner_scaler::sim::twins::forgejo::ForgejoTwin;
use runner_scaler::sim::twins::github::{GitHubTwin, TEST_APP_ID, TEST_APP_PRIVATE_KEY_PEM};
use runner_scaler::sim::twins::nomad::{DispatchInput, NomadTwin, PayloadRule};
use runner_scaler::sim::twins::vault::{VaultPolicy, VaultTwin};
use serde_json::json;

const NOMAD_TOKEN: &str = "canary-nomad-token-4f1d";
const CONSUL_TOKEN: &str = "canary-consul-token-9a2e";
const VAULT_TOKEN: &str = "canary-vault-token-77c3";
const POLL_TOKEN: &str = "canary-github-poll-token-0b5a";
const FORGEJO_TOKEN: &str = "canary-forgejo-api-token-e81f";
const META_RUNNER_TOKEN: &str = "canary-nomad-meta-runner-token-3c9d";

fn repo(name: &str) -> RepoName {
    RepoName::parse(name).unwrap()
}

struct World {
    github: GitHubTwin,
    forgejo: ForgejoTwin,
    _servers: Vec<TwinServer>,
    env: BTreeMap<&'static str, String>,
    _key_file: std::path::PathBuf,
}

async fn world() -> World {
    let github = GitHubTwin::new();
    let forgejo = ForgejoTwin::new();
    let nomad = NomadTwin::with_seed(3);
    let consul = ConsulTwin::with_token(CONSUL_TOKEN);
    let vault = VaultTwin::new();
    let servers = vec![
        github.start().await.unwrap(),
        forgejo.serve().await.unwrap(),
        nomad.serve().await.unwrap(),
        TwinServer::start(consul.router()).await.unwrap(),
        vault.serve().await.unwrap(),
    ];
    github.install_app("acme");
    for name in ["acme/app", "acme/polled", "acme/broken"] {
        github.add_repo(&repo(name));
    }
    github.add_pat(
        POLL_TOKEN,
        "poller",
        Some(&[repo("acme/polled")]),
        &[("actions", "read")],
    );
    github.add_run(&repo("acme/app"), vec![vec!["self-hosted"]]);
    github.add_run(&repo("acme/polled"), vec![vec!["self-hosted", "go"]]);
    forgejo.add_token(FORGEJO_TOKEN);
    forgejo.add_repo("forge/repo");
    forgejo.add_job("forge/repo", "build", &["build"]);
    vault.add_token(
        VAULT_TOKEN,
        VaultPolicy::read_only([
            "secret/data/github/poll",
            "secret/data/forgejo/token",
            "secret/data/github/missing",
        ]),
    );
    vault.put_secret("secret", "github/poll", json!({ "token": POLL_TOKEN }));
    vault.put_secret(
        "secret",
        "forgejo/token",
        json!({ "token": FORGEJO_TOKEN, "url": servers[1].base_url() }),
    );
    nomad.set_acl_token(Some(NOMAD_TOKEN));
    let optional = ["labels", "managed_by"];
    for parent in ["ci-runner", "forgejo-build-runner"] {
        nomad.register_parent(
            parent,
            &["repo_url", "runner_token", "runner_name"],
            &optional,
            PayloadRule::Forbidden,
        );
    }
    nomad.register_parent(
        "go-ci-runner",
        &["repo_url", "runner_name"],
        &optional,
        PayloadRule::Forbidden,
    );
    // A child of ours whose meta still carries the token it was dispatched with: Nomad hands
    // it back in its own listing.
    let meta: BTreeMap<String, String> = [
        ("repo_url", "https://github.com/acme/app"),
        ("labels", "self-hosted"),
        ("runner_name", "ci-runner-0123456789ab"),
        ("managed_by", "runner-scaler"),
        ("runner_token", META_RUNNER_TOKEN),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    nomad
        .dispatch(
            "default",
            "ci-runner",
            DispatchInput {
                meta,
                ..Default::default()
            },
        )
        .unwrap();
    let document = json!({
        "acme/app": { "mode": "app", "maxConcurrent": 3 },
        "acme/polled": {
            "mode": "vault", "vaultPath": "github/poll", "registerVaultPath": "github/admin",
            "profiles": [ { "job": "go-ci-runner", "label": "go", "maxConcurrent": 2 } ]
        },
        "acme/broken": {
            "mode": "vault", "vaultPath": "github/missing", "registerVaultPath": "github/admin2",
            "profiles": [ { "job": "go-ci-runner", "label": "go", "maxConcurrent": 2 } ]
        },
        "forge/repo": {
            "mode": "forgejo", "forgejoUrl": servers[1].base_url(), "vaultPath": "forgejo/token",
            "profiles": [ { "job": "forgejo-build-runner", "label": "build", "maxConcurrent": 1 } ]
        }
    });
    consul.set("runners/config", document.to_string());

    let key_file = std::env::temp_dir().join(format!(
        "runner-scaler-canary-key-{}.pem",
        std::process::id()
    ));
    std::fs::write(&key_file, TEST_APP_PRIVATE_KEY_PEM).unwrap();
    let env = BTreeMap::from([
        ("NOMAD_ADDR", servers[2].base_url()),
        ("NOMAD_TOKEN", NOMAD_TOKEN.to_string()),
        ("RUNNER_SCALER_RUNNER_NAMESPACE", "default".to_string()),
        ("CONSUL_HTTP_ADDR", servers[3].base_url()),
        ("CONSUL_HTTP_TOKEN", CONSUL_TOKEN.to_string()),
        ("VAULT_ADDR", servers[4].base_url()),
        ("VAULT_TOKEN", VAULT_TOKEN.to_string()),
        ("GITHUB_API_URL", servers[0].base_url()),
        ("GITHUB_APP_ID", TEST_APP_ID.to_string()),
        (
            "GITHUB_APP_PRIVATE_KEY_FILE",
            key_file.display().to_string(),
        ),
        ("RUST_LOG", "trace".to_string()),
    ]);
    World {
        github,
        forgejo,
        _servers: servers,
        env,
        _key_file: key_file,
    }
}

async fn run(world: &World, args: &[&str]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_runner-scaler"));
    command.env_clear().args(args);
    if let Some(path) = std::env::var_os("PATH") {
        command.env("PATH", path);
    }
    for (k, v) in &world.env {
        command.env(k, v);
    }
    command.output().await.expect("run runner-scaler")
}

/// Every secret value the run could have seen.
fn canaries(world: &World) -> Vec<String> {
    let mut all: Vec<String> = [
        NOMAD_TOKEN,
        CONSUL_TOKEN,
        VAULT_TOKEN,
        POLL_TOKEN,
        FORGEJO_TOKEN,
        META_RUNNER_TOKEN,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    all.extend(world.github.issued_secrets());
    all.extend(world.forgejo.registration_token("forge/repo"));
    // Each base64 line of the App's private key.
    all.extend(
        TEST_APP_PRIVATE_KEY_PEM
            .lines()
            .filter(|l| !l.starts_with("-----") && l.len() > 16)
            .map(str::to_string),
    );
    all
}

fn assert_clean(world: &World, what: &str, output: &Output) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    for canary in canaries(world) {
        assert!(
            !stdout.contains(&canary),
            "{what}: a secret reached stdout: {canary:.12}…"
        );
        assert!(
            !stderr.contains(&canary),
            "{what}: a secret reached stderr: {canary:.12}…"
        );
    }
    // A JWT's header is base64 of `{"` and always starts so.
    assert!(!stdout.contains("eyJ"), "{what}: a JWT reached stdout");
    assert!(!stderr.contains("eyJ"), "{what}: a JWT reached stderr");
    assert!(
        !stderr.contains("Bearer ") && !stderr.contains("X-Nomad-Token: "),
        "{what}: an authorization header reached the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_logs_errors_or_json_at_trace() {
    let world = world().await;

    let dry = run(&world, &["once", "--dry-run", "--json"]).await;
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    let acting = run(&world, &["once", "--json"]).await;
    assert!(
        acting.status.success(),
        "{}",
        String::from_utf8_lossy(&acting.stderr)
    );
    // The polling token is revoked: the next tick reads it, gets 401, re-reads it from
    // Vault and fails again, and says so.
    world.github.revoke_token(POLL_TOKEN);
    // No daemon answers at the status address (one of this test's own), so `status` runs a
    // fresh dry-run tick against the world.
    let nobody = support::bystander::Bystander::hanging_up().await;
    let status = run(&world, &["status", "--json", "--addr", &nobody.base_url()]).await;
    assert!(status.status.success());

    // The runs did what the canaries are meant to cover.
    let acting_json: serde_json::Value = serde_json::from_slice(&acting.stdout).unwrap();
    let dispatched = acting_json["dispatches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["outcome"] == "dispatched")
        .count();
    assert!(dispatched >= 2, "expected dispatches in {acting_json:#}");
    assert!(
        world.github.issued_secrets().len() >= 2,
        "installation and registration tokens were issued"
    );
    let stderr = String::from_utf8_lossy(&acting.stderr);
    assert!(stderr.contains("TRACE"), "the run did not log at TRACE");
    assert!(
        stderr.contains("github/missing"),
        "the failing Vault read was not reported"
    );
    let status_json = String::from_utf8_lossy(&status.stdout);
    assert!(
        status_json.contains("acme/polled"),
        "the revoked token's repo is not in status: {status_json}"
    );

    for (what, output) in [("dry run", &dry), ("once", &acting), ("status", &status)] {
        assert_clean(&world, what, output);
    }
}
