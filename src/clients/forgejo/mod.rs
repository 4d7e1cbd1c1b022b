//! Forgejo Actions: the runner-job search (queue) and runner credentials, for repos in
//! `forgejo` mode. From Forgejo 15 every dispatch gets an ephemeral runner of its own
//! (`POST …/actions/runners`), deleted once its child is purged; older instances only have
//! the repo's standing registration token, which every runner of the repo shares and which
//! does not expire: weaker, and said so by `config check` and `status`.
//!
//! The API token of a repo is read from Vault (field `token` at the repo's `vaultPath`) and
//! sent as `Authorization: token <t>` only: Forgejo accepts the lower-case `token` scheme
//! (not `Token`), and the deprecated `?token=` query form would put it in URLs and logs.
//!
//! Requests go over the network ([`Forgejo::new`]) or to an in-memory tower service
//! ([`Forgejo::with_service`]); everything above the sending of one request is the same code.

mod transport;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::{Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use tokio::time::Instant;
use url::Url;

use crate::act::{Credential, Deregistration, RegisteredRunners, Registrar, RunnerIdentity};
use crate::clients::http::{TlsFiles, build_client, class_of_status, redirect_refused};
use crate::clients::origin::Origin;
use crate::config::{Mode, RepoConfig};
use crate::model::ErrorClass;
use crate::observe::{ForgeJob, JobState, PortError, QueueSource, RepoJobs};
use crate::secrets::SecretSource;
use transport::{ApiRequest, Transport};

/// The body of a request an in-memory service is handed ([`Forgejo::with_service`]).
pub use hyper::body::Bytes;
pub use transport::ServiceError;

/// Field of the Vault secret at a repo's `vaultPath` that holds the Forgejo API token.
pub const API_TOKEN_FIELD: &str = "token";

/// Field of the same secret that names the Forgejo the token was issued for. The token goes
/// only to that origin: the document's `forgejoUrl` is compared with it, never trusted alone,
/// since whoever edits the document need not be trusted with the token.
pub const API_URL_FIELD: &str = "url";

/// The largest answer read from a Forgejo. The biggest is a repo's runner-job search, which
/// Forgejo does not page: a few hundred bytes a job.
pub const RESPONSE_BODY_MAX_BYTES: usize = 8 * 1024 * 1024;

/// How long an API token read from Vault is reused. Short, so that a rotated token is picked
/// up within minutes even when the old one keeps working; a 401 drops it at once.
pub const API_TOKEN_CACHE_TTL: Duration = Duration::from_secs(5 * 60);

/// How long an instance's version is believed before it is read again.
pub const VERSION_CACHE_TTL: Duration = Duration::from_secs(10 * 60);

/// The first Forgejo major version with the runner-job search
/// (`GET /repos/{owner}/{repo}/actions/runners/jobs`, Forgejo PR #6300, v11.0.0).
pub const JOB_SEARCH_MAJOR_MIN: u64 = 11;

/// The first Forgejo major version that registers a runner through the API
/// (`POST /repos/{owner}/{repo}/actions/runners`, `ephemeral: true` → `{id, uuid, token}`)
/// and deletes one (`DELETE …/actions/runners/{id}`).
pub const EPHEMERAL_RUNNER_MAJOR_MIN: u64 = 15;

struct CachedToken {
    token: SecretString,
    /// The origin the token's secret names, the only one it is sent to.
    origin: Origin,
    read_at: Instant,
}

/// A Forgejo version as `GET /api/v1/version` reports it (`11.0.0+gitea-1.22.0`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForgejoVersion {
    pub raw: String,
    pub major: u64,
    pub minor: u64,
}

impl ForgejoVersion {
    /// Reads the leading `major.minor`; `None` when there is none.
    pub fn parse(raw: &str) -> Option<ForgejoVersion> {
        let core = raw.trim().trim_start_matches('v');
        let mut parts = core.split(|c: char| !c.is_ascii_digit());
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        Some(ForgejoVersion {
            raw: raw.trim().to_string(),
            major,
            minor,
        })
    }
}

/// The Forgejo client: one per daemon, serving every `forgejo` repo of every instance.
pub struct Forgejo {
    transport: Transport,
    secrets: Arc<dyn SecretSource>,
    /// API tokens by Vault path.
    tokens: Mutex<HashMap<String, CachedToken>>,
    /// Versions of the instances that passed the version gate, by API base URL, and when each
    /// was read. Only passing versions are kept, and only for [`VERSION_CACHE_TTL`], so an
    /// instance upgraded past a gate (the job search, or 15's per-runner registration) is
    /// noticed without a restart.
    versions: Mutex<HashMap<String, (ForgejoVersion, Instant)>>,
    token_ttl: Duration,
}

/// What one call is about, for error messages: `list runner jobs for alex/api at http://f:3000`.
struct Call<'a> {
    repo: &'a RepoConfig,
    base: String,
    shown_base: String,
    /// The origin of the document's `forgejoUrl`, or why it has none.
    origin: Result<Origin, String>,
    vault_path: &'a str,
    /// `allowSharedRegistrationToken`.
    allow_shared_token: bool,
}

impl Call<'_> {
    fn doing(&self, what: &str) -> String {
        format!("{what} for {} at {}", self.repo.repo, self.shown_base)
    }
}

#[derive(Deserialize)]
struct WireJob {
    id: u64,
    #[serde(default)]
    runs_on: Option<Vec<String>>,
    #[serde(default)]
    task_id: u64,
    status: String,
}

#[derive(Deserialize)]
struct WireVersion {
    version: String,
}

#[derive(Deserialize)]
struct WireRegistrationToken {
    token: String,
}

#[derive(Deserialize)]
struct WireRegisteredRunner {
    id: u64,
    uuid: String,
    token: String,
}

#[derive(Deserialize)]
struct WireError {
    message: Option<String>,
}

impl Forgejo {
    pub fn new(
        secrets: Arc<dyn SecretSource>,
        tls: &TlsFiles,
        timeout: Duration,
    ) -> Result<Forgejo, String> {
        let client = build_client("Forgejo", tls, timeout)?;
        Ok(Forgejo::over(Transport::Network(client), secrets))
    }

    /// A client whose requests are answered by `service` instead of going over the network
    /// (the seeded simulator's Forgejo): everything above the socket runs as in production,
    /// the token's binding to its origin included. Requests carry absolute URIs
    /// (`https://forgejo.example/api/v1/version`), so one service can be several instances.
    /// A 3xx is refused, not followed, and a body over [`RESPONSE_BODY_MAX_BYTES`] is not
    /// read, as over the network; `timeout` bounds each exchange on tokio's clock, so it is
    /// virtual under a paused one. Each request goes to a clone of `service`.
    pub fn with_service<S, B>(
        secrets: Arc<dyn SecretSource>,
        service: S,
        timeout: Duration,
    ) -> Forgejo
    where
        S: tower::Service<http::Request<Bytes>, Response = http::Response<B>>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<ServiceError>,
        B: Into<reqwest::Body> + 'static,
    {
        Forgejo::over(Transport::over_service(service, timeout), secrets)
    }

    fn over(transport: Transport, secrets: Arc<dyn SecretSource>) -> Forgejo {
        Forgejo {
            transport,
            secrets,
            tokens: Mutex::new(HashMap::new()),
            versions: Mutex::new(HashMap::new()),
            token_ttl: API_TOKEN_CACHE_TTL,
        }
    }

    /// Overrides how long an API token is reused (tests, simulation).
    pub fn with_token_ttl(mut self, ttl: Duration) -> Forgejo {
        self.token_ttl = ttl;
        self
    }

    fn tokens(&self) -> MutexGuard<'_, HashMap<String, CachedToken>> {
        self.tokens.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn versions(&self) -> MutexGuard<'_, HashMap<String, (ForgejoVersion, Instant)>> {
        self.versions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn call<'a>(&self, repo: &'a RepoConfig) -> Result<Call<'a>, PortError> {
        match &repo.mode {
            Mode::Forgejo {
                url,
                vault_path,
                allow_shared_token,
            } => Ok(Call {
                repo,
                base: url.as_str().trim_end_matches('/').to_string(),
                shown_base: shown_url(url),
                origin: Origin::of(url),
                vault_path,
                allow_shared_token: *allow_shared_token,
            }),
            other => Err(PortError::new(
                ErrorClass::Configuration,
                format!(
                    "{} is in {} mode, not forgejo mode",
                    repo.repo,
                    other.as_str()
                ),
            )),
        }
    }

    /// The repo's API token and whether it came from the cache; only when the document's
    /// `forgejoUrl` is the origin the token's secret names.
    async fn api_token(&self, call: &Call<'_>) -> Result<(SecretString, bool), PortError> {
        if let Some(cached) = self.tokens().get(call.vault_path)
            && cached.read_at.elapsed() < self.token_ttl
            && call.origin.as_ref() == Ok(&cached.origin)
        {
            return Ok((cached.token.clone(), true));
        }
        // Not cached, expired, or cached for another origin: read afresh, so a secret whose
        // `url` was just corrected is seen at once.
        let (token, origin) = self.bound_token(call).await?;
        self.tokens().insert(
            call.vault_path.to_string(),
            CachedToken {
                token: token.clone(),
                origin,
                read_at: Instant::now(),
            },
        );
        Ok((token, false))
    }

    /// Reads the token and the origin it is for from Vault, and refuses it unless that origin
    /// is the document's `forgejoUrl`'s.
    async fn bound_token(&self, call: &Call<'_>) -> Result<(SecretString, Origin), PortError> {
        let repo = &call.repo.repo;
        let path = call.vault_path;
        let refused = |problem: String| PortError::new(ErrorClass::Configuration, problem);
        let read = self
            .secrets
            .read_fields(path, &[API_TOKEN_FIELD, API_URL_FIELD])
            .await
            .map_err(|e| e.context(format!("read the Forgejo API token of {repo}")))?;
        let mut read = read.into_iter();
        let (Some(token), url) = (read.next().flatten(), read.next().flatten()) else {
            return Err(refused(format!(
                "{repo}: the Vault secret {path} has no {API_TOKEN_FIELD} field: write the \
                 repo's Forgejo API token there"
            )));
        };
        let Some(url) = url else {
            return Err(refused(format!(
                "{repo}: the Vault secret {path} does not say which Forgejo its token is for, \
                 so it is sent nowhere: add the instance's address beside the token (vault kv \
                 patch {path} {API_URL_FIELD}=https://forgejo.example)"
            )));
        };
        // The secret's own value: shown only once it parsed as an origin without userinfo.
        let bound = Origin::parse(url.expose_secret()).map_err(|problem| {
            refused(format!(
                "{repo}: the {API_URL_FIELD} field of the Vault secret {path} {problem}: write \
                 the address of the Forgejo the token was issued for"
            ))
        })?;
        match &call.origin {
            Ok(origin) if *origin == bound => {}
            Ok(origin) => {
                return Err(refused(format!(
                    "{repo}: forgejoUrl names {origin}, but the API token at Vault path {path} \
                     is for {bound}: nothing is sent to {origin}; correct forgejoUrl, or, if the \
                     instance moved, the {API_URL_FIELD} field of the secret"
                )));
            }
            Err(problem) => {
                return Err(refused(format!("{repo}: forgejoUrl {problem}")));
            }
        }
        if reqwest::header::HeaderValue::from_str(&format!("token {}", token.expose_secret()))
            .is_err()
        {
            return Err(refused(format!(
                "the Forgejo API token of {repo} (Vault path {path}) contains characters not \
                 allowed in an HTTP header"
            )));
        }
        Ok((token, bound))
    }

    /// Where `repo`'s API token may be sent, read from its secret: `config check --live`
    /// shows it, and refuses a repo whose `forgejoUrl` is elsewhere.
    pub async fn token_origin(&self, repo: &RepoConfig) -> Result<Origin, PortError> {
        let call = self.call(repo)?;
        self.bound_token(&call).await.map(|(_, origin)| origin)
    }

    /// GETs `path` under the instance's `/api/v1` with the repo's token.
    async fn get(
        &self,
        call: &Call<'_>,
        path: &str,
        query: &[(&str, String)],
        doing: &str,
    ) -> Result<Vec<u8>, PortError> {
        self.send(call, Method::GET, path, query, None, doing)
            .await
            .map(|(_, body)| body)
    }

    /// [`Self::answer`], with any status but a success turned into an error.
    async fn send(
        &self,
        call: &Call<'_>,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        json: Option<&serde_json::Value>,
        doing: &str,
    ) -> Result<(StatusCode, Vec<u8>), PortError> {
        let (status, body, token) = self.answer(call, method, path, query, json, doing).await?;
        if !status.is_success() {
            return Err(status_error(doing, status, &body, &token));
        }
        Ok((status, body))
    }

    /// Sends one request to `path` under the instance's `/api/v1` with the repo's token and
    /// answers the status, the body and the token it went with. A 401 on a cached token drops
    /// it and retries once with a token read fresh from Vault.
    async fn answer(
        &self,
        call: &Call<'_>,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        json: Option<&serde_json::Value>,
        doing: &str,
    ) -> Result<(StatusCode, Vec<u8>, SecretString), PortError> {
        let (mut token, mut cached) = self.api_token(call).await?;
        loop {
            let request = ApiRequest {
                base: &call.base,
                method: method.clone(),
                path,
                query,
                json,
                token: &token,
            };
            let answer = self.transport.send(request, doing).await?;
            let status = answer.status();
            if status == StatusCode::UNAUTHORIZED {
                // Refused: never reuse it. A cached token may have been rotated in Vault, so
                // it earns one retry with a fresh read; a fresh one does not.
                self.tokens().remove(call.vault_path);
                if cached {
                    (token, cached) = self.api_token(call).await?;
                    continue;
                }
            }
            let body = answer.read_body(doing).await?;
            return Ok((status, body, token));
        }
    }

    /// Checks once per instance that it has the runner-job search, and answers its version.
    async fn ensure_version(&self, call: &Call<'_>) -> Result<ForgejoVersion, PortError> {
        if let Some((version, read_at)) = self.versions().get(&call.base)
            && read_at.elapsed() < VERSION_CACHE_TTL
        {
            return Ok(version.clone());
        }
        let doing = call.doing("read the Forgejo version");
        let body = self.get(call, "version", &[], &doing).await?;
        let wire: WireVersion = serde_json::from_slice(&body)
            .map_err(|e| PortError::new(ErrorClass::Malformed, format!("{doing}: {e}")))?;
        let version = ForgejoVersion::parse(&wire.version).ok_or_else(|| {
            PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: version {:?} has no major number", wire.version),
            )
        })?;
        if version.major < JOB_SEARCH_MAJOR_MIN {
            return Err(PortError::new(
                ErrorClass::Configuration,
                format!(
                    "{} is on a Forgejo at {} running version {:?}: the runner job search needs Forgejo {JOB_SEARCH_MAJOR_MIN}.0 or later",
                    call.repo.repo, call.shown_base, version.raw
                ),
            ));
        }
        self.versions()
            .insert(call.base.clone(), (version.clone(), Instant::now()));
        Ok(version)
    }

    /// The version of `repo`'s instance, once it passed the job-search gate.
    pub async fn instance_version(&self, repo: &RepoConfig) -> Result<ForgejoVersion, PortError> {
        let call = self.call(repo)?;
        self.ensure_version(&call).await
    }

    /// Forgejo 15: registers one ephemeral runner for `runner` and answers its id, uuid and
    /// token. Forgejo takes no labels here: the runner declares them when it connects.
    async fn register_ephemeral(
        &self,
        call: &Call<'_>,
        runner: RunnerIdentity<'_>,
    ) -> Result<Credential, PortError> {
        let repo = call.repo;
        let doing = call.doing(&format!("register ephemeral runner {}", runner.name));
        let path = format!(
            "repos/{}/{}/actions/runners",
            repo.repo.owner(),
            repo.repo.name()
        );
        let options = serde_json::json!({
            "name": runner.name.to_string(),
            "description": format!("runner-scaler, labels {}", runner.labels.to_meta()),
            "ephemeral": true,
        });
        let (status, body) = self
            .send(call, Method::POST, &path, &[], Some(&options), &doing)
            .await?;
        if status != StatusCode::CREATED {
            return Err(PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: {status}, not 201 Created"),
            ));
        }
        // The body holds the runner's secret: say only what shape was expected.
        let wire: WireRegisteredRunner = serde_json::from_slice(&body).map_err(|_| {
            PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: the response is not {{\"id\": int, \"uuid\": string, \"token\": string}}"),
            )
        })?;
        if wire.uuid.trim().is_empty() || wire.token.trim().is_empty() {
            return Err(PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: the uuid or the token is empty"),
            ));
        }
        Ok(Credential::EphemeralRunner {
            uuid: SecretString::from(wire.uuid),
            token: SecretString::from(wire.token),
            runner_id: wire.id,
        })
    }
}

#[async_trait]
impl QueueSource for Forgejo {
    async fn list_jobs(&self, repo: &RepoConfig) -> Result<RepoJobs, PortError> {
        let call = self.call(repo)?;
        // Forgejo compares labels case-sensitively: they are asked for as the document writes
        // them.
        let labels = repo.search_labels();
        // The search returns jobs whose every label is among those asked for: asking for none
        // matches nothing (Forgejo 11.0). The document check refuses such a repo; reporting no
        // demand here would hide its jobs.
        if labels.is_empty() {
            return Err(PortError::new(
                ErrorClass::Configuration,
                format!(
                    "list runner jobs for {}: the job search has no label to ask for (set labels or profiles)",
                    repo.repo
                ),
            ));
        }
        self.ensure_version(&call).await?;
        let doing = call.doing("list runner jobs");
        let joined = labels.into_iter().collect::<Vec<_>>().join(",");
        let path = format!(
            "repos/{}/{}/actions/runners/jobs",
            repo.repo.owner(),
            repo.repo.name()
        );
        let body = self
            .get(&call, &path, &[("labels", joined)], &doing)
            .await?;
        // A Go nil slice: no job matched.
        let wire: Option<Vec<WireJob>> = serde_json::from_slice(&body)
            .map_err(|e| PortError::new(ErrorClass::Malformed, format!("{doing}: {e}")))?;
        let jobs = wire
            .unwrap_or_default()
            .into_iter()
            .filter_map(|job| {
                let state = match (job.status.as_str(), job.task_id) {
                    // `waiting` lasts from creation until a runner claims the job and for a
                    // moment after: only a job without a task is new demand.
                    ("waiting", 0) => JobState::Queued,
                    ("waiting", _) | ("running", _) => JobState::Claimed,
                    _ => return None,
                };
                Some(ForgeJob {
                    id: job.id,
                    labels: job.runs_on.unwrap_or_default(),
                    state,
                    queued_at: None,
                })
            })
            .collect();
        Ok(RepoJobs {
            jobs,
            truncated: false,
        })
    }
}

#[async_trait]
impl Registrar for Forgejo {
    async fn mint(
        &self,
        repo: &RepoConfig,
        runner: RunnerIdentity<'_>,
    ) -> Result<Option<Credential>, PortError> {
        let call = self.call(repo)?;
        let version = self.ensure_version(&call).await?;
        if version.major >= EPHEMERAL_RUNNER_MAJOR_MIN {
            return self.register_ephemeral(&call, runner).await.map(Some);
        }
        if !call.allow_shared_token {
            // The shared token registers a runner whose registration (its `.runner` file) a
            // job step can read during its own job and reuse to receive the repo's later jobs
            // and their secrets; before 15 there is no API to remove it afterwards.
            return Err(PortError::new(
                ErrorClass::Configuration,
                format!(
                    "{}: the Forgejo at {} runs {:?}, which registers no runner per dispatch: its \
                     runners would share the repo's registration token, which a job step can copy \
                     and keep serving the repo's jobs and their secrets; upgrade Forgejo to \
                     {EPHEMERAL_RUNNER_MAJOR_MIN}, or accept that with \
                     \"allowSharedRegistrationToken\": true",
                    repo.repo, call.shown_base, version.raw
                ),
            ));
        }
        let doing = call.doing("get a runner registration token");
        let path = format!(
            "repos/{}/{}/actions/runners/registration-token",
            repo.repo.owner(),
            repo.repo.name()
        );
        let body = self.get(&call, &path, &[], &doing).await?;
        // serde's error text may quote the body, and the body is the secret: say only what
        // shape was expected.
        let wire: WireRegistrationToken = serde_json::from_slice(&body).map_err(|_| {
            PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: the response is not {{\"token\": string}}"),
            )
        })?;
        if wire.token.trim().is_empty() {
            return Err(PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: the token is empty"),
            ));
        }
        Ok(Some(Credential::RegistrationToken(SecretString::from(
            wire.token,
        ))))
    }

    /// Known once the instance's version was read (the first tick).
    fn weaker_credential(&self, repo: &RepoConfig) -> Option<String> {
        let call = self.call(repo).ok()?;
        let (version, _) = self.versions().get(&call.base).cloned()?;
        (version.major < EPHEMERAL_RUNNER_MAJOR_MIN && call.allow_shared_token).then(|| {
            format!(
                "{}: the Forgejo at {} runs {:?}, which registers no runner per dispatch, and allowSharedRegistrationToken is set: every runner gets the repo's shared registration token, which does not expire and registers any number of runners, and a job step can copy it or its runner's registration to serve the repo's later jobs and their secrets (Forgejo {EPHEMERAL_RUNNER_MAJOR_MIN} and later register one ephemeral runner each)",
                repo.repo, call.shown_base, version.raw
            )
        })
    }

    /// `<forgejoUrl>/<owner>/<repo>`; empty for a repo not in forgejo mode, which this client
    /// never serves.
    fn repo_url(&self, repo: &RepoConfig) -> String {
        match &repo.mode {
            Mode::Forgejo { url, .. } => format!(
                "{}/{}/{}",
                url.as_str().trim_end_matches('/'),
                repo.repo.owner(),
                repo.repo.name()
            ),
            _ => String::new(),
        }
    }
}

#[async_trait]
impl RegisteredRunners for Forgejo {
    async fn delete_registered(
        &self,
        repo: &RepoConfig,
        runner_id: u64,
    ) -> Result<Deregistration, PortError> {
        let call = self.call(repo)?;
        let doing = call.doing(&format!("delete runner {runner_id}"));
        let path = format!(
            "repos/{}/{}/actions/runners/{runner_id}",
            repo.repo.owner(),
            repo.repo.name()
        );
        let (status, body, token) = self
            .answer(&call, Method::DELETE, &path, &[], None, &doing)
            .await?;
        match status {
            s if s.is_success() => Ok(Deregistration::Deleted),
            // Forgejo deleted it itself, or an operator did: either way it is gone.
            StatusCode::NOT_FOUND => Ok(Deregistration::NotFound),
            _ => Err(status_error(&doing, status, &body, &token)),
        }
    }
}

/// The instance URL as shown in messages: without a trailing slash or any password.
fn shown_url(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("redacted"));
    }
    shown.as_str().trim_end_matches('/').to_string()
}

/// `list runner jobs for alex/api at http://f:3000: 403 Forbidden: <Forgejo's message>`.
fn status_error(doing: &str, status: StatusCode, body: &[u8], token: &SecretString) -> PortError {
    if status.is_redirection() {
        return redirect_refused("Forgejo", doing, status);
    }
    let detail = serde_json::from_slice::<WireError>(body)
        .ok()
        .and_then(|e| e.message)
        .map(|m| {
            let secret = token.expose_secret();
            let mut m = m.trim().to_string();
            if !secret.is_empty() {
                m = m.replace(secret, "[REDACTED]");
            }
            format!(": {:?}", crate::model::clip_chars(&m, 200))
        })
        .unwrap_or_default();
    PortError::new(
        class_of_status(status),
        format!("{doing}: {status}{detail}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_by_their_leading_major_and_minor() {
        for (raw, major, minor) in [
            ("11.0.0+gitea-1.22.0", 11, 0),
            ("v10.0.3", 10, 0),
            ("15.0.0-dev-123-abcdef+gitea-1.22.0", 15, 0),
            ("11.2", 11, 2),
            // Gitea reports its own numbering and has no runner job search.
            ("1.22.0", 1, 22),
        ] {
            let version = ForgejoVersion::parse(raw).unwrap();
            assert_eq!((version.major, version.minor), (major, minor), "{raw}");
        }
        for raw in ["", "dev", "+gitea"] {
            assert!(ForgejoVersion::parse(raw).is_none(), "{raw:?}");
        }
    }

    #[test]
    fn instance_urls_are_shown_without_password_or_trailing_slash() {
        let url: Url = "https://ci:hunter2@forgejo.example/sub/".parse().unwrap();
        let shown = shown_url(&url);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.ends_with("/sub"), "{shown}");
    }
}
