//! Raw JSON → validated [`Config`], reporting every problem at once.
//!
//! serde's derive stops at the first problem and silently keeps the last of two duplicate
//! keys, so the document is first read into [`Json`], a tree that keeps every key in the order
//! written (duplicates included), and then checked by hand. Each problem names the repo as
//! written and the path of the field inside it (`profiles[1].maxConcurrent`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use url::Url;

use super::{
    Config, ConfigDefaults, CredentialKind, DEFAULT_RUNNER_GROUP_ID, Mode, Profile, RepoConfig,
};
use crate::model::{RepoName, is_valid_label};

/// One problem in the document, naming the repo and the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.render())]
pub struct ConfigError {
    /// The repo key as written in the document; `None` for problems of the whole document.
    pub repo: Option<String>,
    /// The field path inside the repo, e.g. `profiles[1].maxConcurrent`.
    pub field: Option<String>,
    pub message: String,
}

impl ConfigError {
    fn render(&self) -> String {
        match (&self.repo, &self.field) {
            (Some(repo), Some(field)) => format!("{repo}: {field}: {}", self.message),
            (Some(repo), None) => format!("{repo}: {}", self.message),
            (None, _) => self.message.clone(),
        }
    }

    fn document(message: impl Into<String>) -> ConfigError {
        ConfigError {
            repo: None,
            field: None,
            message: message.into(),
        }
    }
}

/// Longest Nomad job id accepted. Nomad itself allows more, but a parent's id becomes part of
/// every child id (`<parent>/dispatch-<unix>-<8 hex>`) and of runner names; 128 is ample.
pub const JOB_ID_LEN_MAX: usize = 128;

/// Parses and validates the whole document, reporting every problem at once.
pub fn parse_document(bytes: &[u8], defaults: &ConfigDefaults) -> Result<Config, Vec<ConfigError>> {
    let tree: Json = serde_json::from_slice(bytes).map_err(|e| {
        vec![ConfigError::document(format!(
            "invalid JSON at line {} column {}: {}",
            e.line(),
            e.column(),
            json_error_cause(&e)
        ))]
    })?;
    let Json::Object(entries) = tree else {
        return Err(vec![ConfigError::document(format!(
            "the document must be a JSON object keyed by repo (owner/name), found {}",
            tree.kind()
        ))]);
    };

    let mut errors = Vec::new();
    let mut repos = BTreeMap::new();
    // Repo keys compare case-insensitively: remember the first spelling of each.
    let mut seen: BTreeMap<RepoName, &str> = BTreeMap::new();
    for (key, value) in &entries {
        let mut report = Report {
            repo: key,
            errors: &mut errors,
        };
        let name = RepoName::parse(key);
        match &name {
            None => report.whole("not a valid repo name: expected owner/name".to_string()),
            Some(name) => {
                if let Some(first) = seen.get(name) {
                    let message = if first == key {
                        "duplicate repo key".to_string()
                    } else {
                        format!(
                            "duplicate repo key: same repo as {first:?} (repo keys compare case-insensitively)"
                        )
                    };
                    report.whole(message);
                } else {
                    seen.insert(name.clone(), key);
                }
            }
        }
        if let Some(repo) = check_repo(&mut report, name.clone(), value, defaults)
            && let Some(name) = name
        {
            repos.entry(name).or_insert(repo);
        }
    }
    if errors.is_empty() {
        Ok(Config { repos })
    } else {
        Err(errors)
    }
}

/// serde_json's message without its trailing ` at line L column C` (we print those first).
fn json_error_cause(e: &serde_json::Error) -> String {
    let full = e.to_string();
    match full.rfind(" at line ") {
        Some(at) => full[..at].to_string(),
        None => full,
    }
}

/// Collects the problems of one repo.
struct Report<'a> {
    repo: &'a str,
    errors: &'a mut Vec<ConfigError>,
}

impl Report<'_> {
    fn field(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ConfigError {
            repo: Some(self.repo.to_string()),
            field: Some(field.into()),
            message: message.into(),
        });
    }

    fn whole(&mut self, message: impl Into<String>) {
        self.errors.push(ConfigError {
            repo: Some(self.repo.to_string()),
            field: None,
            message: message.into(),
        });
    }

    fn count(&self) -> usize {
        self.errors.len()
    }
}

const REPO_FIELDS: &[&str] = &[
    "mode",
    "maxConcurrent",
    "profiles",
    "vaultPath",
    "registerVaultPath",
    "forgejoUrl",
    "defaultJob",
    "labels",
    "credential",
    "runnerGroupId",
    "nomadNamespace",
    "allowSharedRegistrationToken",
];
const PROFILE_FIELDS: &[&str] = &["job", "label", "maxConcurrent", "hardBoundMinutes"];

/// The longest `hardBoundMinutes` accepted: GitHub's 5-day job limit is far below it, and a
/// larger value is more likely a unit mistake than a wish.
const HARD_BOUND_MINUTES_MAX: u64 = 30 * 24 * 60;

/// Looks up known fields of one object, reporting unknown and duplicate keys (the first of
/// duplicates is the one validated further).
fn fields<'j>(
    report: &mut Report<'_>,
    prefix: &str,
    entries: &'j [(String, Json)],
    known: &[&'static str],
) -> BTreeMap<&'static str, &'j Json> {
    let mut found = BTreeMap::new();
    for (key, value) in entries {
        let path = join(prefix, key);
        match known.iter().find(|k| **k == key.as_str()) {
            Some(known_key) => {
                if found.contains_key(known_key) {
                    report.field(path, "duplicate key");
                } else {
                    found.insert(*known_key, value);
                }
            }
            None => {
                let hint = known
                    .iter()
                    .find(|k| k.eq_ignore_ascii_case(key))
                    .map(|k| format!(" (did you mean {k:?}?)"))
                    .unwrap_or_default();
                report.field(
                    path.clone(),
                    format!("unknown field{hint}; known fields: {}", known.join(", ")),
                );
                // Nested objects under an unknown key still must not repeat keys.
                report_nested_duplicates(report, &path, value);
            }
        }
    }
    found
}

fn report_nested_duplicates(report: &mut Report<'_>, path: &str, value: &Json) {
    match value {
        Json::Object(entries) => {
            let mut keys = BTreeSet::new();
            for (key, inner) in entries {
                let inner_path = join(path, key);
                if !keys.insert(key.as_str()) {
                    report.field(inner_path.clone(), "duplicate key");
                }
                report_nested_duplicates(report, &inner_path, inner);
            }
        }
        Json::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                report_nested_duplicates(report, &format!("{path}[{i}]"), item);
            }
        }
        _ => {}
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ModeName {
    App,
    Vault,
    Forgejo,
}

/// Validates one repo; `None` when it had any problem (they are all in `report`).
fn check_repo(
    report: &mut Report<'_>,
    name: Option<RepoName>,
    value: &Json,
    defaults: &ConfigDefaults,
) -> Option<RepoConfig> {
    let before = report.count();
    let Json::Object(entries) = value else {
        report.whole(format!(
            "must be an object with at least \"mode\", found {}",
            value.kind()
        ));
        return None;
    };
    let found = fields(report, "", entries, REPO_FIELDS);

    let mode = match found.get("mode") {
        None => {
            report.field("mode", "required: one of \"app\", \"vault\", \"forgejo\"");
            None
        }
        Some(value) => match string(report, "mode", value) {
            Some("app") => Some(ModeName::App),
            Some("vault") => Some(ModeName::Vault),
            Some("forgejo") => Some(ModeName::Forgejo),
            Some(other) => {
                report.field(
                    "mode",
                    format!("{other:?} is not a mode: one of \"app\", \"vault\", \"forgejo\""),
                );
                None
            }
            None => None,
        },
    };

    let max_concurrent = found
        .get("maxConcurrent")
        .and_then(|v| cap(report, "maxConcurrent", v));
    let profiles = found
        .get("profiles")
        .map(|v| profiles(report, v))
        .unwrap_or_default();
    let vault_path = found
        .get("vaultPath")
        .and_then(|v| checked_vault_path(report, "vaultPath", v));
    let register_vault_path = found
        .get("registerVaultPath")
        .and_then(|v| checked_vault_path(report, "registerVaultPath", v));
    let forgejo_url = found.get("forgejoUrl").and_then(|v| forgejo_url(report, v));
    let default_job = found
        .get("defaultJob")
        .and_then(|v| string(report, "defaultJob", v))
        .and_then(|job| job_id(report, "defaultJob", job));
    let labels = found.get("labels").and_then(|v| labels(report, v));
    let credential_name =
        found
            .get("credential")
            .and_then(|v| match string(report, "credential", v)? {
                name @ ("jit" | "registration") => Some(name),
                other => {
                    report.field(
                        "credential",
                        format!("{other:?} is not a credential: one of \"jit\", \"registration\""),
                    );
                    None
                }
            });
    let runner_group_id = found
        .get("runnerGroupId")
        .and_then(|v| runner_group_id(report, v));
    let allow_shared_token = found
        .get("allowSharedRegistrationToken")
        .and_then(|v| boolean(report, "allowSharedRegistrationToken", v));
    let nomad_namespace = found
        .get("nomadNamespace")
        .and_then(|v| string(report, "nomadNamespace", v))
        .and_then(|ns| namespace_name(report, "nomadNamespace", ns));

    // Mode-specific rules. A field that failed its own check above is absent here, so only
    // "missing" or "not allowed in this mode" is reported for fields actually absent or given.
    let given = |key: &str| found.contains_key(key);
    if let Some(mode) = mode {
        if mode != ModeName::Vault && given("registerVaultPath") {
            report.field(
                "registerVaultPath",
                "only used in \"vault\" mode (the runner job reads the admin token there)",
            );
        }
        if mode != ModeName::App {
            for field in ["credential", "runnerGroupId"] {
                if given(field) {
                    report.field(
                        field,
                        "only used in \"app\" mode (the daemon mints no credential otherwise)",
                    );
                }
            }
        }
        if credential_name == Some("registration") && given("runnerGroupId") {
            report.field(
                "runnerGroupId",
                "only used with \"credential\": \"jit\" (a registration token names no group)",
            );
        }
        if mode != ModeName::Forgejo && given("forgejoUrl") {
            report.field("forgejoUrl", "only used in \"forgejo\" mode");
        }
        if mode != ModeName::Forgejo && given("allowSharedRegistrationToken") {
            report.field(
                "allowSharedRegistrationToken",
                "only used in \"forgejo\" mode (Forgejo before 15 has no per-runner registration)",
            );
        }
        if mode == ModeName::App && given("vaultPath") {
            report.field(
                "vaultPath",
                "not used in \"app\" mode (the GitHub App needs no token from Vault)",
            );
        }
        if mode != ModeName::App && !given("vaultPath") {
            report.field(
                "vaultPath",
                "required in \"vault\" and \"forgejo\" mode: where the daemon reads its token",
            );
        }
        if mode == ModeName::Vault && !given("registerVaultPath") {
            report.field(
                "registerVaultPath",
                "required in \"vault\" mode: where the runner job reads the admin token",
            );
        }
        if mode == ModeName::Forgejo && !given("forgejoUrl") {
            report.field("forgejoUrl", "required in \"forgejo\" mode");
        }
        if mode == ModeName::Vault
            && let (Some(read), Some(register)) = (&vault_path, &register_vault_path)
            && read == register
        {
            report.field(
                "registerVaultPath",
                "must differ from vaultPath: the daemon must not be able to read the admin token",
            );
        }
    }
    // Forgejo compares labels case-sensitively: the search asks for them as written.
    let search_labels_as_written = match found.get("labels") {
        Some(value) => written_strings(value, None),
        None => found
            .get("profiles")
            .map(|value| written_strings(value, Some("label")))
            .unwrap_or_default(),
    };
    if mode == Some(ModeName::Forgejo) && search_labels_as_written.is_empty() {
        if given("labels") {
            if labels.is_some() {
                report.field(
                    "labels",
                    "must name at least one label in \"forgejo\" mode: the job search asks \
                     Forgejo for these labels",
                );
            }
        } else if found
            .get("profiles")
            .is_none_or(|p| matches!(p, Json::Array(items) if items.is_empty()))
        {
            report.field(
                "labels",
                "required in \"forgejo\" mode when there are no profiles: the job search asks \
                 Forgejo for these labels",
            );
        }
    }
    if let Some(allowed) = &labels {
        for (i, profile) in profiles.iter().enumerate() {
            if let Some(profile) = profile
                && !allowed.contains(&profile.label)
            {
                report.field(
                    format!("profiles[{i}].label"),
                    format!(
                        "{:?} is not in labels, so no job could reach this profile",
                        profile.label
                    ),
                );
            }
        }
    }

    if report.count() > before {
        return None;
    }
    let profiles: Vec<Profile> = profiles.into_iter().flatten().collect();
    let max_concurrent = max_concurrent.unwrap_or_else(|| {
        if profiles.is_empty() {
            defaults.default_repo_max
        } else {
            profiles.iter().fold(0u32, |sum, p| {
                sum.saturating_add(p.max_concurrent.unwrap_or(defaults.default_repo_max))
            })
        }
    });
    let mode = match mode? {
        ModeName::App => Mode::App,
        ModeName::Vault => Mode::Vault {
            vault_path: vault_path?,
            register_vault_path: register_vault_path?,
        },
        ModeName::Forgejo => Mode::Forgejo {
            url: forgejo_url?,
            vault_path: vault_path?,
            allow_shared_token: allow_shared_token.unwrap_or(false),
        },
    };
    let default_job = default_job.or_else(|| match mode {
        Mode::App => Some(defaults.default_job.clone()),
        _ => None,
    });
    let credential = match credential_name {
        Some("registration") => CredentialKind::Registration,
        _ => CredentialKind::Jit {
            runner_group_id: runner_group_id.unwrap_or(DEFAULT_RUNNER_GROUP_ID),
        },
    };
    Some(RepoConfig {
        repo: name?,
        mode,
        max_concurrent,
        profiles,
        default_job,
        labels,
        search_labels_as_written,
        credential,
        nomad_namespace,
    })
}

/// The trimmed strings of a JSON array (or the `key` field of each of its objects), as
/// written; anything else is skipped, having been reported by the field's own check.
fn written_strings(value: &Json, key: Option<&str>) -> BTreeSet<String> {
    let Json::Array(items) = value else {
        return BTreeSet::new();
    };
    items
        .iter()
        .filter_map(|item| match (item, key) {
            (Json::String(s), None) => Some(s.trim().to_string()),
            (Json::Object(entries), Some(key)) => {
                entries
                    .iter()
                    .find(|(k, _)| k == key)
                    .and_then(|(_, v)| match v {
                        Json::String(s) => Some(s.trim().to_string()),
                        _ => None,
                    })
            }
            _ => None,
        })
        .collect()
}

/// Each element is `None` when that profile had a problem.
fn profiles(report: &mut Report<'_>, value: &Json) -> Vec<Option<Profile>> {
    let Json::Array(items) = value else {
        report.field(
            "profiles",
            format!(
                "expected an array of {{\"job\", \"label\", \"maxConcurrent\"}}, found {}",
                value.kind()
            ),
        );
        return Vec::new();
    };
    let mut labels_seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("profiles[{i}]");
        let Json::Object(entries) = item else {
            report.field(path, format!("expected an object, found {}", item.kind()));
            out.push(None);
            continue;
        };
        let before = report.count();
        let found = fields(report, &path, entries, PROFILE_FIELDS);
        let job = match found.get("job") {
            None => {
                report.field(
                    format!("{path}.job"),
                    "required: the parent job to dispatch",
                );
                None
            }
            Some(v) => string(report, &format!("{path}.job"), v)
                .and_then(|job| job_id(report, &format!("{path}.job"), job)),
        };
        let label = match found.get("label") {
            None => {
                report.field(format!("{path}.label"), "required: the label routed here");
                None
            }
            Some(v) => string(report, &format!("{path}.label"), v)
                .and_then(|label| label_value(report, &format!("{path}.label"), label)),
        };
        if let Some(label) = &label {
            match labels_seen.get(label) {
                Some(first) => report.field(
                    format!("{path}.label"),
                    format!(
                        "{label:?} is already routed by profiles[{first}]; the first match wins, so this profile would never be used"
                    ),
                ),
                None => {
                    labels_seen.insert(label.clone(), i);
                }
            }
        }
        let max_concurrent = found
            .get("maxConcurrent")
            .and_then(|v| cap(report, &format!("{path}.maxConcurrent"), v));
        let hard_bound = found
            .get("hardBoundMinutes")
            .and_then(|v| hard_bound_minutes(report, &format!("{path}.hardBoundMinutes"), v));
        if report.count() > before {
            out.push(None);
            continue;
        }
        match (job, label) {
            (Some(job), Some(label)) => out.push(Some(Profile {
                job,
                label,
                max_concurrent,
                hard_bound,
            })),
            _ => out.push(None),
        }
    }
    out
}

fn labels(report: &mut Report<'_>, value: &Json) -> Option<BTreeSet<String>> {
    let Json::Array(items) = value else {
        report.field(
            "labels",
            format!("expected an array of labels, found {}", value.kind()),
        );
        return None;
    };
    let before = report.count();
    let mut set = BTreeSet::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("labels[{i}]");
        if let Some(label) = string(report, &path, item).and_then(|l| label_value(report, &path, l))
        {
            set.insert(label);
        }
    }
    (report.count() == before).then_some(set)
}

fn label_value(report: &mut Report<'_>, field: &str, raw: &str) -> Option<String> {
    let label = raw.trim().to_ascii_lowercase();
    if is_valid_label(&label) {
        Some(label)
    } else {
        report.field(
            field,
            format!("{raw:?} is not a valid label: expected ^[a-z0-9][a-z0-9._:-]{{0,63}}$"),
        );
        None
    }
}

fn string<'j>(report: &mut Report<'_>, field: &str, value: &'j Json) -> Option<&'j str> {
    match value {
        Json::String(s) => Some(s),
        other => {
            report.field(field, format!("expected a string, found {}", other.kind()));
            None
        }
    }
}

fn boolean(report: &mut Report<'_>, field: &str, value: &Json) -> Option<bool> {
    match value {
        Json::Bool(b) => Some(*b),
        other => {
            report.field(
                field,
                format!("expected true or false, found {}", other.kind()),
            );
            None
        }
    }
}

/// A profile's hard bound: whole minutes, at least 1.
fn hard_bound_minutes(
    report: &mut Report<'_>,
    field: &str,
    value: &Json,
) -> Option<std::time::Duration> {
    let message = match value {
        Json::Number(Number::Unsigned(n)) if (1..=HARD_BOUND_MINUTES_MAX).contains(n) => {
            return Some(std::time::Duration::from_secs(n * 60));
        }
        Json::Number(Number::Unsigned(n)) if *n == 0 => {
            "0 would tear down every runner at once: expected whole minutes of at least 1"
                .to_string()
        }
        Json::Number(Number::Unsigned(n)) => {
            format!("{n} is too large (at most {HARD_BOUND_MINUTES_MAX} minutes)")
        }
        Json::Number(Number::Signed(n)) => format!("{n} is negative: expected whole minutes"),
        Json::Number(Number::Float(n)) => format!("{n} is not a whole number of minutes"),
        other => format!("expected whole minutes, found {}", other.kind()),
    };
    report.field(field, message);
    None
}

/// A runner group id: a whole number of at least 1 (1 is the group every repo has).
fn runner_group_id(report: &mut Report<'_>, value: &Json) -> Option<u64> {
    let message = match value {
        Json::Number(Number::Unsigned(n)) if *n >= 1 => return Some(*n),
        Json::Number(Number::Unsigned(_)) | Json::Number(Number::Signed(_)) => {
            "expected a runner group id of at least 1 (1 is the repo's Default group)".to_string()
        }
        Json::Number(Number::Float(n)) => format!("{n} is not a whole number"),
        other => format!("expected a whole number, found {}", other.kind()),
    };
    report.field("runnerGroupId", message);
    None
}

/// A cap: a whole number from 0 (pauses) to u32::MAX.
fn cap(report: &mut Report<'_>, field: &str, value: &Json) -> Option<u32> {
    let message = match value {
        Json::Number(Number::Unsigned(n)) => match u32::try_from(*n) {
            Ok(n) => return Some(n),
            Err(_) => format!("{n} is too large (at most {})", u32::MAX),
        },
        Json::Number(Number::Signed(n)) => {
            format!("{n} is negative: expected a whole number of at least 0 (0 pauses)")
        }
        Json::Number(Number::Float(n)) => format!("{n} is not a whole number"),
        other => format!("expected a whole number, found {}", other.kind()),
    };
    report.field(field, message);
    None
}

/// A Nomad job id: what Nomad accepts in a URL path segment without escaping, and what we can
/// safely put in a child id prefix and a runner name.
fn job_id(report: &mut Report<'_>, field: &str, job: &str) -> Option<String> {
    let problem = if job.is_empty() {
        Some("must not be empty".to_string())
    } else if job.len() > JOB_ID_LEN_MAX {
        Some(format!("is longer than {JOB_ID_LEN_MAX} characters"))
    } else if job
        .chars()
        .any(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        Some("may only contain A-Z, a-z, 0-9, '_', '.', '-'".to_string())
    } else if job == "." || job == ".." {
        Some("is not a job id".to_string())
    } else {
        None
    };
    match problem {
        None => Some(job.to_string()),
        Some(problem) => {
            report.field(
                field,
                format!("{job:?} is not a Nomad job id: it {problem}"),
            );
            None
        }
    }
}

/// Longest Nomad namespace name (`validNamespaceName` in nomad/structs/structs.go).
const NAMESPACE_LEN_MAX: usize = 128;

/// A Nomad namespace name: 1 to 128 of `[a-zA-Z0-9-]`, as Nomad accepts; `*` and the like
/// would address many namespaces at once.
fn namespace_name(report: &mut Report<'_>, field: &str, name: &str) -> Option<String> {
    match namespace_name_problem(name) {
        None => Some(name.to_string()),
        Some(problem) => {
            report.field(
                field,
                format!("{name:?} is not a Nomad namespace: it {problem}"),
            );
            None
        }
    }
}

/// Why `name` is not a Nomad namespace name, if it is not.
pub fn namespace_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        Some("must not be empty".to_string())
    } else if name.len() > NAMESPACE_LEN_MAX {
        Some(format!("is longer than {NAMESPACE_LEN_MAX} characters"))
    } else if name
        .chars()
        .any(|c| !(c.is_ascii_alphanumeric() || c == '-'))
    {
        Some("may only contain A-Z, a-z, 0-9 and '-'".to_string())
    } else {
        None
    }
}

/// A Vault path under the KV mount, normalised without leading or trailing slashes. Globs and
/// traversal are refused: the daemon's Vault policy must name exact paths (BRIEF `vault`
/// mode), and a path with `..` or `//` could address a different secret than it reads as.
fn checked_vault_path(report: &mut Report<'_>, field: &str, value: &Json) -> Option<String> {
    let raw = string(report, field, value)?;
    let path = raw.trim_matches('/');
    let problem = if path.is_empty() {
        Some("must not be empty")
    } else if path.contains(['*', '+']) {
        Some("must not contain a glob ('*' or '+'): name the exact secret")
    } else if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("must not contain whitespace or control characters")
    } else if path.split('/').any(|s| s.is_empty()) {
        Some("must not contain empty segments ('//')")
    } else if path.split('/').any(|s| s == "." || s == "..") {
        Some("must not contain '.' or '..' segments")
    } else {
        None
    };
    match problem {
        None => Some(path.to_string()),
        Some(problem) => {
            report.field(field, format!("{raw:?} {problem}"));
            None
        }
    }
}

fn forgejo_url(report: &mut Report<'_>, value: &Json) -> Option<Url> {
    let raw = string(report, "forgejoUrl", value)?;
    let url = match Url::parse(raw.trim()) {
        Ok(url) => url,
        Err(e) => {
            report.field("forgejoUrl", format!("{raw:?} is not a URL: {e}"));
            return None;
        }
    };
    let problem = if !matches!(url.scheme(), "http" | "https") {
        Some("must be an http:// or https:// URL")
    } else if url.host_str().is_none_or(str::is_empty) {
        Some("must name a host")
    } else if !url.username().is_empty() || url.password().is_some() {
        // A credential here would end up in logs and status output; the token comes from Vault.
        Some("must not carry credentials (the API token is read from Vault at vaultPath)")
    } else if url.query().is_some() || url.fragment().is_some() {
        Some("must not have a query or fragment")
    } else {
        None
    };
    match problem {
        None => Some(url),
        Some(problem) => {
            // The URL was refused, possibly for carrying credentials: do not echo it.
            report.field("forgejoUrl", problem);
            None
        }
    }
}

/// A JSON number as written: whole numbers keep their sign, anything else is a float.
#[derive(Clone, Debug, PartialEq)]
enum Number {
    Unsigned(u64),
    Signed(i64),
    Float(f64),
}

/// A JSON value whose objects keep every key in document order, duplicates included.
#[derive(Clone, Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Number(_) => "a number",
            Json::String(_) => "a string",
            Json::Array(_) => "an array",
            Json::Object(_) => "an object",
        }
    }
}

impl<'de> de::Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Json, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Number(Number::Unsigned(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        // serde_json hands non-negative integers to visit_u64; keep that invariant anyway.
        Ok(Json::Number(match u64::try_from(v) {
            Ok(u) => Number::Unsigned(u),
            Err(_) => Number::Signed(v),
        }))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(Json::Number(Number::Float(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut entries = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, Json>()? {
            entries.push((key, value));
        }
        Ok(Json::Object(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn parse(doc: &str) -> Result<Config, Vec<ConfigError>> {
        parse_document(doc.as_bytes(), &ConfigDefaults::default())
    }

    fn rendered_errors(doc: &str) -> Vec<String> {
        parse(doc)
            .expect_err("document should be rejected")
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn repo(name: &str) -> RepoName {
        RepoName::parse(name).unwrap()
    }

    fn profile(job: &str, label: &str, cap: Option<u32>) -> Profile {
        Profile {
            job: job.into(),
            label: label.into(),
            max_concurrent: cap,
            hard_bound: None,
        }
    }

    #[test]
    fn a_forgejo_repo_shares_a_registration_token_only_when_it_says_so() {
        let doc = |extra: &str| {
            format!(
                r#"{{"alex/s3": {{"mode": "forgejo", "forgejoUrl": "https://f.example",
                     "vaultPath": "f", "labels": ["build"]{extra}}}}}"#
            )
        };
        for (extra, allowed) in [
            ("", false),
            (r#", "allowSharedRegistrationToken": false"#, false),
            (r#", "allowSharedRegistrationToken": true"#, true),
        ] {
            let config = parse(&doc(extra)).unwrap();
            assert!(
                matches!(
                    config.repos[&repo("alex/s3")].mode,
                    Mode::Forgejo { allow_shared_token, .. } if allow_shared_token == allowed
                ),
                "{extra}"
            );
        }
    }

    #[test]
    fn the_brief_document_resolves_every_value() {
        let config = parse(BRIEF_DOCUMENT).unwrap();
        let expected = Config {
            repos: BTreeMap::from([
                (
                    repo("afreidah/munchbox"),
                    RepoConfig {
                        repo: repo("afreidah/munchbox"),
                        mode: Mode::App,
                        max_concurrent: 3,
                        profiles: vec![],
                        default_job: Some("ci-runner".into()),
                        labels: None,
                        search_labels_as_written: BTreeSet::new(),
                        credential: Default::default(),
                        nomad_namespace: None,
                    },
                ),
                (
                    repo("alex/s3-orchestrator"),
                    RepoConfig {
                        repo: repo("alex/s3-orchestrator"),
                        mode: Mode::Forgejo {
                            url: Url::parse("http://forgejo.service.consul:30028").unwrap(),
                            vault_path: "forgejo/scaler".into(),
                            allow_shared_token: false,
                        },
                        max_concurrent: 1,
                        profiles: vec![profile("forgejo-build-runner", "build", Some(1))],
                        default_job: None,
                        labels: None,
                        search_labels_as_written: BTreeSet::from(["build".to_string()]),
                        credential: Default::default(),
                        nomad_namespace: None,
                    },
                ),
                (
                    repo("ev-the-dev/moat"),
                    RepoConfig {
                        repo: repo("ev-the-dev/moat"),
                        mode: Mode::Vault {
                            vault_path: "github/moat-poll".into(),
                            register_vault_path: "github/moat-runner".into(),
                        },
                        // No repo cap: the sum of the profile caps.
                        max_concurrent: 4,
                        profiles: vec![
                            profile("github-runner-moat-vm", "vm", Some(1)),
                            profile("go-ci-runner", "go", Some(3)),
                        ],
                        default_job: None,
                        labels: None,
                        search_labels_as_written: BTreeSet::from(["vm".into(), "go".into()]),
                        credential: Default::default(),
                        nomad_namespace: None,
                    },
                ),
            ]),
        };
        assert_eq!(config, expected);
    }

    #[test]
    fn absent_caps_resolve_from_profiles_and_defaults() {
        let defaults = ConfigDefaults {
            default_job: "fallback".into(),
            default_repo_max: 5,
        };
        let doc = r#"{
          "a/plain": { "mode": "app" },
          "a/mixed": { "mode": "app", "profiles": [
              { "job": "j1", "label": "x", "maxConcurrent": 2 },
              { "job": "j2", "label": "y" } ] },
          "a/own-default": { "mode": "app", "defaultJob": "special" }
        }"#;
        let config = parse_document(doc.as_bytes(), &defaults).unwrap();
        let plain = &config.repos[&repo("a/plain")];
        assert_eq!(plain.max_concurrent, 5);
        assert_eq!(plain.default_job.as_deref(), Some("fallback"));
        assert_eq!(config.repos[&repo("a/mixed")].max_concurrent, 2 + 5);
        assert_eq!(
            config.repos[&repo("a/own-default")].default_job.as_deref(),
            Some("special")
        );
    }

    #[test]
    fn zero_pauses_and_is_valid() {
        let config = parse(r#"{"a/b": {"mode": "app", "maxConcurrent": 0}}"#).unwrap();
        assert_eq!(config.repos[&repo("a/b")].max_concurrent, 0);
        let config = parse(
            r#"{"a/b": {"mode": "app", "profiles": [{"job": "j", "label": "l", "maxConcurrent": 0}]}}"#,
        )
        .unwrap();
        assert_eq!(config.repos[&repo("a/b")].max_concurrent, 0);
    }

    #[test]
    fn an_empty_document_has_no_repos() {
        assert_eq!(parse("{}").unwrap(), Config::default());
        assert_eq!(parse(" \n{ }\n").unwrap(), Config::default());
    }

    #[test]
    fn repo_keys_and_labels_are_normalised() {
        let config = parse(
            r#"{"Acme/API": {"mode": "vault", "vaultPath": "/gh/poll/", "registerVaultPath": "gh/admin",
                 "labels": ["Linux", " GO ", "linux"], "defaultJob": "Generic.Runner_2",
                 "profiles": [{"job": "go", "label": "Go"}]}}"#,
        )
        .unwrap();
        let acme = &config.repos[&repo("acme/api")];
        assert_eq!(acme.repo.to_string(), "acme/api");
        assert_eq!(
            acme.labels,
            Some(BTreeSet::from(["go".to_string(), "linux".to_string()]))
        );
        assert_eq!(acme.profiles[0].label, "go");
        // Routing compares lower-cased labels; Forgejo's search compares them as written.
        assert_eq!(
            acme.search_labels(),
            BTreeSet::from(["Linux".to_string(), "GO".to_string(), "linux".to_string()])
        );
        assert_eq!(acme.default_job.as_deref(), Some("Generic.Runner_2"));
        assert_eq!(acme.mode.vault_path(), Some("gh/poll"));
    }

    #[test]
    fn a_broken_document_reports_every_problem_naming_repo_and_field() {
        let doc = r#"{
          "acme/api": {
            "mode": "vault", "vaultPath": "gh/poll/", "registerVaultPath": "/gh/poll",
            "maxConcurrent": -1, "colour": "blue",
            "profiles": [
              { "job": "ok", "label": "go" },
              { "job": "has space", "label": "x", "maxConcurrent": 1.5 },
              { "label": "$(id)" }
            ]
          },
          "acme/web": { "mode": "forgejo", "vaultPath": "forgejo/*", "labels": "linux",
                        "allowSharedRegistrationToken": "yes" },
          "acme/app": { "mode": "app", "registerVaultPath": "gh/admin", "forgejoUrl": "ftp://x",
                        "allowSharedRegistrationToken": true },
          "not a repo": { "mode": "app" },
          "acme/cli": { "mode": "github" },
          "acme/lib": 7
        }"#;
        let errors = rendered_errors(doc);
        let expected = [
            "acme/api: colour: unknown field",
            "acme/api: maxConcurrent: -1 is negative",
            "acme/api: profiles[1].job: \"has space\" is not a Nomad job id",
            "acme/api: profiles[1].maxConcurrent: 1.5 is not a whole number",
            "acme/api: profiles[2].job: required",
            "acme/api: profiles[2].label: \"$(id)\" is not a valid label",
            "acme/api: registerVaultPath: must differ from vaultPath",
            "acme/web: vaultPath: \"forgejo/*\" must not contain a glob",
            "acme/web: labels: expected an array of labels, found a string",
            "acme/web: forgejoUrl: required in \"forgejo\" mode",
            "acme/app: forgejoUrl: must be an http:// or https:// URL",
            "acme/app: forgejoUrl: only used in \"forgejo\" mode",
            "acme/app: registerVaultPath: only used in \"vault\" mode",
            "acme/web: allowSharedRegistrationToken: expected true or false, found a string",
            "acme/app: allowSharedRegistrationToken: only used in \"forgejo\" mode",
            "not a repo: not a valid repo name",
            "acme/cli: mode: \"github\" is not a mode",
            "acme/lib: must be an object",
        ];
        for want in expected {
            assert!(
                errors.iter().any(|e| e.starts_with(want)),
                "missing {want:?} in {errors:#?}"
            );
        }
        assert_eq!(errors.len(), expected.len(), "{errors:#?}");
    }

    #[test]
    fn a_forgejo_search_needs_a_label_to_ask_for() {
        let forgejo = r#""mode": "forgejo", "forgejoUrl": "https://f.example", "vaultPath": "f""#;
        let required = "acme/web: labels: required in \"forgejo\" mode when there are no profiles: the job search asks Forgejo for these labels";
        for fields in [
            "",
            r#", "profiles": []"#,
            r#", "defaultJob": "forgejo-runner""#,
        ] {
            let doc = format!(r#"{{"acme/web": {{{forgejo}{fields}}}}}"#);
            assert_eq!(rendered_errors(&doc), vec![required], "{doc}");
        }
        let doc = format!(r#"{{"acme/web": {{{forgejo}, "labels": []}}}}"#);
        assert_eq!(
            rendered_errors(&doc),
            vec![
                "acme/web: labels: must name at least one label in \"forgejo\" mode: the job search asks Forgejo for these labels"
            ]
        );
        for fields in [
            r#", "labels": ["Docker"]"#,
            r#", "profiles": [{"job": "forgejo-runner", "label": "Build"}]"#,
        ] {
            let doc = format!(r#"{{"acme/web": {{{forgejo}{fields}}}}}"#);
            let config = parse(&doc).unwrap_or_else(|e| panic!("{doc}: {e:?}"));
            let web = &config.repos[&repo("acme/web")];
            assert_eq!(web.search_labels().len(), 1, "{doc}");
            assert!(
                web.search_labels()
                    .iter()
                    .all(|l| l.chars().next().unwrap().is_uppercase()),
                "{doc}: {:?}",
                web.search_labels()
            );
        }
        // Other modes search nothing: GitHub lists runs.
        assert!(parse(r#"{"acme/api": {"mode": "app"}}"#).is_ok());
    }

    #[test]
    fn errors_carry_repo_and_field_separately() {
        let errors = parse(r#"{"acme/api": {"mode": "app", "profiles": [{"job": "j", "label": "l", "maxConcurrent": "2"}]}}"#)
            .unwrap_err();
        assert_eq!(
            errors,
            vec![ConfigError {
                repo: Some("acme/api".into()),
                field: Some("profiles[0].maxConcurrent".into()),
                message: "expected a whole number, found a string".into(),
            }]
        );
    }

    #[test]
    fn duplicate_keys_are_reported_at_every_level() {
        let errors = rendered_errors(
            r#"{
              "acme/api": {
                "mode": "app", "mode": "app",
                "profiles": [ { "job": "a", "label": "x", "job": "b" } ],
                "extra": { "k": 1, "k": 2 }
              },
              "acme/api": { "mode": "app" }
            }"#,
        );
        assert_eq!(
            errors,
            vec![
                "acme/api: mode: duplicate key",
                "acme/api: extra: unknown field; known fields: mode, maxConcurrent, profiles, vaultPath, registerVaultPath, forgejoUrl, defaultJob, labels, credential, runnerGroupId, nomadNamespace, allowSharedRegistrationToken",
                "acme/api: extra.k: duplicate key",
                "acme/api: profiles[0].job: duplicate key",
                "acme/api: duplicate repo key",
            ]
        );
    }

    #[test]
    fn repo_keys_that_differ_only_in_case_are_duplicates() {
        let errors =
            rendered_errors(r#"{"Acme/Api": {"mode": "app"}, "acme/API": {"mode": "app"}}"#);
        assert_eq!(
            errors,
            vec![
                "acme/API: duplicate repo key: same repo as \"Acme/Api\" (repo keys compare case-insensitively)"
            ]
        );
    }

    #[test]
    fn whole_document_problems_are_single_errors() {
        let errors = rendered_errors("{\n  \"a/b\": { \"mode\": \"app\" \n  \"c/d\": {}\n}");
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with("invalid JSON at line 3 column 3: expected `,` or `}`"),
            "{errors:?}"
        );
        assert_eq!(
            rendered_errors(r#"[{"a/b": {"mode": "app"}}]"#),
            vec!["the document must be a JSON object keyed by repo (owner/name), found an array"]
        );
        assert_eq!(rendered_errors("").len(), 1);
    }

    #[test]
    fn mode_rules_are_checked() {
        let cases: &[(&str, &str)] = &[
            (
                r#"{"mode": "vault", "vaultPath": "a"}"#,
                "x/y: registerVaultPath: required",
            ),
            (
                r#"{"mode": "vault", "registerVaultPath": "a"}"#,
                "x/y: vaultPath: required",
            ),
            (
                r#"{"mode": "forgejo", "forgejoUrl": "https://f.example"}"#,
                "x/y: vaultPath: required",
            ),
            (
                r#"{"mode": "forgejo", "vaultPath": "f", "forgejoUrl": "https://user:pw@f.example"}"#,
                "x/y: forgejoUrl: must not carry credentials",
            ),
            (
                r#"{"mode": "forgejo", "vaultPath": "f", "forgejoUrl": "not a url"}"#,
                "x/y: forgejoUrl: \"not a url\" is not a URL",
            ),
            (
                r#"{"mode": "app", "vaultPath": "a"}"#,
                "x/y: vaultPath: not used in \"app\" mode",
            ),
            (
                r#"{"mode": "vault", "vaultPath": "a/../b", "registerVaultPath": "c"}"#,
                "x/y: vaultPath: \"a/../b\" must not contain '.' or '..' segments",
            ),
            (
                r#"{"mode": "vault", "vaultPath": "a//b", "registerVaultPath": "c"}"#,
                "x/y: vaultPath: \"a//b\" must not contain empty segments",
            ),
            (
                r#"{"mode": "vault", "vaultPath": "a/+/b", "registerVaultPath": "c"}"#,
                "x/y: vaultPath: \"a/+/b\" must not contain a glob",
            ),
            (
                r#"{"mode": "vault", "vaultPath": "/", "registerVaultPath": "c"}"#,
                "x/y: vaultPath: \"/\" must not be empty",
            ),
            (r#"{}"#, "x/y: mode: required"),
            (
                r#"{"mode": "app", "defaultJob": ""}"#,
                "x/y: defaultJob: \"\" is not a Nomad job id: it must not be empty",
            ),
            (
                r#"{"mode": "app", "maxConcurrent": 4294967296}"#,
                "x/y: maxConcurrent: 4294967296 is too large",
            ),
            (
                r#"{"mode": "app", "labels": ["go"], "profiles": [{"job": "j", "label": "vm"}]}"#,
                "x/y: profiles[0].label: \"vm\" is not in labels",
            ),
            (
                r#"{"mode": "app", "profiles": [{"job": "j", "label": "go"}, {"job": "k", "label": "GO"}]}"#,
                "x/y: profiles[1].label: \"go\" is already routed by profiles[0]",
            ),
            (
                r#"{"mode": "app", "Mode": "app"}"#,
                "x/y: Mode: unknown field (did you mean \"mode\"?)",
            ),
        ];
        for (repo_doc, want) in cases {
            let doc = format!(r#"{{"x/y": {repo_doc}}}"#);
            let errors = rendered_errors(&doc);
            assert!(
                errors.iter().any(|e| e.starts_with(want)),
                "{repo_doc}: missing {want:?} in {errors:#?}"
            );
        }
        let long_job = "j".repeat(JOB_ID_LEN_MAX + 1);
        let doc = format!(r#"{{"x/y": {{"mode": "app", "defaultJob": "{long_job}"}}}}"#);
        assert!(rendered_errors(&doc)[0].contains("is longer than 128 characters"));
        let ok_job = "j".repeat(JOB_ID_LEN_MAX);
        let doc = format!(r#"{{"x/y": {{"mode": "app", "defaultJob": "{ok_job}"}}}}"#);
        assert!(parse(&doc).is_ok());
    }
}

#[cfg(test)]
mod credential_tests {
    use super::*;
    use crate::model::RepoName;

    fn credential(entry: &str) -> Result<CredentialKind, Vec<String>> {
        let doc = format!(r#"{{ "acme/api": {entry} }}"#);
        parse_document(doc.as_bytes(), &ConfigDefaults::default())
            .map(|c| c.repos[&RepoName::parse("acme/api").unwrap()].credential)
            .map_err(|errors| errors.iter().map(|e| e.to_string()).collect())
    }

    #[test]
    fn app_repos_get_a_jit_config_unless_they_ask_for_a_registration_token() {
        assert_eq!(
            credential(r#"{ "mode": "app" }"#),
            Ok(CredentialKind::Jit { runner_group_id: 1 })
        );
        assert_eq!(
            credential(r#"{ "mode": "app", "credential": "jit", "runnerGroupId": 7 }"#),
            Ok(CredentialKind::Jit { runner_group_id: 7 })
        );
        assert_eq!(
            credential(r#"{ "mode": "app", "credential": "registration" }"#),
            Ok(CredentialKind::Registration)
        );
    }

    #[test]
    fn credential_fields_are_checked() {
        for (entry, field) in [
            (r#"{ "mode": "app", "credential": "pat" }"#, "credential"),
            (r#"{ "mode": "app", "runnerGroupId": 0 }"#, "runnerGroupId"),
            (
                r#"{ "mode": "app", "runnerGroupId": "1" }"#,
                "runnerGroupId",
            ),
            (
                r#"{ "mode": "app", "credential": "registration", "runnerGroupId": 2 }"#,
                "runnerGroupId",
            ),
            (
                r#"{ "mode": "vault", "vaultPath": "a", "registerVaultPath": "b", "credential": "jit" }"#,
                "credential",
            ),
        ] {
            let errors = credential(entry).expect_err(entry);
            assert!(
                errors.iter().any(|e| e.contains(field)),
                "{entry}: {errors:?}"
            );
        }
    }

    #[test]
    fn nomad_namespace_names_the_parents_namespace_or_is_an_error_naming_repo_and_field() {
        let parse = |doc: &str| parse_document(doc.as_bytes(), &ConfigDefaults::default());
        let rendered_errors = |doc: &str| -> Vec<String> {
            parse(doc)
                .expect_err("document should be rejected")
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        let repo = |name: &str| RepoName::parse(name).unwrap();
        let config = parse(
            r#"{
              "acme/api": { "mode": "app" },
              "acme/secure": { "mode": "vault", "vaultPath": "a", "registerVaultPath": "b",
                               "defaultJob": "vm-runner", "nomadNamespace": "ci-runners-vault" }
            }"#,
        )
        .unwrap();
        assert_eq!(config.repos[&repo("acme/api")].nomad_namespace, None);
        assert_eq!(
            config.repos[&repo("acme/secure")]
                .nomad_namespace
                .as_deref(),
            Some("ci-runners-vault")
        );
        for (value, why) in [
            ("\"\"", "must not be empty"),
            ("\"*\"", "may only contain"),
            ("\"ci_runners\"", "may only contain"),
            ("\"ci/runners\"", "may only contain"),
            (&format!("\"{}\"", "n".repeat(129)), "longer than 128"),
        ] {
            let errors = rendered_errors(&format!(
                r#"{{ "acme/api": {{ "mode": "app", "nomadNamespace": {value} }} }}"#
            ));
            assert_eq!(errors.len(), 1, "{value}: {errors:?}");
            assert!(
                errors[0].starts_with("acme/api: nomadNamespace: ") && errors[0].contains(why),
                "{value}: {errors:?}"
            );
        }
        let errors = rendered_errors(r#"{ "acme/api": { "mode": "app", "nomadNamespace": 3 } }"#);
        assert!(
            errors[0].starts_with("acme/api: nomadNamespace: "),
            "{errors:?}"
        );
    }
}
