//! The Nomad job files in `nomad/` and the Terraform in `terraform/`: valid HCL, and the
//! properties the daemon's safety depends on.

use std::collections::BTreeSet;
use std::path::PathBuf;

use hcl::{Block, BlockLabel, Body, Expression, TemplateExpr};

fn repo_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn parse_text(text: &str, what: &str) -> Body {
    hcl::from_str::<Body>(text).unwrap_or_else(|e| panic!("{what} is not valid HCL: {e}"))
}

fn parse(relative: &str) -> Body {
    let path = repo_path(relative);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    parse_text(&text, relative)
}

fn label_text(label: &BlockLabel) -> &str {
    match label {
        BlockLabel::Identifier(ident) => ident.as_str(),
        BlockLabel::String(s) => s,
    }
}

fn blocks<'a>(body: &'a Body, ident: &str) -> Vec<&'a Block> {
    body.blocks().filter(|b| b.identifier() == ident).collect()
}

fn block<'a>(body: &'a Body, ident: &str) -> &'a Block {
    let found = blocks(body, ident);
    assert_eq!(found.len(), 1, "expected one {ident} block");
    found[0]
}

fn labelled<'a>(body: &'a Body, ident: &str, labels: &[&str]) -> &'a Block {
    blocks(body, ident)
        .into_iter()
        .find(|b| b.labels().iter().map(label_text).eq(labels.iter().copied()))
        .unwrap_or_else(|| panic!("no {ident} {labels:?} block"))
}

fn attr<'a>(body: &'a Body, key: &str) -> &'a Expression {
    body.attributes()
        .find(|a| a.key() == key)
        .map(|a| a.expr())
        .unwrap_or_else(|| panic!("no attribute {key}"))
}

fn text(expr: &Expression) -> String {
    match expr {
        Expression::String(s) => s.clone(),
        Expression::TemplateExpr(template) => match template.as_ref() {
            TemplateExpr::QuotedString(s) => s.clone(),
            TemplateExpr::Heredoc(heredoc) => heredoc.template.clone(),
        },
        other => panic!("not a string: {other:?}"),
    }
}

fn strings(expr: &Expression) -> Vec<String> {
    match expr {
        Expression::Array(items) => items.iter().map(text).collect(),
        other => panic!("not a list: {other:?}"),
    }
}

fn number(expr: &Expression) -> i64 {
    match expr {
        Expression::Number(n) => n.as_i64().expect("an integer"),
        other => panic!("not a number: {other:?}"),
    }
}

fn boolean(expr: &Expression) -> bool {
    match expr {
        Expression::Bool(b) => *b,
        other => panic!("not a bool: {other:?}"),
    }
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The whole body back as HCL text, for searching commands and scripts.
fn source(body: &Body) -> String {
    hcl::format::to_string(body).expect("body formats")
}

const RUNNER_JOBS: &[&str] = &[
    "nomad/ci-runner.nomad.hcl",
    "nomad/forgejo-runner.nomad.hcl",
    "nomad/github-runner-vault.nomad.hcl",
];

fn job(relative: &str) -> Body {
    let file = parse(relative);
    block(&file, "job").body().clone()
}

#[test]
fn runner_parents_are_parameterized_batch_jobs_in_their_own_namespace() {
    for file in RUNNER_JOBS {
        let job = job(file);
        assert_eq!(text(attr(&job, "type")), "batch", "{file}");
        assert_eq!(text(attr(&job, "namespace")), "ci-runners", "{file}");
        let parameterized = block(&job, "parameterized").body();
        let optional: BTreeSet<String> = strings(attr(parameterized, "meta_optional"))
            .into_iter()
            .collect();
        assert!(
            optional.is_superset(&set(&["labels", "managed_by"])),
            "{file}: {optional:?}"
        );
        let required: BTreeSet<String> = strings(attr(parameterized, "meta_required"))
            .into_iter()
            .collect();
        assert!(
            required.is_disjoint(&optional),
            "{file}: Nomad requires disjoint sets"
        );
    }
}

#[test]
fn runner_parents_require_exactly_the_meta_the_daemon_sends() {
    for (file, expected) in [
        (
            "nomad/ci-runner.nomad.hcl",
            set(&["repo_url", "runner_token", "runner_name"]),
        ),
        (
            "nomad/forgejo-runner.nomad.hcl",
            set(&["repo_url", "runner_token", "runner_name"]),
        ),
        // In vault mode the daemon mints nothing, and the parent refuses a runner_token.
        (
            "nomad/github-runner-vault.nomad.hcl",
            set(&["repo_url", "runner_name"]),
        ),
    ] {
        let job = job(file);
        let parameterized = block(&job, "parameterized").body();
        let required: BTreeSet<String> = strings(attr(parameterized, "meta_required"))
            .into_iter()
            .collect();
        assert_eq!(required, expected, "{file}");
    }
    let vault = job("nomad/github-runner-vault.nomad.hcl");
    let optional = strings(attr(block(&vault, "parameterized").body(), "meta_optional"));
    assert!(!optional.contains(&"runner_token".to_string()));
}

#[test]
fn runner_children_are_never_restarted_or_rescheduled() {
    for file in RUNNER_JOBS {
        let job = job(file);
        for group in blocks(&job, "group") {
            let group = group.body();
            let restart = block(group, "restart").body();
            assert_eq!(number(attr(restart, "attempts")), 0, "{file}");
            assert_eq!(text(attr(restart, "mode")), "fail", "{file}");
            let reschedule = block(group, "reschedule").body();
            assert_eq!(number(attr(reschedule, "attempts")), 0, "{file}");
            assert!(!boolean(attr(reschedule, "unlimited")), "{file}");
        }
    }
}

/// The runner task's whole text (config, env, templates).
fn runner_task(file: &str) -> String {
    let job = job(file);
    let group = labelled(&job, "group", &["runner"]);
    source(labelled(group.body(), "task", &["runner"]).body())
}

#[test]
fn github_runners_are_ephemeral_named_by_meta_with_their_own_work_dir() {
    for file in [
        "nomad/ci-runner.nomad.hcl",
        "nomad/github-runner-vault.nomad.hcl",
    ] {
        let task = runner_task(file);
        for needle in [
            "${NOMAD_META_runner_name}",
            "--name \"$RUNNER_NAME\"",
            "--ephemeral",
            "--disableupdate",
            "--unattended",
            "--work \"$work\"",
            "work=\"$NOMAD_TASK_DIR/work\"",
        ] {
            assert!(task.contains(needle), "{file}: no {needle}");
        }
        let unset = task.find("unset token").expect("the credential is unset");
        let run = task.find("exec ./run.sh").expect("run.sh is exec'd");
        assert!(unset < run, "{file}: the credential outlives registration");
    }
}

#[test]
fn runner_credentials_leave_the_environment_before_any_job_runs() {
    for (file, start) in [
        ("nomad/ci-runner.nomad.hcl", "exec ./run.sh"),
        (
            "nomad/forgejo-runner.nomad.hcl",
            "exec forgejo-runner one-job",
        ),
    ] {
        let task = runner_task(file);
        let unset = task
            .find("unset RUNNER_TOKEN NOMAD_META_runner_token NOMAD_META_RUNNER_TOKEN")
            .unwrap_or_else(|| panic!("{file}: the token stays in the environment"));
        assert!(unset < task.find(start).unwrap(), "{file}");
    }
    // The vault variant's runner task never sees the admin token: only the mint task has a
    // vault block.
    let vault = job("nomad/github-runner-vault.nomad.hcl");
    let group = labelled(&vault, "group", &["runner"]).body();
    assert!(blocks(labelled(group, "task", &["runner"]).body(), "vault").is_empty());
    assert_eq!(
        blocks(labelled(group, "task", &["mint"]).body(), "vault").len(),
        1
    );
    let runner = runner_task("nomad/github-runner-vault.nomad.hcl");
    assert!(!runner.contains("moat-runner"));
    assert!(runner.contains("rm -f \"$NOMAD_ALLOC_DIR/registration-token\""));
}

#[test]
fn forgejo_runner_registers_non_interactively_and_runs_one_job() {
    let task = runner_task("nomad/forgejo-runner.nomad.hcl");
    for needle in [
        "forgejo-runner register",
        "--no-interactive",
        "--instance \"$instance\"",
        "--name \"$RUNNER_NAME\"",
        "${NOMAD_META_runner_name}",
        "forgejo-runner one-job",
    ] {
        assert!(task.contains(needle), "no {needle}");
    }
}

#[test]
fn the_daemon_is_one_service_copy_with_secrets_outside_its_flags() {
    let job = job("nomad/runner-scaler.nomad.hcl");
    assert_eq!(text(attr(&job, "type")), "service");
    let groups = blocks(&job, "group");
    assert_eq!(groups.len(), 1);
    let group = groups[0].body();
    assert_eq!(number(attr(group, "count")), 1);
    let task = block(group, "task").body();
    let config = block(task, "config").body();
    assert_eq!(strings(attr(config, "args")), ["run"]);
    let env = source(block(task, "env").body());
    for name in [
        "NOMAD_ADDR",
        "CONSUL_HTTP_ADDR",
        "VAULT_ADDR",
        "RUNNER_SCALER_CONFIG_KEY",
    ] {
        assert!(env.contains(name), "no {name}");
    }
    assert!(
        !env.contains("TOKEN ="),
        "a token value in the job spec: {env}"
    );
}

// ---- terraform ----

fn terraform_files() -> Vec<(String, Body)> {
    let mut files: Vec<(String, Body)> = std::fs::read_dir(repo_path("terraform"))
        .expect("terraform/ exists")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "tf"))
        .map(|path| {
            let name = format!("terraform/{}", path.file_name().unwrap().to_string_lossy());
            let body = parse(&name);
            (name, body)
        })
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    files
}

#[test]
fn every_terraform_file_is_valid_hcl() {
    let files = terraform_files();
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    for expected in [
        "terraform/consul.tf",
        "terraform/nomad.tf",
        "terraform/variables.tf",
        "terraform/vault.tf",
    ] {
        assert!(names.contains(&expected), "{expected} missing: {names:?}");
    }
}

fn policy_paths(document: &Block) -> Vec<String> {
    blocks(document.body(), "rule")
        .into_iter()
        .map(|rule| text(attr(rule.body(), "path")))
        .collect()
}

/// `secret/data/<path>` for the `vaultPath`s and `registerVaultPath`s of the example document.
fn document_vault_paths() -> (BTreeSet<String>, BTreeSet<String>) {
    let text = std::fs::read_to_string(repo_path("terraform/runners-config.json")).unwrap();
    let document: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut daemon = BTreeSet::new();
    let mut register = BTreeSet::new();
    for repo in document.as_object().unwrap().values() {
        if let Some(path) = repo["vaultPath"].as_str() {
            daemon.insert(format!("secret/data/{path}"));
        }
        if let Some(path) = repo["registerVaultPath"].as_str() {
            register.insert(format!("secret/data/{path}"));
        }
    }
    (daemon, register)
}

#[test]
fn the_daemons_vault_policy_names_exact_paths_and_no_register_path() {
    let vault = parse("terraform/vault.tf");
    let daemon = policy_paths(labelled(
        &vault,
        "data",
        &["vault_policy_document", "runner_scaler"],
    ));

    assert_eq!(
        daemon.iter().cloned().collect::<BTreeSet<_>>(),
        set(&[
            "secret/data/github/moat-poll",
            "secret/data/forgejo/scaler",
            "secret/data/runner-scaler/github-app",
        ])
    );
    for path in &daemon {
        assert!(
            !path.contains('*') && !path.contains('+'),
            "glob in the daemon's policy: {path}"
        );
    }
    let (polled, register) = document_vault_paths();
    assert!(!register.is_empty());
    for path in &register {
        assert!(
            daemon
                .iter()
                .all(|p| p != path && !path.starts_with(p.as_str())),
            "the daemon's policy covers the register path {path}"
        );
    }
    for path in &polled {
        assert!(daemon.contains(path), "the daemon cannot read {path}");
    }

    let runner = policy_paths(labelled(
        &vault,
        "data",
        &["vault_policy_document", "runner_moat"],
    ));
    assert_eq!(runner, ["secret/data/github/moat-runner"]);
}

#[test]
fn the_daemons_nomad_policy_grants_only_what_it_uses_in_ci_runners() {
    let nomad = parse("terraform/nomad.tf");
    let policy = labelled(&nomad, "resource", &["nomad_acl_policy", "runner_scaler"]);
    let rules = parse_text(&text(attr(policy.body(), "rules_hcl")), "rules_hcl");

    assert_eq!(rules.blocks().count(), 1, "one rule only");
    let namespace = labelled(&rules, "namespace", &["ci-runners"]);
    let capabilities: BTreeSet<String> = strings(attr(namespace.body(), "capabilities"))
        .into_iter()
        .collect();
    assert_eq!(
        capabilities,
        set(&["list-jobs", "read-job", "dispatch-job", "submit-job"])
    );
    assert_eq!(rules.attributes().count(), 0);
}

#[test]
fn the_consul_policy_reads_exactly_the_document_and_writes_only_the_leader_lock() {
    let consul = parse("terraform/consul.tf");
    let policy = labelled(
        &consul,
        "resource",
        &["consul_acl_policy", "runner_scaler_config"],
    );
    let rules = parse_text(&text(attr(policy.body(), "rules")), "rules");

    assert_eq!(
        rules.blocks().count(),
        3,
        "the document, the lock key, sessions"
    );
    let key = labelled(&rules, "key", &["runners/config"]);
    assert_eq!(text(attr(key.body(), "policy")), "read");
    // The leader lock: `?acquire=`/`?release=` on its key, and a session on the agent's node.
    let lock = labelled(&rules, "key", &["runners/leader"]);
    assert_eq!(text(attr(lock.body(), "policy")), "write");
    let sessions = labelled(&rules, "session_prefix", &[""]);
    assert_eq!(text(attr(sessions.body(), "policy")), "write");
}

/// Every image in `nomad/` is pinned to a version or a digest: a moving tag changes the
/// runner (or the daemon) under the operator at the next pull, and with self-update off an
/// unpinned runner image is the only thing deciding the runner version.
#[test]
fn every_image_is_pinned_to_a_version_or_a_digest() {
    let mut seen = 0;
    for entry in std::fs::read_dir(repo_path("nomad")).expect("nomad/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("hcl") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a job file is readable");
        for line in text.lines() {
            let Some(image) = line
                .trim()
                .strip_prefix("image")
                .and_then(|rest| rest.trim().strip_prefix('='))
                .map(|value| value.trim().trim_matches('"'))
            else {
                continue;
            };
            seen += 1;
            let (_, reference) = image
                .rsplit_once(['@', ':'])
                .unwrap_or_else(|| panic!("{}: image {image} has no tag", path.display()));
            let pinned = image.contains("@sha256:")
                || reference.chars().next().is_some_and(|c| c.is_ascii_digit());
            assert!(
                pinned && reference != "latest",
                "{}: image {image} is not pinned to a version or a digest",
                path.display()
            );
        }
    }
    assert!(seen >= 4, "only {seen} images found in nomad/");
}
