//! One repo entry read into typed values: each known field through its own check, unknown
//! and duplicate keys reported, a profile list into profiles. What is wrong with the entry as
//! a whole (a field its mode refuses, a label no job reaches) is left to `checks`.

use std::collections::{BTreeMap, BTreeSet};

use url::Url;

use super::json::Json;
use super::values::{
    boolean, cap, checked_vault_path, forgejo_url, hard_bound_minutes, job_id, label_value,
    namespace_name, runner_group_id, string,
};
use super::{Report, checks};
use crate::config::Profile;

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

/// `mode` as written; the fields each mode needs are checked in `checks`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum ModeName {
    App,
    Vault,
    Forgejo,
}

/// One repo entry's fields, each read and checked on its own; a field that is absent or
/// failed its own check is `None`.
pub(super) struct Entry<'j> {
    /// The known fields as written (the first of duplicates).
    pub(super) found: BTreeMap<&'static str, &'j Json>,
    pub(super) mode: Option<ModeName>,
    pub(super) max_concurrent: Option<u32>,
    /// Each element is `None` when that profile had a problem.
    pub(super) profiles: Vec<Option<Profile>>,
    pub(super) vault_path: Option<String>,
    pub(super) register_vault_path: Option<String>,
    pub(super) forgejo_url: Option<Url>,
    pub(super) default_job: Option<String>,
    pub(super) labels: Option<BTreeSet<String>>,
    /// The labels Forgejo's job search asks for.
    pub(super) search_labels_as_written: BTreeSet<String>,
    pub(super) credential_name: Option<&'j str>,
    pub(super) runner_group_id: Option<u64>,
    pub(super) allow_shared_token: Option<bool>,
    pub(super) nomad_namespace: Option<String>,
}

/// Reads one repo entry; `None` when it is not an object (reported).
pub(super) fn read<'j>(report: &mut Report<'_>, value: &'j Json) -> Option<Entry<'j>> {
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

    // Forgejo compares labels case-sensitively: the search asks for them as written.
    let search_labels_as_written = match found.get("labels") {
        Some(value) => written_strings(value, None),
        None => found
            .get("profiles")
            .map(|value| written_strings(value, Some("label")))
            .unwrap_or_default(),
    };
    Some(Entry {
        found,
        mode,
        max_concurrent,
        profiles,
        vault_path,
        register_vault_path,
        forgejo_url,
        default_job,
        labels,
        search_labels_as_written,
        credential_name,
        runner_group_id,
        allow_shared_token,
        nomad_namespace,
    })
}

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
            checks::label_routed_once(report, &mut labels_seen, &path, label, i);
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
