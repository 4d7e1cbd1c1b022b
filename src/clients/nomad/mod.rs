//! The Nomad client: lists a parent job's children, dispatches, re-reads and purges them.
//!
//! Namespaces: children are listed across all of them (`namespace=*`), so every child of
//! ours is found whatever the document says, and each one carries its namespace, to which
//! its reads, stop and purge go. Dispatches go to the repo's namespace (`nomadNamespace`),
//! else to `--runner-namespace`.
//!
//! `NOMAD_ADDR` may be `unix:///path/api.sock`, the task API socket Nomad (1.5 or later)
//! gives a task with a workload identity; requests then go over that socket.
//!
//! # Layout
//!
//! This file holds the settings, the client, and how one request is sent and its failure read.
//!
//! - `children`: the [`ChildSource`](crate::observe::ChildSource) side: a parent's children,
//!   the parents of ours, how a runner ended.
//! - `parent`: a parent job as Nomad has it, for `config check --live` and held dispatches.
//! - `control`: the [`ChildControl`](crate::act::ChildControl) side: dispatch, stop, purge,
//!   and the re-reads around them.
//! - `wire`: the JSON fields sent and read; the listing's meta keeps only the keys we read.

mod children;
mod control;
mod parent;
mod wire;

use std::time::Duration;

use reqwest::StatusCode;
use secrecy::{ExposeSecret, SecretString};
use url::Url;

use crate::clients::http::{
    TlsFiles, class_of_status, client_builder, redirect_refused, transport_error,
    transport_error_at,
};
use crate::model::{ChildId, ErrorClass, NOMAD_DEFAULT_NAMESPACE};
use crate::observe::PortError;

/// The header Nomad reads the ACL token from.
const TOKEN_HEADER: &str = "X-Nomad-Token";
/// Nomad's error bodies are one line of text; anything longer is cut before it reaches a log.
const ERROR_BODY_CHARS_MAX: usize = 300;

/// Substrings of the plain-text 500s Nomad returns when it refuses a dispatch for reasons of
/// configuration (nomad/job_endpoint.go `Dispatch` and `validateDispatchRequest`). They may
/// arrive prefixed with `rpc error: ` when the agent forwards the request, so match anywhere.
const DISPATCH_CONFIGURATION_ERRORS: &[&str] = &[
    "parameterized job not found",
    "is not a parameterized job",
    "is stopped",
    "Dispatch request included unpermitted metadata keys",
    "Dispatch did not provide required meta keys",
    "Payload is not provided but required",
    "Payload provided but forbidden",
    "Payload exceeds maximum size",
    "missing parameterized job ID",
    "Duplicate key",
    "dispatch job priority must be between",
];

/// Where and how to reach Nomad: `NOMAD_ADDR`, `NOMAD_TOKEN`, `NOMAD_REGION`,
/// `NOMAD_CACERT`, `NOMAD_CLIENT_CERT`, `NOMAD_CLIENT_KEY`, and `--runner-namespace`.
#[derive(Clone, Debug)]
pub struct NomadSettings {
    /// `http(s)://…`, or `unix:///path` for Nomad's task API socket.
    pub addr: Url,
    pub token: Option<SecretString>,
    /// Where the parents of a repo that names no `nomadNamespace` live (`--runner-namespace`);
    /// Nomad's `default` namespace when `None`. Never `NOMAD_NAMESPACE`: Nomad sets that in
    /// every task to the task's own namespace, the daemon's, not its runners'.
    pub namespace: Option<String>,
    /// Sent as `?region=` on every call; the agent's own region when `None`.
    pub region: Option<String>,
    pub tls: TlsFiles,
}

impl NomadSettings {
    /// Settings for `addr` with no token, namespace, region or TLS files.
    pub fn new(addr: Url) -> NomadSettings {
        NomadSettings {
            addr,
            token: None,
            namespace: None,
            region: None,
            tls: TlsFiles::default(),
        }
    }
}

/// A typed client of the Nomad HTTP API, for the calls the daemon makes.
#[derive(Clone)]
pub struct NomadClient {
    http: reqwest::Client,
    settings: NomadSettings,
    /// Where requests go: `addr`, or for a Unix socket a stand-in origin the socket ignores.
    base: Url,
    /// The socket's path when `addr` is `unix://…`, named in transport errors.
    socket: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for NomadClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NomadClient")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Classifies a Nomad error response. Nomad answers dispatch validation failures with HTTP
/// 500 and a plain-text message (BRIEF lesson 10): those are configuration errors that no
/// retry fixes; any other 500 is transient.
fn class_of_response(status: StatusCode, body: &str) -> ErrorClass {
    match status.as_u16() {
        400 => ErrorClass::Configuration,
        403 => ErrorClass::Forbidden,
        500 if DISPATCH_CONFIGURATION_ERRORS
            .iter()
            .any(|needle| body.contains(needle)) =>
        {
            ErrorClass::Configuration
        }
        _ => class_of_status(status),
    }
}

/// Nomad's error text, one line, cut short, with control characters removed so that a body
/// cannot forge log lines.
fn shown_body(status: StatusCode, body: &str) -> String {
    let mut shown: String = body
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(ERROR_BODY_CHARS_MAX)
        .collect();
    if body.trim().chars().count() > ERROR_BODY_CHARS_MAX {
        shown.push('…');
    }
    if shown.is_empty() {
        shown = status.canonical_reason().unwrap_or("").to_string();
    }
    format!("{} {shown}", status.as_u16())
}

/// The socket of a `unix:///path` address: an absolute path, no host.
fn unix_socket_path(addr: &Url) -> Result<std::path::PathBuf, String> {
    let path = addr.path();
    if addr.host_str().is_some_and(|h| !h.is_empty()) || !path.starts_with('/') || path == "/" {
        return Err(format!(
            "NOMAD_ADDR {addr} does not name a socket by its absolute path \
             (unix:///path/to/api.sock)"
        ));
    }
    Ok(std::path::PathBuf::from(path))
}

impl NomadClient {
    /// Builds the client; fails when the address is neither an http(s) URL nor a `unix:///`
    /// socket path, or the TLS files cannot be read.
    pub fn new(settings: NomadSettings, timeout: Duration) -> Result<NomadClient, String> {
        let builder = client_builder("Nomad", &settings.tls, timeout)?;
        let (builder, base, socket) = match settings.addr.scheme() {
            "http" | "https" if !settings.addr.cannot_be_a_base() => {
                (builder, settings.addr.clone(), None)
            }
            "unix" => {
                let path = unix_socket_path(&settings.addr)?;
                // The socket answers whatever the Host; the origin only shapes the requests.
                let base = Url::parse("http://localhost/").expect("a valid URL");
                (builder.unix_socket(path.as_path()), base, Some(path))
            }
            _ => {
                return Err(format!(
                    "NOMAD_ADDR {} is not an http://, https:// or unix:// address",
                    settings.addr
                ));
            }
        };
        let http = builder
            .build()
            .map_err(|e| format!("build Nomad HTTP client: {e}"))?;
        Ok(NomadClient {
            http,
            settings,
            base,
            socket,
        })
    }

    /// Where a dispatch goes when the request names no namespace.
    fn default_namespace(&self) -> &str {
        self.settings
            .namespace
            .as_deref()
            .unwrap_or(NOMAD_DEFAULT_NAMESPACE)
    }

    pub fn settings(&self) -> &NomadSettings {
        &self.settings
    }

    /// `<addr>/v1/<segments…>`, each segment path-escaped (a child id's `/` becomes `%2F`).
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        {
            let mut path = url
                .path_segments_mut()
                .expect("checked in NomadClient::new: an http(s) URL has a path");
            path.pop_if_empty().push("v1");
            for segment in segments {
                path.push(segment);
            }
        }
        url
    }

    /// A request with the token header and the namespace and region parameters: `*` lists
    /// across every namespace the token may see.
    fn request(
        &self,
        method: reqwest::Method,
        url: Url,
        namespace: &str,
    ) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .request(method, url)
            .query(&[("namespace", namespace)]);
        if let Some(token) = &self.settings.token {
            request = request.header(TOKEN_HEADER, token.expose_secret());
        }
        if let Some(region) = &self.settings.region {
            request = request.query(&[("region", region)]);
        }
        request
    }

    /// Sends `request`; a non-2xx status becomes a classified error naming `doing`.
    async fn send(
        &self,
        doing: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, PortError> {
        let response = request.send().await;
        crate::metrics::count_request(
            crate::metrics::Service::Nomad,
            response.as_ref().ok().map(|r| r.status().as_u16()),
        );
        let response = response.map_err(|e| self.transport_error(doing, &e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        if status.is_redirection() {
            return Err(redirect_refused("Nomad", doing, status));
        }
        let body = response.text().await.unwrap_or_default();
        Err(PortError::new(
            class_of_response(status, &body),
            format!("{doing}: {}", shown_body(status, &body)),
        ))
    }

    fn transport_error(&self, doing: &str, e: &reqwest::Error) -> PortError {
        match &self.socket {
            Some(path) => transport_error_at(
                "Nomad",
                &format!("unix socket {}", path.display()),
                doing,
                e,
            ),
            None => transport_error("Nomad", doing, e),
        }
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        doing: &str,
        response: reqwest::Response,
    ) -> Result<T, PortError> {
        let bytes = response
            .bytes()
            .await
            .map_err(|e| self.transport_error(doing, &e))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: unreadable response: {e}"),
            )
        })
    }
}

/// `<id> in namespace <ns>`, what an operator needs for `nomad job status -namespace`.
fn shown_child(child: &ChildId) -> String {
    format!("{} in namespace {}", child.id(), child.namespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatch_validation_500s_are_configuration_errors() {
        let server_error = StatusCode::INTERNAL_SERVER_ERROR;
        for body in [
            "parameterized job not found",
            "rpc error: parameterized job not found",
            "Specified job \"ci\" is not a parameterized job",
            "Specified job \"ci\" is stopped",
            "Dispatch request included unpermitted metadata keys: [foo]",
            "Dispatch did not provide required meta keys: [runner_token]",
            "Payload is not provided but required by parameterized job",
        ] {
            assert_eq!(
                class_of_response(server_error, body),
                ErrorClass::Configuration,
                "{body}"
            );
        }
        assert_eq!(
            class_of_response(server_error, "No cluster leader"),
            ErrorClass::Transient
        );
        assert_eq!(
            class_of_response(StatusCode::FORBIDDEN, "Permission denied"),
            ErrorClass::Forbidden
        );
        assert_eq!(
            class_of_response(StatusCode::BAD_REQUEST, "Job ID does not match"),
            ErrorClass::Configuration
        );
    }

    #[test]
    fn error_bodies_are_one_short_line() {
        let shown = shown_body(StatusCode::INTERNAL_SERVER_ERROR, "line\nforged\x1b[0m");
        assert_eq!(shown, "500 line forged [0m");
        let long = "x".repeat(1000);
        assert!(
            shown_body(StatusCode::INTERNAL_SERVER_ERROR, &long)
                .chars()
                .count()
                < 320
        );
        assert_eq!(shown_body(StatusCode::BAD_GATEWAY, ""), "502 Bad Gateway");
    }

    #[test]
    fn only_http_addresses_are_accepted() {
        let client = |addr: &str| {
            NomadClient::new(
                NomadSettings::new(addr.parse().unwrap()),
                Duration::from_secs(1),
            )
        };
        assert!(client("mailto:ops@example.com").is_err());
        let socket = client("unix:///secrets/api.sock").unwrap();
        assert_eq!(
            socket.socket.as_deref(),
            Some(std::path::Path::new("/secrets/api.sock"))
        );
        assert_eq!(
            socket.url(&["jobs"]).as_str(),
            "http://localhost/v1/jobs",
            "the socket ignores the origin; only the path travels"
        );
        for relative in ["unix://secrets/api.sock", "unix:///"] {
            let error = client(relative).unwrap_err();
            assert!(error.contains("absolute path"), "{relative}: {error}");
        }
        let base = client("https://nomad.example:4646/prefix/").unwrap();
        assert_eq!(
            base.url(&["job", "ci/dispatch-1-a"]).as_str(),
            "https://nomad.example:4646/prefix/v1/job/ci%2Fdispatch-1-a"
        );
    }
}
