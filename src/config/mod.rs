//! The Consul document users edit, validated.
//!
//! The raw JSON is parsed in [`parse`] (every problem reported at once, naming the repo and
//! the field); what leaves this module is a [`Config`] whose every value has been checked and
//! whose implicit semantics (BRIEF "Semantics the document leaves implicit") are resolved.

pub mod parse;
pub mod pause;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};

use url::Url;

use crate::model::{LabelSet, RepoName};

pub use parse::{ConfigError, parse_document};

/// Process settings that give the document its defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigDefaults {
    /// Parent job for `app` repos' jobs that match no profile (`--default-job`).
    pub default_job: String,
    /// Cap of a repo that sets none and has no profiles (`--default-repo-max`).
    pub default_repo_max: u32,
}

impl Default for ConfigDefaults {
    fn default() -> Self {
        ConfigDefaults {
            default_job: "ci-runner".to_string(),
            default_repo_max: 2,
        }
    }
}

/// One validated document.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Config {
    pub repos: BTreeMap<RepoName, RepoConfig>,
}

/// Where a repo's jobs come from and how its runners get credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A GitHub App: the daemon mints per-repo, per-permission installation tokens.
    App,
    /// A GitHub repo the App cannot be installed on: a polling token is read from Vault at
    /// `vault_path`; the runner job itself reads the admin token at `register_vault_path`.
    Vault {
        vault_path: String,
        register_vault_path: String,
    },
    /// A Forgejo repo: an API token is read from Vault at `vault_path`.
    Forgejo {
        url: Url,
        vault_path: String,
        /// `allowSharedRegistrationToken`: on a Forgejo before 15, which registers no runner
        /// per dispatch, runners are dispatched with the repo's shared registration token
        /// anyway. Off, such a repo dispatches nothing: a job step can copy that registration
        /// and serve the repo's later jobs, and their secrets, until an admin removes it.
        allow_shared_token: bool,
    },
}

impl Mode {
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::App => "app",
            Mode::Vault { .. } => "vault",
            Mode::Forgejo { .. } => "forgejo",
        }
    }

    /// The Vault path the daemon itself reads, if any.
    pub fn vault_path(&self) -> Option<&str> {
        match self {
            Mode::App => None,
            Mode::Vault { vault_path, .. } | Mode::Forgejo { vault_path, .. } => Some(vault_path),
        }
    }

    /// True for the modes whose runners talk to GitHub.
    pub fn is_github(&self) -> bool {
        !matches!(self, Mode::Forgejo { .. })
    }
}

/// Routes jobs carrying `label` to the parent job `job`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    pub job: String,
    pub label: String,
    /// Caps this profile's in-flight children; `None` leaves only the repo's cap.
    pub max_concurrent: Option<u32>,
    /// `hardBoundMinutes`: a runner of this profile still busy past this age is torn down as
    /// wedged; `None` keeps `--hard-bound`. A bound below a job's `timeout-minutes` kills that
    /// job.
    pub hard_bound: Option<std::time::Duration>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoConfig {
    pub repo: RepoName,
    pub mode: Mode,
    /// Caps all of the repo's in-flight children, resolved: the document's value, else the sum
    /// of its profiles' caps (a profile without one counting `default_repo_max`), else
    /// `default_repo_max`. `0` pauses the repo.
    pub max_concurrent: u32,
    /// First match wins.
    pub profiles: Vec<Profile>,
    /// Parent for jobs that match no profile, resolved: `defaultJob`, else `--default-job` in
    /// `app` mode, else none (such jobs are unroutable).
    pub default_job: Option<String>,
    /// The label allow-list: a job with a label outside it is unroutable. `None` allows any.
    /// Lower-cased, as routing compares labels.
    pub labels: Option<BTreeSet<String>>,
    /// What the Forgejo job search asks for: `labels`, else the profile labels, exactly as the
    /// document writes them (trimmed). Forgejo compares labels case-sensitively, so a
    /// lower-cased `Linux` would find no job.
    pub search_labels_as_written: BTreeSet<String>,
    /// What the daemon mints for each of the repo's runners (`app` mode).
    pub credential: CredentialKind,
    /// `nomadNamespace`: the namespace of the repo's parent jobs, where its children are
    /// dispatched; `None` for the daemon's `--runner-namespace`.
    pub nomad_namespace: Option<String>,
}

/// The credential an `app` repo's runner gets (`credential` and `runnerGroupId` in the
/// document).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CredentialKind {
    /// A just-in-time runner configuration: single-use, bound to one runner name and label
    /// set, and the runner's registration id is known before it boots.
    Jit { runner_group_id: u64 },
    /// A registration token, good for any number of runners for an hour: for runner images
    /// that cannot start from a JIT config.
    Registration,
}

/// What a valid document alone says about the credentials its runners will get, where one is
/// weaker than a credential bound to a single runner: `config check` prints these beside
/// `ok`. The live `status` says which a Forgejo instance actually does.
pub fn credential_notes(config: &Config) -> Vec<String> {
    config
        .repos
        .values()
        .filter_map(|repo| match (&repo.mode, &repo.credential) {
            (
                Mode::Forgejo {
                    allow_shared_token: false,
                    ..
                },
                _,
            ) => Some(format!(
                "{} (forgejo): on Forgejo 15 and later each runner is registered on its own, ephemeral, for one job; before 15 the repo dispatches nothing unless it sets \"allowSharedRegistrationToken\": true (`runner-scaler status` says which this instance does)",
                repo.repo
            )),
            (
                Mode::Forgejo {
                    allow_shared_token: true,
                    ..
                },
                _,
            ) => Some(format!(
                "{} (forgejo): allowSharedRegistrationToken: on a Forgejo before 15 every runner gets the repo's shared registration token, which does not expire and registers any number of runners; a job step can read it, or the registration it made (the runner's .runner file), and keep serving the repo's later jobs and their secrets until an admin removes that runner or resets the token. On Forgejo 15 and later the field changes nothing",
                repo.repo
            )),
            (Mode::App, CredentialKind::Registration) => Some(format!(
                "{} (app): credential \"registration\": every runner gets a registration token good for any number of runners for an hour: weaker than the default \"jit\", whose config is single-use and bound to one runner",
                repo.repo
            )),
            _ => None,
        })
        .collect()
}

/// The runner group every repository has (`Default`).
pub const DEFAULT_RUNNER_GROUP_ID: u64 = 1;

impl Default for CredentialKind {
    fn default() -> Self {
        CredentialKind::Jit {
            runner_group_id: DEFAULT_RUNNER_GROUP_ID,
        }
    }
}

/// Where a job goes: which parent, under which profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub parent: String,
    /// Index into the repo's `profiles`; `None` for the default job.
    pub profile: Option<usize>,
}

/// Why a job cannot be routed to any parent.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unroutable {
    /// A label is outside the repo's `labels` allow-list.
    LabelNotAllowed(String),
    /// No profile matches and the repo has no default job.
    NoParent,
}

impl std::fmt::Display for Unroutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unroutable::LabelNotAllowed(label) => {
                write!(f, "label {label:?} is not in the repo's labels")
            }
            Unroutable::NoParent => write!(f, "no profile matches and the repo has no default job"),
        }
    }
}

/// Labels GitHub adds to every self-hosted job; always allowed by a `labels` allow-list.
pub const IMPLICIT_GITHUB_LABELS: &[&str] = &["self-hosted"];

impl RepoConfig {
    /// Routes a job by its labels: the first profile whose label the job carries, else the
    /// default job.
    pub fn route(&self, labels: &LabelSet) -> Result<Route, Unroutable> {
        if let Some(allowed) = &self.labels {
            for label in labels.iter() {
                let implicit = self.mode.is_github() && IMPLICIT_GITHUB_LABELS.contains(&label);
                if !implicit && !allowed.contains(label) {
                    return Err(Unroutable::LabelNotAllowed(label.to_string()));
                }
            }
        }
        if let Some((index, profile)) = self
            .profiles
            .iter()
            .enumerate()
            .find(|(_, p)| labels.contains(&p.label))
        {
            return Ok(Route {
                parent: profile.job.clone(),
                profile: Some(index),
            });
        }
        match &self.default_job {
            Some(job) => Ok(Route {
                parent: job.clone(),
                profile: None,
            }),
            None => Err(Unroutable::NoParent),
        }
    }

    /// Every parent job this repo can dispatch to.
    pub fn parents(&self) -> BTreeSet<String> {
        let mut parents: BTreeSet<String> = self.profiles.iter().map(|p| p.job.clone()).collect();
        parents.extend(self.default_job.clone());
        parents
    }

    /// The labels a Forgejo job search asks for, as the document writes them: the allow-list,
    /// else the profile labels.
    pub fn search_labels(&self) -> BTreeSet<String> {
        self.search_labels_as_written.clone()
    }
}

impl Config {
    /// Every parent job the document names.
    pub fn parents(&self) -> BTreeSet<String> {
        self.repos.values().flat_map(RepoConfig::parents).collect()
    }
}
