//! `config check --live` against the twins, the daemon's refusal of an admin token it can
//! read, and `FORGEJO_CACERT`.

mod support;

use std::process::{Command, Output};
use std::sync::Arc;

use runner_scaler::clients::vault::{VaultKv, VaultSettings};
use runner_scaler::secrets::CapabilityProbe;
use runner_scaler::sim::twins::github::TEST_APP_PRIVATE_KEY_PEM;
use runner_scaler::sim::twins::nomad::PayloadRule;
use runner_scaler::sim::twins::vault::VaultPolicy;
use secrecy::SecretString;
use support::twins::{PARENT_META_OPTIONAL, TempFile, Twins, VAULT_TOKEN, config, repo};

const BIN: &str = env!("CARGO_BIN_EXE_runner-scaler");

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn shown(output: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        output.status.code(),
        text(&output.stdout),
        text(&output.stderr)
    )
}

/// `runner-scaler config check --live <document>` with the twins' environment, on a blocking
/// thread while the twins keep serving.
async fn check_live(twins: &Twins, document: &str) -> Output {
    let key_file = TempFile::with_contents("app-key.pem", TEST_APP_PRIVATE_KEY_PEM);
    let file = TempFile::with_contents("document.json", document);
    let env = twins.daemon_env(key_file.path());
    let path = file.path().display().to_string();
    tokio::task::spawn_blocking(move || {
        let output = Command::new(BIN)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(env)
            .args(["config", "check", "--live", &path])
            .output()
            .expect("run runner-scaler");
        drop((key_file, file));
        output
    })
    .await
    .expect("the child's thread")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correct_setup_passes_and_says_what_it_checked() {
    let twins = Twins::start().await;
    let document = twins.provision_brief_world();
    twins.forgejo.set_version("15.0.1+gitea-1.22.0");
    let output = check_live(&twins, &document).await;
    assert_eq!(output.status.code(), Some(0), "{}", shown(&output));
    assert_eq!(text(&output.stderr), "", "{}", shown(&output));
    let stdout = text(&output.stdout);
    for checked in [
        "checked: afreidah/munchbox: parent job ci-runner takes the meta app mode sends",
        "checked: afreidah/munchbox: the GitHub App is installed on it",
        "checked: ev-the-dev/moat: parent job go-ci-runner takes the meta vault mode sends",
        "checked: ev-the-dev/moat: vaultPath github/moat-poll is readable",
        "checked: ev-the-dev/moat: registerVaultPath github/moat-runner is not readable",
        "checked: alex/s3-orchestrator: parent job forgejo-build-runner takes the meta forgejo mode sends",
        "checked: alex/s3-orchestrator: the API token at forgejo/scaler is for http://127.0.0.1:",
        "checked: alex/s3-orchestrator: the Forgejo at",
        "note: alex/s3-orchestrator: the API token at forgejo/scaler travels to http://127.0.0.1:",
    ] {
        assert!(stdout.contains(checked), "no {checked:?} in\n{stdout}");
    }
    assert!(stdout.ends_with("live: all well\n"), "{stdout}");
    // What was asked: each parent read once, Vault asked about the admin token's path.
    let asked = twins.vault.requests_for("sys/capabilities-self");
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0].status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_wrong_setup_gives_one_line_naming_the_repo() {
    let twins = Twins::start().await;
    twins.provision_brief_world();
    // munchbox's parent lacks runner_name: Nomad would refuse every dispatch.
    twins.nomad.register_parent(
        "ci-runner",
        &["repo_url", "runner_token"],
        PARENT_META_OPTIONAL,
        PayloadRule::Forbidden,
    );
    // A repo whose owner never installed the App, on a parent that is right.
    twins.github.add_repo(&repo("stranger/no-app"));
    twins.register_token_parent("stranger-runner");
    // A vault repo whose polling token the daemon cannot read, and one whose admin token it
    // can.
    twins.vault.put_secret(
        "secret",
        "github/unreadable",
        serde_json::json!({ "token": "x" }),
    );
    twins.vault.put_secret(
        "secret",
        "github/leaky-admin",
        serde_json::json!({ "token": "admin-only" }),
    );
    twins.vault.add_token(
        VAULT_TOKEN,
        VaultPolicy::read_only([
            "secret/data/github/moat-poll",
            "secret/data/forgejo/scaler",
            "secret/data/github/leaky-admin",
        ]),
    );
    // A Forgejo before the runner job search.
    twins.forgejo.set_version("10.0.2+gitea-1.22.0");
    let document = format!(
        r#"{{
  "afreidah/munchbox": {{ "mode": "app" }},
  "stranger/no-app": {{ "mode": "app", "defaultJob": "stranger-runner" }},
  "ev-the-dev/moat": {{
    "mode": "vault", "vaultPath": "github/unreadable", "registerVaultPath": "github/moat-runner",
    "defaultJob": "go-ci-runner"
  }},
  "ev-the-dev/leaky": {{
    "mode": "vault", "vaultPath": "github/moat-poll", "registerVaultPath": "github/leaky-admin",
    "defaultJob": "go-ci-runner"
  }},
  "alex/s3-orchestrator": {{
    "mode": "forgejo", "forgejoUrl": "{}", "vaultPath": "forgejo/scaler",
    "defaultJob": "forgejo-build-runner", "labels": ["build"]
  }}
}}"#,
        twins.forgejo_server.base_url()
    );
    let output = check_live(&twins, &document).await;
    assert_eq!(output.status.code(), Some(1), "{}", shown(&output));
    let stderr = text(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 5, "one line per problem:\n{}", shown(&output));
    let line_of = |repo: &str| {
        let of: Vec<&&str> = lines
            .iter()
            .filter(|l| l.starts_with(&format!("{repo}: ")) || l.starts_with(&format!("{repo} ")))
            .collect();
        assert_eq!(of.len(), 1, "{repo}: {lines:#?}");
        of[0].to_string()
    };
    let munchbox = line_of("afreidah/munchbox");
    assert!(
        munchbox.contains("parent job ci-runner does not permit meta key runner_name"),
        "{munchbox}"
    );
    let stranger = line_of("stranger/no-app");
    assert!(stranger.contains("App is not installed"), "{stranger}");
    let moat = line_of("ev-the-dev/moat");
    assert!(
        moat.contains("vaultPath github/unreadable is not readable")
            && moat.contains("secret/data/github/unreadable"),
        "{moat}"
    );
    let leaky = line_of("ev-the-dev/leaky");
    assert!(
        leaky.contains("VAULT_TOKEN can read registerVaultPath github/leaky-admin")
            && leaky.contains("remove read on secret/data/github/leaky-admin"),
        "{leaky}"
    );
    let forgejo = line_of("alex/s3-orchestrator");
    assert!(
        forgejo.contains("10.0.2") && forgejo.contains("11.0 or later"),
        "{forgejo}"
    );
    // Nothing secret on either stream.
    for secret in [VAULT_TOKEN, "admin-only"] {
        assert!(!shown(&output).contains(secret), "{secret} shown");
    }
}

fn vault_probe(twins: &Twins) -> Arc<dyn CapabilityProbe> {
    Arc::new(
        VaultKv::new(VaultSettings {
            addr: twins.vault_server.base_url().parse().unwrap(),
            token: SecretString::from(VAULT_TOKEN),
            namespace: None,
            ca_cert: None,
            mount: "secret".into(),
        })
        .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readable_admin_token_holds_its_repo_alone_until_the_policy_is_fixed() {
    let twins = Twins::start().await;
    let document = twins.provision_brief_world();
    let config = config(&document);
    let moat = repo("ev-the-dev/moat");
    let munchbox = repo("afreidah/munchbox");
    // The daemon's policy wrongly grants read on moat's admin token.
    twins.vault.add_token(
        VAULT_TOKEN,
        VaultPolicy::read_only([
            "secret/data/github/moat-poll",
            "secret/data/forgejo/scaler",
            "secret/data/github/moat-runner",
        ]),
    );
    twins.github.add_run(&moat, vec![vec!["self-hosted", "go"]]);
    twins.github.add_run(&munchbox, vec![vec!["self-hosted"]]);
    let mut controller = twins
        .controller()
        .with_admin_token_guard(Some(vault_probe(&twins)));

    let start = chrono::Utc::now();
    // Ticks a poll interval and more apart, so that every repo's queue is read each time.
    let at = |tick: i64| start + chrono::Duration::minutes(2 * tick);
    let view = controller.tick(&config, 1, at(0), false).await;
    let held = view
        .buckets
        .iter()
        .find(|b| b.repo == moat.to_string())
        .unwrap_or_else(|| panic!("no bucket of moat in {view:#?}"));
    assert_eq!(held.to_dispatch, 0, "{view:#?}");
    let why = held.reason.as_deref().unwrap_or_default();
    assert!(
        why.starts_with("held: VAULT_TOKEN can read registerVaultPath github/moat-runner"),
        "{why}"
    );
    assert_eq!(twins.dispatch_requests("go-ci-runner"), 0);
    // The others go on.
    assert_eq!(twins.our_children("ci-runner").len(), 1);

    // Fixed in Vault, with the same document: the hold goes at the next tick.
    twins.vault.add_token(
        VAULT_TOKEN,
        VaultPolicy::read_only(["secret/data/github/moat-poll", "secret/data/forgejo/scaler"]),
    );
    let view = controller.tick(&config, 1, at(1), false).await;
    let moat_bucket = view
        .buckets
        .iter()
        .find(|b| b.repo == moat.to_string())
        .unwrap();
    assert_eq!(moat_bucket.to_dispatch, 1, "{view:#?}");
    assert_eq!(twins.our_children("go-ci-runner").len(), 1);
    // Once all is well, Vault is asked again only for a new document.
    let asked = twins.vault.requests_for("sys/capabilities-self").len();
    controller.tick(&config, 1, chrono::Utc::now(), false).await;
    assert_eq!(
        twins.vault.requests_for("sys/capabilities-self").len(),
        asked
    );
    controller.tick(&config, 2, at(3), false).await;
    assert_eq!(
        twins.vault.requests_for("sys/capabilities-self").len(),
        asked + 1
    );
}

#[test]
fn a_forgejo_ca_that_does_not_parse_is_a_bad_setting_naming_it() {
    for contents in [
        "not a certificate at all\n",
        "-----BEGIN CERTIFICATE-----\n!!not base64!!\n-----END CERTIFICATE-----\n",
    ] {
        let ca = TempFile::with_contents("forgejo-ca.pem", contents);
        let output = Command::new(BIN)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("FORGEJO_CACERT", ca.path())
            .args(["once", "--dry-run"])
            .output()
            .expect("run runner-scaler");
        assert_eq!(output.status.code(), Some(64), "{}", shown(&output));
        let stderr = text(&output.stderr);
        assert!(
            stderr.contains("--forgejo-cacert (FORGEJO_CACERT)")
                && stderr.contains(&ca.path().display().to_string()),
            "{stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgejo_repo_aimed_elsewhere_or_at_an_unbound_token_fails_the_check() {
    let twins = Twins::start().await;
    twins.provision_brief_world();
    let elsewhere = support::bystander::Bystander::start().await;
    // Before the upgrade: a second repo's secret has its token and no url.
    twins.vault.put_secret(
        "secret",
        "forgejo/unbound",
        serde_json::json!({ "token": support::twins::FORGEJO_TOKEN }),
    );
    twins.vault.add_token(
        VAULT_TOKEN,
        VaultPolicy::read_only([
            "secret/data/github/moat-poll",
            "secret/data/forgejo/scaler",
            "secret/data/forgejo/unbound",
        ]),
    );
    let document = format!(
        r#"{{
  "alex/s3-orchestrator": {{
    "mode": "forgejo", "forgejoUrl": "{}", "vaultPath": "forgejo/scaler",
    "defaultJob": "forgejo-build-runner", "labels": ["build"]
  }},
  "alex/unbound": {{
    "mode": "forgejo", "forgejoUrl": "{}", "vaultPath": "forgejo/unbound",
    "defaultJob": "forgejo-build-runner", "labels": ["build"]
  }}
}}"#,
        elsewhere.base_url(),
        twins.forgejo_server.base_url()
    );
    let output = check_live(&twins, &document).await;
    assert_eq!(output.status.code(), Some(1), "{}", shown(&output));
    let stderr = text(&output.stderr);
    let aimed = stderr
        .lines()
        .find(|l| l.starts_with("alex/s3-orchestrator: "))
        .unwrap_or_else(|| panic!("no line for the aimed repo:\n{}", shown(&output)));
    assert!(
        aimed.contains(&elsewhere.base_url()) && aimed.contains("forgejo/scaler"),
        "{aimed}"
    );
    let unbound = stderr
        .lines()
        .find(|l| l.starts_with("alex/unbound: "))
        .unwrap_or_else(|| panic!("no line for the unbound repo:\n{}", shown(&output)));
    assert!(
        unbound.contains("forgejo/unbound") && unbound.contains("url="),
        "{unbound}"
    );
    // Checked on the other side: the check sent that host nothing.
    assert_eq!(elsewhere.connections(), 0);
    assert!(!shown(&output).contains(support::twins::FORGEJO_TOKEN));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgejo_before_15_fails_the_check_unless_the_repo_opts_in_and_the_cost_is_said() {
    let twins = Twins::start().await;
    let document = twins.provision_brief_world();
    twins.forgejo.set_version("14.0.2+gitea-1.22.0");
    let output = check_live(&twins, &document).await;
    assert_eq!(output.status.code(), Some(1), "{}", shown(&output));
    let stderr = text(&output.stderr);
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("alex/s3-orchestrator: ")
                && l.contains("14.0.2")
                && l.contains("allowSharedRegistrationToken")),
        "{}",
        shown(&output)
    );

    let opted_in = document.replace(
        r#""mode": "forgejo","#,
        r#""mode": "forgejo", "allowSharedRegistrationToken": true,"#,
    );
    let output = check_live(&twins, &opted_in).await;
    assert_eq!(output.status.code(), Some(0), "{}", shown(&output));
    let stdout = text(&output.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("note: alex/s3-orchestrator: ")
                && l.contains("shared registration token")
                && l.contains("a job step can copy")),
        "{stdout}"
    );
}
