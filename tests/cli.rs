//! The binary as a user runs it: exit codes, what goes to stdout and stderr, and what
//! `--help` must never show. Every child runs with a cleared environment plus PATH.

mod support;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use runner_scaler::sim::twins::github::TEST_APP_PRIVATE_KEY_PEM;
use serde_json::Value;
use support::twins::{
    CONSUL_TOKEN, FORGEJO_TOKEN, NOMAD_TOKEN, POLL_TOKEN, TempFile, Twins, VAULT_TOKEN, repo,
};

const BIN: &str = env!("CARGO_BIN_EXE_runner-scaler");

/// The document of BRIEF.md ("The configuration users edit"), verbatim.
const BRIEF_DOCUMENT: &str = r#"{
  "afreidah/munchbox": { "maxConcurrent": 3, "mode": "app" },
  "alex/s3-orchestrator": {
    "mode": "forgejo", "forgejoUrl": "http://forgejo.service.consul:30028",
    "maxConcurrent": 1, "vaultPath": "forgejo/scaler",
    "profiles": [ { "job": "forgejo-build-runner", "label": "build", "maxConcurrent": 1 } ]
  },
  "ev-the-dev/moat": {
    "mode": "vault", "vaultPath": "github/moat-poll", "registerVaultPath": "github/moat-runner",
    "profiles": [
      { "job": "github-runner-moat-vm", "label": "vm", "maxConcurrent": 1 },
      { "job": "go-ci-runner", "label": "go", "maxConcurrent": 3 }
    ]
  }
}"#;

fn cli(env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(BIN);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    for (key, value) in env {
        command.env(key, value);
    }
    command
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    cli(env).args(args).output().expect("run runner-scaler")
}

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

#[test]
fn config_check_accepts_the_brief_document_from_a_file() {
    let file = TempFile::with_contents("brief.json", BRIEF_DOCUMENT);
    let output = run(
        &["config", "check", &file.path().display().to_string()],
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", shown(&output));
    let stdout = text(&output.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "ok: 3 repos");
    // Before Forgejo 15 the Forgejo repo dispatches nothing unless it opts in: said plainly.
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[1].starts_with("note: alex/s3-orchestrator (forgejo): ")
            && lines[1].contains("before 15 the repo dispatches nothing")
            && lines[1].contains("allowSharedRegistrationToken"),
        "{stdout}"
    );
    assert!(output.stderr.is_empty(), "{}", shown(&output));
}

#[test]
fn config_check_accepts_the_brief_document_from_stdin() {
    let mut child = cli(&[])
        .args(["config", "check", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start runner-scaler");
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(BRIEF_DOCUMENT.as_bytes())
        .expect("write the document");
    let output = child.wait_with_output().expect("wait for runner-scaler");
    assert_eq!(output.status.code(), Some(0), "{}", shown(&output));
    assert!(text(&output.stdout).starts_with("ok: 3 repos\n"));
}

#[test]
fn config_check_reports_every_problem_of_a_broken_document_one_line_each() {
    let broken = r#"{
      "acme/api": { "mode": "app", "colour": "blue" },
      "acme/web": { "mode": "app", "maxConcurrent": -1 },
      "acme/cli": { "mode": "app", "profiles": [ { "job": "go-runner", "label": "$(id)" } ] },
      "acme/moat": { "mode": "vault", "vaultPath": "github/moat-poll" },
      "Acme/Docs": { "mode": "app" },
      "acme/DOCS": { "mode": "app" }
    }"#;
    let file = TempFile::with_contents("broken.json", broken);
    let output = run(
        &["config", "check", &file.path().display().to_string()],
        &[],
    );
    assert_eq!(output.status.code(), Some(1), "{}", shown(&output));
    assert!(output.stdout.is_empty(), "{}", shown(&output));
    let stderr = text(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    // Each line names the repo as written, then the field.
    let expected = [
        "acme/api: colour: unknown field",
        "acme/web: maxConcurrent: -1 is negative",
        "acme/cli: profiles[0].label: \"$(id)\" is not a valid label",
        "acme/moat: registerVaultPath: required",
        "acme/DOCS: duplicate repo key: same repo as \"Acme/Docs\"",
    ];
    for want in expected {
        assert_eq!(
            lines.iter().filter(|l| l.starts_with(want)).count(),
            1,
            "{want:?} not reported exactly once in\n{stderr}"
        );
    }
    assert_eq!(lines.len(), expected.len(), "{stderr}");
}

#[test]
fn config_check_of_a_missing_file_exits_1_naming_the_path() {
    let path = std::env::temp_dir().join(format!(
        "runner-scaler-test-{}-no-such-document.json",
        std::process::id()
    ));
    let path = path.display().to_string();
    let output = run(&["config", "check", &path], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", shown(&output));
    assert!(text(&output.stderr).contains(&path), "{}", shown(&output));
}

/// Arguments, environment, and the setting the error must name.
type BadSettings<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

#[test]
fn bad_process_settings_exit_64_naming_the_setting_never_its_secret() {
    let token_file = TempFile::with_contents("nomad-token", "canary-file-token-8812");
    let token_file = token_file.path().display().to_string();
    let cases: &[BadSettings] = &[
        (&["once", "--nomad-addr", "not a url"], &[], "--nomad-addr"),
        (&["once"], &[("NOMAD_ADDR", "http://[::1")], "--nomad-addr"),
        (
            &["run", "--poll-interval", "nonsense"],
            &[],
            "--poll-interval",
        ),
        (
            &["once"],
            &[
                ("NOMAD_TOKEN", "canary-nomad-token-5521"),
                ("NOMAD_TOKEN_FILE", &token_file),
            ],
            "NOMAD_TOKEN_FILE",
        ),
        (&["once"], &[("GITHUB_APP_ID", "12345")], "GITHUB_APP_ID"),
        (&["frobnicate"], &[], "frobnicate"),
    ];
    for (args, env, named) in cases {
        let output = run(args, env);
        let stderr = text(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(64),
            "{args:?} {env:?}\n{}",
            shown(&output)
        );
        assert!(
            stderr.contains(named),
            "{args:?}: {named} not named in {stderr}"
        );
        assert!(
            !stderr.contains("canary-nomad-token-5521") && !stderr.contains("canary-file-token"),
            "a secret was printed: {stderr}"
        );
    }
}

#[test]
fn help_exits_0() {
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["once", "--help"],
        &["config", "check", "--help"],
    ] {
        let output = run(args, &[]);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}\n{}",
            shown(&output)
        );
        assert!(
            text(&output.stdout).contains("Usage:"),
            "{}",
            shown(&output)
        );
    }
}

/// Every `--flag` a help text names.
fn flags(help: &str) -> Vec<String> {
    help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .map(str::to_string)
        .collect()
}

#[test]
fn help_of_run_and_once_never_shows_environment_values_or_a_secret_flag() {
    let key_file = "/canary-dir-3310/canary-app-key.pem";
    let env = [
        ("NOMAD_ADDR", "http://canary-host-7731:4646"),
        ("NOMAD_TOKEN", "canary-nomad-token-5521"),
        ("NOMAD_NAMESPACE", "canary-namespace-1187"),
        ("CONSUL_HTTP_ADDR", "http://canary-consul-4402:8500"),
        ("CONSUL_HTTP_TOKEN", "canary-consul-token-6630"),
        ("VAULT_ADDR", "http://canary-vault-2219:8200"),
        ("VAULT_TOKEN", "canary-vault-token-9904"),
        ("GITHUB_API_URL", "https://canary-ghes-5150.example/api/v3"),
        ("GITHUB_APP_ID", "canary-app-id-7070"),
        ("GITHUB_APP_PRIVATE_KEY_FILE", key_file),
        ("GITHUB_APP_VAULT_PATH", "canary/app-path-3131"),
        ("RUNNER_SCALER_LISTEN_TOKEN", "canary-listen-token-4848"),
    ];
    for subcommand in ["run", "once", "status"] {
        let output = run(&[subcommand, "--help"], &env);
        assert_eq!(output.status.code(), Some(0), "{}", shown(&output));
        let help = format!("{}{}", text(&output.stdout), text(&output.stderr));
        for (variable, value) in &env {
            assert!(
                !help.contains(value),
                "`{subcommand} --help` shows the value of {variable}"
            );
        }
        assert!(!help.contains("canary"), "{help}");
        let flags = flags(&help);
        assert!(flags.iter().any(|f| f == "--nomad-addr"), "{flags:?}");
        for flag in &flags {
            assert!(!flag.contains("token"), "{flag} would take a token");
            // `--github-app-private-key-file` takes a path; a flag taking the key would not.
            assert!(
                !flag.ends_with("private-key"),
                "{flag} would take a private key"
            );
        }
    }
}

/// Runs the binary on a blocking thread while the twins keep serving on the runtime.
async fn run_against(twins: &Twins, key_file: &TempFile, args: &[&str]) -> Output {
    let env: Vec<(&'static str, String)> = twins.daemon_env(key_file.path());
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        cli(&env).args(&args).output().expect("run runner-scaler")
    })
    .await
    .expect("the child's thread")
}

fn secrets_of(twins: &Twins) -> Vec<String> {
    let mut secrets: Vec<String> = [
        NOMAD_TOKEN,
        VAULT_TOKEN,
        CONSUL_TOKEN,
        POLL_TOKEN,
        FORGEJO_TOKEN,
        "admin-only",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    secrets.extend(twins.github.issued_secrets());
    // A line of the key's body, not its BEGIN/END markers.
    secrets.push(
        TEST_APP_PRIVATE_KEY_PEM
            .lines()
            .nth(1)
            .expect("a PEM body")
            .to_string(),
    );
    secrets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_dry_run_plans_without_acting_and_once_then_dispatches_one_child() {
    let twins = Twins::start().await;
    twins.provision_brief_world();
    let munchbox = repo("afreidah/munchbox");
    twins.github.add_run(&munchbox, vec![vec!["self-hosted"]]);
    let key_file = TempFile::with_contents("app-key.pem", TEST_APP_PRIVATE_KEY_PEM);

    let output = run_against(&twins, &key_file, &["once", "--dry-run", "--json"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", shown(&output));
    let plan: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", shown(&output)));
    assert_eq!(plan["dry_run"], true);
    assert_eq!(plan["gaps"], serde_json::json!([]), "every twin was read");
    assert_eq!(plan["queued"], 1);
    let buckets = plan["buckets"].as_array().expect("buckets");
    let bucket = buckets
        .iter()
        .find(|b| b["repo"] == "afreidah/munchbox")
        .unwrap_or_else(|| panic!("no munchbox bucket in {plan:#}"));
    assert_eq!(bucket["labels"], "self-hosted");
    assert_eq!(bucket["parent"], "ci-runner");
    assert_eq!(bucket["to_dispatch"], 1);
    let dispatches = plan["dispatches"].as_array().expect("dispatches");
    assert_eq!(dispatches.len(), 1, "{plan:#}");
    assert_eq!(dispatches[0]["repo"], "afreidah/munchbox");
    assert_eq!(dispatches[0]["parent"], "ci-runner");
    assert_eq!(dispatches[0]["outcome"], "planned");
    let dispatch_requests = twins
        .nomad
        .requests()
        .iter()
        .filter(|r| r.method == "POST")
        .count();
    assert_eq!(dispatch_requests, 0, "a dry run wrote to Nomad");
    assert!(twins.nomad.children("ci-runner").is_empty());

    let output = run_against(&twins, &key_file, &["once", "--json"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", shown(&output));
    let tick: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", shown(&output)));
    assert_eq!(tick["dry_run"], false);
    assert_eq!(tick["started"], 1, "{tick:#}");
    let children = twins.our_children("ci-runner");
    assert_eq!(children.len(), 1);
    assert_eq!(twins.dispatch_requests("ci-runner"), 1);
    assert_eq!(
        tick["dispatches"][0]["child"].as_str(),
        Some(children[0].id.as_str())
    );
    assert!(children[0].meta["repo_url"].ends_with("/afreidah/munchbox"));
    for parent in [
        "forgejo-build-runner",
        "github-runner-moat-vm",
        "go-ci-runner",
    ] {
        assert!(twins.nomad.children(parent).is_empty(), "{parent}");
    }

    let printed = format!("{}{}", text(&output.stdout), text(&output.stderr));
    let mut secrets = secrets_of(&twins);
    secrets.push(children[0].meta["runner_token"].clone());
    for secret in secrets {
        assert!(!printed.contains(&secret), "a secret was printed");
    }
}

#[test]
fn config_check_refuses_a_forgejo_repo_whose_job_search_has_no_label_to_ask_for() {
    let document = r#"{
      "acme/web": { "mode": "forgejo", "forgejoUrl": "https://forgejo.example", "vaultPath": "forgejo/web" },
      "acme/docs": { "mode": "forgejo", "forgejoUrl": "https://forgejo.example", "vaultPath": "forgejo/docs", "labels": ["Docker"] }
    }"#;
    let file = TempFile::with_contents("forgejo-without-labels.json", document);
    let output = run(
        &["config", "check", &file.path().display().to_string()],
        &[],
    );
    assert_eq!(output.status.code(), Some(1), "{}", shown(&output));
    assert_eq!(
        text(&output.stderr).lines().collect::<Vec<_>>(),
        vec![
            "acme/web: labels: required in \"forgejo\" mode when there are no profiles: the job search asks Forgejo for these labels"
        ],
        "{}",
        shown(&output)
    );
}

/// Runs the binary, killing it if it is still running after `deadline` (a daemon that
/// accepted a setting it should have refused runs forever).
fn run_at_most(args: &[&str], deadline: std::time::Duration) -> Output {
    run_at_most_with(args, &[], deadline)
}

/// [`run_at_most`] with `env`.
fn run_at_most_with(args: &[&str], env: &[(&str, &str)], deadline: std::time::Duration) -> Output {
    let child = cli(env)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start runner-scaler");
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match finished.recv_timeout(deadline) {
        Ok(output) => output.expect("wait for runner-scaler"),
        Err(_) => {
            // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("runner-scaler {args:?} was still running after {deadline:?}");
        }
    }
}

#[test]
fn impossible_settings_exit_64_naming_the_setting() {
    for (args, named) in [
        (&["run", "--poll-interval", "0s"][..], "--poll-interval"),
        (&["run", "--request-timeout", "0s"], "--request-timeout"),
        (&["run", "--max-in-flight", "0"], "--max-in-flight"),
        (&["run", "--listen", "localhost:9464"], "--listen"),
        (&["run", "--webhook-listen", "9465"], "--webhook-listen"),
        (&["run", "--stuck-after", "0s"], "--stuck-after"),
        (
            &["once", "--dry-run", "--config-key", ""],
            "--runner-scaler-config-key",
        ),
    ] {
        let output = run_at_most(args, std::time::Duration::from_secs(60));
        assert_eq!(
            output.status.code(),
            Some(64),
            "{args:?}\n{}",
            shown(&output)
        );
        let stderr = text(&output.stderr);
        assert!(
            stderr.starts_with(&format!("runner-scaler: {named}")),
            "{args:?}\n{}",
            shown(&output)
        );
    }
    let output = run_at_most(
        &["run", "--max-in-flight", "0"],
        std::time::Duration::from_secs(60),
    );
    assert!(
        text(&output.stderr).contains("maxConcurrent to 0 in the document"),
        "{}",
        shown(&output)
    );
}

/// `--webhook-listen` without a secret to check deliveries with, or with one set twice, is
/// refused before anything starts, naming the variables and never a value.
#[test]
fn webhooks_without_a_secret_or_with_two_exit_64_naming_the_variables() {
    let secret_file = TempFile::with_contents("webhook-secret", "canary-webhook-file-3d7a");
    let secret_file = secret_file.path().display().to_string();
    let listen = ["run", "--webhook-listen", "127.0.0.1:0"];
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[], "no webhook secret is: set GITHUB_WEBHOOK_SECRET"),
        (
            &[
                ("GITHUB_WEBHOOK_SECRET", "canary-webhook-env-91fe"),
                ("GITHUB_WEBHOOK_SECRET_FILE", &secret_file),
            ],
            "set GITHUB_WEBHOOK_SECRET or GITHUB_WEBHOOK_SECRET_FILE, not both",
        ),
        (
            &[("FORGEJO_WEBHOOK_SECRET_FILE", "/nonexistent/webhook-secret")],
            "FORGEJO_WEBHOOK_SECRET_FILE",
        ),
    ];
    for (env, named) in cases {
        let output = run_at_most_with(&listen, env, std::time::Duration::from_secs(60));
        assert_eq!(
            output.status.code(),
            Some(64),
            "{env:?}\n{}",
            shown(&output)
        );
        let stderr = text(&output.stderr);
        assert!(stderr.contains(named), "{env:?}: {named} not in {stderr}");
        assert!(
            !stderr.contains("canary-webhook"),
            "a secret was printed: {stderr}"
        );
    }
}

#[test]
fn a_listen_address_in_use_exits_64_naming_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let output = run_at_most(
        &["run", "--listen", &addr],
        std::time::Duration::from_secs(60),
    );
    assert_eq!(output.status.code(), Some(64), "{}", shown(&output));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains(&format!("runner-scaler: listen on {addr}")),
        "{}",
        shown(&output)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_refuses_to_act_while_another_daemon_holds_the_leader_lock_naming_it() {
    use runner_scaler::leader::{Holder, LockStore, SessionRequest};
    use runner_scaler::sim::twins::consul::TwinLock;

    let twins = Twins::start().await;
    twins.provision_brief_world();
    twins
        .github
        .add_run(&repo("afreidah/munchbox"), vec![vec!["self-hosted"]]);
    let key_file = TempFile::with_contents("app-key.pem", TEST_APP_PRIVATE_KEY_PEM);
    // Another daemon holds the lock.
    let other = TwinLock {
        twin: twins.consul.clone(),
        token: "other-daemon".into(),
    };
    let session = other
        .create_session(&SessionRequest {
            name: "other".into(),
            ttl: std::time::Duration::from_secs(60),
            lock_delay: std::time::Duration::from_secs(5),
        })
        .await
        .expect("a session");
    let holder = Holder {
        holder: "node-7 (alloc 0f3c)".into(),
        pid: 4242,
    };
    assert!(
        other
            .acquire("runners/leader", &session, &holder.to_value())
            .await
            .unwrap()
    );

    let output = run_against(&twins, &key_file, &["once"]).await;
    assert_eq!(output.status.code(), Some(1), "{}", shown(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("held by node-7 (alloc 0f3c) pid 4242"),
        "{stderr}"
    );
    assert_eq!(twins.dispatch_requests("ci-runner"), 0, "once acted");
    assert_eq!(twins.consul.lock_holder("runners/leader"), Some(session.0));
    assert_eq!(
        twins.consul.sessions().len(),
        1,
        "once left its session behind"
    );

    // Looking needs no lock.
    let output = run_against(&twins, &key_file, &["once", "--dry-run"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", shown(&output));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_ttl_consul_refuses_exits_64_naming_the_setting() {
    let twins = Twins::start().await;
    twins.provision_brief_world();
    let key_file = TempFile::with_contents("app-key.pem", TEST_APP_PRIVATE_KEY_PEM);
    // The twin keeps Consul's default session_ttl_min of 10s.
    let output = run_against(&twins, &key_file, &["once", "--lock-ttl", "5s"]).await;
    assert_eq!(output.status.code(), Some(64), "{}", shown(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("Invalid Session TTL"), "{stderr}");
    assert!(stderr.contains("session_ttl_min"), "{stderr}");
    assert!(stderr.contains("--lock-ttl"), "{stderr}");
}
