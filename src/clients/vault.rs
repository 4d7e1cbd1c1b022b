//! Vault KV v2 through `vaultrs`: the [`SecretSource`] the daemon reads its forge credentials
//! through (`vault` and `forgejo` modes) and the GitHub App credentials
//! (`GITHUB_APP_VAULT_PATH`).
//!
//! No cache here: each caller knows how long its credential may be reused and caches it.
//!
//! # What `vaultrs` and `rustify` log
//!
//! Read from their sources (vaultrs 0.8.0, rustify 0.7.0): neither logs a request or response
//! body or a header value at any level. They log the request path and URI, body lengths,
//! status codes, Vault's `errors` strings (`vaultrs::api`, ERROR) and `warnings` (WARN), and
//! every failed call once more through `#[instrument(err)]` (ERROR, a fixed text such as
//! "Server returned error"). The secret still sits in places a careless `{:?}` would print:
//! `rustify::errors::ClientError::{ServerResponseError, ResponseParseError}` carry the raw
//! response body, and `VaultClientSettings` / `EndpointMiddleware` derive `Debug` with the
//! token inside. This module therefore never formats a `vaultrs` error or setting with
//! `Debug` or through its source chain: it matches on the variant and builds its own message.
//! Because those crates log every 403/404 at ERROR level, which is noise next to our own
//! classified error, the daemon's default log filter should carry `vaultrs=off,rustify=off`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Map, Value};
use url::Url;
use vaultrs::client::{VaultClient, VaultClientSettingsBuilder};
use vaultrs::error::ClientError as VaultError;

use crate::clients::http::{
    REQUEST_TIMEOUT_DEFAULT, TlsFiles, build_client, class_of_status, install_crypto_provider,
    redirect_refused,
};
use crate::model::ErrorClass;
use crate::observe::PortError;
use crate::secrets::SecretSource;

/// The KV v2 mount used when `--vault-mount` is not given; Vault's dev server mounts KV v2
/// there.
pub const MOUNT_DEFAULT: &str = "secret";

/// How to reach Vault: the standard `VAULT_*` environment plus the KV v2 mount.
pub struct VaultSettings {
    /// `VAULT_ADDR`.
    pub addr: Url,
    /// `VAULT_TOKEN`.
    pub token: SecretString,
    /// `VAULT_NAMESPACE`, sent as `X-Vault-Namespace` (Vault Enterprise, HCP Vault).
    pub namespace: Option<String>,
    /// `VAULT_CACERT`.
    pub ca_cert: Option<PathBuf>,
    /// `--vault-mount`.
    pub mount: String,
}

impl VaultSettings {
    /// Reads the standard variables through `lookup` (the process environment in `main`).
    /// `VAULT_ADDR` defaults to Vault's own default, `https://127.0.0.1:8200`; `VAULT_TOKEN`
    /// is required. Errors name the variable, never its value.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        mount: String,
    ) -> Result<VaultSettings, String> {
        let set = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let addr_raw = set("VAULT_ADDR").unwrap_or_else(|| "https://127.0.0.1:8200".to_string());
        let addr =
            Url::parse(addr_raw.trim()).map_err(|e| format!("VAULT_ADDR is not a URL: {e}"))?;
        if !matches!(addr.scheme(), "http" | "https") {
            return Err("VAULT_ADDR must be an http:// or https:// URL".to_string());
        }
        let token = set("VAULT_TOKEN").ok_or("VAULT_TOKEN is not set")?;
        Ok(VaultSettings {
            addr,
            token: SecretString::from(token.trim().to_string()),
            namespace: set("VAULT_NAMESPACE").map(|v| v.trim().to_string()),
            ca_cert: set("VAULT_CACERT").map(PathBuf::from),
            mount,
        })
    }
}

/// A GitHub App's credentials as stored in Vault (`app_id`, `private_key`, optional
/// `installation_id` and `webhook_secret`).
pub struct AppSecret {
    pub app_id: String,
    pub private_key: SecretString,
    pub installation_id: Option<u64>,
    /// The secret the App's webhook deliveries are signed with (`--webhook-listen`).
    pub webhook_secret: Option<SecretString>,
}

impl std::fmt::Debug for AppSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppSecret")
            .field("app_id", &self.app_id)
            .field("private_key", &"[REDACTED]")
            .field("installation_id", &self.installation_id)
            .field(
                "webhook_secret",
                &self.webhook_secret.as_ref().map(|_| "[REDACTED]"),
            )
            .finish()
    }
}

/// Reads KV v2 secrets under one mount.
pub struct VaultKv {
    client: VaultClient,
    mount: String,
    /// `scheme://host:port` of Vault, for errors.
    origin: String,
    /// For `sys/wrapping/wrap`, which vaultrs offers only with a fixed TTL: the same client
    /// (no redirects followed), Vault's address, the daemon's token and namespace.
    http: reqwest::Client,
    addr: Url,
    token: SecretString,
    namespace: Option<String>,
}

impl VaultKv {
    /// Builds the client. Nothing is read from the environment here: every setting comes from
    /// `settings` (vaultrs would otherwise consult `VAULT_SKIP_VERIFY`, `VAULT_CAPATH` and
    /// client-certificate variables on its own).
    pub fn new(settings: VaultSettings) -> Result<VaultKv, String> {
        install_crypto_provider();
        let token = settings.token.expose_secret();
        // vaultrs unwraps the header value it builds from the token: a token read with a
        // stray newline would panic the daemon instead of failing here.
        if token.is_empty() || reqwest::header::HeaderValue::from_str(token).is_err() {
            return Err(
                "VAULT_TOKEN is empty or contains characters not allowed in an HTTP header"
                    .to_string(),
            );
        }
        let mount = settings.mount.trim_matches('/').to_string();
        if mount.is_empty()
            || mount
                .split('/')
                .any(|s| s.is_empty() || s == "." || s == "..")
        {
            return Err(format!("Vault mount {mount:?} is not a valid mount path"));
        }
        let mut builder = VaultClientSettingsBuilder::default();
        builder
            .address(settings.addr.as_str())
            .token(token)
            .ca_certs(
                settings
                    .ca_cert
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect(),
            )
            .identity(None)
            .verify(true)
            .timeout(Some(REQUEST_TIMEOUT_DEFAULT));
        let client_namespace = settings.namespace.clone();
        if let Some(namespace) = settings.namespace.clone() {
            builder.set_namespace(namespace);
        }
        // The builder's error and the settings' Debug would show the token: neither is printed.
        let client_settings = builder
            .build()
            .map_err(|_| "invalid Vault client settings".to_string())?;
        let mut client = VaultClient::new(client_settings).map_err(|e| match e {
            VaultError::FileReadError { path, source } => {
                format!("read Vault CA certificate {path}: {source}")
            }
            VaultError::ParseCertificateError { path, .. } => {
                format!("parse Vault CA certificate {path}")
            }
            _ => "build Vault HTTP client".to_string(),
        })?;
        // vaultrs's reqwest client follows redirects, and reqwest strips only
        // `Authorization`-type headers when a redirect leaves the origin: `X-Vault-Token`
        // would travel to wherever a 3xx points (a standby's redirect, a proxy). Its `http`
        // field is public; the replacement follows none, and vaultrs's middleware still adds
        // the token and the namespace to every request.
        let http = build_client(
            "Vault",
            &TlsFiles {
                ca_cert: settings.ca_cert.clone(),
                ..TlsFiles::default()
            },
            REQUEST_TIMEOUT_DEFAULT,
        )?;
        client.http.http = http.clone();
        Ok(VaultKv {
            client,
            mount,
            origin: settings.addr.origin().ascii_serialization(),
            http,
            token: settings.token.clone(),
            namespace: client_namespace,
            addr: settings.addr,
        })
    }

    pub fn mount(&self) -> &str {
        &self.mount
    }

    /// The `data.data` map of the latest version of the secret at `path`.
    async fn read_secret(&self, path: &str) -> Result<Map<String, Value>, PortError> {
        let path = path.trim_matches('/');
        let doing = format!(
            "read Vault secret {path} (mount {}) at {}",
            self.mount, self.origin
        );
        if path.is_empty()
            || path
                .split('/')
                .any(|s| s.is_empty() || s == "." || s == "..")
        {
            return Err(PortError::new(
                ErrorClass::Configuration,
                format!("{doing}: not a valid secret path"),
            ));
        }
        // Read as an untyped value: a typed read would put the offending value into
        // serde's error text.
        let read = vaultrs::kv2::read(&self.client, &self.mount, path).await;
        crate::metrics::count_request(crate::metrics::Service::Vault, answered_status(&read));
        let data: Value = read.map_err(|e| vault_error(&doing, e))?;
        match data {
            Value::Object(map) => Ok(map),
            other => Err(PortError::new(
                ErrorClass::Malformed,
                format!(
                    "{doing}: data.data is {}, expected an object",
                    json_kind(&other)
                ),
            )),
        }
    }

    /// `app_id`, `private_key` and optional `installation_id` of the secret at `path`.
    pub async fn read_app_credentials(&self, path: &str) -> Result<AppSecret, PortError> {
        let mut secret = self.read_secret(path).await?;
        let app_id = match secret.remove("app_id") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
            Some(Value::Number(n)) if n.is_u64() => n.to_string(),
            other => {
                return Err(self.field_error(
                    path,
                    "app_id",
                    other.as_ref(),
                    "a string or an integer",
                ));
            }
        };
        let private_key = take_string(&mut secret, "private_key")
            .map_err(|found| self.field_error(path, "private_key", found.as_ref(), "a string"))?;
        let installation_id = match secret.remove("installation_id") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) if n.is_u64() => n.as_u64(),
            Some(Value::String(s)) if s.trim().parse::<u64>().is_ok() => s.trim().parse().ok(),
            Some(other) => {
                return Err(self.field_error(path, "installation_id", Some(&other), "an integer"));
            }
        };
        let webhook_secret = match secret.remove("webhook_secret") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.trim().is_empty() => {
                Some(SecretString::from(s.trim().to_string()))
            }
            Some(other) => {
                return Err(self.field_error(
                    path,
                    "webhook_secret",
                    Some(&other),
                    "a non-empty string",
                ));
            }
        };
        Ok(AppSecret {
            app_id,
            private_key,
            installation_id,
            webhook_secret,
        })
    }

    /// A Configuration error naming the secret, the field and what was wrong with it, never
    /// its value.
    fn field_error(
        &self,
        path: &str,
        field: &str,
        found: Option<&Value>,
        expected: &str,
    ) -> PortError {
        let problem = match found {
            None => "has no such field".to_string(),
            Some(Value::String(s)) if s.trim().is_empty() => "is empty".to_string(),
            Some(value) => format!("is {}, expected {expected}", json_kind(value)),
        };
        PortError::new(
            ErrorClass::Configuration,
            format!(
                "Vault secret {} (mount {}): field {field:?} {problem}",
                path.trim_matches('/'),
                self.mount
            ),
        )
    }
}

impl VaultKv {
    /// A POST to `url` with the daemon's token (a sensitive header) and namespace.
    fn post(&self, url: Url, doing: &str) -> Result<reqwest::RequestBuilder, PortError> {
        let mut token = reqwest::header::HeaderValue::from_str(self.token.expose_secret())
            .map_err(|_| {
                PortError::new(
                    ErrorClass::Configuration,
                    format!("{doing}: VAULT_TOKEN is not a valid header value"),
                )
            })?;
        token.set_sensitive(true);
        // X-Vault-Request: a Vault Agent or Proxy listener with `require_request_header`
        // refuses any request without it (vaultrs sends it on the reads it makes).
        let mut request = self
            .http
            .post(url)
            .header("X-Vault-Token", token)
            .header("X-Vault-Request", "true");
        if let Some(namespace) = &self.namespace {
            request = request.header("X-Vault-Namespace", namespace);
        }
        Ok(request)
    }

    /// Sends `request` and answers its JSON body; any status but a success is an error
    /// carrying Vault's `errors`, which name the problem and never echo the request.
    async fn answer_json(
        &self,
        request: reqwest::RequestBuilder,
        doing: &str,
    ) -> Result<Value, PortError> {
        let response = request
            .send()
            .await
            .map_err(|e| crate::clients::http::transport_error("Vault", doing, &e))?;
        let status = response.status();
        if status.is_redirection() {
            return Err(crate::clients::http::redirect_refused(
                "Vault", doing, status,
            ));
        }
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            let errors: Vec<String> = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["errors"].as_array().cloned())
                .unwrap_or_default()
                .iter()
                .filter_map(|e| e.as_str().map(str::to_string))
                .collect();
            return Err(status_error(
                doing,
                status.as_u16(),
                &errors_detail(&errors),
            ));
        }
        response.json().await.map_err(|_| {
            PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: the response is not JSON"),
            )
        })
    }

    /// The API path of the KV v2 secret at `path` under this mount, as a Vault policy names
    /// it: `<mount>/data/<path>`.
    pub fn data_path(&self, path: &str) -> String {
        format!("{}/data/{}", self.mount, path.trim_matches('/'))
    }

    /// What the daemon's own token may do on each KV v2 secret of `paths` (secret paths under
    /// the mount, as the document writes them): `POST sys/capabilities-self` with
    /// `{"paths": ["<mount>/data/<path>", …]}`, answered with a capability list per API path
    /// (`["deny"]`, `["read"]`, `["root"]`…), at the top level and, from Vault's logical
    /// layer, under `data`. Keyed by the secret path as given.
    pub async fn capabilities_self(
        &self,
        paths: &[String],
    ) -> Result<BTreeMap<String, Vec<String>>, PortError> {
        let doing = format!("ask Vault at {} what VAULT_TOKEN may do", self.origin);
        if paths.is_empty() {
            return Ok(BTreeMap::new());
        }
        let url = self
            .addr
            .join("v1/sys/capabilities-self")
            .map_err(|e| PortError::new(ErrorClass::Configuration, format!("{doing}: {e}")))?;
        let api_paths: Vec<String> = paths.iter().map(|p| self.data_path(p)).collect();
        let request = self
            .post(url, &doing)?
            .json(&serde_json::json!({ "paths": api_paths }));
        let answer = self.answer_json(request, &doing).await?;
        let mut capabilities = BTreeMap::new();
        for (path, api_path) in paths.iter().zip(&api_paths) {
            let listed = answer
                .get(api_path)
                .or_else(|| answer["data"].get(api_path))
                .and_then(Value::as_array)
                .ok_or_else(|| {
                    PortError::new(
                        ErrorClass::Malformed,
                        format!("{doing}: the answer has no capability list for {api_path}"),
                    )
                })?;
            capabilities.insert(
                path.clone(),
                listed
                    .iter()
                    .filter_map(|c| c.as_str().map(str::to_string))
                    .collect(),
            );
        }
        Ok(capabilities)
    }
}

#[async_trait]
impl crate::secrets::CapabilityProbe for VaultKv {
    async fn capabilities(
        &self,
        paths: &[String],
    ) -> Result<BTreeMap<String, Vec<String>>, PortError> {
        self.capabilities_self(paths).await
    }

    fn api_path(&self, path: &str) -> String {
        self.data_path(path)
    }
}

/// `POST sys/wrapping/wrap` (API-CONTRACTS 4.4): the daemon's token authenticates, the TTL
/// goes in `X-Vault-Wrap-TTL`, the body is the object to wrap; the answer's
/// `wrap_info.token` is the single-use token. The body and the answer are never shown in an
/// error: they hold the credential.
#[async_trait]
impl crate::act::CredentialWrapper for VaultKv {
    async fn wrap(
        &self,
        fields: &[(&'static str, SecretString)],
        ttl: std::time::Duration,
    ) -> Result<SecretString, PortError> {
        let doing = format!("wrap a runner credential in Vault at {}", self.origin);
        let url = self
            .addr
            .join("v1/sys/wrapping/wrap")
            .map_err(|e| PortError::new(ErrorClass::Configuration, format!("{doing}: {e}")))?;
        let body: Map<String, Value> = fields
            .iter()
            .map(|(field, value)| {
                (
                    field.to_string(),
                    Value::String(value.expose_secret().to_string()),
                )
            })
            .collect();
        let request = self
            .post(url, &doing)?
            .header("X-Vault-Wrap-TTL", format!("{}s", ttl.as_secs().max(1)))
            .json(&body);
        let answer = self.answer_json(request, &doing).await?;
        match answer["wrap_info"]["token"].as_str() {
            Some(token) if !token.is_empty() => Ok(SecretString::from(token.to_string())),
            _ => Err(PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: the response has no wrap_info.token"),
            )),
        }
    }
}

#[async_trait]
impl SecretSource for VaultKv {
    async fn read_field(&self, path: &str, field: &str) -> Result<SecretString, PortError> {
        let mut secret = self.read_secret(path).await?;
        take_string(&mut secret, field)
            .map_err(|found| self.field_error(path, field, found.as_ref(), "a string"))
    }

    async fn read_fields(
        &self,
        path: &str,
        fields: &[&str],
    ) -> Result<Vec<Option<SecretString>>, PortError> {
        let mut secret = self.read_secret(path).await?;
        fields
            .iter()
            .map(|field| match take_string(&mut secret, field) {
                Ok(value) => Ok(Some(value)),
                Err(None) => Ok(None),
                Err(found) => Err(self.field_error(path, field, found.as_ref(), "a string")),
            })
            .collect()
    }
}

/// Moves a non-empty string field out of the secret into a [`SecretString`]; on failure returns
/// what was there instead, for the error message to describe (by kind only).
fn take_string(
    secret: &mut Map<String, Value>,
    field: &str,
) -> Result<SecretString, Option<Value>> {
    match secret.remove(field) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(SecretString::from(s)),
        Some(Value::String(s)) => Err(Some(Value::String(s))),
        other => Err(other),
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Maps a vaultrs error by its variant. Never formats `e` itself: some variants carry the raw
/// response body, which for a KV read is the secret.
/// The HTTP status of a read, as far as vaultrs lets it be known; `None` (the `error`
/// class) when no answer came back or vaultrs dropped its status.
fn answered_status<T>(read: &Result<T, VaultError>) -> Option<u16> {
    use rustify::errors::ClientError as Rest;
    match read {
        Ok(_) => Some(200),
        Err(VaultError::APIError { code, .. })
        | Err(VaultError::RestClientError {
            source: Rest::ServerResponseError { code, .. },
        }) => Some(*code),
        Err(_) => None,
    }
}

fn vault_error(doing: &str, e: VaultError) -> PortError {
    use rustify::errors::ClientError as Rest;
    match e {
        VaultError::APIError { code, errors } => status_error(doing, code, &errors_detail(&errors)),
        VaultError::RestClientError { source } => match source {
            // A soft-deleted or destroyed version answers 404 with the envelope (and
            // `data.data: null`) instead of `{"errors": [...]}`; only its metadata is read.
            Rest::ServerResponseError { code, content } => {
                let detail = if code == 404 {
                    content
                        .as_deref()
                        .map(deleted_version_detail)
                        .unwrap_or_default()
                } else {
                    String::new()
                };
                status_error(doing, code, &detail)
            }
            Rest::RequestError { source, .. } => {
                // A transport failure carries no response, so no secret: its root cause (a
                // refused connection, a certificate) is what the operator needs.
                let cause = source
                    .downcast_ref::<reqwest::Error>()
                    .map(|e| {
                        if e.is_timeout() {
                            "timed out"
                        } else if e.is_connect() {
                            "cannot connect"
                        } else {
                            "request failed"
                        }
                    })
                    .unwrap_or("request failed");
                let root = crate::clients::http::root_cause(source.as_ref());
                PortError::new(ErrorClass::Transient, format!("{doing}: {cause}: {root}"))
            }
            Rest::ResponseError { .. } => PortError::new(
                ErrorClass::Transient,
                format!("{doing}: reading the response failed"),
            ),
            Rest::ResponseParseError { .. } | Rest::ResponseConversionError { .. } => {
                PortError::new(
                    ErrorClass::Malformed,
                    format!("{doing}: the response is not a KV v2 secret"),
                )
            }
            _ => PortError::new(
                ErrorClass::Configuration,
                format!("{doing}: could not build the request"),
            ),
        },
        VaultError::ResponseEmptyError | VaultError::ResponseDataEmptyError => PortError::new(
            ErrorClass::Malformed,
            format!("{doing}: the response has no data"),
        ),
        VaultError::JsonParseError { .. } => PortError::new(
            ErrorClass::Malformed,
            format!("{doing}: the response is not a KV v2 secret"),
        ),
        _ => PortError::new(ErrorClass::Transient, format!("{doing}: request failed")),
    }
}

/// `: first; second; third` from Vault's `errors`, each clipped; empty when there are none.
fn errors_detail(errors: &[String]) -> String {
    let shown: Vec<String> = errors
        .iter()
        .take(3)
        .map(|m| crate::model::clip_chars(m.trim(), 200))
        .collect();
    if shown.is_empty() {
        String::new()
    } else {
        format!(": {}", shown.join("; "))
    }
}

fn status_error(doing: &str, code: u16, detail: &str) -> PortError {
    let status = reqwest::StatusCode::from_u16(code).unwrap_or(reqwest::StatusCode::BAD_GATEWAY);
    if status.is_redirection() {
        return redirect_refused("Vault", doing, status);
    }
    let class = match code {
        // Vault answers 412 when a performance standby has not caught up yet.
        412 => ErrorClass::Transient,
        _ => class_of_status(status),
    };
    PortError::new(class, format!("{doing}: {status}{detail}"))
}

/// `: version 3 was deleted` / `destroyed` from a 404 body, when it is the KV v2 envelope.
fn deleted_version_detail(body: &str) -> String {
    let Ok(envelope) = serde_json::from_str::<Value>(body) else {
        return String::new();
    };
    let metadata = &envelope["data"]["metadata"];
    let version = metadata["version"].as_u64();
    let destroyed = metadata["destroyed"].as_bool().unwrap_or(false);
    let deleted = metadata["deletion_time"]
        .as_str()
        .is_some_and(|t| !t.is_empty());
    match (version, destroyed, deleted) {
        (Some(v), true, _) => format!(": version {v} was destroyed"),
        (Some(v), false, true) => format!(": version {v} was deleted"),
        _ => String::new(),
    }
}
