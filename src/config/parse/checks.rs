//! The document's semantic checks: rules across the fields of one entry (what each mode
//! requires and refuses, labels no job could reach, what Forgejo's search needs) and across
//! entries (a repo keyed twice, a label routed by two profiles). Each field was read and
//! checked on its own before (`entry`, `values`): one that failed is absent here, so only
//! "missing" or "not allowed" is said of it.

use std::collections::BTreeMap;

use super::Report;
use super::entry::{Entry, ModeName};
use super::json::Json;
use crate::model::RepoName;

/// The rules across one entry's fields, in the order they are reported.
pub(super) fn check_entry(report: &mut Report<'_>, entry: &Entry<'_>) {
    mode_rules(report, entry);
    forgejo_search_has_labels(report, entry);
    profile_labels_are_allowed(report, entry);
}

/// Repo keys compare case-insensitively: `seen` remembers the first spelling of each.
pub(super) fn repo_named_once<'d>(
    report: &mut Report<'_>,
    seen: &mut BTreeMap<RepoName, &'d str>,
    name: &RepoName,
    key: &'d str,
) {
    if let Some(first) = seen.get(name) {
        let message = if *first == key {
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

/// A job goes to the first profile whose label it carries: a later profile with the same
/// label would never be used. `routed` maps each label to the profile that routes it.
pub(super) fn label_routed_once(
    report: &mut Report<'_>,
    routed: &mut BTreeMap<String, usize>,
    path: &str,
    label: &str,
    i: usize,
) {
    match routed.get(label) {
        Some(first) => report.field(
            format!("{path}.label"),
            format!(
                "{label:?} is already routed by profiles[{first}]; the first match wins, so this profile would never be used"
            ),
        ),
        None => {
            routed.insert(label.to_string(), i);
        }
    }
}

/// Mode-specific rules. A field that failed its own check is absent here, so only
/// "missing" or "not allowed in this mode" is reported for fields actually absent or given.
fn mode_rules(report: &mut Report<'_>, entry: &Entry<'_>) {
    let given = |key: &str| entry.found.contains_key(key);
    if let Some(mode) = entry.mode {
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
        if entry.credential_name == Some("registration") && given("runnerGroupId") {
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
            && let (Some(read), Some(register)) = (&entry.vault_path, &entry.register_vault_path)
            && read == register
        {
            report.field(
                "registerVaultPath",
                "must differ from vaultPath: the daemon must not be able to read the admin token",
            );
        }
    }
}

/// Forgejo's job search asks for the entry's labels (or its profiles' labels) as written:
/// with none it would find nothing.
fn forgejo_search_has_labels(report: &mut Report<'_>, entry: &Entry<'_>) {
    let given = |key: &str| entry.found.contains_key(key);
    if entry.mode == Some(ModeName::Forgejo) && entry.search_labels_as_written.is_empty() {
        if given("labels") {
            if entry.labels.is_some() {
                report.field(
                    "labels",
                    "must name at least one label in \"forgejo\" mode: the job search asks \
                     Forgejo for these labels",
                );
            }
        } else if entry
            .found
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
}

/// A profile whose label is not among the entry's `labels` could never be reached.
fn profile_labels_are_allowed(report: &mut Report<'_>, entry: &Entry<'_>) {
    if let Some(allowed) = &entry.labels {
        for (i, profile) in entry.profiles.iter().enumerate() {
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
}

#[cfg(test)]
mod tests {
    use super::super::tests::{parse, rendered_errors, repo};

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
}
