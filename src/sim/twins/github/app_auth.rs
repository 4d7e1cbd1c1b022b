//! App authentication and the credentials the twin issues: App JWTs checked as GitHub checks
//! them, installations, installation tokens narrowed to repos and permissions, personal
//! access tokens, and the grant a token carries into every request. The seeded world's
//! in-memory GitHub shares [`check_app_jwt`] and [`stateless_installation_token`].

use std::collections::{BTreeMap, BTreeSet};

use axum::http::{HeaderMap, StatusCode, Uri};
use chrono::{DateTime, Duration, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use rand::Rng;
use serde_json::{Value, json};

use super::GitHubTwin;
use super::requests::{DOCS_REST, Reply, header_text};
use super::state::{InstallationState, Twin};
use super::templates::{TEMPLATES, time};
use crate::model::RepoName;

pub(super) const TOKEN_LIFETIME: Duration = Duration::hours(1);
/// GitHub refuses JWTs whose `exp` is more than 10 minutes ahead.
const JWT_LIFETIME_MAX_S: i64 = 600;
const JWT_CLOCK_DRIFT_S: i64 = 60;

const TEMPLATES_DOCS_TOKEN: &str =
    "https://docs.github.com/rest/apps/apps#create-an-installation-access-token-for-an-app";

/// A recorded `POST /app/installations/{id}/access_tokens`.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenRequest {
    pub installation_id: u64,
    pub body: Value,
    pub status: u16,
}

/// What a token used on a request was allowed (never the token itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantView {
    /// `None`: every repo of the installation (or of the PAT's user).
    pub repositories: Option<Vec<String>>,
    pub permissions: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Holder {
    Installation(u64),
    Pat(String),
}

impl Holder {
    pub(super) fn key(&self) -> String {
        match self {
            Holder::Installation(id) => format!("installation:{id}"),
            Holder::Pat(name) => format!("pat:{name}"),
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct Grant {
    pub(super) holder: Holder,
    pub(super) repos: Option<BTreeSet<RepoName>>,
    pub(super) owner: Option<String>,
    pub(super) permissions: BTreeMap<String, String>,
    pub(super) expires_at: Option<DateTime<Utc>>,
}

impl Grant {
    pub(super) fn allows(&self, permission: &str, level: &str) -> bool {
        match self.permissions.get(permission).map(String::as_str) {
            Some("write") | Some("admin") => true,
            Some("read") => level == "read",
            _ => false,
        }
    }

    pub(super) fn covers(&self, repo: &RepoName) -> bool {
        if let Some(owner) = &self.owner
            && owner != repo.owner()
        {
            return false;
        }
        self.repos.as_ref().is_none_or(|repos| repos.contains(repo))
    }

    pub(super) fn view(&self) -> GrantView {
        GrantView {
            repositories: self
                .repos
                .as_ref()
                .map(|repos| repos.iter().map(|r| r.name().to_string()).collect()),
            permissions: self.permissions.clone(),
        }
    }
}

/// An installation token as GitHub has minted them since 2026-04 (`ghs_<APPID>_<JWT>`, about
/// 520 characters, length varying with what the JWT holds): the client must carry it whole,
/// with its dots and underscores, wherever a 40-character `ghs_` token went before. `nonce`
/// makes it unique; the same inputs give the same token (the seeded world replays by seed).
pub fn stateless_installation_token(app_id: &str, installation: u64, nonce: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    let encode = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let header = encode(br#"{"alg":"RS256","typ":"JWT","kid":"twin-s2s-1"}"#);
    let claims = encode(
        json!({
            "iss": "https://api.github.com/twin-s2s-issuer",
            "aid": app_id,
            "iid": installation,
            "nonce": nonce,
            "scp": "installation",
        })
        .to_string()
        .as_bytes(),
    );
    // An RS256 signature is 256 bytes: stand one in, derived from the rest.
    let mut signature = Vec::with_capacity(256);
    let mut block = sha2::Sha256::digest(format!("{header}.{claims}").as_bytes()).to_vec();
    while signature.len() < 256 {
        signature.extend_from_slice(&block);
        block = sha2::Sha256::digest(&block).to_vec();
    }
    signature.truncate(256);
    format!("ghs_{app_id}_{header}.{claims}.{}", encode(&signature))
}

pub(super) fn random_string(len: usize, alphabet: &[u8]) -> String {
    let mut rng = rand::rng();
    (0..len)
        .map(|_| alphabet[rng.random_range(0..alphabet.len())] as char)
        .collect()
}

fn default_installation_permissions() -> BTreeMap<String, String> {
    [
        ("actions", "read"),
        ("administration", "write"),
        ("metadata", "read"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

impl GitHubTwin {
    /// Installs the App for every repo of `owner`; returns the installation id.
    pub fn install_app(&self, owner: &str) -> u64 {
        let mut twin = self.lock();
        let owner = owner.to_ascii_lowercase();
        if let Some(installation) = twin.installations.get(&owner) {
            return installation.id;
        }
        let id = twin.id();
        twin.installations.insert(
            owner,
            InstallationState {
                id,
                permissions: default_installation_permissions(),
            },
        );
        id
    }

    /// Replaces what the installation on `owner` may be granted.
    pub fn set_installation_permissions(&self, owner: &str, permissions: &[(&str, &str)]) {
        let mut twin = self.lock();
        if let Some(installation) = twin.installations.get_mut(&owner.to_ascii_lowercase()) {
            installation.permissions = permissions
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        }
    }

    /// A personal access token (vault mode's polling token) named `name` for its budget,
    /// limited to `repos` (`None`: every repo) and holding `permissions`.
    pub fn add_pat(
        &self,
        token: &str,
        name: &str,
        repos: Option<&[RepoName]>,
        permissions: &[(&str, &str)],
    ) {
        let mut twin = self.lock();
        twin.tokens.insert(
            token.to_string(),
            Grant {
                holder: Holder::Pat(name.to_string()),
                repos: repos.map(|r| r.iter().cloned().collect()),
                owner: None,
                permissions: permissions
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                expires_at: None,
            },
        );
    }

    /// Revokes one token (a rotated PAT): its next use is a 401.
    pub fn revoke_token(&self, token: &str) {
        self.lock().tokens.remove(token);
    }

    /// Revokes every installation token issued so far: their next use is a 401.
    pub fn revoke_installation_tokens(&self) {
        let mut twin = self.lock();
        twin.tokens
            .retain(|_, grant| !matches!(grant.holder, Holder::Installation(_)));
    }

    pub fn token_requests(&self) -> Vec<TokenRequest> {
        self.lock().token_requests.clone()
    }

    /// Every installation and registration token issued so far, for tests that prove none
    /// of them leaks into a log or an error.
    pub fn issued_secrets(&self) -> Vec<String> {
        self.lock().issued.clone()
    }
}

pub(super) fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = header_text(headers, "authorization")?;
    let (scheme, token) = value.split_once(' ')?;
    matches!(scheme.to_ascii_lowercase().as_str(), "bearer" | "token")
        .then(|| token.trim().to_string())
}

#[derive(serde::Deserialize)]
struct JwtClaims {
    iss: Value,
    iat: i64,
    exp: i64,
}

/// GitHub's answer to a JWT it cannot use.
pub const JWT_UNDECODABLE: &str = "A JSON web token could not be decoded";

/// Checks an App's JWT the way GitHub does: RS256 with the App's key, `exp` in the future but
/// at most 10 minutes ahead, `iat` not in the future (a minute of drift allowed), `iss` the
/// App (GitHub takes the numeric id as a number or a string). `Err` is GitHub's message for
/// the 401. Shared by the twin and the seeded world's in-memory GitHub.
pub fn check_app_jwt(
    jwt: &str,
    key: &DecodingKey,
    app_id: &str,
    now_unix: i64,
) -> Result<(), &'static str> {
    let mut validation = Validation::new(Algorithm::RS256);
    validation.validate_exp = false;
    validation.validate_aud = false;
    // `iss` is checked below: jsonwebtoken's check wants a string. `iat` is required by
    // `JwtClaims` itself.
    validation.set_required_spec_claims(&["exp"]);
    let claims = jsonwebtoken::decode::<JwtClaims>(jwt, key, &validation)
        .map_err(|_| JWT_UNDECODABLE)?
        .claims;
    if claims.exp <= now_unix {
        return Err(
            "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires.",
        );
    }
    if claims.exp > now_unix + JWT_LIFETIME_MAX_S {
        return Err("'Expiration time' claim ('exp') is too far in the future");
    }
    if claims.iat > now_unix + JWT_CLOCK_DRIFT_S {
        return Err(
            "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued.",
        );
    }
    let iss = match &claims.iss {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        _ => return Err(JWT_UNDECODABLE),
    };
    if iss != app_id {
        return Err(JWT_UNDECODABLE);
    }
    Ok(())
}

impl Twin {
    /// Checks the App's JWT the way GitHub does (see [`check_app_jwt`]).
    pub(super) fn verify_jwt(&self, headers: &HeaderMap) -> Result<(), Reply> {
        let unauthorized =
            |message: &str| Reply::error(StatusCode::UNAUTHORIZED, message, DOCS_REST);
        let jwt = bearer(headers).ok_or_else(|| unauthorized(JWT_UNDECODABLE))?;
        check_app_jwt(&jwt, &self.app_key, &self.app_id, self.now().timestamp())
            .map_err(unauthorized)
    }

    fn installation_json(
        &self,
        owner: &str,
        installation: &InstallationState,
        base: &str,
    ) -> Value {
        let mut value = TEMPLATES.installation.clone();
        value["id"] = json!(installation.id);
        value["account"]["login"] = json!(owner);
        value["account"]["url"] = json!(format!("{base}/users/{owner}"));
        value["account"]["html_url"] = json!(format!("{base}/{owner}"));
        value["access_tokens_url"] = json!(format!(
            "{base}/app/installations/{}/access_tokens",
            installation.id
        ));
        value["repositories_url"] = json!(format!("{base}/installation/repositories"));
        if let Ok(app_id) = self.app_id.parse::<u64>() {
            value["app_id"] = json!(app_id);
        }
        value["target_id"] = json!(installation.id);
        value["permissions"] = json!(installation.permissions);
        value["repository_selection"] = json!("all");
        value
    }

    pub(super) fn app_installation(&self, id: u64, base: &str) -> Reply {
        match self.installations.iter().find(|(_, i)| i.id == id) {
            Some((owner, installation)) => Reply::json(
                StatusCode::OK,
                self.installation_json(owner, installation, base),
            ),
            None => Reply::not_found(),
        }
    }

    pub(super) fn repo_installation(&self, uri: &Uri, base: &str) -> Reply {
        let segments: Vec<&str> = uri.path().split('/').collect();
        let repo = match segments.as_slice() {
            ["", "repos", owner, name, "installation"] => {
                RepoName::parse(&format!("{owner}/{name}"))
            }
            _ => None,
        };
        let Some(repo) = repo.filter(|r| self.repos.contains_key(r)) else {
            return Reply::not_found();
        };
        match self.installations.get(repo.owner()) {
            Some(installation) => Reply::json(
                StatusCode::OK,
                self.installation_json(repo.owner(), installation, base),
            ),
            None => Reply::not_found(),
        }
    }

    pub(super) fn create_access_token(&mut self, id: u64, body: &[u8]) -> Reply {
        let request: Value = if body.is_empty() {
            json!({})
        } else {
            match serde_json::from_slice(body) {
                Ok(value) => value,
                Err(_) => {
                    return Reply::error(
                        StatusCode::BAD_REQUEST,
                        "Problems parsing JSON",
                        TEMPLATES_DOCS_TOKEN,
                    );
                }
            }
        };
        let reply = self.grant_access_token(id, &request);
        self.token_requests.push(TokenRequest {
            installation_id: id,
            body: request,
            status: reply.status.as_u16(),
        });
        reply
    }

    fn grant_access_token(&mut self, id: u64, request: &Value) -> Reply {
        let Some((owner, installation)) = self.installations.iter().find(|(_, i)| i.id == id)
        else {
            return Reply::not_found();
        };
        let owner = owner.clone();
        let installable: Vec<RepoName> = self
            .repos
            .keys()
            .filter(|r| r.owner() == owner)
            .cloned()
            .collect();
        let repos = match request.get("repositories") {
            None => None,
            Some(Value::Array(names)) => {
                let mut repos = BTreeSet::new();
                for name in names {
                    let found = name.as_str().and_then(|n| {
                        installable
                            .iter()
                            .find(|r| r.name().eq_ignore_ascii_case(n))
                    });
                    match found {
                        Some(repo) => repos.insert(repo.clone()),
                        None => {
                            return Reply::error(
                                StatusCode::UNPROCESSABLE_ENTITY,
                                "There is at least one repository that does not exist or is not accessible to the parent installation.",
                                TEMPLATES_DOCS_TOKEN,
                            );
                        }
                    };
                }
                Some(repos)
            }
            Some(_) => {
                return Reply::error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid request.",
                    TEMPLATES_DOCS_TOKEN,
                );
            }
        };
        let permissions = match request.get("permissions").and_then(Value::as_object) {
            None => installation.permissions.clone(),
            Some(asked) => {
                let mut granted = BTreeMap::new();
                for (name, level) in asked {
                    let level = level.as_str().unwrap_or_default();
                    let allowed = match installation.permissions.get(name).map(String::as_str) {
                        Some("write") | Some("admin") => matches!(level, "read" | "write"),
                        Some("read") => level == "read",
                        _ => false,
                    };
                    if !allowed {
                        return Reply::error(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            "The permissions requested are not granted to this installation.",
                            TEMPLATES_DOCS_TOKEN,
                        );
                    }
                    granted.insert(name.clone(), level.to_string());
                }
                granted
            }
        };
        let token = stateless_installation_token(
            &self.app_id,
            id,
            &random_string(
                16,
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
            ),
        );
        let expires_at = self.now() + TOKEN_LIFETIME;
        let listed: Vec<RepoName> = match &repos {
            Some(repos) => repos.iter().cloned().collect(),
            None => installable,
        };
        let repositories: Vec<Value> = listed
            .iter()
            .map(|repo| {
                let mut value = TEMPLATES.token_repository.clone();
                value["id"] = json!(self.repos.get(repo).map_or(0, |s| s.id));
                value["name"] = json!(repo.name());
                value["full_name"] = json!(repo.to_string());
                value["owner"]["login"] = json!(repo.owner());
                value
            })
            .collect();
        let mut body = TEMPLATES.access_token.clone();
        body["token"] = json!(token);
        body["expires_at"] = json!(time(expires_at));
        body["permissions"] = json!(permissions);
        body["repository_selection"] = json!(if repos.is_some() { "selected" } else { "all" });
        body["repositories"] = json!(repositories);
        self.tokens.insert(
            token.clone(),
            Grant {
                holder: Holder::Installation(id),
                repos,
                owner: Some(owner),
                permissions,
                expires_at: Some(expires_at),
            },
        );
        self.issued.push(token);
        Reply::json(StatusCode::CREATED, body)
    }
}
