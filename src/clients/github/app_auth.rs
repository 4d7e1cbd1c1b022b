//! GitHub App authentication: the App's JWT, installations per owner, and installation
//! tokens narrowed to what they are for: reading the document's repos of an installation, or
//! writing to one repo.
//!
//! octocrab's own App support is not used: `octocrab::auth::create_jwt` takes only a numeric
//! App id (GitHub now recommends the client id as `iss`), and its installation tokens cover the
//! whole installation with every permission the App has, which is exactly what the daemon
//! must not hold.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;

use crate::model::{ErrorClass, RepoName};
use crate::observe::PortError;

/// GitHub refuses a JWT whose `exp` is more than 10 minutes ahead; 9 leaves room for drift.
const JWT_LIFETIME: Duration = Duration::minutes(9);
/// `iat` is backdated as GitHub recommends, so a server clock slightly behind ours accepts it.
const JWT_BACKDATE: Duration = Duration::seconds(60);
/// A signed JWT is reused while it has at least this long to live: one RSA signature every
/// eight minutes instead of one per App call, and no call starts with a JWT about to expire.
const JWT_REUSE_MARGIN: Duration = Duration::seconds(60);
/// An installation token is used only while it has at least this long to live, so a request
/// never starts with a token that expires on the way.
pub const TOKEN_RENEW_BEFORE: Duration = Duration::minutes(5);
/// Installations rarely move; looking them up again hourly notices a re-installed App.
pub const INSTALLATION_TTL: Duration = Duration::hours(1);

/// What an installation token is minted for.
///
/// Reading is shared: one token with `actions: read` and `administration: read` covers every
/// configured repo of an installation (up to [`REPOS_PER_TOKEN_MAX`] per token), since the
/// daemon held all those read grants at once anyway and a token per repo cost an
/// installation-token mint per repo and hour. Writing stays narrow: a token that can mint
/// registration tokens or delete runners names one repo.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Permission {
    /// `actions: read` and `administration: read`: list runs, jobs and runner registrations.
    Read,
    /// `administration: write`: mint registration tokens and JIT configs, delete runners.
    AdministrationWrite,
}

/// GitHub names at most this many repositories in one installation token.
pub const REPOS_PER_TOKEN_MAX: usize = 500;

impl Permission {
    /// The `permissions` object of the token request.
    pub fn grants(self) -> serde_json::Value {
        match self {
            Permission::Read => serde_json::json!({ "actions": "read", "administration": "read" }),
            Permission::AdministrationWrite => serde_json::json!({ "administration": "write" }),
        }
    }

    /// The body of `POST /app/installations/{id}/access_tokens` for `repos` (names without
    /// their owner: a token covers repos of one installation, so of one owner).
    pub fn token_request(self, repos: &[String]) -> serde_json::Value {
        serde_json::json!({
            "repositories": repos,
            "permissions": self.grants(),
        })
    }
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Permission::Read => f.write_str("actions: read, administration: read"),
            Permission::AdministrationWrite => f.write_str("administration: write"),
        }
    }
}

/// Signs the App's JWTs.
pub struct AppSigner {
    app_id: String,
    key: EncodingKey,
    /// The last JWT signed, with its `iat` and `exp`.
    signed: std::sync::Mutex<Option<SignedJwt>>,
}

struct SignedJwt {
    jwt: SecretString,
    issued_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
}

#[derive(Serialize)]
struct Claims {
    iss: serde_json::Value,
    iat: i64,
    exp: i64,
    /// A random id per JWT (RFC 7519 §4.1.7): two signed in the same second differ, so a
    /// server or proxy that refuses a replayed JWT can tell them apart.
    jti: String,
}

impl AppSigner {
    /// `app_id` is the numeric App id or the App's client id; `private_key` its PEM key.
    pub fn new(app_id: &str, private_key: &SecretString) -> Result<AppSigner, String> {
        let app_id = app_id.trim();
        if app_id.is_empty() {
            return Err("GitHub App id is empty".to_string());
        }
        // jsonwebtoken's error names the problem (e.g. "InvalidKeyFormat"), never the key.
        let key = EncodingKey::from_rsa_pem(private_key.expose_secret().as_bytes())
            .map_err(|e| format!("GitHub App private key is not an RSA PEM key: {e}"))?;
        Ok(AppSigner {
            app_id: app_id.to_string(),
            key,
            signed: std::sync::Mutex::new(None),
        })
    }

    pub fn app_id(&self) -> &str {
        &self.app_id
    }

    /// A JWT valid at `now` for at least another minute: the last one signed while it is
    /// (and `now` is not before it was issued: a clock set back signs afresh), else a new one
    /// valid from a minute ago to nine minutes from `now`.
    pub fn jwt(&self, now: DateTime<Utc>) -> Result<SecretString, PortError> {
        let mut signed = self.signed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(last) = signed.as_ref()
            && now >= last.issued_at
            && now + JWT_REUSE_MARGIN < last.expires_at
        {
            return Ok(last.jwt.clone());
        }
        let jwt = self.sign(now)?;
        *signed = Some(SignedJwt {
            jwt: jwt.clone(),
            issued_at: now - JWT_BACKDATE,
            expires_at: now + JWT_LIFETIME,
        });
        Ok(jwt)
    }

    fn sign(&self, now: DateTime<Utc>) -> Result<SecretString, PortError> {
        // A numeric App id goes out as a number, as in GitHub's own examples; a client id
        // (`Iv1.…`) as a string.
        let iss = match self.app_id.parse::<u64>() {
            Ok(id) => serde_json::Value::from(id),
            Err(_) => serde_json::Value::from(self.app_id.clone()),
        };
        let claims = Claims {
            iss,
            iat: (now - JWT_BACKDATE).timestamp(),
            exp: (now + JWT_LIFETIME).timestamp(),
            jti: format!("{:032x}", rand::random::<u128>()),
        };
        jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &self.key)
            .map(SecretString::from)
            .map_err(|e| {
                PortError::new(
                    ErrorClass::Configuration,
                    format!("sign the GitHub App JWT: {e}"),
                )
            })
    }
}

/// An installation token and what it was minted for.
#[derive(Clone)]
pub struct InstallationToken {
    pub token: SecretString,
    pub installation: u64,
    pub expires_at: DateTime<Utc>,
    /// The repo names it covers, lowercased and sorted.
    pub repos: Vec<String>,
}

impl InstallationToken {
    pub fn is_fresh(&self, now: DateTime<Utc>) -> bool {
        now + TOKEN_RENEW_BEFORE < self.expires_at
    }

    /// Fresh at `now` and minted for a set that includes `repo`.
    pub fn serves(&self, repo: &RepoName, now: DateTime<Utc>) -> bool {
        self.is_fresh(now)
            && self
                .repos
                .binary_search(&repo.name().to_ascii_lowercase())
                .is_ok()
    }
}

/// Which cached token a call uses.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TokenKey {
    /// A token of one repo.
    Repo(RepoName),
    /// The shared read token of one owner's installation; `chunk` counts groups of
    /// [`REPOS_PER_TOKEN_MAX`] repos in name order.
    Installation { owner: String, chunk: usize },
}

type Slot = Arc<tokio::sync::Mutex<Option<InstallationToken>>>;

/// Installation tokens per key and permission. Each has its own async lock so that
/// concurrent calls mint one token between them, while calls needing other tokens go on.
#[derive(Default)]
pub struct TokenCache {
    slots: Mutex<HashMap<(TokenKey, Permission), Slot>>,
}

impl TokenCache {
    pub fn slot(&self, key: TokenKey, permission: Permission) -> Slot {
        let mut slots = self.slots.lock().expect("token cache lock");
        slots.entry((key, permission)).or_default().clone()
    }
}

/// Installation ids per owner, with when they were looked up.
#[derive(Default)]
pub struct Installations {
    by_owner: Mutex<HashMap<String, (u64, DateTime<Utc>)>>,
}

impl Installations {
    pub fn get(&self, owner: &str, now: DateTime<Utc>) -> Option<u64> {
        let by_owner = self.by_owner.lock().expect("installations lock");
        let (id, looked_up) = by_owner.get(owner)?;
        (now - *looked_up < INSTALLATION_TTL).then_some(*id)
    }

    /// The id last seen for `owner`, however old: enough to name its rate-limit budget.
    pub fn last_known(&self, owner: &str) -> Option<u64> {
        let by_owner = self.by_owner.lock().expect("installations lock");
        by_owner.get(owner).map(|(id, _)| *id)
    }

    pub fn put(&self, owner: &str, id: u64, now: DateTime<Utc>) {
        let mut by_owner = self.by_owner.lock().expect("installations lock");
        by_owner.insert(owner.to_string(), (id, now));
    }

    pub fn forget(&self, owner: &str) {
        let mut by_owner = self.by_owner.lock().expect("installations lock");
        by_owner.remove(owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{DecodingKey, Validation};

    const PRIVATE_KEY: &str = include_str!("../../../tests/fixtures/github/test-only-app-key.pem");
    const PUBLIC_KEY: &str =
        include_str!("../../../tests/fixtures/github/test-only-app-key.pub.pem");

    fn decode(jwt: &SecretString) -> serde_json::Value {
        let mut validation = Validation::new(Algorithm::RS256);
        validation.validate_exp = false;
        validation.required_spec_claims.clear();
        jsonwebtoken::decode::<serde_json::Value>(
            jwt.expose_secret(),
            &DecodingKey::from_rsa_pem(PUBLIC_KEY.as_bytes()).unwrap(),
            &validation,
        )
        .unwrap()
        .claims
    }

    #[test]
    fn jwt_is_backdated_a_minute_and_lives_under_ten() {
        let signer = AppSigner::new("12345", &SecretString::from(PRIVATE_KEY)).unwrap();
        let now = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let claims = decode(&signer.jwt(now).unwrap());
        assert_eq!(claims["iss"], serde_json::json!(12345));
        assert_eq!(claims["iat"], serde_json::json!(1_700_000_000 - 60));
        let exp = claims["exp"].as_i64().unwrap();
        assert!(exp > 1_700_000_000 && exp - 1_700_000_000 <= 600, "{exp}");
    }

    #[test]
    fn every_jwt_signed_carries_its_own_jti() {
        let now = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let ids: std::collections::BTreeSet<String> = (0..5)
            .map(|_| {
                // A new signer each time: the same second, nothing reused.
                let signer = AppSigner::new("12345", &SecretString::from(PRIVATE_KEY)).unwrap();
                let jti = decode(&signer.jwt(now).unwrap())["jti"].clone();
                jti.as_str().expect("a jti string").to_string()
            })
            .collect();
        assert_eq!(ids.len(), 5, "{ids:?}");
        assert!(ids.iter().all(|id| id.len() == 32), "{ids:?}");
    }

    #[test]
    fn a_jwt_is_reused_for_eight_minutes_then_signed_afresh() {
        let signer = AppSigner::new("1", &SecretString::from(PRIVATE_KEY)).unwrap();
        let t0 = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let first = signer.jwt(t0).unwrap();
        for later in [1, 60, 7 * 60, 7 * 60 + 59] {
            let again = signer.jwt(t0 + Duration::seconds(later)).unwrap();
            assert_eq!(again.expose_secret(), first.expose_secret(), "+{later}s");
        }
        // A minute before it expires, a new one, valid for nine minutes from then.
        let t1 = t0 + Duration::minutes(8);
        let renewed = signer.jwt(t1).unwrap();
        assert_ne!(renewed.expose_secret(), first.expose_secret());
        assert_eq!(
            decode(&renewed)["exp"],
            serde_json::json!((t1 + Duration::minutes(9)).timestamp())
        );
        // A clock set back before the JWT's iat signs afresh rather than send a JWT from the
        // future.
        let back = t1 - Duration::minutes(5);
        assert_ne!(
            signer.jwt(back).unwrap().expose_secret(),
            renewed.expose_secret()
        );
    }

    #[test]
    fn client_ids_are_sent_as_strings() {
        let signer = AppSigner::new("Iv1.abc123", &SecretString::from(PRIVATE_KEY)).unwrap();
        let claims = decode(&signer.jwt(Utc::now()).unwrap());
        assert_eq!(claims["iss"], serde_json::json!("Iv1.abc123"));
    }

    #[test]
    fn a_bad_key_is_refused_without_quoting_it() {
        let e = AppSigner::new(
            "1",
            &SecretString::from("-----BEGIN RSA PRIVATE KEY-----\nsecretline\n"),
        )
        .err()
        .unwrap();
        assert!(!e.contains("secretline"), "{e}");
    }

    #[test]
    fn read_tokens_name_many_repos_and_write_tokens_one() {
        assert_eq!(
            Permission::Read.token_request(&["api".into(), "web".into()]),
            serde_json::json!({
                "repositories": ["api", "web"],
                "permissions": {"actions": "read", "administration": "read"}
            })
        );
        assert_eq!(
            Permission::AdministrationWrite.token_request(&["api".into()]),
            serde_json::json!({"repositories": ["api"], "permissions": {"administration": "write"}})
        );
    }

    #[test]
    fn a_token_serves_only_the_repos_it_names_while_fresh() {
        let now = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let token = InstallationToken {
            token: SecretString::from("t"),
            installation: 1,
            expires_at: now + Duration::hours(1),
            repos: vec!["api".into(), "web".into()],
        };
        assert!(token.serves(&RepoName::parse("acme/API").unwrap(), now));
        assert!(!token.serves(&RepoName::parse("acme/db").unwrap(), now));
        assert!(!token.serves(
            &RepoName::parse("acme/api").unwrap(),
            now + Duration::minutes(56)
        ));
    }
}
