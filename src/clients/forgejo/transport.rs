//! Where a Forgejo request goes: over the network through reqwest, or to an in-memory tower
//! service (the seeded simulator's Forgejo, on virtual time, with no socket). The request is
//! built once, the same for both, and both answer a `reqwest::Response`, so the status
//! classification, the body cap and every error text above are one code.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use hyper::body::Bytes;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, USER_AGENT};
use reqwest::{Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use tokio::time::Instant;
use url::Url;

use super::RESPONSE_BODY_MAX_BYTES;
use crate::clients::http::{Unanswered, read_body_capped, transport_error, unanswered_error};
use crate::model::ErrorClass;
use crate::observe::PortError;

const SERVICE: &str = "Forgejo";

/// The error an in-memory service may fail a request with.
pub type ServiceError = Box<dyn std::error::Error + Send + Sync>;

type Answering = Pin<Box<dyn Future<Output = Result<reqwest::Response, ServiceError>> + Send>>;

/// One request to a Forgejo's `/api/v1`, as the client means it.
pub(super) struct ApiRequest<'a> {
    /// The instance's URL, without a trailing slash.
    pub base: &'a str,
    pub method: Method,
    /// Below `/api/v1/`.
    pub path: &'a str,
    pub query: &'a [(&'a str, String)],
    pub json: Option<&'a serde_json::Value>,
    pub token: &'a SecretString,
}

pub(super) enum Transport {
    /// Its timeout bounds each exchange, body included; it follows no redirect.
    Network(reqwest::Client),
    InMemory {
        service: Box<dyn InMemoryService>,
        /// Bounds each exchange, body included, as the network client's timeout does; on
        /// tokio's clock, so a paused one (the seeded world) makes it virtual.
        timeout: Duration,
    },
}

/// An answer whose body is still to be read.
pub(super) struct Answer {
    response: reqwest::Response,
    /// When an in-memory exchange must be over, and the URL it was for.
    in_memory_deadline: Option<(Instant, Url)>,
}

impl Answer {
    pub fn status(&self) -> StatusCode {
        self.response.status()
    }

    /// The body, refused past [`RESPONSE_BODY_MAX_BYTES`].
    pub async fn read_body(self, doing: &str) -> Result<Vec<u8>, PortError> {
        let reading = read_body_capped(self.response, RESPONSE_BODY_MAX_BYTES, SERVICE, doing);
        match self.in_memory_deadline {
            None => reading.await,
            Some((deadline, url)) => tokio::time::timeout_at(deadline, reading)
                .await
                .unwrap_or_else(|_| {
                    Err(unanswered_error(SERVICE, doing, &url, Unanswered::TimedOut))
                }),
        }
    }
}

impl Transport {
    pub fn over_service<S, B>(service: S, timeout: Duration) -> Transport
    where
        S: tower::Service<http::Request<Bytes>, Response = http::Response<B>>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<ServiceError>,
        B: Into<reqwest::Body> + 'static,
    {
        Transport::InMemory {
            service: Box::new(SharedService(Mutex::new(service))),
            timeout,
        }
    }

    /// Sends `request` and answers the status and the unread body. Fails only when no HTTP
    /// answer came back (transient).
    pub async fn send(&self, request: ApiRequest<'_>, doing: &str) -> Result<Answer, PortError> {
        let sent = self.exchange(request, doing).await;
        crate::metrics::count_request(
            crate::metrics::Service::Forgejo,
            sent.as_ref().ok().map(|answer| answer.status().as_u16()),
        );
        sent
    }

    async fn exchange(&self, request: ApiRequest<'_>, doing: &str) -> Result<Answer, PortError> {
        // reqwest's words for a request it could not build, so both transports say it alike.
        let unbuilt = |e: &dyn std::fmt::Display| {
            PortError::new(
                ErrorClass::Transient,
                format!("{doing}: request failed: {e}"),
            )
        };
        let mut url = Url::parse(&format!("{}/api/v1/{}", request.base, request.path))
            .map_err(|e| unbuilt(&e))?;
        if !request.query.is_empty() {
            url.query_pairs_mut().extend_pairs(
                request
                    .query
                    .iter()
                    .map(|(name, value)| (*name, value.as_str())),
            );
        }
        let mut headers = HeaderMap::new();
        // Never `?token=`: a query string ends up in URLs and logs.
        let mut authorization =
            HeaderValue::from_str(&format!("token {}", request.token.expose_secret()))
                .map_err(|e| unbuilt(&e))?;
        authorization.set_sensitive(true);
        headers.insert(AUTHORIZATION, authorization);
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        let body = request.json.map(|json| {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            json.to_string().into_bytes()
        });
        match self {
            Transport::Network(client) => {
                let mut sending = client.request(request.method, url).headers(headers);
                if let Some(body) = body {
                    sending = sending.body(body);
                }
                let response = sending
                    .send()
                    .await
                    .map_err(|e| transport_error(SERVICE, doing, &e))?;
                Ok(Answer {
                    response,
                    in_memory_deadline: None,
                })
            }
            Transport::InMemory { service, timeout } => {
                let deadline = Instant::now() + *timeout;
                // The network client adds its User-Agent itself.
                headers.insert(
                    USER_AGENT,
                    HeaderValue::from_static(crate::clients::http::USER_AGENT),
                );
                // Absolute, so that one service can be several instances.
                let mut built = http::Request::builder()
                    .method(request.method)
                    .uri(url.as_str())
                    .body(Bytes::from(body.unwrap_or_default()))
                    .map_err(|e| {
                        PortError::new(
                            ErrorClass::Configuration,
                            format!("{doing}: build request: {e}"),
                        )
                    })?;
                *built.headers_mut() = headers;
                match tokio::time::timeout_at(deadline, service.answer(built)).await {
                    Ok(Ok(response)) => Ok(Answer {
                        response,
                        in_memory_deadline: Some((deadline, url)),
                    }),
                    Ok(Err(e)) => Err(unanswered_error(
                        SERVICE,
                        doing,
                        &url,
                        Unanswered::Failed(&*e),
                    )),
                    Err(_) => Err(unanswered_error(SERVICE, doing, &url, Unanswered::TimedOut)),
                }
            }
        }
    }
}

/// A tower service behind a shared reference: the client is shared by every task, and tower
/// calls take `&mut self`.
pub(super) trait InMemoryService: Send + Sync {
    fn answer(&self, request: http::Request<Bytes>) -> Answering;
}

/// Each request goes to a clone of the service, the way tower shares one (its `Buffer`,
/// `BoxCloneService`): readiness is then the clone's own, and no lock is held across a wait.
struct SharedService<S>(Mutex<S>);

impl<S, B> InMemoryService for SharedService<S>
where
    S: tower::Service<http::Request<Bytes>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<ServiceError>,
    B: Into<reqwest::Body> + 'static,
{
    fn answer(&self, request: http::Request<Bytes>) -> Answering {
        let mut service = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Box::pin(async move {
            std::future::poll_fn(|cx| service.poll_ready(cx))
                .await
                .map_err(Into::into)?;
            let response = service.call(request).await.map_err(Into::into)?;
            Ok(reqwest::Response::from(response))
        })
    }
}
