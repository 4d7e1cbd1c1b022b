//! The deployment files read as an operator applies them: `Dockerfile`, `nomad/`, `terraform/`.
//! Terraform cannot validate here (no providers), so these tests parse every file and resolve
//! the values that matter (variable defaults, `for_each` entries, `dynamic` blocks) by hand:
//! who may write jobs where, what each identity is bound to, which Vault paths a policy names.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use hcl::{Block, Body, Expression, ObjectKey, TemplateExpr};
use support::hcl_files::{
    attr, block, blocks, label_text, labelled, optional_attr, parse, parse_text, read, repo_path,
    templates,
};

/// A string literal or template as written, `${…}` included; anything else as HCL source
/// (`var.x`, `each.value.job_id`, `a ? b : c`).
fn raw(expr: &Expression) -> String {
    match expr {
        Expression::String(s) => s.clone(),
        Expression::TemplateExpr(template) => match template.as_ref() {
            TemplateExpr::QuotedString(s) => s.clone(),
            TemplateExpr::Heredoc(heredoc) => heredoc.template.clone(),
        },
        other => hcl::format::to_string(other).expect("an expression formats"),
    }
}

/// Names bound while resolving: `var.x`, `local.y`, `each.key`, `each.value.f`, `rule.value`.
type Scope = BTreeMap<String, String>;

/// The value of an expression: a reference is looked up in `scope`, a template has each of its
/// `${…}` looked up. A name the scope lacks fails the test: nothing unresolved slips through.
fn resolve(expr: &Expression, scope: &Scope, what: &str) -> String {
    match expr {
        Expression::String(_) | Expression::TemplateExpr(_) => {
            resolve_template(&raw(expr), scope, what)
        }
        Expression::Bool(b) => b.to_string(),
        Expression::Number(n) => n.to_string(),
        other => {
            let name = raw(other);
            scope
                .get(name.trim())
                .cloned()
                .unwrap_or_else(|| panic!("{what}: cannot resolve {name}"))
        }
    }
}

/// The names the tests resolve; any other `${…}` is left for Nomad or Terraform.
const BOUND_ROOTS: &[&str] = &["var.", "local.", "each.", "rule."];

fn resolve_template(text: &str, scope: &Scope, what: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        // `$${` is HCL's escape for a literal `${`.
        if start > 0 && rest[..start].ends_with('$') {
            out.push_str(&rest[..start - 1]);
            out.push_str("${");
            rest = &rest[start + 2..];
            continue;
        }
        out.push_str(&rest[..start]);
        let end = rest[start..]
            .find('}')
            .unwrap_or_else(|| panic!("{what}: unclosed ${{ in {text}"));
        let name = rest[start + 2..start + end].trim();
        match scope.get(name) {
            Some(value) => out.push_str(value),
            // Nomad's runtime variables (`NOMAD_SECRETS_DIR`, `attr.…`) and Terraform's
            // `path.module` are filled in later, by the client or by Terraform: kept as written.
            None if !BOUND_ROOTS.iter().any(|root| name.starts_with(root)) => {
                out.push_str(&rest[start..start + end + 1]);
            }
            None => panic!("{what}: cannot resolve ${{{name}}} in {text}"),
        }
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

fn object_entries(expr: &Expression) -> Vec<(String, &Expression)> {
    let Expression::Object(object) = expr else {
        panic!("not an object: {expr:?}");
    };
    object
        .iter()
        .map(|(key, value)| {
            let key = match key {
                ObjectKey::Identifier(ident) => ident.as_str().to_string(),
                ObjectKey::Expression(e) => raw(e),
                other => panic!("an object key: {other:?}"),
            };
            (key, value)
        })
        .collect()
}

fn strings(expr: &Expression) -> Vec<String> {
    match expr {
        Expression::Array(items) => items.iter().map(raw).collect(),
        other => panic!("not a list: {other:?}"),
    }
}

// ---- terraform ----

/// Every `.tf` file under `terraform/`, parsed and merged into one body (Terraform reads a
/// module's files as one).
fn terraform() -> Body {
    let mut merged = Vec::new();
    let mut seen = 0;
    for entry in std::fs::read_dir(repo_path("terraform")).expect("terraform/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|e| e == "tf") {
            seen += 1;
            let name = format!("terraform/{}", path.file_name().unwrap().to_string_lossy());
            merged.extend(parse(&name));
        }
    }
    assert!(seen >= 5, "only {seen} .tf files");
    Body::from(merged)
}

fn variable_defaults(tf: &Body) -> BTreeMap<String, Expression> {
    blocks(tf, "variable")
        .into_iter()
        .filter_map(|v| {
            optional_attr(v.body(), "default")
                .map(|d| (label_text(&v.labels()[0]).to_string(), d.clone()))
        })
        .collect()
}

/// `var.<name>` for every variable whose default is a string or a bool, and each `local`
/// resolved as on a cluster where the optional resources already exist (the `false` branch
/// of `var.create_… ? resource : var.…`).
fn terraform_scope(tf: &Body) -> Scope {
    let mut scope = Scope::new();
    for (name, default) in variable_defaults(tf) {
        match &default {
            Expression::String(_) | Expression::TemplateExpr(_) | Expression::Bool(_) => {
                scope.insert(format!("var.{name}"), raw(&default));
            }
            _ => {}
        }
    }
    for locals in blocks(tf, "locals") {
        for local in locals.body().attributes() {
            let value = match local.expr() {
                Expression::Conditional(conditional) => {
                    resolve(&conditional.false_expr, &scope, local.key())
                }
                other => resolve(other, &scope, local.key()),
            };
            scope.insert(format!("local.{}", local.key()), value);
        }
    }
    scope
}

fn resource<'a>(tf: &'a Body, kind: &str, name: &str) -> &'a Block {
    labelled(tf, "resource", &[kind, name])
}

/// The scopes of a block's instances: one per `for_each` entry of a map variable (with
/// `each.key` and `each.value.<field>`), or the block's own scope when it has no `for_each`.
fn instances(block: &Block, tf: &Body, scope: &Scope) -> Vec<Scope> {
    let Some(for_each) = optional_attr(block.body(), "for_each") else {
        return vec![scope.clone()];
    };
    let name = raw(for_each);
    let variable = name
        .strip_prefix("var.")
        .unwrap_or_else(|| panic!("for_each over {name}, not a variable"));
    let defaults = variable_defaults(tf);
    let default = defaults
        .get(variable)
        .unwrap_or_else(|| panic!("variable {variable} has no default"));
    object_entries(default)
        .into_iter()
        .map(|(key, value)| {
            let mut scope = scope.clone();
            scope.insert("each.key".into(), key);
            for (field, v) in object_entries(value) {
                scope.insert(format!("each.value.{field}"), raw(v));
            }
            scope
        })
        .collect()
}

/// The paths of a `vault_policy_document`'s rules, `dynamic "rule"` blocks expanded over their
/// list variable.
fn policy_paths(document: &Block, tf: &Body, scope: &Scope) -> Vec<String> {
    let body = document.body();
    let mut paths: Vec<String> = blocks(body, "rule")
        .into_iter()
        .map(|rule| resolve(attr(rule.body(), "path"), scope, "rule path"))
        .collect();
    for dynamic in blocks(body, "dynamic") {
        assert_eq!(label_text(&dynamic.labels()[0]), "rule");
        let over = raw(attr(dynamic.body(), "for_each"));
        let variable = over.strip_prefix("var.").expect("for_each over a variable");
        let defaults = variable_defaults(tf);
        let items = strings(&defaults[variable]);
        assert!(!items.is_empty(), "{variable} is empty");
        let content = block(dynamic.body(), "content").body();
        for item in items {
            let mut scope = scope.clone();
            scope.insert("rule.value".into(), item);
            paths.push(resolve(attr(content, "path"), &scope, "dynamic rule path"));
        }
    }
    paths
}

/// `vault_policy.<name>[…].name` → `<name>`, and the same for data sources.
fn referenced(expr_text: &str, prefix: &str) -> String {
    let start = expr_text
        .find(prefix)
        .unwrap_or_else(|| panic!("{expr_text} names no {prefix}"))
        + prefix.len();
    expr_text[start..]
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

struct VaultRole {
    name: String,
    namespace: String,
    job_id: String,
    task: Option<String>,
    paths: Vec<String>,
}

/// Every JWT role in `terraform/`, each instance resolved: its bound claims and the paths its
/// token's policies may read.
fn vault_roles(tf: &Body) -> Vec<VaultRole> {
    let base = terraform_scope(tf);
    let mut roles = Vec::new();
    for role in blocks(tf, "resource")
        .into_iter()
        .filter(|b| label_text(&b.labels()[0]) == "vault_jwt_auth_backend_role")
    {
        for scope in instances(role, tf, &base) {
            let body = role.body();
            let claims: BTreeMap<String, String> = object_entries(attr(body, "bound_claims"))
                .into_iter()
                .map(|(k, v)| (k, resolve(v, &scope, "bound claim")))
                .collect();
            let mut paths = Vec::new();
            for policy in strings(attr(body, "token_policies")) {
                let policy = resource(tf, "vault_policy", &referenced(&policy, "vault_policy."));
                let document_ref = raw(attr(policy.body(), "policy"));
                let document = labelled(
                    tf,
                    "data",
                    &[
                        "vault_policy_document",
                        &referenced(&document_ref, "vault_policy_document."),
                    ],
                );
                paths.extend(policy_paths(document, tf, &scope));
            }
            roles.push(VaultRole {
                name: resolve(attr(body, "role_name"), &scope, "role_name"),
                namespace: claims.get("nomad_namespace").cloned().unwrap_or_default(),
                job_id: claims.get("nomad_job_id").cloned().unwrap_or_default(),
                task: claims.get("nomad_task").cloned(),
                paths,
            });
        }
    }
    assert!(
        roles.len() >= 2,
        "the daemon's role and a vault-mode runner's"
    );
    roles
}

/// The example document's repos.
fn document() -> serde_json::Map<String, serde_json::Value> {
    serde_json::from_str::<serde_json::Value>(&read("terraform/runners-config.json"))
        .expect("the seed document is JSON")
        .as_object()
        .expect("an object of repos")
        .clone()
}

/// `<mount>/data/<path>` of every `registerVaultPath` the seed document and the Terraform
/// variables name: the admin tokens.
fn register_paths(tf: &Body, scope: &Scope) -> BTreeSet<String> {
    let mount = &scope["var.vault_kv_mount"];
    let mut paths: BTreeSet<String> = document()
        .values()
        .filter_map(|repo| repo["registerVaultPath"].as_str())
        .map(|p| format!("{mount}/data/{p}"))
        .collect();
    for entry in object_entries(&variable_defaults(tf)["vault_mode_runners"]) {
        let fields: BTreeMap<String, String> = object_entries(entry.1)
            .into_iter()
            .map(|(k, v)| (k, raw(v)))
            .collect();
        paths.insert(format!("{mount}/data/{}", fields["register_path"]));
    }
    assert!(!paths.is_empty());
    paths
}

/// A namespace rule of a Nomad ACL policy: its coarse `policy`, if any, and its capabilities.
type NamespaceRule = (Option<String>, BTreeSet<String>);

/// The daemon's Nomad ACL policy, its `${var.…}` resolved, by namespace label: the coarse
/// `policy` and the capabilities.
fn daemon_nomad_policy(tf: &Body) -> (BTreeMap<String, NamespaceRule>, Block) {
    let scope = terraform_scope(tf);
    let policy = resource(tf, "nomad_acl_policy", "runner_scaler");
    let rules = resolve(attr(policy.body(), "rules_hcl"), &scope, "rules_hcl");
    let rules = parse_text(&rules, "rules_hcl");
    let mut namespaces = BTreeMap::new();
    for rule in rules.blocks() {
        assert_eq!(
            rule.identifier(),
            "namespace",
            "the daemon needs namespace rules only, not {}",
            rule.identifier()
        );
        let label = label_text(&rule.labels()[0]).to_string();
        let coarse = optional_attr(rule.body(), "policy").map(raw);
        let capabilities = optional_attr(rule.body(), "capabilities")
            .map(strings)
            .unwrap_or_default()
            .into_iter()
            .collect();
        namespaces.insert(label, (coarse, capabilities));
    }
    (namespaces, policy.clone())
}

/// Nomad's namespace-rule lookup: an exact label first, else the glob with the most matched
/// characters (acl-policy spec). Only `*` globs are used here.
fn rule_for<'a, T>(rules: &'a BTreeMap<String, T>, namespace: &str) -> Option<&'a T> {
    if let Some(rule) = rules.get(namespace) {
        return Some(rule);
    }
    rules
        .iter()
        .filter(|(label, _)| label.contains('*') && glob_matches(label, namespace))
        .max_by_key(|(label, _)| label.replace('*', "").len())
        .map(|(_, rule)| rule)
}

fn glob_matches(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let mut rest = text;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            let Some(r) = rest.strip_prefix(part) else {
                return false;
            };
            rest = r;
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else if let Some(at) = rest.find(part) {
            rest = &rest[at + part.len()..];
        } else {
            return false;
        }
    }
    rest.is_empty()
}

/// Capabilities that write to jobs or reach into a running allocation: with any of them in a
/// namespace whose jobs hold a Vault role for an admin token, the daemon could register a job
/// that logs in as that role, or read what its task holds.
const JOB_WRITING: &[&str] = &[
    "submit-job",
    // Nomad 2.0 splits submit-job; these two (re)register jobs.
    "register-job",
    "revert-job",
    "scale-job",
    "alloc-exec",
    "alloc-node-exec",
    "alloc-lifecycle",
    "read-fs",
    "csi-register-plugin",
];

// ---- nomad ----

/// A job file's `variable` defaults as `var.<name>`.
fn job_scope(file: &Body) -> Scope {
    blocks(file, "variable")
        .into_iter()
        .filter_map(|v| {
            optional_attr(v.body(), "default")
                .map(|d| (format!("var.{}", label_text(&v.labels()[0])), raw(d)))
        })
        .collect()
}

fn job_files() -> Vec<(String, Body)> {
    let mut files: Vec<(String, Body)> = std::fs::read_dir(repo_path("nomad"))
        .expect("nomad/ is readable")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with(".nomad.hcl"))
        .map(|path| {
            let name = format!("nomad/{}", path.file_name().unwrap().to_string_lossy());
            let body = parse(&name);
            (name, body)
        })
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(files.len() >= 4, "{files:?}");
    files
}

struct Task {
    file: String,
    /// The job file's variables at their defaults.
    scope: Scope,
    namespace: String,
    /// The job's id: its `id` attribute where it has one (a variable), else its label.
    job: String,
    group: String,
    task: String,
    body: Body,
    /// The task's group has a `consul` block, or the task has one: Nomad gives the task a
    /// Consul token of its workload identity.
    consul_identity: bool,
}

fn tasks() -> Vec<Task> {
    let mut tasks = Vec::new();
    for (file, body) in job_files() {
        let scope = job_scope(&body);
        let job = block(&body, "job");
        let namespace = resolve(attr(job.body(), "namespace"), &scope, &file);
        let job_id = optional_attr(job.body(), "id")
            .map(|id| resolve(id, &scope, &file))
            .unwrap_or_else(|| label_text(&job.labels()[0]).to_string());
        for group in blocks(job.body(), "group") {
            let group_consul = !blocks(group.body(), "consul").is_empty();
            for task in blocks(group.body(), "task") {
                tasks.push(Task {
                    file: file.clone(),
                    scope: scope.clone(),
                    namespace: namespace.clone(),
                    job: job_id.clone(),
                    group: label_text(&group.labels()[0]).to_string(),
                    task: label_text(&task.labels()[0]).to_string(),
                    body: task.body().clone(),
                    consul_identity: group_consul || !blocks(task.body(), "consul").is_empty(),
                });
            }
        }
    }
    tasks
}

fn vault_role_of(task: &Task) -> Option<String> {
    blocks(&task.body, "vault")
        .first()
        .map(|v| resolve(attr(v.body(), "role"), &task.scope, &task.file))
}

const DAEMON_JOB: &str = "nomad/runner-scaler.nomad.hcl";

// ---- the tests ----

/// Every file under `nomad/` (job files) and `terraform/` (`.tf` and the example tfvars) is
/// HCL that parses.
#[test]
fn every_deploy_file_parses() {
    let mut parsed = 0;
    for dir in ["nomad", "terraform"] {
        let mut stack = vec![repo_path(dir)];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("a readable directory") {
                let path = entry.expect("a directory entry").path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let name = path.to_string_lossy().to_string();
                if name.ends_with(".hcl")
                    || name.ends_with(".tf")
                    || name.ends_with(".tfvars.example")
                {
                    let text = std::fs::read_to_string(&path).expect("readable");
                    parse_text(&text, &name);
                    parsed += 1;
                }
            }
        }
    }
    assert!(parsed >= 10, "only {parsed} HCL files found");
}

/// The namespaces whose jobs hold a Vault role that reads an admin token (a
/// `registerVaultPath`) are derived from the files, and there the daemon's Nomad policy has no
/// capability that writes jobs: it can list, read and dispatch, never register a job that logs
/// in as that role.
#[test]
fn the_daemon_writes_no_jobs_where_a_job_holds_an_admin_token_role() {
    let tf = terraform();
    let scope = terraform_scope(&tf);
    let register = register_paths(&tf, &scope);
    let roles = vault_roles(&tf);

    let admin_roles: Vec<&VaultRole> = roles
        .iter()
        .filter(|r| r.paths.iter().any(|p| register.contains(p)))
        .collect();
    assert!(!admin_roles.is_empty(), "no role reads {register:?}");
    let mut admin_namespaces: BTreeSet<String> =
        admin_roles.iter().map(|r| r.namespace.clone()).collect();

    // The job files agree: every task holding one of those roles runs in such a namespace, and
    // the namespace in the files is where its role is bound.
    let role_names: BTreeSet<&str> = admin_roles.iter().map(|r| r.name.as_str()).collect();
    let mut holders = 0;
    for task in tasks() {
        if let Some(role) = vault_role_of(&task)
            && role_names.contains(role.as_str())
        {
            holders += 1;
            admin_namespaces.insert(task.namespace.clone());
            let bound = admin_roles.iter().find(|r| r.name == role).unwrap();
            assert_eq!(task.namespace, bound.namespace, "{}", task.file);
            assert_eq!(task.job, bound.job_id, "{}", task.file);
            assert_eq!(
                Some(task.task.clone()),
                bound.task,
                "{}: {}",
                task.file,
                role
            );
        }
    }
    assert!(holders >= 1, "no job file holds an admin-token role");
    // So does the document: a repo with a registerVaultPath names such a namespace.
    for (repo, fields) in document() {
        if fields.get("registerVaultPath").is_some() {
            let namespace = fields["nomadNamespace"]
                .as_str()
                .unwrap_or_else(|| panic!("{repo}: a vault-mode repo without nomadNamespace"));
            assert!(admin_namespaces.contains(namespace), "{repo}: {namespace}");
        }
    }

    let (rules, _) = daemon_nomad_policy(&tf);
    for namespace in &admin_namespaces {
        assert_ne!(
            namespace, "default",
            "an admin-token role in the default namespace"
        );
        let (coarse, capabilities) = rule_for(&rules, namespace)
            .unwrap_or_else(|| panic!("the daemon has no rule for {namespace}"));
        assert_ne!(
            coarse.as_deref(),
            Some("write"),
            "{namespace}: policy = write"
        );
        for capability in JOB_WRITING {
            assert!(
                !capabilities.contains(*capability),
                "the daemon has {capability} in {namespace}, whose jobs hold an admin-token role"
            );
        }
        for needed in ["list-jobs", "read-job", "dispatch-job"] {
            assert!(capabilities.contains(needed), "{namespace}: no {needed}");
        }
    }
    // And nowhere does it hold a coarse policy or a glob that reaches those namespaces.
    for (label, (coarse, _)) in &rules {
        assert!(coarse.is_none(), "{label}: a coarse policy {coarse:?}");
        assert!(!label.contains('*'), "a glob namespace rule {label}");
    }
}

/// Every capability the daemon's Nomad policy names is one Nomad defines for namespace rules
/// (https://developer.hashicorp.com/nomad/docs/other-specifications/acl-policy, and Nomad 2.0's
/// split of submit-job), and it has submit-job (stop and purge on 1.x) only in the runners'
/// namespace.
#[test]
fn the_daemons_nomad_capabilities_are_documented_ones() {
    let documented: BTreeSet<&str> = [
        "deny",
        "list-jobs",
        "parse-job",
        "read-job",
        "submit-job",
        "dispatch-job",
        "read-logs",
        "read-fs",
        "alloc-exec",
        "alloc-node-exec",
        "alloc-lifecycle",
        "csi-register-plugin",
        "csi-write-volume",
        "csi-read-volume",
        "csi-list-volume",
        "csi-mount-volume",
        "list-scaling-policies",
        "read-scaling-policy",
        "read-job-scaling",
        "scale-job",
        "sentinel-override",
    ]
    .into_iter()
    .collect();
    // Nomad 2.0 splits submit-job (hashicorp/nomad#27287, acl/policy.go); 1.x servers refuse
    // these names, and the shipped files support Nomad 1.8 and later.
    let nomad_2_only: BTreeSet<&str> = [
        "register-job",
        "revert-job",
        "deregister-job",
        "purge-job",
        "evaluate-job",
        "plan-job",
        "tag-job-version",
        "stable-job",
    ]
    .into_iter()
    .collect();
    let tf = terraform();
    let scope = terraform_scope(&tf);
    let (rules, _) = daemon_nomad_policy(&tf);
    assert_eq!(rules.len(), 2, "{rules:?}");
    for (label, (_, capabilities)) in &rules {
        for capability in capabilities {
            assert!(
                !nomad_2_only.contains(capability.as_str()),
                "{label}: {capability} exists only from Nomad 2.0; 1.x servers refuse the policy"
            );
            assert!(
                documented.contains(capability.as_str()),
                "{label}: {capability} is not a Nomad capability"
            );
        }
    }
    let runners = &rules[&scope["var.runner_namespace"]].1;
    assert!(
        runners.contains("submit-job"),
        "stopping and purging children"
    );
    assert!(!rules.contains_key("default"));
}

/// The daemon's identities (Vault role, Consul binding rule, Nomad policy) are bound to its
/// own namespace, its job id and its task, as the daemon's job file names them, and that
/// namespace is not `default`.
#[test]
fn the_daemons_identities_are_bound_to_its_namespace_job_and_task() {
    let tf = terraform();
    let scope = terraform_scope(&tf);
    let daemon = tasks()
        .into_iter()
        .find(|t| t.file == DAEMON_JOB)
        .expect("the daemon's task");
    assert_ne!(daemon.namespace, "default");
    assert_ne!(daemon.namespace, scope["var.runner_namespace"]);
    assert_ne!(daemon.namespace, scope["var.vault_runner_namespace"]);
    assert_eq!(daemon.namespace, scope["var.daemon_namespace"]);
    assert_eq!(daemon.job, scope["var.daemon_job_id"]);
    assert_eq!(daemon.group, scope["var.daemon_group"]);
    assert_eq!(daemon.task, scope["var.daemon_task"]);

    let role_name = vault_role_of(&daemon).expect("the daemon has a vault block");
    let roles = vault_roles(&tf);
    let role = roles
        .iter()
        .find(|r| r.name == role_name)
        .expect("its role");
    assert_eq!(role.namespace, daemon.namespace);
    assert_eq!(role.job_id, daemon.job);
    assert_eq!(role.task.as_deref(), Some(daemon.task.as_str()));

    let rule = resource(&tf, "consul_acl_binding_rule", "runner_scaler");
    let selector = resolve(attr(rule.body(), "selector"), &scope, "selector");
    let clauses: BTreeSet<String> = selector
        .split(" and ")
        .map(|c| c.replace(' ', ""))
        .collect();
    assert_eq!(
        clauses,
        BTreeSet::from([
            format!("value.nomad_namespace==\"{}\"", daemon.namespace),
            format!("value.nomad_job_id==\"{}\"", daemon.job),
            format!("value.nomad_task==\"{}\"", daemon.task),
        ]),
        "{selector}"
    );

    let (_, policy) = daemon_nomad_policy(&tf);
    let job_acl = block(policy.body(), "job_acl").body();
    assert_eq!(
        resolve(attr(job_acl, "namespace"), &scope, "job_acl"),
        daemon.namespace
    );
    assert_eq!(
        resolve(attr(job_acl, "job_id"), &scope, "job_acl"),
        daemon.job
    );
    // Without group and task the policy is every task's of the job (Nomad's nomad/auth
    // policiesForWorkload matches only what job_acl names): a sidecar added to the daemon's job
    // would get the daemon's Nomad capabilities.
    let bound_to = |key| {
        optional_attr(job_acl, key)
            .map(|e| resolve(e, &scope, "job_acl"))
            .unwrap_or_else(|| panic!("job_acl names no {key}: the policy is every task's"))
    };
    assert_eq!(bound_to("group"), daemon.group);
    assert_eq!(bound_to("task"), daemon.task);
}

/// A task with a Consul workload identity gets its Consul token from Nomad, in its environment
/// as CONSUL_HTTP_TOKEN (hashicorp/nomad client/allocrunner/taskrunner/consul_hook.go, Nomad
/// 1.8 and later). A job file that sets the token or a token file itself either replaces
/// Nomad's token or, with CONSUL_HTTP_TOKEN_FILE, makes the daemon refuse to start ("set X or
/// X_FILE, not both"); the file the hook writes is root's and mode 0640 besides.
#[test]
fn a_task_with_a_consul_identity_takes_its_token_from_nomad_not_from_its_job_file() {
    const SET_BY_NOMAD: &[&str] = &[
        "CONSUL_HTTP_TOKEN",
        "CONSUL_HTTP_TOKEN_FILE",
        "CONSUL_TOKEN",
    ];
    let mut with_identity = Vec::new();
    for task in tasks().into_iter().filter(|t| t.consul_identity) {
        let what = format!("{} task {}", task.file, task.task);
        for env in blocks(&task.body, "env") {
            for name in env.body().attributes().map(|a| a.key()) {
                assert!(
                    !SET_BY_NOMAD.contains(&name),
                    "{what} sets {name}: Nomad's Consul hook sets CONSUL_HTTP_TOKEN"
                );
            }
        }
        // A template rendered into the environment could set them just the same.
        for body in templates(&task.body) {
            if optional_attr(body, "env").is_some_and(|e| matches!(e, Expression::Bool(true))) {
                let data = raw(attr(body, "data"));
                for name in SET_BY_NOMAD {
                    assert!(
                        !data.contains(&format!("{name}=")),
                        "{what}: an env template sets {name}"
                    );
                }
            }
        }
        with_identity.push(task.file.clone());
    }
    assert!(
        with_identity.iter().any(|f| f == DAEMON_JOB),
        "the daemon's task has no Consul identity: {with_identity:?}"
    );
}

/// Every path in every Vault policy is exact (no `*`, no `+`), under the KV v2 mount variable's
/// `data/`; the daemon's covers the App key and each repo's vaultPath, and no admin token.
#[test]
fn every_vault_policy_path_is_exact() {
    let tf = terraform();
    let scope = terraform_scope(&tf);
    let mount = &scope["var.vault_kv_mount"];
    let register = register_paths(&tf, &scope);
    let mut documents = 0;
    for document in blocks(&tf, "data")
        .into_iter()
        .filter(|b| label_text(&b.labels()[0]) == "vault_policy_document")
    {
        for instance in instances(document, &tf, &scope) {
            documents += 1;
            for path in policy_paths(document, &tf, &instance) {
                assert!(
                    !path.contains('*') && !path.contains('+'),
                    "a glob in a Vault policy: {path}"
                );
                assert!(path.starts_with(&format!("{mount}/data/")), "{path}");
            }
        }
    }
    assert!(documents >= 2);

    let daemon = vault_roles(&tf)
        .into_iter()
        .find(|r| r.name == "runner-scaler")
        .expect("the daemon's role");
    for path in &register {
        assert!(
            daemon.paths.iter().all(|p| p != path),
            "the daemon's policy reads the admin token at {path}"
        );
    }
    let app = format!("{mount}/data/{}", scope["var.github_app_vault_path"]);
    assert!(daemon.paths.contains(&app), "{:?}", daemon.paths);
    for (repo, fields) in document() {
        if let Some(path) = fields.get("vaultPath").and_then(|p| p.as_str()) {
            let path = format!("{mount}/data/{path}");
            assert!(
                daemon.paths.contains(&path),
                "{repo}: the daemon cannot read {path}"
            );
        }
    }
}

/// No value a variable names is written out elsewhere in `terraform/`: a changed variable
/// changes every place that uses it.
#[test]
fn terraform_names_no_value_a_variable_names() {
    let tf = terraform();
    let scope = terraform_scope(&tf);
    for entry in std::fs::read_dir(repo_path("terraform")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".tf") || name == "variables.tf" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        for variable in [
            "config_key",
            "pause_key",
            "leader_key",
            "state_key",
            "vault_jwt_backend_path",
            "consul_auth_method",
            "github_app_vault_path",
        ] {
            let value = &scope[&format!("var.{variable}")];
            assert!(
                !code.contains(&format!("\"{value}\"")) && !code.contains(&format!("\"{value}/")),
                "{name} writes out {value} instead of var.{variable}"
            );
        }
        let mount = &scope["var.vault_kv_mount"];
        assert!(
            !code.contains(&format!("\"{mount}/data")),
            "{name}: {mount}/data"
        );
        // A namespace's name may also be another thing's name (the daemon's role is called
        // runner-scaler too): it counts only where a namespace is meant.
        for variable in [
            "daemon_namespace",
            "runner_namespace",
            "vault_runner_namespace",
        ] {
            let value = &scope[&format!("var.{variable}")];
            for line in code.lines().filter(|l| l.contains("namespace")) {
                assert!(
                    !line.contains(&format!("\"{value}\"")),
                    "{name} writes out namespace {value} instead of var.{variable}: {line}"
                );
            }
        }
    }
}

/// Vault and Consul fetch Nomad's signing keys over HTTPS, checked against a CA variable; the
/// JWT backend and the auth method are created only when asked, under the names variables give.
#[test]
fn workload_identity_trust_is_https_and_optional() {
    let tf = terraform();
    let scope = terraform_scope(&tf);
    assert!(scope["var.nomad_jwks_url"].starts_with("https://"));
    let backend = resource(&tf, "vault_jwt_auth_backend", "nomad").body();
    assert_eq!(
        raw(attr(backend, "count")),
        "var.create_vault_jwt_backend ? 1 : 0"
    );
    assert_eq!(raw(attr(backend, "jwks_ca_pem")), "var.jwks_ca_pem");
    assert_eq!(raw(attr(backend, "path")), "var.vault_jwt_backend_path");
    let method = resource(&tf, "consul_acl_auth_method", "nomad_workloads").body();
    assert_eq!(
        raw(attr(method, "count")),
        "var.create_consul_auth_method ? 1 : 0"
    );
    let config = raw(attr(method, "config_json"));
    assert!(config.contains("JWKSCACert = var.jwks_ca_pem"), "{config}");
    for create in [
        "create_vault_jwt_backend",
        "create_consul_auth_method",
        "create_vault_kv_mount",
    ] {
        assert_eq!(scope[&format!("var.{create}")], "false", "{create}");
    }
}

/// The seed document is written only when asked, and never over a live one: a precondition
/// reads the key first, and the key outlives the resource (no `delete = true`).
#[test]
fn the_seed_document_never_overwrites_a_live_one() {
    let tf = terraform();
    let scope = terraform_scope(&tf);
    assert_eq!(scope["var.seed_config"], "false");
    let seeds: Vec<&Block> = blocks(&tf, "resource")
        .into_iter()
        .filter(|b| {
            let kind = label_text(&b.labels()[0]);
            kind == "consul_keys" || kind == "consul_key_prefix"
        })
        .collect();
    assert_eq!(seeds.len(), 1, "one seeding resource");
    let seed = seeds[0].body();
    assert_eq!(raw(attr(seed, "count")), "var.seed_config ? 1 : 0");
    let key = block(seed, "key").body();
    assert!(
        optional_attr(key, "delete").is_none_or(|d| raw(d) == "false"),
        "the key would be deleted with the resource"
    );
    let lifecycle = block(seed, "lifecycle").body();
    let precondition = block(lifecycle, "precondition").body();
    let condition = raw(attr(precondition, "condition"));
    assert!(
        condition.contains("data.consul_keys.") && condition.contains("== \"\""),
        "{condition}"
    );
    let live = labelled(&tf, "data", &["consul_keys", "live_config"]).body();
    let live_key = block(live, "key").body();
    assert_eq!(raw(attr(live_key, "path")), "var.config_key");
}

/// Every image a job file runs, its variables resolved, names a version tag or a digest: not
/// `latest`, not untagged.
#[test]
fn no_image_is_latest_or_untagged() {
    let mut seen = 0;
    for (file, body) in job_files() {
        let scope = job_scope(&body);
        let job = block(&body, "job");
        for group in blocks(job.body(), "group") {
            for task in blocks(group.body(), "task") {
                let config = block(task.body(), "config").body();
                seen += 1;
                // A required variable (no default) is checked by its validation instead:
                // the_daemons_image_is_required_and_must_be_pinned.
                let expr = attr(config, "image");
                if let Some(name) = raw(expr).strip_prefix("var.")
                    && !scope.contains_key(&format!("var.{name}"))
                {
                    let variable = labelled(&body, "variable", &[name]).body();
                    assert!(
                        !blocks(variable, "validation").is_empty(),
                        "{file}: var.{name}"
                    );
                    continue;
                }
                let image = resolve(expr, &scope, &file);
                assert_pinned(&image, &file);
            }
        }
    }
    assert!(seen >= 5, "only {seen} images");
}

fn assert_pinned(image: &str, what: &str) {
    if image.contains("@sha256:") {
        return;
    }
    let last = image.rsplit('/').next().unwrap();
    let (_, tag) = last
        .split_once(':')
        .unwrap_or_else(|| panic!("{what}: image {image} has no tag"));
    assert!(
        tag != "latest" && tag.chars().next().is_some_and(|c| c.is_ascii_digit()),
        "{what}: image {image} is not pinned to a version"
    );
}

/// The daemon's job: its own namespace, the runners' namespace by its own variable (Nomad sets
/// NOMAD_NAMESPACE to the task's own), the task API socket with the workload identity as token,
/// HTTPS addresses with CA bundles, a `disconnect` stop, and templates owned by the image's
/// user.
#[test]
fn the_daemons_job_uses_its_namespace_the_task_socket_and_tls() {
    let file = parse(DAEMON_JOB);
    let scope = job_scope(&file);
    let job = block(&file, "job").body();
    assert_eq!(
        resolve(attr(job, "namespace"), &scope, "namespace"),
        "runner-scaler"
    );
    let group = block(job, "group").body();
    let disconnect = block(group, "disconnect").body();
    assert!(!raw(attr(disconnect, "stop_on_client_after")).is_empty());
    let task = block(group, "task").body();
    assert!(matches!(
        attr(block(task, "identity").body(), "env"),
        Expression::Bool(true)
    ));

    let env: BTreeMap<String, String> = block(task, "env")
        .body()
        .attributes()
        .map(|a| (a.key().to_string(), resolve(a.expr(), &scope, a.key())))
        .collect();
    assert!(
        !env.contains_key("NOMAD_NAMESPACE"),
        "Nomad sets it to the daemon's own"
    );
    assert_eq!(env["RUNNER_SCALER_RUNNER_NAMESPACE"], "ci-runners");
    assert_eq!(env["NOMAD_ADDR"], "unix://${NOMAD_SECRETS_DIR}/api.sock");
    for (addr, ca) in [
        ("CONSUL_HTTP_ADDR", "CONSUL_CACERT"),
        ("VAULT_ADDR", "VAULT_CACERT"),
    ] {
        assert!(env[addr].starts_with("https://"), "{addr} = {}", env[addr]);
        assert!(!env[ca].is_empty(), "{ca}");
    }
    assert!(
        !env.keys().any(|k| k.ends_with("TOKEN")),
        "a token in the job spec"
    );

    let user: i64 = raw(attr(task, "user")).parse().expect("a numeric user");
    assert_eq!(user, dockerfile_user(), "the task runs as the image's user");
    let templates = templates(task);
    assert!(!templates.is_empty());
    for template in templates {
        for key in ["uid", "gid"] {
            assert_eq!(
                raw(attr(template, key)).parse::<i64>().ok(),
                Some(user),
                "a template's {key}"
            );
        }
    }
}

/// The vault-mode parent lives in the namespace its Vault role is bound to; the others in the
/// runners' namespace.
#[test]
fn runner_parents_live_in_the_namespaces_their_identities_expect() {
    let tf = terraform();
    let scope = terraform_scope(&tf);
    for task in tasks() {
        if task.file == DAEMON_JOB {
            continue;
        }
        let holds_vault = tasks()
            .iter()
            .any(|t| t.file == task.file && vault_role_of(t).is_some());
        let expected = if holds_vault {
            &scope["var.vault_runner_namespace"]
        } else {
            &scope["var.runner_namespace"]
        };
        assert_eq!(&task.namespace, expected, "{}", task.file);
    }
}

/// Nomad refuses to register a job in a node pool that does not exist ("job … is in
/// nonexistent node pool", hashicorp/nomad nomad/job_endpoint_hook_node_pool.go), and only a
/// client registering in it creates one: Terraform creates the pool every runner parent names.
#[test]
fn terraform_creates_the_node_pool_the_runner_parents_run_in() {
    let tf = terraform();
    let scope = terraform_scope(&tf);
    let pool = resource(&tf, "nomad_node_pool", "runners").body();
    assert_eq!(
        raw(attr(pool, "count")),
        "var.create_runner_node_pool ? 1 : 0"
    );
    assert_eq!(scope["var.create_runner_node_pool"], "true");
    let name = resolve(attr(pool, "name"), &scope, "node pool name");
    let mut parents = 0;
    for (file, body) in job_files() {
        if file == DAEMON_JOB {
            continue;
        }
        let job = block(&body, "job").body();
        let named = resolve(attr(job, "node_pool"), &job_scope(&body), &file);
        assert_eq!(
            named, name,
            "{file} runs in a pool Terraform does not create"
        );
        parents += 1;
    }
    assert!(parents >= 3, "only {parents} runner parents");
}

// ---- Dockerfile ----

struct Stage {
    base: String,
    name: Option<String>,
    instructions: Vec<(String, String)>,
}

/// The Dockerfile's stages, each with its instructions (continuation lines joined).
fn dockerfile() -> Vec<Stage> {
    dockerfile_at("Dockerfile")
}

/// The stages of the Dockerfile at `relative`.
fn dockerfile_at(relative: &str) -> Vec<Stage> {
    let text = read(relative);
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || trimmed.is_empty() {
            continue;
        }
        if let Some(part) = trimmed.strip_suffix('\\') {
            current.push_str(part);
            current.push(' ');
        } else {
            current.push_str(trimmed);
            logical.push(std::mem::take(&mut current));
        }
    }
    let mut stages: Vec<Stage> = Vec::new();
    for line in logical {
        let (op, args) = line.split_once(' ').unwrap_or((&line, ""));
        let op = op.to_ascii_uppercase();
        if op == "FROM" {
            let words: Vec<&str> = args.split_whitespace().collect();
            let name = match words.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some(name.to_string()),
                [_] => None,
                other => panic!("FROM {other:?}"),
            };
            stages.push(Stage {
                base: words[0].to_string(),
                name,
                instructions: Vec::new(),
            });
        } else {
            stages
                .last_mut()
                .expect("an instruction before FROM")
                .instructions
                .push((op, args.trim().to_string()));
        }
    }
    stages
}

fn instruction<'a>(stage: &'a Stage, op: &str) -> Vec<&'a str> {
    stage
        .instructions
        .iter()
        .filter(|(o, _)| o == op)
        .map(|(_, a)| a.as_str())
        .collect()
}

/// The numeric uid of the run stage's USER.
fn dockerfile_user() -> i64 {
    let stages = dockerfile();
    let users = instruction(stages.last().unwrap(), "USER");
    assert_eq!(users.len(), 1, "one USER in the run stage");
    let uid = users[0].split(':').next().unwrap();
    uid.parse()
        .unwrap_or_else(|_| panic!("USER {} is not numeric", users[0]))
}

/// The binary `cargo build --release` makes: the `[[bin]]` name if the manifest has one, else
/// the package name.
fn release_binary() -> String {
    let manifest = read("Cargo.toml");
    let mut section = String::new();
    let mut package = None;
    let mut bin = None;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        if let Some(value) = line.strip_prefix("name").map(str::trim_start)
            && let Some(value) = value.strip_prefix('=')
        {
            let value = value.trim().trim_matches('"').to_string();
            match section.as_str() {
                "[package]" => package = Some(value),
                "[[bin]]" if bin.is_none() => bin = Some(value),
                _ => {}
            }
        }
    }
    bin.or(package).expect("Cargo.toml names the package")
}

/// Two stages or more; the last runs on a base with no shell (distroless or scratch), as a
/// numeric non-root user, with an exec-form entrypoint; it copies exactly the binary
/// `cargo build --release` makes in the build stage; every base image is pinned.
#[test]
fn the_dockerfile_builds_the_release_binary_into_a_shell_less_non_root_image() {
    let stages = dockerfile();
    assert!(stages.len() >= 2, "a build stage and a run stage");
    for stage in &stages {
        // A base names a tag or a digest, never latest (distroless tags name a variant,
        // `nonroot`, not a version: a digest pins it further).
        if stage.base != "scratch" && !stage.base.contains("@sha256:") {
            let last = stage.base.rsplit('/').next().unwrap();
            let tag = last.split_once(':').map(|(_, t)| t);
            assert!(
                tag.is_some_and(|t| t != "latest"),
                "FROM {} is untagged or latest",
                stage.base
            );
        }
    }
    let run = stages.last().unwrap();
    assert!(
        run.base == "scratch" || run.base.starts_with("gcr.io/distroless/"),
        "the run stage's base {} may carry a shell",
        run.base
    );
    assert!(
        instruction(run, "RUN").is_empty(),
        "RUN in the run stage needs a shell"
    );
    let uid = dockerfile_user();
    assert!(uid > 0, "USER {uid} is root");
    for entry in instruction(run, "ENTRYPOINT") {
        assert!(
            entry.starts_with('['),
            "ENTRYPOINT {entry}: exec form, no shell"
        );
    }

    let binary = release_binary();
    assert_eq!(binary, "runner-scaler");
    let copies: Vec<&str> = instruction(run, "COPY")
        .into_iter()
        .filter(|c| c.starts_with("--from="))
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    let words: Vec<&str> = copies[0].split_whitespace().collect();
    let from = words[0].strip_prefix("--from=").unwrap();
    let build = stages
        .iter()
        .find(|s| s.name.as_deref() == Some(from))
        .unwrap_or_else(|| panic!("COPY --from={from}: no such stage"));
    let workdir = instruction(build, "WORKDIR");
    let workdir = workdir.last().expect("the build stage sets WORKDIR");
    let builds = instruction(build, "RUN");
    assert!(
        builds
            .iter()
            .any(|r| r.contains("cargo build") && r.contains("--release")),
        "{builds:?}"
    );
    assert_eq!(
        Path::new(words[1]),
        Path::new(workdir).join("target/release").join(&binary),
        "the binary copied is not the one cargo build --release makes"
    );
}

/// The image is the daemon alone: built without default features, so neither the simulator
/// nor tokio's `test-util` (which lets a paused clock stand still) is in it.
#[test]
fn the_image_builds_the_daemon_without_the_simulator() {
    let stages = dockerfile();
    let builds: Vec<&str> = stages
        .iter()
        .flat_map(|stage| instruction(stage, "RUN"))
        .filter(|r| r.contains("cargo build"))
        .collect();
    assert_eq!(builds.len(), 1, "{builds:?}");
    assert!(builds[0].contains("--no-default-features"), "{builds:?}");
    // The manifest's sections, by their headers: what the daemon depends on, and the features.
    let manifest = read("Cargo.toml");
    let section = |header: &str| -> Vec<&str> {
        manifest
            .lines()
            .skip_while(|l| l.trim() != header)
            .skip(1)
            .take_while(|l| !l.starts_with('['))
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect()
    };
    let tokio: Vec<&str> = section("[dependencies]")
        .into_iter()
        .filter(|l| l.starts_with("tokio "))
        .collect();
    assert_eq!(tokio.len(), 1, "{tokio:?}");
    assert!(!tokio[0].contains("test-util"), "{tokio:?}");
    let features = section("[features]");
    assert!(
        features.contains(&"sim = [\"tokio/test-util\"]"),
        "{features:?}"
    );
}

/// openssl-sys (consulrs → reqwest 0.11 → native-tls) compiles against the system OpenSSL: its
/// build script needs pkg-config and libssl-dev's headers, which the `-slim` Rust images lack.
/// Whenever Cargo.lock has it, the build stage installs both before it runs `cargo build`.
#[test]
fn the_build_stage_installs_what_openssl_sys_builds_against() {
    let lock = read("Cargo.lock");
    if !lock.lines().any(|l| l.trim() == "name = \"openssl-sys\"") {
        return;
    }
    let stages = dockerfile();
    let run = stages.last().unwrap();
    let copy = instruction(run, "COPY")
        .into_iter()
        .find(|c| c.starts_with("--from="))
        .expect("the run stage copies the binary");
    let from = copy.split_whitespace().next().unwrap();
    let from = from.strip_prefix("--from=").unwrap();
    let build = stages
        .iter()
        .find(|s| s.name.as_deref() == Some(from))
        .unwrap_or_else(|| panic!("COPY --from={from}: no such stage"));
    let runs: Vec<&str> = instruction(build, "RUN");
    let cargo = runs
        .iter()
        .position(|r| r.contains("cargo build"))
        .expect("the build stage runs cargo build");
    let installs = runs[..cargo].iter().any(|r| {
        let words: Vec<&str> = r.split_whitespace().collect();
        r.contains("apt-get install")
            && words.contains(&"pkg-config")
            && words.contains(&"libssl-dev")
    });
    assert!(
        installs,
        "Cargo.lock has openssl-sys, but the build stage ({}) installs no pkg-config and \
         libssl-dev before cargo build: {runs:?}",
        build.base
    );
}

// ---- Consul logins of tasks with templates (Nomad 1.8 and 1.9) ----

/// `value.<claim>=="<v>"` clauses joined by ` and `, alternatives by ` or `: the only selector
/// form the shipped binding rules use. Anything else fails the test rather than guess.
fn selector_matches(selector: &str, claims: &BTreeMap<&str, String>) -> bool {
    selector.split(" or ").any(|alternative| {
        alternative.split(" and ").all(|clause| {
            let (lhs, rhs) = clause
                .split_once("==")
                .unwrap_or_else(|| panic!("selector clause {clause:?} is not value.x==\"y\""));
            let claim = lhs
                .trim()
                .strip_prefix("value.")
                .unwrap_or_else(|| panic!("selector clause {clause:?} reads no value.<claim>"));
            let wanted = rhs.trim();
            assert!(
                wanted.len() >= 2 && wanted.starts_with('"') && wanted.ends_with('"'),
                "selector clause {clause:?}"
            );
            claims.get(claim).map(String::as_str) == Some(&wanted[1..wanted.len() - 1])
        })
    })
}

/// Nomad 1.8 and 1.9 give every task that has a template an implicit Consul workload identity
/// once the servers set `consul { task_identity }` (hashicorp/nomad
/// nomad/job_endpoint_hook_implicit_identities.go at v1.8.0 and v1.9.0; dropped in 1.10,
/// hashicorp/nomad#25298), and the client logs each in before any task starts
/// (client/allocrunner/consul_hook.go). A login that no binding rule gives a role is refused
/// (Consul agent/consul/auth/binder.go) and the allocation fails with "failed to derive Consul
/// token". So every such task, in every job file, is matched by a binding rule whose role
/// Terraform creates; a runner's roles grant nothing (no policy, no identity).
#[test]
fn every_task_nomad_1_8_logs_in_to_consul_gets_a_role_and_runners_get_one_that_grants_nothing() {
    let tf = terraform();
    let scope = terraform_scope(&tf);
    let mut rules = Vec::new();
    for rule in blocks(&tf, "resource")
        .into_iter()
        .filter(|b| label_text(&b.labels()[0]) == "consul_acl_binding_rule")
    {
        let body = rule.body();
        assert_eq!(raw(attr(body, "bind_type")), "role");
        assert_eq!(raw(attr(body, "auth_method")), "local.consul_auth_method");
        let role = resource(
            &tf,
            "consul_acl_role",
            &referenced(&raw(attr(body, "bind_name")), "consul_acl_role."),
        );
        let role = role.body();
        let grants = optional_attr(role, "policies").is_some_and(|p| !strings(p).is_empty())
            || ["service_identities", "node_identities", "templated_policy"]
                .iter()
                .any(|b| !blocks(role, b).is_empty());
        let selector = resolve(attr(body, "selector"), &scope, "selector");
        rules.push((label_text(&rule.labels()[1]).to_string(), selector, grants));
    }

    let mut runners = 0;
    for task in tasks() {
        let logs_in = !templates(&task.body).is_empty() || task.consul_identity;
        if !logs_in {
            continue;
        }
        let claims = BTreeMap::from([
            ("nomad_namespace", task.namespace.clone()),
            ("nomad_job_id", task.job.clone()),
            ("nomad_task", task.task.clone()),
        ]);
        let matching: Vec<&(String, String, bool)> = rules
            .iter()
            .filter(|(_, selector, _)| selector_matches(selector, &claims))
            .collect();
        let what = format!("{} task {}", task.file, task.task);
        assert!(
            !matching.is_empty(),
            "{what}: no binding rule matches {claims:?}: on Nomad 1.8 and 1.9 its allocation \
             fails with \"failed to derive Consul token\""
        );
        if task.file == DAEMON_JOB {
            assert!(matching.iter().any(|(_, _, grants)| *grants), "{what}");
        } else {
            runners += 1;
            for (name, selector, grants) in matching {
                assert!(
                    !grants,
                    "{what}: binding rule {name} ({selector}) gives a runner a role that grants"
                );
            }
        }
    }
    assert!(runners >= 4, "only {runners} runner tasks with templates");
}

// ---- runners and Vault ----

/// A runner unwraps its credential at VAULT_ADDR from inside its container, whose resolver is
/// not the host's loopback one: the address is a job variable with the name and default of
/// the daemon's (one -var serves both), and the container's DNS servers are a variable too
/// (the Docker driver's dns_servers).
#[test]
fn runners_unwrap_at_the_daemons_vault_addr_through_dns_servers_the_operator_chooses() {
    let daemon = job_scope(&parse(DAEMON_JOB));
    let mut checked = 0;
    for (file, body) in job_files() {
        if file == DAEMON_JOB {
            continue;
        }
        let scope = job_scope(&body);
        let job = block(&body, "job").body();
        for group in blocks(job, "group") {
            for task in blocks(group.body(), "task") {
                let Some(addr) = blocks(task.body(), "env")
                    .first()
                    .and_then(|env| optional_attr(env.body(), "VAULT_ADDR"))
                else {
                    continue;
                };
                let what = format!("{file} task {}", label_text(&task.labels()[0]));
                assert_eq!(raw(addr), "var.vault_addr", "{what}: VAULT_ADDR");
                assert_eq!(
                    scope["var.vault_addr"], daemon["var.vault_addr"],
                    "{what}: vault_addr's default differs from the daemon's"
                );
                let config = block(task.body(), "config").body();
                assert_eq!(
                    raw(attr(config, "dns_servers")),
                    "var.dns_servers",
                    "{what}"
                );
                let dns = labelled(&body, "variable", &["dns_servers"]).body();
                assert_eq!(raw(attr(dns, "type")), "list(string)", "{what}");
                assert!(strings(attr(dns, "default")).is_empty(), "{what}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 2, "only {checked} runner tasks unwrap at Vault");
    let readme = read("README.md");
    assert!(
        readme.contains("dns_servers") && readme.contains("-var vault_addr="),
        "the README does not say how a runner resolves vault_addr"
    );
}

// ---- runner images ----

/// The Forgejo runner job registers its labels as `<label>:host`, so steps run in its own
/// container, and act starts a JavaScript action with the `node` on that PATH
/// (pkg/runner/run_context.go GetNodeToolFullPath): Forgejo's image has none. The shipped
/// nomad/runner/forgejo-runner.Dockerfile adds it (and curl) to the job file's own default
/// image, and runs as the task's user; the job takes it through its image variable.
#[test]
fn the_forgejo_runner_image_for_uses_actions_adds_node_to_the_job_files_image() {
    let file = "nomad/forgejo-runner.nomad.hcl";
    let body = parse(file);
    let scope = job_scope(&body);
    let job = block(&body, "job").body();
    let task = labelled(
        labelled(job, "group", &["runner"]).body(),
        "task",
        &["runner"],
    )
    .body();
    let config = block(task, "config").body();
    assert_eq!(raw(attr(config, "image")), "var.image", "{file}");

    let stages = dockerfile_at("nomad/runner/forgejo-runner.Dockerfile");
    assert_eq!(stages.len(), 1);
    let stage = &stages[0];
    assert_eq!(
        stage.base, scope["var.image"],
        "the Dockerfile's base and the job's default image move together"
    );
    let installs = instruction(stage, "RUN").into_iter().any(|r| {
        let words: Vec<&str> = r.split_whitespace().collect();
        r.contains("apk add") && words.contains(&"nodejs") && words.contains(&"curl")
    });
    assert!(installs, "the image installs no nodejs and curl");
    let users = instruction(stage, "USER");
    let last = users.last().expect("a USER").split(':').next().unwrap();
    assert_eq!(
        last,
        raw(attr(task, "user")),
        "the image ends as the task's user"
    );
    // The entrypoint still turns bare labels into host labels: no docker:// label, which would
    // need a Docker daemon.
    let entrypoint = read("nomad/runner/entrypoint.sh");
    assert!(entrypoint.contains(r#"[[ $label == *:* ]] || label="$label:host""#));
}

/// The actions-runner image gives its user passwordless sudo, so a workflow step can become
/// root and read what the entrypoint keeps from other uids. A `no_new_privileges` job
/// variable (off by default: `sudo apt-get` keeps working) sets Docker's no-new-privileges on
/// the GitHub runner tasks (the Docker driver's `security_opt`); the vault-mode mint task,
/// which holds the admin token and needs no sudo, always has it.
#[test]
fn runner_steps_can_be_kept_from_gaining_privileges() {
    for file in [
        "nomad/ci-runner.nomad.hcl",
        "nomad/github-runner-vault.nomad.hcl",
    ] {
        let body = parse(file);
        let variable = labelled(&body, "variable", &["no_new_privileges"]).body();
        assert_eq!(raw(attr(variable, "type")), "bool", "{file}");
        assert!(
            matches!(attr(variable, "default"), Expression::Bool(false)),
            "{file}: no_new_privileges must default to false"
        );
        let job = block(&body, "job").body();
        let group = labelled(job, "group", &["runner"]).body();
        let runner = labelled(group, "task", &["runner"]).body();
        let option = attr(block(runner, "config").body(), "security_opt");
        let Expression::Conditional(conditional) = option else {
            panic!("{file}: security_opt is not var.no_new_privileges ? … : …: {option:?}");
        };
        assert_eq!(
            raw(&conditional.cond_expr),
            "var.no_new_privileges",
            "{file}"
        );
        assert_eq!(
            strings(&conditional.true_expr),
            ["no-new-privileges"],
            "{file}"
        );
        assert!(strings(&conditional.false_expr).is_empty(), "{file}");
        if let Some(mint) = blocks(group, "task")
            .into_iter()
            .find(|t| label_text(&t.labels()[0]) == "mint")
        {
            let option = attr(block(mint.body(), "config").body(), "security_opt");
            assert_eq!(
                strings(option),
                ["no-new-privileges"],
                "{file}: the mint task"
            );
        }
    }
    assert!(read("README.md").contains("no_new_privileges"));
}

// ---- names the job files share with Terraform ----

/// Every name a job file shares with Terraform is a job variable whose default is Terraform's
/// (so one changed name is a -var on each side, and the defaults cannot drift apart), and the
/// file uses the variable where the name matters.
#[test]
fn job_variables_that_mirror_terraform_variables_have_its_defaults() {
    let tf = terraform();
    let terraform = terraform_scope(&tf);
    let mirrored: &[(&str, &[(&str, &str)])] = &[
        (
            DAEMON_JOB,
            &[
                ("namespace", "daemon_namespace"),
                ("job_id", "daemon_job_id"),
                ("runner_namespace", "runner_namespace"),
                ("vault_role", "daemon_vault_role"),
                ("vault_mount", "vault_kv_mount"),
                ("github_app_vault_path", "github_app_vault_path"),
                ("config_key", "config_key"),
                ("pause_key", "pause_key"),
                ("leader_key", "leader_key"),
                ("state_key", "state_key"),
            ],
        ),
        (
            "nomad/ci-runner.nomad.hcl",
            &[
                ("namespace", "runner_namespace"),
                ("node_pool", "runner_node_pool"),
            ],
        ),
        (
            "nomad/forgejo-runner.nomad.hcl",
            &[
                ("namespace", "runner_namespace"),
                ("node_pool", "runner_node_pool"),
            ],
        ),
        (
            "nomad/github-runner-vault.nomad.hcl",
            &[
                ("namespace", "vault_runner_namespace"),
                ("node_pool", "runner_node_pool"),
                ("vault_mount", "vault_kv_mount"),
            ],
        ),
    ];
    for (file, pairs) in mirrored {
        let scope = job_scope(&parse(file));
        for (job_var, tf_var) in *pairs {
            assert_eq!(
                scope.get(&format!("var.{job_var}")),
                terraform.get(&format!("var.{tf_var}")),
                "{file}: var.{job_var} and terraform var.{tf_var}"
            );
        }
    }

    // The vault-mode parent mirrors its entry of vault_mode_runners: the key is its role.
    let file = "nomad/github-runner-vault.nomad.hcl";
    let scope = job_scope(&parse(file));
    let defaults = variable_defaults(&tf);
    let entries = object_entries(&defaults["vault_mode_runners"]);
    let (_, entry) = entries
        .iter()
        .find(|(key, _)| *key == scope["var.vault_role"])
        .unwrap_or_else(|| panic!("{file}: no vault_mode_runners entry for its vault_role"));
    let entry: BTreeMap<String, String> = object_entries(entry)
        .into_iter()
        .map(|(k, v)| (k, raw(v)))
        .collect();
    assert_eq!(scope["var.job_id"], entry["job_id"], "{file}");
    assert_eq!(
        scope["var.register_vault_path"], entry["register_path"],
        "{file}"
    );

    // Where the names are used.
    let daemon = parse(DAEMON_JOB);
    let job = block(&daemon, "job").body();
    assert_eq!(raw(attr(job, "id")), "var.job_id");
    let task = block(block(job, "group").body(), "task").body();
    assert_eq!(
        raw(attr(block(task, "vault").body(), "role")),
        "var.vault_role"
    );
    let env = block(task, "env").body();
    for (name, variable) in [
        ("RUNNER_SCALER_CONFIG_KEY", "var.config_key"),
        ("RUNNER_SCALER_PAUSE_KEY", "var.pause_key"),
        ("RUNNER_SCALER_LEADER_KEY", "var.leader_key"),
        ("RUNNER_SCALER_STATE_KEY", "var.state_key"),
        ("VAULT_MOUNT", "var.vault_mount"),
    ] {
        assert_eq!(raw(attr(env, name)), variable, "{DAEMON_JOB}: {name}");
    }
    let vault_mode = parse(file);
    let job = block(&vault_mode, "job").body();
    assert_eq!(raw(attr(job, "id")), "var.job_id");
    let mint = labelled(
        labelled(job, "group", &["runner"]).body(),
        "task",
        &["mint"],
    )
    .body();
    assert_eq!(
        raw(attr(block(mint, "vault").body(), "role")),
        "var.vault_role"
    );
    let secret_read = templates(mint).into_iter().any(|t| {
        raw(attr(t, "data")).contains("${var.vault_mount}/data/${var.register_vault_path}")
    });
    assert!(
        secret_read,
        "{file}: the admin token's path is not built from the variables"
    );
    for (file, body) in job_files() {
        let job = block(&body, "job").body();
        assert_eq!(raw(attr(job, "namespace")), "var.namespace", "{file}");
        if file != DAEMON_JOB {
            assert_eq!(raw(attr(job, "node_pool")), "var.node_pool", "{file}");
        }
    }
}

// ---- the daemon's job ----

/// Each CA template of the daemon's job can be turned off (a `dynamic "template"` over a bool
/// variable, on by default), reads the Variable of the job's own id, and fails on a missing
/// key (error_on_missing_key) instead of writing an empty file the daemon would then refuse.
#[test]
fn the_daemons_ca_templates_are_optional_and_fail_on_a_missing_key() {
    let body = parse(DAEMON_JOB);
    let scope = job_scope(&body);
    let job = block(&body, "job").body();
    let task = block(block(job, "group").body(), "task").body();
    for (key, switch, destination) in [
        ("consul_ca", "render_consul_ca", "local/ca/consul.pem"),
        ("vault_ca", "render_vault_ca", "local/ca/vault.pem"),
    ] {
        assert!(
            blocks(task, "template")
                .iter()
                .all(|t| raw(attr(t.body(), "destination")) != destination),
            "{destination} is rendered by a template that cannot be turned off"
        );
        let dynamic = blocks(task, "dynamic")
            .into_iter()
            .find(|d| {
                label_text(&d.labels()[0]) == "template"
                    && raw(attr(block(d.body(), "content").body(), "destination")) == destination
            })
            .unwrap_or_else(|| panic!("no dynamic template renders {destination}"));
        assert_eq!(
            raw(attr(dynamic.body(), "for_each")),
            format!("var.{switch} ? [\"{key}\"] : []")
        );
        assert_eq!(scope[&format!("var.{switch}")], "true", "{switch}");
        let content = block(dynamic.body(), "content").body();
        assert!(
            matches!(
                attr(content, "error_on_missing_key"),
                Expression::Bool(true)
            ),
            "{destination}: a missing {key} would render an empty file"
        );
        let data = raw(attr(content, "data"));
        assert!(data.contains(&format!(".{key}")), "{data}");
        assert!(
            data.contains(r#"nomadVar (printf "nomad/jobs/%s" (env "NOMAD_JOB_ID"))"#),
            "{destination}: the Variable's path does not follow the job id: {data}"
        );
    }
}

/// The daemon's image has no default (no published image is built from this checkout): the
/// operator names the one the README's image section builds, and the variable's validation
/// refuses `latest` and untagged names; the README's build tags a version.
#[test]
fn the_daemons_image_is_required_and_must_be_pinned() {
    let body = parse(DAEMON_JOB);
    let image = labelled(&body, "variable", &["image"]).body();
    assert!(
        optional_attr(image, "default").is_none(),
        "a default image nothing builds"
    );
    let condition = raw(attr(block(image, "validation").body(), "condition"));
    assert!(
        condition.contains("var.image") && condition.contains("@sha256:"),
        "{condition}"
    );
    let readme = read("README.md");
    let section = readme_section(&readme, "### The image");
    let tag = section
        .lines()
        .find_map(|l| l.trim().strip_prefix("docker build -t "))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the image section builds with docker build -t");
    assert_pinned(tag, "README's image section");
}

/// The README section that starts at `heading`, up to the next heading of its level or above.
fn readme_section<'a>(readme: &'a str, heading: &str) -> &'a str {
    let start = readme
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("the README has no {heading}"))
        + 1;
    let level = heading.split(' ').next().unwrap().len();
    let rest = &readme[start + heading.len()..];
    let mut end = rest.len();
    let mut offset = 0;
    let mut fenced = false;
    for line in rest.split_inclusive('\n') {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !fenced && hashes > 0 && hashes <= level && line[hashes..].starts_with(' ') {
            end = offset;
            break;
        }
        offset += line.len();
    }
    &readme[start..start + heading.len() + end]
}

/// The README runs the daemon's job only after what it needs exists: Terraform's namespaces
/// and roles and the CA Variable (deploy steps 2 and 3), never in the image section, which
/// comes first.
#[test]
fn the_readme_runs_the_daemons_job_only_after_what_it_needs() {
    let readme = read("README.md");
    let image = readme_section(&readme, "### The image");
    assert!(
        !image.contains("nomad job run"),
        "the image section runs a job before the namespaces exist: {image}"
    );
    let deploy = readme_section(&readme, "## Deploying on a real cluster");
    // Each command with its `\`-continued lines, at the offset where it starts.
    let mut commands: Vec<(usize, String)> = Vec::new();
    let mut offset = 0;
    let mut continued = false;
    for line in deploy.split_inclusive('\n') {
        let text = line.trim().trim_end_matches('\\').trim().to_string();
        if continued {
            let last = commands.last_mut().unwrap();
            last.1.push(' ');
            last.1.push_str(&text);
        } else {
            commands.push((offset, text));
        }
        continued = line.trim_end().ends_with('\\');
        offset += line.len();
    }
    let (run, command) = commands
        .iter()
        .find(|(_, c)| c.contains("nomad job run") && c.contains("nomad/runner-scaler.nomad.hcl"))
        .expect("the deploy steps run the daemon's job");
    for needed in ["terraform apply", "nomad var put -namespace runner-scaler"] {
        let at = deploy
            .find(needed)
            .unwrap_or_else(|| panic!("the deploy steps never say {needed}"));
        assert!(at < *run, "the daemon's job runs before `{needed}`");
    }
    for var in [
        "-var image=",
        "daemon_nodes=",
        "terraform -chdir=terraform output -json daemon_nodes",
    ] {
        assert!(command.contains(var), "{command}: no {var}");
    }
}

/// The README names the address the daemon's job listens on, not another one.
#[test]
fn the_readme_names_the_listen_address_the_daemons_job_uses() {
    let body = parse(DAEMON_JOB);
    let job = block(&body, "job").body();
    let task = block(block(job, "group").body(), "task").body();
    let listen = raw(attr(block(task, "env").body(), "RUNNER_SCALER_LISTEN"));
    let readme = read("README.md");
    let metrics = readme_section(&readme, "## Metrics and health");
    assert!(
        metrics.contains(&format!("`{listen}`")),
        "the metrics section does not name {listen}"
    );
    assert!(
        !readme.contains("0.0.0.0:${NOMAD_PORT_http}"),
        "the README names a listen address the job does not use"
    );
}

/// The default JWKS URL names a host that `nomad tls cert create -server` puts in every server
/// certificate (server.<region>.nomad, server.global.nomad, localhost and 127.0.0.1: hashicorp/
/// nomad command/tls_cert_create.go, recordPreparation), and not loopback (the fetch comes from
/// Vault's and Consul's servers).
#[test]
fn the_default_jwks_url_names_a_host_nomads_server_certificates_carry() {
    let tf = terraform();
    let scope = terraform_scope(&tf);
    let url = &scope["var.nomad_jwks_url"];
    let host = url
        .strip_prefix("https://")
        .and_then(|rest| rest.split([':', '/']).next())
        .unwrap_or_else(|| panic!("{url}"));
    assert_eq!(host, "server.global.nomad", "{url}");
    assert!(url.ends_with("/.well-known/jwks.json"), "{url}");
    let example = read("terraform/terraform.tfvars.example");
    assert!(
        example.contains(url.as_str()),
        "the example names another JWKS URL"
    );
}

/// Prometheus finds the daemon through Nomad's own service catalogue (the job's service has
/// provider = "nomad"): the README's scrape config uses nomad_sd_configs in the daemon's
/// namespace and keeps the job's service.
#[test]
fn the_readme_scrapes_the_daemon_through_nomad_service_discovery() {
    let body = parse(DAEMON_JOB);
    let scope = job_scope(&body);
    let job = block(&body, "job").body();
    let service = block(block(job, "group").body(), "service").body();
    assert_eq!(raw(attr(service, "provider")), "nomad");
    let name = raw(attr(service, "name"));

    let readme = read("README.md");
    let metrics = readme_section(&readme, "## Metrics and health");
    let yaml = metrics
        .split("```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the metrics section has a yaml block");
    let config: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).expect("the block is YAML");
    let scrape = &config["scrape_configs"][0];
    let sd = &scrape["nomad_sd_configs"][0];
    assert_eq!(
        sd["namespace"].as_str(),
        Some(scope["var.namespace"].as_str()),
        "{yaml}"
    );
    assert!(
        sd["server"]
            .as_str()
            .is_some_and(|s| s.starts_with("https://"))
    );
    let keeps = scrape["relabel_configs"]
        .as_sequence()
        .expect("relabel_configs")
        .iter()
        .any(|r| {
            r["action"].as_str() == Some("keep")
                && r["source_labels"][0].as_str() == Some("__meta_nomad_service")
                && r["regex"].as_str() == Some(name.as_str())
        });
    assert!(
        keeps,
        "the scrape config does not keep the {name} service: {yaml}"
    );
}

/// The capabilities of a Nomad rule's `capabilities = [...]` list written as a string.
fn capability_list(quoted: &str) -> Vec<String> {
    let body = parse_text(&format!("capabilities = [{quoted}]"), "capabilities");
    strings(attr(&body, "capabilities"))
}

#[test]
fn vault_children_cleanup_grants_purge_job_and_nothing_that_registers_a_job() {
    let tf = terraform();
    let local = blocks(&tf, "locals")
        .into_iter()
        .flat_map(|l| l.body().attributes())
        .find(|a| a.key() == "vault_runner_capabilities")
        .expect("local.vault_runner_capabilities")
        .expr()
        .clone();
    let Expression::Conditional(conditional) = local else {
        panic!("vault_runner_capabilities is not conditional on the setting");
    };
    assert_eq!(
        raw(&conditional.cond_expr).trim(),
        "var.nomad_vault_children_cleanup"
    );
    let on = capability_list(&raw(&conditional.true_expr));
    let off = capability_list(&raw(&conditional.false_expr));
    assert!(on.contains(&"purge-job".to_string()), "{on:?}");
    assert!(!off.contains(&"purge-job".to_string()), "{off:?}");
    for capability in ["submit-job", "register-job", "revert-job", "write"] {
        assert!(
            !on.contains(&capability.to_string()),
            "{capability} in {on:?}"
        );
    }
    // Off by default, in Terraform and in the daemon's job, which passes its setting on.
    let defaults = variable_defaults(&tf);
    assert_eq!(raw(&defaults["nomad_vault_children_cleanup"]), "false");
    let job = read("nomad/runner-scaler.nomad.hcl");
    assert!(
        job.contains("RUNNER_SCALER_VAULT_CHILDREN_CLEANUP = var.vault_children_cleanup"),
        "the daemon's job does not pass vault_children_cleanup"
    );
}

#[test]
fn daemon_secret_paths_refuses_globs_and_any_admin_tokens_path() {
    let tf = terraform();
    let variable = labelled(&tf, "variable", &["daemon_secret_paths"]);
    let condition = raw(attr(
        block(variable.body(), "validation").body(),
        "condition",
    ));
    let pattern = condition
        .split("regex(\"")
        .nth(1)
        .and_then(|rest| rest.split("\",").next())
        .expect("the validation holds each path against a regex")
        .replace("\\\\", "\\");
    let pattern = regex::Regex::new(&pattern).expect("an RE2-compatible pattern");
    for exact in ["github/moat-poll", "forgejo/scaler", "a/b.c/d_e-f"] {
        assert!(pattern.is_match(exact), "{exact} refused");
    }
    for glob in [
        "github/*",
        "github/+/x",
        "*",
        "/github/x",
        "github/",
        "github//x",
        "",
    ] {
        assert!(!pattern.is_match(glob), "{glob:?} accepted");
    }
    for segment in ["\"..\"", "\".\""] {
        assert!(
            condition.contains(segment),
            "no check of {segment} segments"
        );
    }
    // A daemon path that is a vault-mode runner's register_path fails the plan.
    let policy = resource(&tf, "vault_policy", "runner_scaler");
    let precondition = block(block(policy.body(), "lifecycle").body(), "precondition");
    let check = raw(attr(precondition.body(), "condition"));
    assert!(
        check.contains("var.daemon_secret_paths")
            && check.contains("register_path")
            && check.contains("setintersection"),
        "{check}"
    );
}

#[test]
fn the_daemons_job_off_loopback_reads_a_listen_token_only_it_can_read() {
    let file = parse(DAEMON_JOB);
    let scope = job_scope(&file);
    let job = block(&file, "job").body();
    let task = block(block(job, "group").body(), "task").body();
    let env: BTreeMap<String, String> = block(task, "env")
        .body()
        .attributes()
        .map(|a| (a.key().to_string(), resolve(a.expr(), &scope, a.key())))
        .collect();
    // Not loopback: the daemon refuses to start without the token (exit 64).
    assert!(!env["RUNNER_SCALER_LISTEN"].starts_with("127."));
    let token_file = env
        .get("RUNNER_SCALER_LISTEN_TOKEN_FILE")
        .expect("the job names the listen token's file");
    let in_secrets = token_file
        .strip_prefix("${NOMAD_SECRETS_DIR}/")
        .expect("the token's file is in the task's secrets directory");
    let rendered = templates(task)
        .into_iter()
        .find(|t| raw(attr(t, "destination")) == format!("secrets/{in_secrets}"))
        .expect("a template renders the listen token's file");
    assert!(raw(attr(rendered, "destination")).starts_with("secrets/"));
    assert_eq!(raw(attr(rendered, "perms")), "0400");
    assert!(matches!(
        attr(rendered, "error_on_missing_key"),
        Expression::Bool(true)
    ));
    assert!(raw(attr(rendered, "data")).contains(".listen_token"));

    // The README puts the key in the Variable and has Prometheus present the token.
    let readme = read("README.md");
    assert!(
        readme.contains("listen_token=@"),
        "deploy step 3 writes no listen_token"
    );
    let metrics = readme_section(&readme, "## Metrics and health");
    let yaml = metrics
        .split("```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the metrics section has a yaml block");
    let config: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).expect("the block is YAML");
    assert!(
        config["scrape_configs"][0]["authorization"]["credentials_file"]
            .as_str()
            .is_some(),
        "{yaml}"
    );
}
