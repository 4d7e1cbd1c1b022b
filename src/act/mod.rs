//! Act: carry out a [`Plan`](crate::plan::Plan).
//!
//! Reality may refuse: a dispatch Nomad rejects or a child that is no longer dead when it is
//! re-read is an [`Outcome`] to report, not an error that stops the tick.

use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};

use crate::config::{Mode, RepoConfig};
use crate::model::{ChildId, LabelSet, RunnerName};
use crate::observe::{ChildStatus, PortError, RunnerRegistration};

/// A credential minted for one runner. Never logged, never in an error: its `Debug` shows
/// only its kind (and a JIT runner's id, which is no secret).
pub enum Credential {
    /// A registration token: on GitHub good for any number of runners for an hour, on
    /// Forgejo the repo's standing token.
    RegistrationToken(SecretString),
    /// A GitHub just-in-time runner configuration: single-use, bound to one runner name and
    /// label set. GitHub registered the runner when it made it, so its id is known before
    /// the runner boots.
    JitConfig {
        encoded: SecretString,
        runner_id: u64,
    },
    /// A Forgejo (15 and later) ephemeral runner the daemon registered for this one runner:
    /// its uuid and token are its whole identity, good for one job. Forgejo made it, so its
    /// id is known before the runner boots, and it is deleted once its child is purged.
    EphemeralRunner {
        uuid: SecretString,
        token: SecretString,
        runner_id: u64,
    },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::RegistrationToken(_) => f.write_str("RegistrationToken([REDACTED])"),
            Credential::JitConfig { runner_id, .. } => {
                write!(
                    f,
                    "JitConfig {{ runner_id: {runner_id}, encoded: [REDACTED] }}"
                )
            }
            Credential::EphemeralRunner { runner_id, .. } => write!(
                f,
                "EphemeralRunner {{ runner_id: {runner_id}, uuid: [REDACTED], token: [REDACTED] }}"
            ),
        }
    }
}

impl Credential {
    /// The registration id of the runner the credential is bound to, where it is bound.
    pub fn runner_id(&self) -> Option<u64> {
        match self {
            Credential::RegistrationToken(_) => None,
            Credential::JitConfig { runner_id, .. }
            | Credential::EphemeralRunner { runner_id, .. } => Some(*runner_id),
        }
    }

    /// The value as the runner takes it when it travels unwrapped (`<uuid>:<token>` for a
    /// Forgejo ephemeral runner, as `nomad/runner/entrypoint.sh` reads it).
    pub fn plain(&self) -> SecretString {
        match self {
            Credential::RegistrationToken(token) => token.clone(),
            Credential::JitConfig { encoded, .. } => encoded.clone(),
            Credential::EphemeralRunner { uuid, token, .. } => SecretString::from(format!(
                "{}:{}",
                uuid.expose_secret(),
                token.expose_secret()
            )),
        }
    }

    /// The fields the runner's entrypoint finds in the unwrapped object
    /// (`nomad/runner/entrypoint.sh`): exactly one of `{jitconfig}`, `{registration_token}`
    /// or `{runner_uuid, runner_token}`.
    pub fn wrapped_fields(&self) -> Vec<(&'static str, SecretString)> {
        match self {
            Credential::RegistrationToken(token) => vec![("registration_token", token.clone())],
            Credential::JitConfig { encoded, .. } => vec![("jitconfig", encoded.clone())],
            Credential::EphemeralRunner { uuid, token, .. } => vec![
                ("runner_uuid", uuid.clone()),
                ("runner_token", token.clone()),
            ],
        }
    }

    /// A short name for logs and reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Credential::RegistrationToken(_) => "registration token",
            Credential::JitConfig { .. } => "JIT config",
            Credential::EphemeralRunner { .. } => "ephemeral runner",
        }
    }
}

/// The runner a credential is minted for.
#[derive(Clone, Copy, Debug)]
pub struct RunnerIdentity<'a> {
    pub name: &'a RunnerName,
    /// Its bucket's labels: a JIT runner carries exactly these.
    pub labels: &'a LabelSet,
}

/// Mints runner credentials. Implemented by the GitHub and Forgejo clients.
#[async_trait]
pub trait Registrar: Send + Sync {
    /// A fresh credential for `runner` of `repo`, or `None` where the mode mints none
    /// (`vault` mode: the runner job reads its admin token from Vault itself).
    async fn mint(
        &self,
        repo: &RepoConfig,
        runner: RunnerIdentity<'_>,
    ) -> Result<Option<Credential>, PortError>;

    /// The web URL a runner registers against (`https://github.com/owner/repo`).
    fn repo_url(&self, repo: &RepoConfig) -> String;

    /// Why `repo`'s runners get a credential weaker than one bound to a single runner, as far
    /// as this registrar already knows without asking anyone; `None` when they do not.
    fn weaker_credential(&self, _repo: &RepoConfig) -> Option<String> {
        None
    }
}

/// Wraps credentials with Vault response wrapping (`POST sys/wrapping/wrap`), so that what
/// Nomad stores in dispatch meta is a single-use token and not the credential itself.
/// Implemented by the Vault client.
#[async_trait]
pub trait CredentialWrapper: Send + Sync {
    /// A wrapping token for the object of `fields`, unwrappable once within `ttl`.
    async fn wrap(
        &self,
        fields: &[(&'static str, SecretString)],
        ttl: std::time::Duration,
    ) -> Result<SecretString, PortError>;
}

/// Finds the registrar for a repo's mode.
pub trait Registrars: Sync {
    /// `None` when the daemon has no client for `mode`.
    fn for_mode(&self, mode: &Mode) -> Option<&dyn Registrar>;

    /// The runner registrations of `mode`'s repos; `None` where the daemon has no such API.
    fn runners_for(&self, mode: &Mode) -> Option<&dyn RunnerRegistry>;

    /// Where the runner a dispatch registered (a Forgejo ephemeral runner) is deleted once
    /// its child is purged; `None` where the daemon registers no runner per dispatch.
    fn registered_runners(&self, _mode: &Mode) -> Option<&dyn RegisteredRunners> {
        None
    }

    /// Where credentials are wrapped before they go into dispatch meta; `None` without Vault.
    fn wrapper(&self) -> Option<&dyn CredentialWrapper> {
        None
    }
}

/// The meta a child is dispatched with.
#[derive(Debug)]
pub struct DispatchMeta {
    pub repo_url: String,
    /// Lower-case, sorted, comma-separated.
    pub labels: String,
    pub runner_name: RunnerName,
    /// The `runner_token` meta: the plain credential, or a Vault wrapping token of it.
    pub runner_token: Option<SecretString>,
}

#[derive(Debug)]
pub struct DispatchRequest {
    pub parent: String,
    /// The parent's namespace: the repo's `nomadNamespace`; `None` for the daemon's
    /// `--runner-namespace`.
    pub namespace: Option<String>,
    pub meta: DispatchMeta,
    /// Fresh per planned dispatch; reused only when retrying that same request.
    pub idempotency_token: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dispatched {
    pub child: ChildId,
    /// Nomad returned an existing child for the idempotency token: not a new dispatch.
    pub deduplicated: bool,
}

/// Dispatches and purges children. Implemented by the Nomad client.
#[async_trait]
pub trait ChildControl: Send + Sync {
    async fn dispatch(&self, request: &DispatchRequest) -> Result<Dispatched, PortError>;

    /// Re-reads one child's status at the moment of acting; `None` when it is gone.
    async fn child_status(&self, child: &ChildId) -> Result<Option<ChildStatus>, PortError>;

    /// Deregisters and purges a child (`DELETE /v1/job/<id>?purge=true`).
    async fn purge(&self, child: &ChildId) -> Result<(), PortError>;

    /// Re-reads a child's allocations at the moment of acting (`GET /v1/job/<id>/allocations`):
    /// true when one is pending, running or on a disconnected client, i.e. a runner may exist.
    async fn has_live_allocation(&self, child: &ChildId) -> Result<bool, PortError>;

    /// Stops a child without purging it (`DELETE /v1/job/<id>`): its allocation is told to
    /// stop and the child turns dead, to be purged by a later tick once re-read as dead.
    async fn stop(&self, child: &ChildId) -> Result<(), PortError>;
}

/// What the forge said to deleting a runner's registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deregistration {
    /// 204: the registration is gone.
    Deleted,
    /// 422: the forge refused because the runner is executing a job: a veto, not an error.
    StillBusy,
    /// 404: gone, or this credential may not see it; the caller decides which.
    NotFound,
}

/// The runner registrations of a repo (GitHub `app` mode: the daemon holds `administration:
/// write` for the repo). Implemented by the GitHub client.
#[async_trait]
pub trait RunnerRegistry: Send + Sync {
    /// Every registration of the repo, all pages.
    async fn list_runners(&self, repo: &RepoConfig) -> Result<Vec<RunnerRegistration>, PortError>;

    /// One registration as the forge knows it now (`GET …/actions/runners/<id>`): the last
    /// reading before its delete, so a runner that took a job since the listing is vetoed.
    /// `None` on a 404 (gone, or this credential may not see it).
    async fn get_runner(
        &self,
        repo: &RepoConfig,
        runner_id: u64,
    ) -> Result<Option<RunnerRegistration>, PortError>;

    /// Deletes one registration (`DELETE …/actions/runners/<id>`).
    async fn delete_runner(
        &self,
        repo: &RepoConfig,
        runner_id: u64,
    ) -> Result<Deregistration, PortError>;
}

/// Runners the daemon registered itself, one per dispatch (Forgejo 15 and later), deleted
/// once their child is purged so an instance does not fill with offline runners.
/// Implemented by the Forgejo client.
#[async_trait]
pub trait RegisteredRunners: Send + Sync {
    /// Deletes runner `runner_id` of `repo` (`DELETE …/actions/runners/<id>`).
    async fn delete_registered(
        &self,
        repo: &RepoConfig,
        runner_id: u64,
    ) -> Result<Deregistration, PortError>;
}

pub mod execute;
pub mod services;
