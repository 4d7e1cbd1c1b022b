//! Raw JSON → validated [`Config`], reporting every problem at once.
//!
//! serde's derive stops at the first problem and silently keeps the last of two duplicate
//! keys, so the document is first read into [`Json`], a tree that keeps every key in the order
//! written (duplicates included), and then checked by hand. Each problem names the repo as
//! written and the path of the field inside it (`profiles[1].maxConcurrent`).
//!
//! # Layout
//!
//! This file walks the document: each repo entry is read, checked, then resolved into a
//! [`RepoConfig`] (the implicit semantics: absent caps, the default job, the credential).
//!
//! - `json`: the tree that keeps duplicate keys.
//! - `entry`: one repo entry's fields read into typed values, unknown and duplicate keys.
//! - `values`: one value's own check: a job id, a namespace, a Vault path, a cap, a URL.
//! - `checks`: the semantic checks across fields and entries: what a mode requires and
//!   refuses, labels that no job could reach, a repo or a label named twice.

mod checks;
mod entry;
mod json;
mod values;

use std::collections::BTreeMap;

use super::{
    Config, ConfigDefaults, CredentialKind, DEFAULT_RUNNER_GROUP_ID, Mode, Profile, RepoConfig,
};
use crate::model::RepoName;
use entry::{Entry, ModeName};
use json::Json;
pub use values::{JOB_ID_LEN_MAX, namespace_name_problem};

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
            Some(name) => checks::repo_named_once(&mut report, &mut seen, name, key),
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

/// Validates one repo; `None` when it had any problem (they are all in `report`).
fn check_repo(
    report: &mut Report<'_>,
    name: Option<RepoName>,
    value: &Json,
    defaults: &ConfigDefaults,
) -> Option<RepoConfig> {
    let before = report.count();
    let entry = entry::read(report, value)?;
    checks::check_entry(report, &entry);
    if report.count() > before {
        return None;
    }
    resolve(entry, name, defaults)
}

/// `entry`, checked, with what the document leaves implicit resolved (BRIEF "Semantics the
/// document leaves implicit"); `None` when a value it needs is missing, which was reported.
fn resolve(
    entry: Entry<'_>,
    name: Option<RepoName>,
    defaults: &ConfigDefaults,
) -> Option<RepoConfig> {
    let Entry {
        found: _,
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
    } = entry;
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use url::Url;

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

    pub(super) fn parse(doc: &str) -> Result<Config, Vec<ConfigError>> {
        parse_document(doc.as_bytes(), &ConfigDefaults::default())
    }

    pub(super) fn rendered_errors(doc: &str) -> Vec<String> {
        parse(doc)
            .expect_err("document should be rejected")
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    pub(super) fn repo(name: &str) -> RepoName {
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
