//! Consul KV client: reads the configuration document with blocking queries, through the
//! `consulrs` crate.
//!
//! What `consulrs` 0.1 does and does not do, and how this file makes up for it:
//! - It builds its own reqwest 0.11 client **without any timeout**: every read here runs under
//!   a `tokio` timeout longer than the blocking wait (plus Consul's wait/16 jitter).
//! - A 404 comes back as a bare status code, without the response's `X-Consul-Index`: a
//!   missing key is reported as [`Fetched::Missing`] with index 0, and the watcher polls.
//! - Its CA option reads only the **first** certificate of a PEM file (`Certificate::from_pem`)
//!   and, without one, trusts the bundled web PKI roots rather than the system's; it honours
//!   client certificates, but has no `CONSUL_TLS_SERVER_NAME` and no `unix://` addresses. The
//!   client that replaces its own (below) trusts every certificate of the file.
//! - Its reqwest client follows redirects, and reqwest strips only `Authorization`-type
//!   headers when a redirect leaves the origin: `X-Consul-Token` would travel to wherever a
//!   3xx points. `ConsulClient::http` is public, so its client is replaced here by one built
//!   the same way that follows none; a 3xx is reported as a configuration error.
//! - It keeps the ACL token as a plain `String` in its settings (which derive `Debug`) and
//!   panics on a token that is not a valid header value: the token is checked here first, and
//!   the settings are never formatted. Its tracing spans skip the client and the request, so
//!   the token does not reach logs; but it logs every request at INFO and every failure
//!   (404s included) at ERROR through `#[instrument(err)]`, so the daemon's log filter should
//!   turn `consulrs` and `rustify` down (`consulrs=off,rustify=off`): this file logs what
//!   matters itself.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use consulrs::api::features::{Blocking, Features};
use consulrs::api::kv::requests::ReadKeyRequest;
use consulrs::client::{ConsulClient, ConsulClientSettings};
use consulrs::error::ClientError;
use secrecy::{ExposeSecret, SecretString};

use crate::clients::http::{
    REQUEST_TIMEOUT_DEFAULT, class_of_status, redirect_refused, root_cause,
};
use crate::config::watch::{DocumentSource, Fetched};
use crate::model::ErrorClass;
use crate::observe::PortError;

/// Default key of the document (BRIEF "The configuration users edit").
pub const CONFIG_KEY_DEFAULT: &str = "runners/config";
/// Consul caps a blocking wait at 10 minutes.
pub const BLOCKING_WAIT_MAX: Duration = Duration::from_secs(10 * 60);

/// Where Consul is and how to authenticate, from the standard `CONSUL_*` environment.
#[derive(Clone, Debug)]
pub struct ConsulSettings {
    /// `CONSUL_HTTP_ADDR`, e.g. `http://127.0.0.1:8500`; `host:port` means `http://host:port`.
    pub address: String,
    /// `CONSUL_HTTP_TOKEN` (or the file named by `CONSUL_HTTP_TOKEN_FILE`); absent means the
    /// anonymous token.
    pub token: Option<SecretString>,
    /// `CONSUL_CACERT` (every certificate of the file).
    pub ca_cert: Option<PathBuf>,
    /// `CONSUL_CLIENT_CERT` and `CONSUL_CLIENT_KEY`.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

impl ConsulSettings {
    /// Reads the standard `CONSUL_*` variables; the address defaults to Consul's own default.
    pub fn from_env() -> Result<ConsulSettings, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let token = match (var("CONSUL_HTTP_TOKEN"), var("CONSUL_HTTP_TOKEN_FILE")) {
            (Some(token), _) => Some(SecretString::from(token)),
            (None, Some(path)) => Some(SecretString::from(
                std::fs::read_to_string(&path)
                    .map_err(|e| format!("read CONSUL_HTTP_TOKEN_FILE {path}: {e}"))?,
            )),
            (None, None) => None,
        };
        Ok(ConsulSettings {
            address: var("CONSUL_HTTP_ADDR").unwrap_or_else(|| "http://127.0.0.1:8500".into()),
            token,
            ca_cert: var("CONSUL_CACERT").map(PathBuf::from),
            client_cert: var("CONSUL_CLIENT_CERT").map(PathBuf::from),
            client_key: var("CONSUL_CLIENT_KEY").map(PathBuf::from),
        })
    }
}

/// Reads one KV key, implementing [`DocumentSource`].
pub struct ConsulKv {
    client: ConsulClient,
    key: String,
    /// The normalised address, for error messages (it carries no credential).
    address: String,
}

/// `http://host:port` without a trailing slash; a bare `host:port` gets `http://`, as the
/// Consul CLI does.
fn normalise_address(raw: &str) -> Result<String, String> {
    let raw = raw.trim().trim_end_matches('/');
    let with_scheme = if raw.contains("://") {
        raw.to_string()
    } else {
        format!("http://{raw}")
    };
    let url = url::Url::parse(&with_scheme)
        .map_err(|e| format!("CONSUL_HTTP_ADDR {raw:?} is not an address: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "CONSUL_HTTP_ADDR {raw:?}: only http:// and https:// addresses are supported"
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("CONSUL_HTTP_ADDR must not carry credentials; use CONSUL_HTTP_TOKEN".into());
    }
    Ok(with_scheme)
}

/// A key Consul accepts without escaping (API-CONTRACTS gotcha 21: recent Consul validates
/// keys; no leading `/`, no `..`).
pub(crate) fn check_key(key: &str) -> Result<(), String> {
    let valid = !key.is_empty()
        && !key.starts_with('/')
        && !key.split('/').any(|s| s == "..")
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ',' | '_' | '.' | '/' | '-'));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "Consul key {key:?} is not usable: expected [A-Za-z0-9,_./-], no leading '/', no '..'"
        ))
    }
}

fn path_string(path: &std::path::Path, what: &str) -> Result<String, String> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{what} path {} is not valid UTF-8", path.display()))
}

/// Go duration syntax for `?wait=`: whole seconds, or milliseconds below one second.
fn go_duration(wait: Duration) -> String {
    if wait >= Duration::from_secs(1) {
        format!("{}s", wait.as_secs())
    } else {
        format!("{}ms", wait.as_millis().max(1))
    }
}

impl ConsulKv {
    pub fn new(settings: &ConsulSettings, key: &str) -> Result<ConsulKv, String> {
        check_key(key)?;
        let address = normalise_address(&settings.address)?;
        let token = match &settings.token {
            None => None,
            Some(token) => {
                let token = token.expose_secret().trim();
                // consulrs unwraps HeaderValue::from_str on the token: refuse what would panic.
                if token.chars().any(|c| !(c.is_ascii_graphic() || c == ' ')) {
                    return Err(
                        "the Consul token contains characters not allowed in an HTTP header".into(),
                    );
                }
                (!token.is_empty()).then(|| token.to_string())
            }
        };
        let client_cert = match (&settings.client_cert, &settings.client_key) {
            (Some(cert), Some(key)) => Some((
                path_string(cert, "CONSUL_CLIENT_CERT")?,
                path_string(key, "CONSUL_CLIENT_KEY")?,
            )),
            (None, None) => None,
            _ => {
                return Err(
                    "Consul: a client certificate needs both CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY"
                        .into(),
                );
            }
        };
        let ca_certs = match &settings.ca_cert {
            Some(path) => vec![path_string(path, "CONSUL_CACERT")?],
            None => Vec::new(),
        };
        // Every field is set here, so consulrs's builder never falls back to reading the
        // environment on its own.
        let consul_settings = ConsulClientSettings {
            address: address.clone(),
            ca_certs,
            client_cert: client_cert.as_ref().map(|(cert, _)| cert.clone()),
            client_key: client_cert.map(|(_, key)| key),
            token,
            verify: true,
            version: 1,
        };
        let mut client = ConsulClient::new(consul_settings)
            .map_err(|e| format!("build Consul client for {address}: {}", root_cause(&e)))?;
        client.http.http = without_redirects(&client.settings)
            .map_err(|e| format!("build Consul client for {address}: {e}"))?;
        Ok(ConsulKv {
            client,
            key: key.to_string(),
            address,
        })
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// The HTTP client (no redirects followed), for the calls consulrs lacks (sessions).
    pub(crate) fn http_client(&self) -> reqwest_0_11::Client {
        self.client.http.http.clone()
    }

    /// The normalised address, without a trailing slash.
    pub(crate) fn address(&self) -> &str {
        &self.address
    }

    fn doing(&self) -> String {
        format!("read Consul key {} at {}", self.key, self.address)
    }
}

/// The reqwest client `ConsulClient::new` builds from `settings` (consulrs 0.1: the same TLS
/// options, no timeout), except that it follows no redirect.
fn without_redirects(settings: &ConsulClientSettings) -> Result<reqwest_0_11::Client, String> {
    let mut builder = reqwest_0_11::ClientBuilder::new()
        .danger_accept_invalid_certs(!settings.verify)
        .redirect(reqwest_0_11::redirect::Policy::none());
    for path in &settings.ca_certs {
        let pem = std::fs::read(path).map_err(|e| format!("read CA certificate {path}: {e}"))?;
        // Every certificate of the file: a CA bundle may hold intermediates before the root.
        let certs = reqwest_0_11::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("parse CA certificates {path}: {e}"))?;
        if certs.is_empty() {
            return Err(format!(
                "parse CA certificates {path}: no PEM certificate in it"
            ));
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    if let (Some(cert), Some(key)) = (&settings.client_cert, &settings.client_key) {
        let mut pem =
            std::fs::read(cert).map_err(|e| format!("read client certificate {cert}: {e}"))?;
        pem.extend(std::fs::read(key).map_err(|e| format!("read client key {key}: {e}"))?);
        let identity = reqwest_0_11::Identity::from_pem(&pem)
            .map_err(|e| format!("load client certificate {cert} and key: {e}"))?;
        builder = builder.identity(identity);
    }
    builder
        .build()
        .map_err(|e| format!("build HTTP client: {e}"))
}

/// Consul's error bodies are short plain text; keep them short and on one line anyway.
fn excerpt(body: &str) -> String {
    let line: String = body.trim().chars().take(200).collect();
    line.escape_debug().to_string()
}

fn classify(doing: &str, e: ClientError) -> PortError {
    match e {
        ClientError::APIError { code, message } => {
            let status = reqwest::StatusCode::from_u16(code)
                .unwrap_or(reqwest::StatusCode::INTERNAL_SERVER_ERROR);
            if status.is_redirection() {
                return redirect_refused("Consul", doing, status);
            }
            let body = message.as_deref().map(excerpt).unwrap_or_default();
            let mut text = format!("{doing}: {status}");
            if !body.is_empty() {
                text.push_str(": ");
                text.push_str(&body);
            }
            PortError::new(class_of_status(status), text)
        }
        ClientError::RestClientError { source } => {
            // rustify's error type is not ours to name (no direct dependency); its messages
            // are fixed strings: "Error parsing HTTP response", "Error parsing server response
            // as UTF-8" for bodies we cannot read, transport failures otherwise.
            let class = if source.to_string().starts_with("Error parsing") {
                ErrorClass::Malformed
            } else {
                ErrorClass::Transient
            };
            PortError::new(class, format!("{doing}: {}", root_cause(&source)))
        }
        other => PortError::new(
            ErrorClass::Malformed,
            format!("{doing}: {}", root_cause(&other)),
        ),
    }
}

#[async_trait]
impl DocumentSource for ConsulKv {
    async fn fetch(&self, index: u64, wait: Duration) -> Result<Fetched, PortError> {
        let doing = self.doing();
        let wait = wait.min(BLOCKING_WAIT_MAX);
        let mut request = ReadKeyRequest::builder();
        let timeout = if index > 0 {
            request.features(Features {
                blocking: Some(Blocking {
                    index,
                    wait: Some(go_duration(wait)),
                }),
                ..Features::default()
            });
            // Consul may hold the answer for wait + wait/16 (its jitter).
            wait + wait / 16 + REQUEST_TIMEOUT_DEFAULT
        } else {
            REQUEST_TIMEOUT_DEFAULT
        };
        let read = consulrs::kv::read(&self.client, &self.key, Some(&mut request));
        let read = tokio::time::timeout(timeout, read).await;
        // consulrs hides the status of a success; an API error carries its code.
        let status = match &read {
            Ok(Ok(_)) => Some(200),
            Ok(Err(ClientError::APIError { code, .. })) => Some(*code),
            _ => None,
        };
        crate::metrics::count_request(crate::metrics::Service::Consul, status);
        let response = match read {
            Err(_) => {
                return Err(PortError::new(
                    ErrorClass::Transient,
                    format!("{doing}: timed out after {}s", timeout.as_secs()),
                ));
            }
            Ok(Err(ClientError::APIError { code: 404, message }))
                if message.as_deref().is_none_or(|m| m.trim().is_empty()) =>
            {
                // consulrs drops the 404's headers, so the index is unknown: 0 makes the
                // watcher poll instead of blocking.
                return Ok(Fetched::Missing { index: 0 });
            }
            Ok(Err(e)) => return Err(classify(&doing, e)),
            Ok(Ok(response)) => response,
        };
        let index = match response.index.as_deref().map(str::parse::<u64>) {
            Some(Ok(index)) => index,
            _ => {
                return Err(PortError::new(
                    ErrorClass::Malformed,
                    format!("{doing}: the answer has no valid X-Consul-Index header"),
                ));
            }
        };
        let Some(pair) = response.response.into_iter().find(|p| p.key == self.key) else {
            return Ok(Fetched::Missing { index });
        };
        let bytes = match pair.value {
            // Consul sends `"Value": null` for an empty value.
            None => Vec::new(),
            Some(value) => value.try_into().map_err(|e: ClientError| {
                PortError::new(
                    ErrorClass::Malformed,
                    format!("{doing}: Value is not base64: {}", root_cause(&e)),
                )
            })?,
        };
        Ok(Fetched::Found { bytes, index })
    }
}

/// The state key (`--state-key`): read with one plain read, written with a plain PUT (the
/// lock holder is its only writer, behind its fence).
#[async_trait]
impl crate::act::services::CarriedStore for ConsulKv {
    async fn load(&self) -> Result<Option<Vec<u8>>, PortError> {
        match self.fetch(0, Duration::ZERO).await? {
            Fetched::Found { bytes, .. } => Ok(Some(bytes)),
            Fetched::Missing { .. } => Ok(None),
        }
    }

    async fn save(&self, value: Vec<u8>) -> Result<(), PortError> {
        let doing = format!("write Consul key {} at {}", self.key, self.address);
        let endpoint = consulrs::api::kv::requests::SetKeyRequest::builder()
            .key(self.key.as_str())
            .value(value)
            .build()
            .map_err(|e| PortError::new(ErrorClass::Configuration, format!("{doing}: {e}")))?;
        let written = tokio::time::timeout(
            REQUEST_TIMEOUT_DEFAULT,
            consulrs::api::exec_with_result(&self.client, endpoint),
        )
        .await;
        let status = match &written {
            Ok(Ok(_)) => Some(200),
            Ok(Err(ClientError::APIError { code, .. })) => Some(*code),
            _ => None,
        };
        crate::metrics::count_request(crate::metrics::Service::Consul, status);
        match written {
            Err(_) => Err(PortError::new(
                ErrorClass::Transient,
                format!(
                    "{doing}: timed out after {}s",
                    REQUEST_TIMEOUT_DEFAULT.as_secs()
                ),
            )),
            Ok(Err(e)) => Err(classify(&doing, e)),
            // Consul answers `false` to a plain PUT only when a check-and-set or a lock
            // refused it, which this write never asks for.
            Ok(Ok(response)) if !response.response => Err(PortError::new(
                ErrorClass::Transient,
                format!("{doing}: Consul answered false"),
            )),
            Ok(Ok(_)) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_normalised_like_the_consul_cli() {
        assert_eq!(
            normalise_address("127.0.0.1:8500").unwrap(),
            "http://127.0.0.1:8500"
        );
        assert_eq!(
            normalise_address("https://consul.example:8501/").unwrap(),
            "https://consul.example:8501"
        );
        assert!(normalise_address("unix:///var/run/consul.sock").is_err());
        let refused = normalise_address("http://user:hunter2@consul:8500").unwrap_err();
        assert!(!refused.contains("hunter2"), "{refused}");
    }

    #[test]
    fn keys_consul_would_refuse_are_refused_up_front() {
        assert!(check_key("runners/config").is_ok());
        for bad in ["", "/runners/config", "runners/../x", "runners config"] {
            assert!(check_key(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_token_that_is_not_a_header_value_is_refused_without_echoing_it() {
        let settings = ConsulSettings {
            address: "http://127.0.0.1:8500".into(),
            token: Some(SecretString::from("s3cr3t\nvalue")),
            ca_cert: None,
            client_cert: None,
            client_key: None,
        };
        let error = ConsulKv::new(&settings, CONFIG_KEY_DEFAULT)
            .err()
            .expect("refused");
        assert!(!error.contains("s3cr3t"), "{error}");
    }

    #[test]
    fn waits_are_written_as_go_durations() {
        assert_eq!(go_duration(Duration::from_secs(300)), "300s");
        assert_eq!(go_duration(Duration::from_millis(250)), "250ms");
    }
}
