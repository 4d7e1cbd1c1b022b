//! Which token a call carries, and where it comes from: in `app` mode an installation token
//! (the installation's shared read token, or a write token for one repo), minted with the
//! App's JWT and cached; in `vault` mode the polling token read from Vault.
//!
//! The token cache itself ([`TokenCache`]) and the JWT live in `app_auth`; this file asks
//! GitHub for them.

use chrono::{DateTime, Utc};
use http::Method;
use secrecy::{ExposeSecret, SecretString};
use tracing::{debug, warn};

use super::app_auth::{
    AppSigner, InstallationToken, Installations, Permission, REPOS_PER_TOKEN_MAX, TokenCache,
    TokenKey,
};
use super::budget::BudgetHolder;
use super::transport::{Answer, Target, malformed};
use super::{GitHub, not_github, wire};
use crate::config::{Mode, RepoConfig};
use crate::model::{ErrorClass, RepoName};
use crate::observe::PortError;

/// How long a polling token read from Vault is reused, so that a tick does not read Vault
/// once per request; a rotation in Vault is picked up within this time (or at once on 401).
pub const POLLING_TOKEN_TTL: chrono::Duration = chrono::Duration::minutes(5);
/// The Vault field holding a polling token.
pub const POLLING_TOKEN_FIELD: &str = "token";

/// The configured GitHub App: what signs its JWTs, and the installations and tokens it got.
pub(super) struct App {
    pub(super) signer: AppSigner,
    pub(super) fallback_installation: Option<u64>,
    pub(super) installations: Installations,
    pub(super) tokens: TokenCache,
}

/// A token for one call and the budget it spends.
pub(super) struct Credential {
    pub(super) token: SecretString,
    pub(super) holder: BudgetHolder,
}

impl GitHub {
    fn app(&self, repo: &RepoName) -> Result<&App, PortError> {
        self.app.as_ref().ok_or_else(|| {
            PortError::new(
                ErrorClass::Configuration,
                format!(
                    "{repo} is in app mode but no GitHub App is configured \
                     (GITHUB_APP_ID, GITHUB_APP_PRIVATE_KEY_FILE)"
                ),
            )
        })
    }

    /// A call authenticated as the App itself (JWT).
    async fn app_call(
        &self,
        app: &App,
        method: Method,
        path: String,
        body: Option<&serde_json::Value>,
        doing: &str,
    ) -> Result<Answer, PortError> {
        let holder = BudgetHolder::App;
        self.refuse_while_paused(&holder, doing)?;
        let jwt = app.signer.jwt(self.now())?;
        self.spend_points(&holder, &method);
        let answer = self
            .transport
            .send(method, &Target::Path(path), &jwt, body, None, doing)
            .await?;
        self.record(&holder, &answer);
        if answer.is_success() {
            return Ok(answer);
        }
        let mut error = self.refusal(&holder, &answer, doing);
        if error.class == ErrorClass::Unauthorized {
            error.message.push_str(&format!(
                " (GitHub refused the JWT of App {}: check GITHUB_APP_ID, the private key and \
                 this host's clock)",
                app.signer.app_id()
            ));
        }
        Err(error)
    }

    async fn installation_of(&self, app: &App, repo: &RepoName) -> Result<u64, PortError> {
        let now = self.now();
        if let Some(id) = app.installations.get(repo.owner(), now) {
            return Ok(id);
        }
        let id = match self.lookup_installation(app, repo).await {
            Ok(id) => id,
            Err(e) if e.class == ErrorClass::NotFound => match app.fallback_installation {
                Some(id) => id,
                None => {
                    return Err(e.context(format!(
                        "the App is not installed for {} and GITHUB_APP_INSTALLATION_ID is not set",
                        repo.owner()
                    )));
                }
            },
            Err(e) => return Err(e),
        };
        app.installations.put(repo.owner(), id, now);
        Ok(id)
    }

    /// `GET /repos/{owner}/{repo}/installation` with the App's JWT: the installation that
    /// covers `repo`; a `NotFound` error when the App is not installed on it.
    async fn lookup_installation(&self, app: &App, repo: &RepoName) -> Result<u64, PortError> {
        let doing = format!("look up the GitHub App installation for {repo}");
        let path = format!("/repos/{}/{}/installation", repo.owner(), repo.name());
        let answer = self.app_call(app, Method::GET, path, None, &doing).await?;
        Ok(serde_json::from_str::<wire::Installation>(&answer.body)
            .map_err(|e| malformed(&doing, &e))?
            .id)
    }

    /// `config check --live`: the installation of the App that covers `repo` itself, asked
    /// afresh (no per-owner cache, no `GITHUB_APP_INSTALLATION_ID` fallback); `None` when
    /// the App is not installed on it.
    pub async fn app_installation_on(&self, repo: &RepoName) -> Result<Option<u64>, PortError> {
        let app = self.app(repo)?;
        match self.lookup_installation(app, repo).await {
            Ok(id) => Ok(Some(id)),
            Err(e) if e.class == ErrorClass::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn mint_installation_token(
        &self,
        app: &App,
        installation: u64,
        repo: &RepoName,
        repos: &[String],
        permission: Permission,
    ) -> Result<InstallationToken, PortError> {
        let doing = if repos.len() > 1 {
            format!(
                "mint an installation token ({permission}) for {repo} and {} other repos of {} (installation {installation})",
                repos.len() - 1,
                repo.owner()
            )
        } else {
            format!(
                "mint an installation token ({permission}) for {repo} (installation {installation})"
            )
        };
        let path = format!("/app/installations/{installation}/access_tokens");
        let body = permission.token_request(repos);
        let answer = match self
            .app_call(app, Method::POST, path, Some(&body), &doing)
            .await
        {
            Ok(answer) => answer,
            Err(e) => {
                if e.class == ErrorClass::NotFound {
                    // The installation is gone: look it up again.
                    app.installations.forget(repo.owner());
                }
                return Err(e);
            }
        };
        let token: wire::Token =
            serde_json::from_str(&answer.body).map_err(|e| malformed(&doing, &e))?;
        let expires_at = DateTime::parse_from_rfc3339(&token.expires_at)
            .map_err(|_| {
                PortError::new(
                    ErrorClass::Malformed,
                    format!(
                        "{doing}: expires_at {:?} is not a timestamp",
                        token.expires_at
                    ),
                )
            })?
            .with_timezone(&Utc);
        debug!(%repo, repos = repos.len(), %permission, installation, %expires_at, "minted installation token");
        let mut covered: Vec<String> = repos.iter().map(|r| r.to_ascii_lowercase()).collect();
        covered.sort_unstable();
        covered.dedup();
        Ok(InstallationToken {
            token: token.token,
            installation,
            expires_at,
            repos: covered,
        })
    }

    /// The repos a shared read token for `repo` names: the configured `app` repos of its
    /// owner (as last told through
    /// [`QueueSource::serving`](crate::observe::QueueSource::serving), plus `repo` itself), in
    /// groups of [`REPOS_PER_TOKEN_MAX`] by name; and which group. Just `repo` once GitHub
    /// refused exactly that group (a repo the App is not installed on would otherwise stop
    /// every read of the owner).
    fn read_scope(&self, repo: &RepoName) -> (TokenKey, Vec<String>) {
        let owner = repo.owner().to_ascii_lowercase();
        let name = repo.name().to_string();
        let mut names: Vec<String> = self
            .read_sets
            .lock()
            .expect("read sets lock")
            .get(&owner)
            .map(|names| names.iter().cloned().collect())
            .unwrap_or_default();
        if !names.iter().any(|n| n.eq_ignore_ascii_case(&name)) {
            names.push(name.clone());
        }
        names.sort_unstable_by_key(|n| n.to_ascii_lowercase());
        let at = names
            .iter()
            .position(|n| n.eq_ignore_ascii_case(&name))
            .expect("pushed above");
        let chunk = at / REPOS_PER_TOKEN_MAX;
        let group: Vec<String> = names
            .into_iter()
            .skip(chunk * REPOS_PER_TOKEN_MAX)
            .take(REPOS_PER_TOKEN_MAX)
            .collect();
        let refused = self
            .shared_refused
            .lock()
            .expect("refused sets lock")
            .get(&(owner.clone(), chunk))
            .is_some_and(|refused| *refused == group);
        if group.len() == 1 || refused {
            return (TokenKey::Repo(repo.clone()), vec![name]);
        }
        (TokenKey::Installation { owner, chunk }, group)
    }

    /// Which cached token serves `repo` for `permission`, and the repos it names: reads share
    /// the installation's ([`Self::read_scope`]), a write token is the repo's own.
    fn token_scope(&self, repo: &RepoName, permission: Permission) -> (TokenKey, Vec<String>) {
        match permission {
            Permission::Read => self.read_scope(repo),
            Permission::AdministrationWrite => {
                (TokenKey::Repo(repo.clone()), vec![repo.name().to_string()])
            }
        }
    }

    async fn app_token(
        &self,
        repo: &RepoName,
        permission: Permission,
    ) -> Result<Credential, PortError> {
        let app = self.app(repo)?;
        let (key, repos) = self.token_scope(repo, permission);
        let slot = app.tokens.slot(key.clone(), permission);
        let mut held = slot.lock().await;
        let token = match held.as_ref().filter(|t| t.serves(repo, self.now())) {
            Some(token) => token.clone(),
            None => {
                let installation = self.installation_of(app, repo).await?;
                let minted = self
                    .mint_installation_token(app, installation, repo, &repos, permission)
                    .await;
                let token = match (minted, &key) {
                    (Ok(token), _) => token,
                    // 422: a repo of the group is not one the installation covers. Read this
                    // one with a token of its own; the group is tried again once it changes.
                    (Err(e), TokenKey::Installation { owner, chunk })
                        if e.class == ErrorClass::Configuration =>
                    {
                        warn!(
                            repo = %repo,
                            "{}; reading each repo of {owner} with a token of its own until the document changes",
                            e.message
                        );
                        self.shared_refused
                            .lock()
                            .expect("refused sets lock")
                            .insert((owner.clone(), *chunk), repos.clone());
                        drop(held);
                        return Box::pin(self.app_token(repo, permission)).await;
                    }
                    (Err(e), _) => return Err(e),
                };
                *held = Some(token.clone());
                token
            }
        };
        Ok(Credential {
            token: token.token,
            holder: BudgetHolder::Installation(token.installation),
        })
    }

    async fn polling_token(&self, vault_path: &str) -> Result<Credential, PortError> {
        let holder = BudgetHolder::PollingToken {
            vault_path: vault_path.to_string(),
        };
        let now = self.now();
        {
            let cached = self.polling_tokens.lock().expect("polling token lock");
            if let Some((token, read_at)) = cached.get(vault_path)
                && now - *read_at < POLLING_TOKEN_TTL
            {
                return Ok(Credential {
                    token: token.clone(),
                    holder,
                });
            }
        }
        let token = self
            .secrets
            .read_field(vault_path, POLLING_TOKEN_FIELD)
            .await
            .map_err(|e| e.context(format!("read the GitHub polling token at {vault_path}")))?;
        debug!(vault_path, "read GitHub polling token");
        self.polling_tokens
            .lock()
            .expect("polling token lock")
            .insert(vault_path.to_string(), (token.clone(), now));
        Ok(Credential { token, holder })
    }

    pub(super) async fn credential(
        &self,
        repo: &RepoConfig,
        permission: Permission,
    ) -> Result<Credential, PortError> {
        match &repo.mode {
            Mode::App => self.app_token(&repo.repo, permission).await,
            Mode::Vault { vault_path, .. } => self.polling_token(vault_path).await,
            Mode::Forgejo { .. } => Err(not_github(repo)),
        }
    }

    /// Drops a credential GitHub refused with 401, unless another call already replaced it.
    pub(super) async fn forget(
        &self,
        repo: &RepoConfig,
        permission: Permission,
        refused: &Credential,
    ) {
        let same = |token: &SecretString| token.expose_secret() == refused.token.expose_secret();
        match &repo.mode {
            Mode::App => {
                if let Some(app) = &self.app {
                    let (key, _) = self.token_scope(&repo.repo, permission);
                    let slot = app.tokens.slot(key, permission);
                    let mut held = slot.lock().await;
                    if held.as_ref().is_some_and(|t| same(&t.token)) {
                        *held = None;
                    }
                }
            }
            Mode::Vault { vault_path, .. } => {
                let mut cached = self.polling_tokens.lock().expect("polling token lock");
                if cached.get(vault_path).is_some_and(|(t, _)| same(t)) {
                    cached.remove(vault_path);
                }
            }
            Mode::Forgejo { .. } => {}
        }
    }
}
