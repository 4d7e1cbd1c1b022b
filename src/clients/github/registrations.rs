//! The [`Registrar`] and [`RunnerRegistry`] side: a JIT config or a registration token for a
//! runner about to be dispatched, and the repo's runner registrations, listed and deleted.
//!
//! Every write here carries a per-repo token with `administration: write`; GitHub refusing to
//! delete a busy runner is an outcome, not an error.

use async_trait::async_trait;
use http::{Method, StatusCode};
use tracing::instrument;

use super::app_auth::Permission;
use super::calls::Payload;
use super::pages::{PAGES_MAX, PER_PAGE};
use super::transport::{Target, malformed};
use super::{GitHub, not_github, wire};
use crate::act::{self, Deregistration, Registrar, RunnerIdentity, RunnerRegistry};
use crate::config::{CredentialKind, Mode, RepoConfig};
use crate::model::{ErrorClass, RunnerName};
use crate::observe::{PortError, RunnerRegistration};

#[async_trait]
impl Registrar for GitHub {
    #[instrument(level = "debug", skip_all, fields(repo = %repo.repo))]
    async fn mint(
        &self,
        repo: &RepoConfig,
        runner: RunnerIdentity<'_>,
    ) -> Result<Option<act::Credential>, PortError> {
        match &repo.mode {
            // The runner job reads its admin token from Vault itself; the daemon cannot.
            Mode::Vault { .. } => Ok(None),
            Mode::Forgejo { .. } => Err(not_github(repo)),
            Mode::App => match repo.credential {
                CredentialKind::Jit { runner_group_id } => self
                    .generate_jit_config(repo, runner, runner_group_id)
                    .await
                    .map(Some),
                CredentialKind::Registration => {
                    let doing = format!("mint a registration token for {}", repo.repo);
                    let path = format!(
                        "/repos/{}/{}/actions/runners/registration-token",
                        repo.repo.owner(),
                        repo.repo.name()
                    );
                    let answer = self
                        .repo_call(
                            repo,
                            Permission::AdministrationWrite,
                            Method::POST,
                            &Target::Path(path),
                            Payload::Nothing,
                            &doing,
                        )
                        .await?;
                    let token: wire::Token =
                        serde_json::from_str(&answer.body).map_err(|e| malformed(&doing, &e))?;
                    Ok(Some(act::Credential::RegistrationToken(token.token)))
                }
            },
        }
    }

    fn repo_url(&self, repo: &RepoConfig) -> String {
        format!("{}/{}", self.web_url, repo.repo)
    }
}

/// The runner registrations of `app` repos: read to decide whether a runner is busy before its
/// child is stopped, and deleted first (GitHub refuses with 422 while a job runs).
#[async_trait]
impl RunnerRegistry for GitHub {
    #[instrument(level = "debug", skip_all, fields(repo = %repo.repo))]
    async fn list_runners(&self, repo: &RepoConfig) -> Result<Vec<RunnerRegistration>, PortError> {
        let doing = format!("list runners of {}", repo.repo);
        let first = format!("{}?per_page={PER_PAGE}", runners_path(repo)?);
        // Read when a runner is about to be taken back (and in a slow sweep for stale
        // registrations): no conditional cache, so the answer is always today's. Listing needs
        // only `administration: read`, which the installation's shared read token carries.
        let listing = self
            .walk::<wire::RunnersPage>(repo, Permission::Read, &first, &doing, None)
            .await?;
        if listing.capped {
            return Err(PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: more than {PAGES_MAX} pages of runners"),
            ));
        }
        Ok(listing.items.into_iter().map(registration_of).collect())
    }

    #[instrument(level = "debug", skip_all, fields(repo = %repo.repo, runner_id))]
    async fn get_runner(
        &self,
        repo: &RepoConfig,
        runner_id: u64,
    ) -> Result<Option<RunnerRegistration>, PortError> {
        let doing = format!("read runner {runner_id} of {}", repo.repo);
        let path = format!("{}/{runner_id}", runners_path(repo)?);
        let answer = self
            .repo_call_answering(
                repo,
                Permission::Read,
                Method::GET,
                &Target::Path(path),
                Payload::Nothing,
                &[StatusCode::NOT_FOUND],
                &doing,
            )
            .await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let runner: wire::Runner =
            serde_json::from_str(&answer.body).map_err(|e| malformed(&doing, &e))?;
        Ok(Some(registration_of(runner)))
    }

    #[instrument(level = "debug", skip_all, fields(repo = %repo.repo, runner_id))]
    async fn delete_runner(
        &self,
        repo: &RepoConfig,
        runner_id: u64,
    ) -> Result<Deregistration, PortError> {
        let doing = format!("delete runner {runner_id} of {}", repo.repo);
        let path = format!("{}/{runner_id}", runners_path(repo)?);
        let answer = self
            .repo_call_answering(
                repo,
                Permission::AdministrationWrite,
                Method::DELETE,
                &Target::Path(path),
                Payload::Nothing,
                &[StatusCode::NOT_FOUND, StatusCode::UNPROCESSABLE_ENTITY],
                &doing,
            )
            .await?;
        Ok(match answer.status {
            StatusCode::NOT_FOUND => Deregistration::NotFound,
            // The documented refusal: the runner is still running a job.
            StatusCode::UNPROCESSABLE_ENTITY => Deregistration::StillBusy,
            _ => Deregistration::Deleted,
        })
    }
}

impl GitHub {
    /// `POST …/actions/runners/generate-jitconfig`: registers `runner` (offline until it
    /// boots) with exactly the bucket's labels and returns its single-use configuration.
    async fn generate_jit_config(
        &self,
        repo: &RepoConfig,
        runner: RunnerIdentity<'_>,
        runner_group_id: u64,
    ) -> Result<act::Credential, PortError> {
        let doing = format!(
            "generate a JIT config for runner {} of {}",
            runner.name, repo.repo
        );
        let body = serde_json::json!({
            "name": runner.name.0,
            "runner_group_id": runner_group_id,
            "labels": runner.labels.iter().collect::<Vec<_>>(),
            // Relative to the runner's own directory, inside its allocation.
            "work_folder": "_work",
        });
        let answer = self
            .repo_call(
                repo,
                Permission::AdministrationWrite,
                Method::POST,
                &Target::Path(format!("{}/generate-jitconfig", runners_path(repo)?)),
                Payload::Json(&body),
                &doing,
            )
            .await?;
        let jit: wire::JitConfig =
            serde_json::from_str(&answer.body).map_err(|e| malformed(&doing, &e))?;
        if jit.runner.name != runner.name.0 {
            return Err(PortError::new(
                ErrorClass::Malformed,
                format!(
                    "{doing}: GitHub registered a runner named {:?}",
                    crate::model::clip_chars(&jit.runner.name, 100)
                ),
            ));
        }
        Ok(act::Credential::JitConfig {
            encoded: jit.encoded_jit_config,
            runner_id: jit.runner.id,
        })
    }
}

fn registration_of(runner: wire::Runner) -> RunnerRegistration {
    RunnerRegistration {
        id: runner.id,
        name: RunnerName(runner.name),
        online: runner.status.eq_ignore_ascii_case("online"),
        busy: runner.busy,
    }
}

/// `/repos/{owner}/{repo}/actions/runners` of an `app` repo: only there does the daemon hold
/// a credential that may manage the repo's runners.
fn runners_path(repo: &RepoConfig) -> Result<String, PortError> {
    if !matches!(repo.mode, Mode::App) {
        return Err(PortError::new(
            ErrorClass::Configuration,
            format!(
                "{} is a {} repo: the daemon manages runner registrations in app mode only",
                repo.repo,
                repo.mode.as_str()
            ),
        ));
    }
    Ok(format!(
        "/repos/{}/{}/actions/runners",
        repo.repo.owner(),
        repo.repo.name()
    ))
}
