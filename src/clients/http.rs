//! One way to build an HTTP client for a HashiCorp service or a forge: TLS settings honoured,
//! a request timeout on every call, a User-Agent naming us, and no redirects followed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::model::ErrorClass;
use crate::observe::PortError;

/// Default timeout of one HTTP request. GitHub itself gives up on requests after 10 s.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(15);

pub const USER_AGENT: &str = concat!("runner-scaler/", env!("CARGO_PKG_VERSION"));

/// TLS material for one service, from `*_CACERT`, `*_CLIENT_CERT`, `*_CLIENT_KEY`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca_cert: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

/// Installs the process-wide TLS crypto provider; harmless when called twice.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("read {what} {}: {e}", path.display()))
}

/// Builds a reqwest client for `service` (named in errors) with its TLS files.
pub fn build_client(
    service: &str,
    tls: &TlsFiles,
    timeout: Duration,
) -> Result<reqwest::Client, String> {
    client_builder(service, tls, timeout)?
        .build()
        .map_err(|e| format!("build {service} HTTP client: {e}"))
}

/// The builder behind [`build_client`], for a client that needs one more setting (Nomad's
/// task API socket).
pub fn client_builder(
    service: &str,
    tls: &TlsFiles,
    timeout: Duration,
) -> Result<reqwest::ClientBuilder, String> {
    install_crypto_provider();
    // Every request carries a token in a header (`X-Nomad-Token`, `Authorization: token`).
    // reqwest follows redirects by default and strips only `Authorization`-type headers when
    // one leaves the origin, so a redirect would hand the others to whoever it points at.
    let mut builder = reqwest::Client::builder()
        .user_agent(USER_AGENT)
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(5)))
        .redirect(reqwest::redirect::Policy::none());
    if let Some(ca) = &tls.ca_cert {
        let pem = read(ca, &format!("{service} CA certificate"))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("parse {service} CA certificate {}: {e}", ca.display()))?;
        // A file with no PEM block parses as an empty bundle: trusting nothing more than the
        // system roots would fail later, on every request, far from the setting at fault.
        if certs.is_empty() {
            return Err(format!(
                "parse {service} CA certificate {}: no PEM certificate in it",
                ca.display()
            ));
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    match (&tls.client_cert, &tls.client_key) {
        (Some(cert), Some(key)) => {
            let mut pem = read(cert, &format!("{service} client certificate"))?;
            pem.push(b'\n');
            pem.extend(read(key, &format!("{service} client key"))?);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| format!("load {service} client certificate and key: {e}"))?;
            builder = builder.identity(identity);
        }
        (None, None) => {}
        _ => {
            return Err(format!(
                "{service}: a client certificate needs both the certificate and the key"
            ));
        }
    }
    Ok(builder)
}

/// Classifies a transport failure (no HTTP status): always transient. One line: what was
/// being done, the service and its address, and the root cause once.
pub fn transport_error(
    service: &str,
    doing: impl std::fmt::Display,
    e: &reqwest::Error,
) -> PortError {
    let what = what_failed(e);
    let doing = doing.to_string();
    let origin = e.url().map(|u| u.origin().ascii_serialization());
    // Said once: a caller that talks to several instances (Forgejo) names the one already.
    let whom = match origin {
        Some(origin) if !doing.contains(&origin) => format!("{service} at {origin}: "),
        _ => String::new(),
    };
    PortError::new(
        ErrorClass::Transient,
        format!("{doing}: {whom}{what}: {}", root_cause(e)),
    )
}

fn what_failed(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    }
}

/// [`transport_error`] for a client whose requests' URLs do not say where they went (a Unix
/// socket): `at` names the place instead.
pub fn transport_error_at(
    service: &str,
    at: &str,
    doing: impl std::fmt::Display,
    e: &reqwest::Error,
) -> PortError {
    let what = what_failed(e);
    PortError::new(
        ErrorClass::Transient,
        format!("{doing}: {service} at {at}: {what}: {}", root_cause(e)),
    )
}

/// The innermost error of a chain: the one that says why. HTTP stacks wrap a refused
/// connection in three or four layers that each repeat their source's text after their own,
/// so printing the chain says the cause four times; the outer layers add nothing an operator
/// acts on once the caller has said what it was doing and to which address.
pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut innermost = e;
    while let Some(source) = innermost.source() {
        innermost = source;
    }
    innermost.to_string()
}

/// A 3xx answer to a request that carries a token: the clients do not follow redirects (see
/// [`build_client`]), so the answer names what to fix instead of where the token would go.
/// The `Location` is not shown: it is the answering server's text.
pub fn redirect_refused(
    service: &str,
    doing: impl std::fmt::Display,
    status: reqwest::StatusCode,
) -> PortError {
    PortError::new(
        ErrorClass::Configuration,
        format!(
            "{doing}: {service} answered a redirect to another location ({status}); redirects \
             are not followed because the request carries a token"
        ),
    )
}

/// The usual status mapping for services without special rules (Nomad, Consul, Vault,
/// Forgejo); GitHub refines 403 and 429 by its rate-limit headers.
pub fn class_of_status(status: reqwest::StatusCode) -> ErrorClass {
    match status.as_u16() {
        // Never followed: see `redirect_refused`.
        300..=399 => ErrorClass::Configuration,
        401 => ErrorClass::Unauthorized,
        403 => ErrorClass::Forbidden,
        404 => ErrorClass::NotFound,
        429 => ErrorClass::RateLimited,
        400 | 405 | 409 | 422 => ErrorClass::Configuration,
        _ => ErrorClass::Transient,
    }
}

/// Reads a response body of at most `max_bytes`: a forge is a server on the other side of a
/// trust boundary, and one that answers a body without end must not take the daemon's memory
/// with it. A declared `Content-Length` over the cap is refused before any of it is read.
pub async fn read_body_capped(
    mut response: reqwest::Response,
    max_bytes: usize,
    service: &str,
    doing: &str,
) -> Result<Vec<u8>, PortError> {
    let too_large = || {
        PortError::new(
            ErrorClass::Malformed,
            format!("{doing}: {service} answered a body over {max_bytes} bytes; it was not read"),
        )
    };
    if response
        .content_length()
        .is_some_and(|declared| declared > max_bytes as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| transport_error(service, doing, &e))?
    {
        if body.len() + chunk.len() > max_bytes {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Why an exchange that no reqwest client carried (an in-memory service) gave no answer.
pub enum Unanswered<'e> {
    /// The request's timeout ran out first.
    TimedOut,
    /// The service failed the request.
    Failed(&'e (dyn std::error::Error + 'static)),
}

/// [`transport_error`] for an exchange that no reqwest client carried (an in-memory service):
/// the same line, its address taken from the URL the request was for, and what failed read
/// from an I/O error's kind where reqwest would have known it from the connection.
pub fn unanswered_error(
    service: &str,
    doing: impl std::fmt::Display,
    url: &url::Url,
    why: Unanswered<'_>,
) -> PortError {
    let (what, cause) = match why {
        // reqwest's own words for its timeout, so both transports say it alike.
        Unanswered::TimedOut => ("timed out", "operation timed out".to_string()),
        Unanswered::Failed(e) => (what_failed_in(e), root_cause(e)),
    };
    let doing = doing.to_string();
    let origin = url.origin().ascii_serialization();
    let whom = if doing.contains(&origin) {
        String::new()
    } else {
        format!("{service} at {origin}: ")
    };
    PortError::new(
        ErrorClass::Transient,
        format!("{doing}: {whom}{what}: {cause}"),
    )
}

fn what_failed_in(e: &(dyn std::error::Error + 'static)) -> &'static str {
    let mut layer = Some(e);
    while let Some(e) = layer {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::TimedOut => "timed out",
                std::io::ErrorKind::ConnectionRefused
                | std::io::ErrorKind::HostUnreachable
                | std::io::ErrorKind::NetworkUnreachable => "cannot connect",
                _ => "request failed",
            };
        }
        layer = e.source();
    }
    "request failed"
}
