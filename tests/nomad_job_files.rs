//! The Nomad job files in `nomad/` and the Terraform in `terraform/`: valid HCL, and the
//! properties the daemon's safety depends on.

mod support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use hcl::{Body, Expression, TemplateExpr};
use support::hcl_files::{
    attr, block, blocks, evaluate_with_vars, labelled, optional_attr, parse, parse_text, repo_path,
    templates,
};

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

/// A job file's variable, `var.<name>` as written in the file: its block.
fn variable<'a>(file: &'a Body, name: &str) -> &'a Body {
    labelled(file, "variable", &[name]).body()
}

/// The string an expression of `relative` stands for: a string as written, or a job variable
/// (`var.x`) by its default.
fn resolved(relative: &str, expr: &Expression) -> String {
    match expr {
        Expression::String(_) | Expression::TemplateExpr(_) => text(expr),
        other => {
            let source = hcl::format::to_string(other).expect("an expression formats");
            let name = source
                .trim()
                .strip_prefix("var.")
                .unwrap_or_else(|| panic!("{relative}: {source} is neither a string nor var.x"));
            text(attr(variable(&parse(relative), name), "default"))
        }
    }
}

#[test]
fn runner_parents_are_parameterized_batch_jobs_in_their_own_namespace() {
    for file in RUNNER_JOBS {
        let job = job(file);
        assert_eq!(text(attr(&job, "type")), "batch", "{file}");
        // Vault-mode parents hold a Vault role for an admin token: they live where the daemon
        // cannot register jobs (tests/deploy_files.rs checks the policy).
        let namespace = if file.contains("vault") {
            "ci-runners-vault"
        } else {
            "ci-runners"
        };
        assert_eq!(resolved(file, attr(&job, "namespace")), namespace, "{file}");
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

/// GitHub's default `timeout-minutes` of a job (a Forgejo runner's default timeout is 3h).
const DEFAULT_JOB_TIMEOUT: Duration = Duration::from_secs(360 * 60);

/// The group fields `disconnect {}` replaced in Nomad 1.8.
const DEPRECATED_DISCONNECT_FIELDS: [&str; 3] = [
    "max_client_disconnect",
    "prevent_reschedule_on_lost",
    "stop_after_client_disconnect",
];

fn duration(expr: &Expression) -> Duration {
    let value = text(expr);
    humantime::parse_duration(&value).unwrap_or_else(|e| panic!("{value} is no duration: {e}"))
}

/// A runner's dispatch meta holds its one credential, and every allocation of the child reads
/// the same meta: a replacement allocation boots with a credential its first allocation spent.
/// So on a node that misses heartbeats the allocation goes `unknown` and is not replaced while
/// it is (`replace = false`, which needs `lost_after`: without it Nomad 1.11.2 and later
/// replace at once); `lost_after` outlasts a job of the default timeout that starts at the end of the
/// runner's idle wait, so a partitioned runner still running is kept when the node returns; and
/// a reconnecting runner always wins over any replacement (`keep_original`). No
/// `stop_on_client_after`: it would kill a partitioned runner's job. The deprecated group
/// fields are ignored from Nomad 1.10 (1.8 and 1.9 refuse `prevent_reschedule_on_lost`
/// beside `replace`).
#[test]
fn runner_children_are_never_replaced_on_a_lost_node_and_win_when_it_returns() {
    for file in RUNNER_JOBS {
        let job = job(file);
        for deprecated in DEPRECATED_DISCONNECT_FIELDS {
            assert!(
                optional_attr(&job, deprecated).is_none(),
                "{file}: {deprecated}"
            );
        }
        for group in blocks(&job, "group") {
            let group = group.body();
            for deprecated in DEPRECATED_DISCONNECT_FIELDS {
                assert!(
                    optional_attr(group, deprecated).is_none(),
                    "{file}: {deprecated} (use disconnect {{}})"
                );
            }
            let disconnect = blocks(group, "disconnect");
            assert_eq!(disconnect.len(), 1, "{file}: no disconnect block");
            let disconnect = disconnect[0].body();
            assert!(!boolean(attr(disconnect, "replace")), "{file}: replace");
            assert_eq!(
                text(attr(disconnect, "reconcile")),
                "keep_original",
                "{file}"
            );
            assert!(
                optional_attr(disconnect, "stop_on_client_after").is_none(),
                "{file}: stop_on_client_after kills a partitioned runner's job"
            );
            let lost_after = duration(attr(disconnect, "lost_after"));
            let mut runners = 0;
            for task in blocks(group, "task") {
                if blocks(task.body(), "env").is_empty() {
                    continue;
                }
                let Some(idle) = env_value(&env_of(task.body()), "RUNNER_IDLE_TIMEOUT") else {
                    continue;
                };
                let idle = humantime::parse_duration(&idle).expect("RUNNER_IDLE_TIMEOUT");
                assert!(
                    lost_after >= idle + DEFAULT_JOB_TIMEOUT,
                    "{file}: lost_after {lost_after:?} is shorter than the idle wait and a job"
                );
                runners += 1;
            }
            assert_eq!(runners, 1, "{file}: one task with RUNNER_IDLE_TIMEOUT");
        }
    }
}

/// Every job file under `nomad/`, parsed, by its path relative to the repository.
fn every_job_file() -> Vec<(String, Body)> {
    let mut files: Vec<(String, Body)> = std::fs::read_dir(repo_path("nomad"))
        .expect("nomad/ is readable")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with(".nomad.hcl"))
        .map(|path| {
            let name = format!("nomad/{}", path.file_name().unwrap().to_string_lossy());
            let body = block(&parse(&name), "job").body().clone();
            (name, body)
        })
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(files.len() >= 4, "{files:?}");
    files
}

/// A uid as a job file writes it: `user = "1001"` on a task, `uid = 1001` on a template.
fn uid(expr: &Expression) -> i64 {
    match expr {
        Expression::Number(_) => number(expr),
        _ => text(expr)
            .parse()
            .unwrap_or_else(|_| panic!("not a numeric uid: {expr:?}")),
    }
}

/// The path a `file("…")` call names, resolved as the Nomad CLI does: relative to the
/// directory of the job file (jobspec2 ParseConfig.BaseDir = dir(Path)).
fn file_call(expr: &Expression, job_file: &str) -> Option<PathBuf> {
    let Expression::FuncCall(call) = expr else {
        return None;
    };
    if call.name.name.as_str() != "file" || call.args.len() != 1 {
        return None;
    }
    let dir = repo_path(job_file).parent().unwrap().to_path_buf();
    Some(dir.join(text(&call.args[0])))
}

/// Every string in a body, at any depth: attribute values, lists, objects, templates.
fn all_strings(body: &Body, out: &mut Vec<String>) {
    fn walk(expr: &Expression, out: &mut Vec<String>) {
        match expr {
            Expression::String(_) | Expression::TemplateExpr(_) => out.push(text(expr)),
            Expression::Array(items) => items.iter().for_each(|e| walk(e, out)),
            Expression::Object(object) => object.values().for_each(|e| walk(e, out)),
            Expression::FuncCall(call) => call.args.iter().for_each(|e| walk(e, out)),
            _ => {}
        }
    }
    for attribute in body.attributes() {
        walk(attribute.expr(), out);
    }
    for block in body.blocks() {
        all_strings(block.body(), out);
    }
}

/// A task's `env` entries: strings as written (`${NOMAD_META_x}` included), anything else, such
/// as a job variable's `var.repo_url`, as its HCL source.
fn env_of(task: &Body) -> Vec<(String, String)> {
    block(task, "env")
        .body()
        .attributes()
        .map(|a| {
            let value = match a.expr() {
                Expression::String(_) | Expression::TemplateExpr(_) => text(a.expr()),
                other => hcl::format::to_string(other).expect("an expression formats"),
            };
            (a.key().to_string(), value)
        })
        .collect()
}

fn env_value(env: &[(String, String)], name: &str) -> Option<String> {
    env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

fn runner_task_body(file: &str) -> Body {
    let job = job(file);
    let group = labelled(&job, "group", &["runner"]).body().clone();
    labelled(&group, "task", &["runner"]).body().clone()
}

/// Every runner task runs the shipped entrypoint, nomad/runner/entrypoint.sh, as the content
/// of a template read with file() (so `nomad job run nomad/<file>` works as shipped), passed
/// through untouched by the template engine, with a kill signal and time of its own.
#[test]
fn every_runner_task_runs_the_shipped_entrypoint() {
    let entrypoint = repo_path("nomad/runner/entrypoint.sh");
    let script = std::fs::read_to_string(&entrypoint).expect("the entrypoint exists");
    for file in RUNNER_JOBS {
        let task = runner_task_body(file);
        let config = block(&task, "config").body();
        assert_eq!(text(attr(config, "command")), "/bin/bash", "{file}");
        assert_eq!(
            strings(attr(config, "args")),
            ["${NOMAD_TASK_DIR}/entrypoint.sh"],
            "{file}"
        );
        let template = templates(&task)
            .into_iter()
            .find(|t| text(attr(t, "destination")) == "local/entrypoint.sh")
            .unwrap_or_else(|| panic!("{file}: no template renders local/entrypoint.sh"));
        let source = file_call(attr(template, "data"), file)
            .unwrap_or_else(|| panic!("{file}: the entrypoint is not file(\"…\")"));
        assert_eq!(
            source
                .canonicalize()
                .expect("file() names an existing file"),
            entrypoint.canonicalize().unwrap(),
            "{file}"
        );
        for delimiter in ["left_delimiter", "right_delimiter"] {
            let value = text(attr(template, delimiter));
            assert!(
                !script.contains(&value),
                "{file}: the script contains its template {delimiter} {value}"
            );
        }
        assert!(
            !text(attr(&task, "kill_timeout")).is_empty(),
            "{file}: kill_timeout"
        );
        assert_eq!(text(attr(&task, "kill_signal")), "SIGTERM", "{file}");
        let env: BTreeSet<String> = env_of(&task).into_iter().map(|(k, _)| k).collect();
        for name in ["RUNNER_FORGE", "REPO_URL", "RUNNER_NAME", "RUNNER_LABELS"] {
            assert!(env.contains(name), "{file}: no {name}");
        }
        assert!(env.contains("RUNNER_IDLE_TIMEOUT"), "{file}");
    }
}

/// Each runner task's credential comes from exactly where its mode puts it: dispatch meta in
/// app and forgejo mode, the prestart task's file in vault mode (whose runner task accepts no
/// runner_token and holds no Vault token).
#[test]
fn runner_credentials_come_from_meta_or_the_prestart_file_never_both() {
    for file in [
        "nomad/ci-runner.nomad.hcl",
        "nomad/forgejo-runner.nomad.hcl",
    ] {
        let env = env_of(&runner_task_body(file));
        assert!(
            env.contains(&(
                "RUNNER_TOKEN".to_string(),
                "${NOMAD_META_runner_token}".to_string()
            )),
            "{file}: {env:?}"
        );
        assert!(
            !env.iter().any(|(k, _)| k == "RUNNER_CREDENTIAL_FILE"),
            "{file}"
        );
    }

    let file = "nomad/github-runner-vault.nomad.hcl";
    let job = job(file);
    let group = labelled(&job, "group", &["runner"]).body();
    let mint = labelled(group, "task", &["mint"]).body();
    let runner = labelled(group, "task", &["runner"]).body();
    let lifecycle = block(mint, "lifecycle").body();
    assert_eq!(text(attr(lifecycle, "hook")), "prestart");
    assert!(!boolean(attr(lifecycle, "sidecar")));
    assert_eq!(blocks(mint, "vault").len(), 1, "the mint task reads Vault");
    assert!(
        blocks(runner, "vault").is_empty(),
        "the runner holds no Vault token"
    );
    assert!(blocks(runner, "identity").is_empty());

    let runner_env = env_of(runner);
    assert!(!runner_env.iter().any(|(k, _)| k == "RUNNER_TOKEN"));
    assert!(!source(runner).contains("NOMAD_META_runner_token"));
    let credential = |env: &[(String, String)]| {
        env.iter()
            .find(|(k, _)| k == "RUNNER_CREDENTIAL_FILE")
            .map(|(_, v)| v.clone())
            .expect("RUNNER_CREDENTIAL_FILE")
    };
    let written = credential(&env_of(mint));
    assert!(written.starts_with("${NOMAD_ALLOC_DIR}/"), "{written}");
    assert_eq!(written, credential(&runner_env), "read where it is written");
    assert!(runner_env.contains(&("RUNNER_CREDENTIAL_WRAPPED".to_string(), "false".to_string())));
    let mint_script = blocks(mint, "template")
        .into_iter()
        .find_map(|t| file_call(attr(t.body(), "data"), file))
        .expect("the mint script is a file()");
    assert!(mint_script.exists(), "{}", mint_script.display());
}

/// The vault-mode mint task sends the repo's admin token to the API of REPO_URL (or to
/// GITHUB_API_URL). Whoever may dispatch the job chooses its meta, so neither may come from
/// meta: both are the job file's own variables, the dispatched repo_url reaches the task only
/// as DISPATCHED_REPO_URL (which the mint script compares, tests/runner_entrypoint.rs), and the
/// runner task registers at the same job-file URL.
#[test]
fn the_vault_mode_admin_token_goes_only_to_the_repo_the_job_file_names() {
    let file = "nomad/github-runner-vault.nomad.hcl";
    let parsed = parse(file);
    let job = block(&parsed, "job").body();
    let group = labelled(job, "group", &["runner"]).body();
    let mint = env_of(labelled(group, "task", &["mint"]).body());
    let runner = env_of(labelled(group, "task", &["runner"]).body());

    for name in ["REPO_URL", "GITHUB_API_URL"] {
        let value = env_value(&mint, name).unwrap_or_else(|| panic!("{file}: mint sets no {name}"));
        assert!(
            value.starts_with("var.") && !value.contains("NOMAD_META"),
            "{file}: the mint task's {name} = {value}, not a job file variable"
        );
        let variable = value.trim_start_matches("var.");
        labelled(&parsed, "variable", &[variable]);
    }
    assert_eq!(
        env_value(&mint, "DISPATCHED_REPO_URL").as_deref(),
        Some("${NOMAD_META_repo_url}"),
        "{file}: the mint script compares the dispatch's repo_url"
    );
    // Meta reaches the mint task only where it names the runner, never where a request goes.
    for (name, value) in &mint {
        if value.contains("NOMAD_META") {
            assert!(
                ["DISPATCHED_REPO_URL", "RUNNER_NAME", "RUNNER_LABELS"].contains(&name.as_str()),
                "{file}: the mint task's {name} comes from dispatch meta: {value}"
            );
        }
    }
    assert_eq!(
        env_value(&runner, "REPO_URL"),
        env_value(&mint, "REPO_URL"),
        "{file}: the runner registers where the mint task minted"
    );

    // The shipped default is the example document's vault-mode repo whose profile routes here.
    let default = text(attr(
        labelled(&parsed, "variable", &["repo_url"]).body(),
        "default",
    ));
    let document: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_path("terraform/runners-config.json")).unwrap(),
    )
    .unwrap();
    // The job's id: its `id` attribute (a job variable) where it has one, else its label.
    let job_id = optional_attr(job, "id")
        .map(|id| resolved(file, id))
        .unwrap_or_else(|| block(&parsed, "job").labels()[0].as_str().to_string());
    let served: Vec<String> = document
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, repo)| {
            repo["profiles"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["job"] == job_id.as_str()))
        })
        .map(|(name, _)| format!("https://github.com/{name}"))
        .collect();
    assert_eq!(served, [default], "{file}: repo_url's default");
}

/// A runner that unwraps its credential at an https VAULT_ADDR can be given Vault's CA: the
/// job renders it from the parent's Nomad Variable (nomad/jobs/<parent id>: a dispatched
/// child's workload identity carries the parent's job id), guarded by nomadVarExists so a
/// cluster with a public CA needs no Variable, into the file VAULT_CACERT names.
#[test]
fn runners_that_unwrap_at_an_https_vault_get_an_optional_ca_from_their_parents_variable() {
    let mut checked = 0;
    for file in RUNNER_JOBS {
        let task = runner_task_body(file);
        let env = env_of(&task);
        let Some(vault) = env_value(&env, "VAULT_ADDR") else {
            continue;
        };
        let vault = match vault.strip_prefix("var.") {
            Some(name) => text(attr(variable(&parse(file), name), "default")),
            None => vault,
        };
        if !vault.starts_with("https://") {
            continue;
        }
        let cacert = env_value(&env, "VAULT_CACERT")
            .unwrap_or_else(|| panic!("{file}: VAULT_ADDR {vault} without VAULT_CACERT"));
        let destination = cacert
            .strip_prefix("${NOMAD_TASK_DIR}/")
            .map(|rest| format!("local/{rest}"))
            .unwrap_or_else(|| panic!("{file}: VAULT_CACERT {cacert} is not in the task dir"));
        let template = templates(&task)
            .into_iter()
            .find(|t| text(attr(t, "destination")) == destination)
            .unwrap_or_else(|| panic!("{file}: no template renders {destination}"));
        let data = text(attr(template, "data"));
        for needed in [
            "nomadVarExists",
            "nomadVar $path",
            r#"printf "nomad/jobs/%s" (env "NOMAD_JOB_PARENT_ID")"#,
            ".vault_ca",
        ] {
            assert!(
                data.contains(needed),
                "{file}: the CA template lacks {needed}: {data}"
            );
        }
        // The guard comes first: an unguarded nomadVar blocks the task until the Variable
        // exists.
        assert!(
            data.find("nomadVarExists") < data.find("with nomadVar"),
            "{file}: {data}"
        );
        checked += 1;
    }
    assert!(
        checked >= 2,
        "only {checked} runner jobs unwrap at an https Vault"
    );
}

/// In every group, a file one task writes is readable by the others: every task that sets a
/// user sets the same one, and every template with an owner is owned by its task's user.
/// (A prestart task writing the credential as another uid than the runner reads it as would
/// leave the runner without it, or make it readable by more than the runner.)
#[test]
fn files_are_written_as_the_uid_that_reads_them() {
    for (file, job) in every_job_file() {
        for group in blocks(&job, "group") {
            let tasks = blocks(group.body(), "task");
            let has_prestart = tasks.iter().any(|t| {
                blocks(t.body(), "lifecycle")
                    .first()
                    .is_some_and(|l| text(attr(l.body(), "hook")) == "prestart")
            });
            let users: BTreeSet<i64> = tasks
                .iter()
                .filter_map(|t| optional_attr(t.body(), "user").map(uid))
                .collect();
            if has_prestart {
                assert_eq!(
                    users.len(),
                    1,
                    "{file}: a prestart task and users {users:?}"
                );
                assert!(
                    tasks
                        .iter()
                        .all(|t| optional_attr(t.body(), "user").is_some()),
                    "{file}: a task without a user beside a prestart task"
                );
            }
            for task in &tasks {
                let user = optional_attr(task.body(), "user").map(uid);
                for template in templates(task.body()) {
                    for key in ["uid", "gid"] {
                        if let Some(owner) = optional_attr(template, key) {
                            assert_eq!(
                                Some(uid(owner)),
                                user,
                                "{file}: a template's {key} is not its task's user"
                            );
                        }
                    }
                }
            }
        }
    }
    // The runner tasks all set their user and own their entrypoint.
    for file in RUNNER_JOBS {
        let task = runner_task_body(file);
        assert!(optional_attr(&task, "user").is_some(), "{file}: no user");
    }
}

/// The host's Docker socket in a runner is the node handed to every workflow: no job file
/// mounts it, in `volumes`, a `mount` block or anywhere else.
#[test]
fn no_job_file_mounts_the_host_docker_socket_or_runs_latest() {
    for (file, job) in every_job_file() {
        let mut strings = Vec::new();
        all_strings(&job, &mut strings);
        for value in &strings {
            assert!(!value.contains("docker.sock"), "{file}: {value}");
        }
        for value in strings.iter().filter(|v| v.contains("latest")) {
            assert!(
                !value.ends_with(":latest"),
                "{file}: an image on latest: {value}"
            );
        }
    }
}

#[test]
fn runners_run_only_in_their_own_node_pool() {
    for file in RUNNER_JOBS {
        assert_eq!(
            resolved(file, attr(&job(file), "node_pool")),
            "ci-runners",
            "{file}"
        );
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

#[test]
fn the_daemon_is_checked_on_livez_at_the_port_it_listens_on() {
    let job = job("nomad/runner-scaler.nomad.hcl");
    let group = blocks(&job, "group")[0].body();
    let network = block(group, "network").body();
    let ports: Vec<String> = blocks(network, "port")
        .iter()
        .map(|p| p.labels()[0].as_str().to_string())
        .collect();
    assert_eq!(ports, ["http"]);
    let service = block(group, "service").body();
    assert_eq!(text(attr(service, "port")), "http");
    let check = block(service, "check").body();
    assert_eq!(text(attr(check, "type")), "http");
    assert_eq!(text(attr(check, "path")), "/livez");
    // The host's network (to reach the local Consul agent on 127.0.0.1): the daemon binds the
    // address and port Nomad gave the port, which the check then polls.
    assert_eq!(text(attr(network, "mode")), "host");
    let task = block(group, "task").body();
    assert_eq!(
        text(attr(block(task, "config").body(), "network_mode")),
        "host"
    );
    let env = block(task, "env").body();
    assert_eq!(
        text(attr(env, "RUNNER_SCALER_LISTEN")),
        "${NOMAD_IP_http}:${NOMAD_PORT_http}"
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

/// The default of a Terraform variable in `terraform/variables.tf`.
fn variable_default(name: &str) -> String {
    let variables = parse("terraform/variables.tf");
    text(attr(
        labelled(&variables, "variable", &[name]).body(),
        "default",
    ))
}

/// The Consul policy's rules as Terraform renders them, with `daemon_nodes` set to `nodes` and
/// every other variable at its default.
fn consul_rules(nodes: &[&str]) -> Body {
    let consul = parse("terraform/consul.tf");
    let policy = labelled(
        &consul,
        "resource",
        &["consul_acl_policy", "runner_scaler_config"],
    );
    let mut vars = hcl::Map::new();
    for key in ["config_key", "pause_key", "leader_key", "state_key"] {
        vars.insert(key.to_string(), hcl::Value::from(variable_default(key)));
    }
    vars.insert(
        "daemon_nodes".to_string(),
        hcl::Value::Array(nodes.iter().map(|n| hcl::Value::from(*n)).collect()),
    );
    let rules = evaluate_with_vars(
        attr(policy.body(), "rules"),
        hcl::Value::Object(vars),
        "the Consul policy's rules",
    );
    parse_text(&rules, "rules")
}

#[test]
fn the_consul_policy_reads_the_document_and_the_pause_key_and_writes_only_the_lock_and_state_keys()
{
    let rules = consul_rules(&["infra-1"]);
    assert_eq!(
        rules.blocks().count(),
        5,
        "the document, the pause key, the lock key, the state key, the node's sessions"
    );
    for read in ["runners/config", "runners/paused"] {
        let key = labelled(&rules, "key", &[read]);
        assert_eq!(text(attr(key.body(), "policy")), "read", "{read}");
    }
    // The leader lock: `?acquire=`/`?release=` on its key.
    let lock = labelled(&rules, "key", &["runners/leader"]);
    assert_eq!(text(attr(lock.body(), "policy")), "write");
    // The lock holder's state (crash-loop backoff, deleted registrations), exactly that key.
    let state = labelled(&rules, "key", &["runners/state"]);
    assert_eq!(text(attr(state.body(), "policy")), "write");
    assert!(
        blocks(&rules, "key_prefix").is_empty(),
        "{}",
        source(&rules)
    );
}

/// Consul checks session:write on a session's node to create, renew or destroy it
/// (agent/consul/session_endpoint.go), and a destroyed session with Behavior=delete deletes the
/// keys it holds. So the daemon writes sessions on exactly its own nodes (Terraform's
/// daemon_nodes: one exact `session` rule each, no `session_prefix`), and its job runs only on
/// those nodes, matched from the same list.
#[test]
fn the_daemon_writes_sessions_only_on_the_nodes_its_job_is_pinned_to() {
    let nodes = ["infra-1", "infra-2"];
    let rules = consul_rules(&nodes);
    assert!(
        blocks(&rules, "session_prefix").is_empty(),
        "session_prefix reaches other nodes' sessions: {}",
        source(&rules)
    );
    let sessions: BTreeSet<String> = blocks(&rules, "session")
        .iter()
        .map(|b| {
            assert_eq!(text(attr(b.body(), "policy")), "write");
            b.labels()[0].as_str().to_string()
        })
        .collect();
    assert_eq!(sessions, set(&nodes));

    // Terraform's variable has no default (no node name is right everywhere) and refuses an
    // empty list; its output is what the job takes.
    let variables = parse("terraform/variables.tf");
    let daemon_nodes = labelled(&variables, "variable", &["daemon_nodes"]).body();
    assert!(optional_attr(daemon_nodes, "default").is_none());
    assert!(
        hcl::format::to_string(attr(block(daemon_nodes, "validation").body(), "condition"))
            .unwrap()
            .contains("length(var.daemon_nodes) > 0")
    );
    let outputs = parse("terraform/outputs.tf");
    let output = labelled(&outputs, "output", &["daemon_nodes"]).body();
    assert_eq!(
        hcl::format::to_string(attr(output, "value"))
            .unwrap()
            .trim(),
        "var.daemon_nodes"
    );

    // The daemon's job: a required list variable of the same name, matched against the
    // client's node name. set_contains_any splits its value on commas (hashicorp/nomad
    // scheduler/feasible.go checkSetContainsAny), so join(",", …) lists every node.
    let file = "nomad/runner-scaler.nomad.hcl";
    let parsed = parse(file);
    let job_nodes = variable(&parsed, "daemon_nodes");
    assert!(optional_attr(job_nodes, "default").is_none(), "{file}");
    assert_eq!(
        hcl::format::to_string(attr(job_nodes, "type"))
            .unwrap()
            .trim(),
        "list(string)"
    );
    let job = job(file);
    let pinned = blocks(&job, "constraint").into_iter().any(|c| {
        let c = c.body();
        text(attr(c, "attribute")) == "${node.unique.name}"
            && text(attr(c, "operator")) == "set_contains_any"
            && hcl::format::to_string(attr(c, "value")).unwrap().trim()
                == "join(\",\", var.daemon_nodes)"
    });
    assert!(
        pinned,
        "{file}: no constraint pins the job to var.daemon_nodes"
    );
}
