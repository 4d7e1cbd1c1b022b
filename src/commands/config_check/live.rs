//! Catching a wrong setup before it costs a tick.
//!
//! `config check --live` ([`check_live`]) holds a valid document against the services it
//! names: each parent job's parameterized meta against what the repo's mode sends, the App's
//! installation on each `app` repo, each `vaultPath` readable and each `registerVaultPath`
//! not (the daemon's own guard, [`admin_token_holds`], asks the same), each Forgejo
//! instance's version. One problem per line, naming the repo and what to fix.

use std::collections::BTreeMap;

use crate::clients::forgejo::EPHEMERAL_RUNNER_MAJOR_MIN;
use crate::config::{Config, Mode, RepoConfig};
use crate::control_loop::admin_token::{admin_token_holds, register_paths};
use crate::model::RepoName;
use crate::observe::PortError;
use crate::secrets::SecretSource;
use crate::wiring::LiveClients;

pub use crate::observe::{ParentJob, meta_sent, parent_problems};

/// What `config check --live` found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveReport {
    /// What was checked and found right, one line each.
    pub checked: Vec<String>,
    /// Worth knowing, not wrong.
    pub notes: Vec<String>,
    /// One line per problem, naming the repo and what to fix.
    pub problems: Vec<String>,
}

/// `<repo>: <message>`, unless the message names the repo first already.
fn about(repo: &RepoName, message: &str) -> String {
    if message.starts_with(&repo.to_string()) {
        message.to_string()
    } else {
        format!("{repo}: {message}")
    }
}

/// Checks every repo of `config` against the live services.
pub async fn check_live(config: &Config, clients: &LiveClients) -> LiveReport {
    let mut report = LiveReport::default();
    let mut parents: BTreeMap<String, Result<ParentJob, PortError>> = BTreeMap::new();
    for repo in config.repos.values() {
        check_parents(repo, clients, &mut parents, &mut report).await;
        match &repo.mode {
            Mode::App => check_installation(repo, clients, &mut report).await,
            Mode::Vault { vault_path, .. } => {
                check_readable(repo, vault_path, clients, &mut report).await;
            }
            Mode::Forgejo {
                url, vault_path, ..
            } => {
                // The version is read with the repo's API token: without it, or without the
                // origin it may be sent to, that is the one problem to fix first.
                if check_readable(repo, vault_path, clients, &mut report).await
                    && check_token_origin(repo, vault_path, clients, &mut report).await
                {
                    check_forgejo(repo, url, clients, &mut report).await;
                }
            }
        }
    }
    check_register_paths(config, clients, &mut report).await;
    report
}

async fn check_parents(
    repo: &RepoConfig,
    clients: &LiveClients,
    parents: &mut BTreeMap<String, Result<ParentJob, PortError>>,
    report: &mut LiveReport,
) {
    for parent in repo.parents() {
        // The same parent name may live in two namespaces: one reading per (namespace, name).
        let key = format!(
            "{}/{parent}",
            repo.nomad_namespace.as_deref().unwrap_or_default()
        );
        if !parents.contains_key(&key) {
            let read = crate::observe::ChildSource::read_parent(
                clients.nomad.as_ref(),
                &parent,
                repo.nomad_namespace.as_deref(),
            )
            .await;
            parents.insert(key.clone(), read);
        }
        match &parents[&key] {
            Ok(job) => {
                let problems = parent_problems(repo, &parent, job);
                if problems.is_empty() {
                    report.checked.push(format!(
                        "{}: parent job {parent} takes the meta {} mode sends",
                        repo.repo,
                        repo.mode.as_str()
                    ));
                }
                report.problems.extend(problems);
            }
            Err(e) => report.problems.push(format!(
                "{}: parent job {parent} could not be read: {}",
                repo.repo, e.message
            )),
        }
    }
}

async fn check_installation(repo: &RepoConfig, clients: &LiveClients, report: &mut LiveReport) {
    match clients.github.app_installation_on(&repo.repo).await {
        Ok(Some(id)) => report.checked.push(format!(
            "{}: the GitHub App is installed on it (installation {id})",
            repo.repo
        )),
        Ok(None) => report.problems.push(format!(
            "{}: the GitHub App is not installed on it: install the App on the repo (or on all \
             of {}'s repositories)",
            repo.repo,
            repo.repo.owner()
        )),
        Err(e) => report.problems.push(about(&repo.repo, &e.message)),
    }
}

/// Whether the token field at `path` could be read.
async fn check_readable(
    repo: &RepoConfig,
    path: &str,
    clients: &LiveClients,
    report: &mut LiveReport,
) -> bool {
    let Some(vault) = &clients.vault else {
        report.problems.push(format!(
            "{}: vaultPath {path} cannot be read: VAULT_TOKEN is not set",
            repo.repo
        ));
        return false;
    };
    let field = crate::clients::forgejo::API_TOKEN_FIELD;
    match vault.read_field(path, field).await {
        Ok(_) => {
            report.checked.push(format!(
                "{}: vaultPath {path} is readable and has a {field} field",
                repo.repo
            ));
            true
        }
        Err(e) => {
            report.problems.push(format!(
                "{}: vaultPath {path} is not readable by VAULT_TOKEN: {}; grant read on {} to the \
             daemon's policy and write the {field} field there",
                repo.repo,
                e.message,
                vault.data_path(path)
            ));
            false
        }
    }
}

/// Whether the secret at `path` names the origin of the repo's `forgejoUrl`, the only one its
/// token is sent to. Before this was checked, any `forgejoUrl` got the token: an operator
/// upgrading runs `config check --live` to list the secrets that need their `url`.
async fn check_token_origin(
    repo: &RepoConfig,
    path: &str,
    clients: &LiveClients,
    report: &mut LiveReport,
) -> bool {
    match clients.forgejo.token_origin(repo).await {
        Ok(origin) => {
            report.checked.push(format!(
                "{}: the API token at {path} is for {origin}, the origin of forgejoUrl",
                repo.repo
            ));
            if origin.is_plain_http() {
                report.notes.push(format!(
                    "{}: the API token at {path} travels to {origin} in clear text, as its \
                     secret's url says",
                    repo.repo
                ));
            }
            true
        }
        Err(e) => {
            report.problems.push(about(&repo.repo, &e.message));
            false
        }
    }
}

async fn check_forgejo(
    repo: &RepoConfig,
    url: &url::Url,
    clients: &LiveClients,
    report: &mut LiveReport,
) {
    let shown = url.origin().ascii_serialization();
    let version = clients.forgejo.instance_version(repo).await;
    match version.map(|v| (v.major >= EPHEMERAL_RUNNER_MAJOR_MIN, v.raw)) {
        Ok((true, _)) => report.checked.push(format!(
            "{}: the Forgejo at {shown} is 15 or later: one ephemeral runner per job",
            repo.repo
        )),
        Ok((false, version)) => {
            report.checked.push(format!(
                "{}: the Forgejo at {shown} has the runner job search",
                repo.repo
            ));
            if matches!(
                repo.mode,
                Mode::Forgejo {
                    allow_shared_token: true,
                    ..
                }
            ) {
                report.notes.push(format!(
                    "{}: the Forgejo at {shown} runs {version:?}, older than 15, and allowSharedRegistrationToken \
                     is set: every runner gets the repo's shared registration token, which does \
                     not expire, and a job step can copy it or its runner's registration",
                    repo.repo
                ));
            } else {
                report.problems.push(format!(
                    "{}: the Forgejo at {shown} runs {version:?}, older than 15, which registers no runner per \
                     dispatch, so the repo dispatches nothing: upgrade Forgejo to 15, or accept \
                     a shared registration token a job step can copy with \
                     \"allowSharedRegistrationToken\": true",
                    repo.repo
                ));
            }
        }
        Err(e) => report.problems.push(about(&repo.repo, &e.message)),
    }
}

/// `config check --live`: builds the clients as `run` does (exit 64 on a bad setting),
/// checks, prints what was checked and notes on stdout and one line per problem on stderr;
/// exit 1 on any problem.
pub fn run_live_check(config: &Config, args: &crate::cli::DaemonArgs) -> std::process::ExitCode {
    use crate::cli::{EXIT_BAD_SETTINGS, EXIT_INVALID};
    use std::process::ExitCode;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("start the tokio runtime");
    let report = runtime.block_on(async {
        let built = crate::wiring::build(args).await?;
        Ok::<_, String>(check_live(config, &built.live).await)
    });
    let report = match report {
        Ok(report) => report,
        Err(e) => {
            eprintln!("runner-scaler: {e}");
            return ExitCode::from(EXIT_BAD_SETTINGS as u8);
        }
    };
    for line in &report.checked {
        println!("checked: {line}");
    }
    for note in &report.notes {
        println!("note: {note}");
    }
    for problem in &report.problems {
        eprintln!("{problem}");
    }
    if report.problems.is_empty() {
        println!("live: all well");
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_INVALID as u8)
    }
}

async fn check_register_paths(config: &Config, clients: &LiveClients, report: &mut LiveReport) {
    let paths = register_paths(config);
    if paths.is_empty() {
        return;
    }
    let Some(vault) = &clients.vault else {
        for (repo, path) in &paths {
            report.problems.push(format!(
                "{repo}: registerVaultPath {path} cannot be checked: VAULT_TOKEN is not set"
            ));
        }
        return;
    };
    let holds = admin_token_holds(config, vault.as_ref()).await;
    for (repo, path) in &paths {
        match holds.get(repo) {
            Some(why) => report.problems.push(format!("{repo}: {why}")),
            None => report.checked.push(format!(
                "{repo}: registerVaultPath {path} is not readable by VAULT_TOKEN"
            )),
        }
    }
}
