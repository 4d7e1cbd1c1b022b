//! Who may ask what: the App's JWT (checked as GitHub does, against virtual time), the
//! installation of each owner with an `app` repo, installation tokens minted for named repos
//! and permissions, and the polling token Vault holds for each `vault` repo. Every repo
//! request is authorized here against the token it carries.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use http::StatusCode;
use http::request::Parts;
use jsonwebtoken::DecodingKey;
use serde_json::{Value, json};

use super::serve::{DOCS_REST, Reply, repo_id};
use super::service::HttpState;
use super::{API_URL, TOKEN_LIFETIME_S, polling_token, timestamp};
use crate::config::Mode;
use crate::model::RepoName;
use crate::sim::seeded::ports::Sim;
use crate::sim::seeded::world::EPOCH_UNIX;
use crate::sim::twins;
use crate::sim::twins::github::{JWT_UNDECODABLE, TEST_APP_ID, check_app_jwt};

/// The App's key pair. 1024 bits, not the 2048 GitHub requires: the real client signs a
/// JWT per App call, and a sweep of thousands of seeds feels every millisecond of RSA.
pub(super) const APP_PRIVATE_KEY_PEM: &str =
    include_str!("../../../../tests/fixtures/github/seeded-only-app-key-1024.pem");
const APP_PUBLIC_KEY_PEM: &str =
    include_str!("../../../../tests/fixtures/github/seeded-only-app-key-1024.pub.pem");

/// Ids of installations count from here, one per owner with an `app` repo.
const INSTALLATION_ID_BASE: u64 = 40_000;

const DOCS_TOKEN: &str =
    "https://docs.github.com/rest/apps/apps#create-an-installation-access-token-for-an-app";

static APP_KEY: LazyLock<DecodingKey> = LazyLock::new(|| {
    DecodingKey::from_rsa_pem(APP_PUBLIC_KEY_PEM.as_bytes()).expect("test App key is valid")
});

/// What an installation token was minted for.
#[derive(Clone, Debug)]
pub(super) struct Grant {
    pub(super) repos: BTreeSet<RepoName>,
    pub(super) permissions: BTreeMap<String, String>,
    pub(super) expires_s: u64,
}

impl Grant {
    pub(super) fn allows(&self, permission: &str, level: &str) -> bool {
        self.permissions
            .get(permission)
            .is_some_and(|held| held == "write" || level == "read")
    }
}

/// What the App's installation may grant, as `installation_json` shows it.
const INSTALLATION_PERMISSIONS: [(&str, &str); 3] = [
    ("actions", "read"),
    ("administration", "write"),
    ("metadata", "read"),
];

/// What a token request asks for, once GitHub has checked it against the installation.
pub(super) struct TokenAsk {
    pub(super) owner: String,
    pub(super) repos: BTreeSet<RepoName>,
    pub(super) permissions: BTreeMap<String, String>,
}

fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts
        .headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    matches!(scheme.to_ascii_lowercase().as_str(), "bearer" | "token").then(|| token.trim())
}

/// Checks the App's JWT as GitHub does, against virtual time.
pub(super) fn verify_jwt(parts: &Parts, t: u64) -> Result<(), Reply> {
    let unauthorized = |message: &str| Reply::error(StatusCode::UNAUTHORIZED, message, DOCS_REST);
    let jwt = bearer(parts).ok_or_else(|| unauthorized(JWT_UNDECODABLE))?;
    check_app_jwt(jwt, &APP_KEY, TEST_APP_ID, EPOCH_UNIX + t as i64).map_err(unauthorized)
}

/// Installation ids by owner: one per owner with an `app` repo in the document.
pub(super) fn installations(sim: &Sim) -> BTreeMap<String, u64> {
    let mut owners: Vec<&str> = sim
        .config
        .repos
        .values()
        .filter(|r| matches!(r.mode, Mode::App))
        .map(|r| r.repo.owner())
        .collect();
    owners.sort_unstable();
    owners.dedup();
    owners
        .into_iter()
        .zip(INSTALLATION_ID_BASE..)
        .map(|(owner, id)| (owner.to_string(), id))
        .collect()
}

/// A token request as GitHub checks it against installation `installation`: repos of its
/// owner that the document holds (one to 500 of them) and named permissions the installation
/// holds, at levels it may grant. `Err` is GitHub's 404 for an unknown installation or its 422.
pub(super) fn token_ask(
    sim: &Sim,
    installations: &BTreeMap<String, u64>,
    installation: u64,
    body: &[u8],
) -> Result<TokenAsk, Reply> {
    let Some(owner) = installations
        .iter()
        .find(|(_, id)| **id == installation)
        .map(|(owner, _)| owner.clone())
    else {
        return Err(Reply::not_found());
    };
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let refuse =
        |message: &str| Reply::error(StatusCode::UNPROCESSABLE_ENTITY, message, DOCS_TOKEN);
    let names = request["repositories"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let repos: Option<BTreeSet<RepoName>> = names
        .iter()
        .map(|name| {
            RepoName::parse(&format!("{owner}/{}", name.as_str()?))
                .filter(|r| sim.config.repos.contains_key(r))
        })
        .collect();
    let Some(repos) = repos.filter(|r| !r.is_empty() && r.len() <= 500) else {
        return Err(refuse(
            "There is at least one repository that does not exist or is not accessible to the parent installation.",
        ));
    };
    let asked = request["permissions"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut granted = BTreeMap::new();
    for (permission, level) in &asked {
        let level = level.as_str().unwrap_or_default();
        let allowed = INSTALLATION_PERMISSIONS
            .iter()
            .any(|(p, held)| p == permission && (*held == "write" || level == "read"));
        if !allowed || !matches!(level, "read" | "write") {
            return Err(refuse(
                "The permissions requested are not granted to this installation.",
            ));
        }
        granted.insert(permission.clone(), level.to_string());
    }
    if granted.is_empty() {
        return Err(refuse("The daemon always asks for named permissions."));
    }
    Ok(TokenAsk {
        owner,
        repos,
        permissions: granted,
    })
}

/// `GET /repos/{owner}/{repo}/installation`: the installation of the repo's owner.
pub(super) fn repo_installation(installations: &BTreeMap<String, u64>, repo: &RepoName) -> Reply {
    match installations.get(repo.owner()) {
        Some(id) => Reply::json(
            StatusCode::OK,
            installation_json(repo.owner(), *id).to_string(),
        ),
        None => Reply::not_found(),
    }
}

/// `POST /app/installations/{id}/access_tokens`: a token for exactly what `ask` names, valid
/// for an hour of virtual time.
pub(super) fn mint_access_token(
    state: &mut HttpState,
    sim: &mut Sim,
    installation: u64,
    ask: TokenAsk,
    t: u64,
) -> Reply {
    let TokenAsk {
        repos, permissions, ..
    } = ask;
    state.tokens_issued += 1;
    let token = crate::sim::twins::github::stateless_installation_token(
        TEST_APP_ID,
        installation,
        &state.tokens_issued.to_string(),
    );
    let expires_s = t + TOKEN_LIFETIME_S;
    let listed: Vec<(RepoName, u64)> = repos
        .iter()
        .map(|repo| (repo.clone(), repo_id(sim, repo)))
        .collect();
    let body = access_token_json(&token, expires_s, &permissions, &listed);
    state.tokens.insert(
        token,
        Grant {
            repos,
            permissions,
            expires_s,
        },
    );
    sim.requests.github_token_mints += 1;
    Reply::json(StatusCode::CREATED, body.to_string())
}

/// The token of a repo request: an unexpired installation token minted for this repo and
/// permission (`app`), or the polling token Vault holds for the repo (`vault`).
pub(super) fn authorize(
    state: &HttpState,
    sim: &Sim,
    parts: &Parts,
    repo: &RepoName,
    (permission, level): (&str, &str),
) -> Result<(), Reply> {
    let bad = || Reply::error(StatusCode::UNAUTHORIZED, "Bad credentials", DOCS_REST);
    let token = bearer(parts).ok_or_else(bad)?;
    let config = sim.config.repos.get(repo).ok_or_else(Reply::not_found)?;
    match &config.mode {
        Mode::Vault { vault_path, .. } => {
            if token != polling_token(vault_path) {
                return Err(bad());
            }
            // A polling token reads; it administers nothing.
            if permission != "actions" {
                return Err(Reply::error(
                    StatusCode::FORBIDDEN,
                    "Resource not accessible by personal access token",
                    DOCS_REST,
                ));
            }
            Ok(())
        }
        Mode::App => {
            let grant = state
                .tokens
                .get(token)
                .filter(|g| g.expires_s > sim.t)
                .ok_or_else(bad)?;
            if !grant.repos.contains(repo) {
                return Err(Reply::not_found());
            }
            if !grant.allows(permission, level) {
                return Err(Reply::error(
                    StatusCode::FORBIDDEN,
                    "Resource not accessible by integration",
                    DOCS_REST,
                )
                .header(
                    "x-accepted-github-permissions",
                    format!("{permission}={level}"),
                ));
            }
            Ok(())
        }
        Mode::Forgejo { .. } => Err(Reply::not_found()),
    }
}

fn installation_json(owner: &str, id: u64) -> Value {
    let mut value = twins::github::TEMPLATES.installation.clone();
    value["id"] = json!(id);
    value["account"]["login"] = json!(owner);
    value["account"]["url"] = json!(format!("{API_URL}/users/{owner}"));
    value["account"]["html_url"] = json!(format!("https://github.com/{owner}"));
    value["access_tokens_url"] = json!(format!("{API_URL}/app/installations/{id}/access_tokens"));
    value["app_id"] = json!(TEST_APP_ID.parse::<u64>().unwrap_or(1));
    value["target_id"] = json!(id);
    value["permissions"] =
        json!({ "actions": "read", "administration": "write", "metadata": "read" });
    value["repository_selection"] = json!("all");
    value
}

fn access_token_json(
    token: &str,
    expires_s: u64,
    permissions: &BTreeMap<String, String>,
    repos: &[(RepoName, u64)],
) -> Value {
    let repositories: Vec<Value> = repos
        .iter()
        .map(|(repo, id)| {
            let mut repository = twins::github::TEMPLATES.token_repository.clone();
            repository["id"] = json!(id);
            repository["name"] = json!(repo.name());
            repository["full_name"] = json!(repo.to_string());
            repository["owner"]["login"] = json!(repo.owner());
            repository
        })
        .collect();
    let mut body = twins::github::TEMPLATES.access_token.clone();
    body["token"] = json!(token);
    body["expires_at"] = json!(timestamp(expires_s as i64));
    body["permissions"] = json!(permissions);
    body["repository_selection"] = json!("selected");
    body["repositories"] = json!(repositories);
    body
}
