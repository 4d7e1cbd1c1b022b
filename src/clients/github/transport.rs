//! One GitHub request through octocrab, and what its failure means.
//!
//! octocrab is used as a transport only: its own retry layer is not compiled in (the
//! `retry` feature is off) because the loop classifies and retries itself, and its auth
//! state is `None` because every call here carries a token chosen for that one call. Its
//! tracing layer records the method, the URI and the status, never a header; the
//! `Authorization` value is also marked sensitive so that anything that prints headers shows
//! `Sensitive`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use http::header::{ACCEPT, AUTHORIZATION, HeaderMap, HeaderValue, IF_NONE_MATCH};
use http::{Method, StatusCode};
use octocrab::Octocrab;
use secrecy::{ExposeSecret, SecretString};
use url::Url;

use crate::clients::http::{install_crypto_provider, root_cause};
use crate::model::{ErrorClass, RATE_LIMIT_WAIT_MAX_S};
use crate::observe::PortError;

/// The media type GitHub documents for its REST API.
pub const MEDIA_TYPE: &str = "application/vnd.github+json";

/// Longest GitHub error message kept in one of our errors; the rest is noise in a log line.
const GITHUB_MESSAGE_LEN_MAX: usize = 200;

/// The largest answer read from GitHub. The biggest are pages of 100 workflow runs, each with
/// two repository objects: about 1.5 MiB. A server that sends more is not GitHub answering a
/// listing, and is not read to the end.
pub const RESPONSE_BODY_MAX_BYTES: usize = 16 * 1024 * 1024;

/// How one exchange failed to give an answer.
enum Unanswered {
    Failed(octocrab::Error),
    TooLarge,
    BodyNotText,
}

/// GitHub asks for at least a minute of waiting after a secondary rate limit without
/// `retry-after` (docs "Rate limits for the REST API").
pub const SECONDARY_LIMIT_WAIT_S: u64 = 60;

/// What GitHub answered.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Answer {
    pub fn is_success(&self) -> bool {
        self.status.is_success()
    }
}

/// Where a request goes: a path below the API URL, or a `Link` URL GitHub gave us (already
/// checked to be on the API's own origin).
pub enum Target {
    Path(String),
    Absolute(Url),
}

impl Target {
    /// The cache key and log form of the target; carries no secret.
    pub fn as_key(&self) -> String {
        match self {
            Target::Path(path) => path.clone(),
            Target::Absolute(url) => url.to_string(),
        }
    }
}

pub struct Transport {
    octocrab: Octocrab,
    api_url: Url,
    timeout: Duration,
}

impl Transport {
    pub fn new(api_url: &Url, timeout: Duration) -> Result<Transport, String> {
        install_crypto_provider();
        let octocrab = Octocrab::builder()
            .base_uri(api_url.as_str())
            .map_err(|e| format!("GitHub API URL {api_url}: {e}"))?
            // No read or write timeout on the connection: hyper-timeout's read timer runs on
            // while a pooled connection sits idle, so a connection reused a poll interval
            // later failed at once ("timed out"). Every exchange is bounded in `send`.
            .set_connect_timeout(Some(timeout.min(Duration::from_secs(5))))
            .build()
            .map_err(|e| format!("build GitHub client for {api_url}: {e}"))?;
        Ok(Transport {
            octocrab,
            api_url: api_url.clone(),
            timeout,
        })
    }

    /// A transport whose requests go to `service` instead of over hyper (the seeded
    /// simulator's in-memory GitHub). No base-URI layer sits in front of it: requests carry
    /// path-only URIs, or the absolute `Link` URLs GitHub handed out, as they are sent.
    /// octocrab spawns its buffer worker on the current tokio runtime, so this must be
    /// called inside the runtime that will drive the requests.
    pub fn over_service<S>(api_url: &Url, timeout: Duration, service: S) -> Transport
    where
        S: tower::Service<http::Request<octocrab::OctoBody>, Response = http::Response<String>>
            + Send
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let built = octocrab::OctocrabBuilder::new_empty()
            .with_service(service)
            .with_auth(octocrab::AuthState::None)
            .build();
        let octocrab = match built {
            Ok(octocrab) => octocrab,
            Err(never) => match never {},
        };
        Transport {
            octocrab,
            api_url: api_url.clone(),
            timeout,
        }
    }

    pub fn api_url(&self) -> &Url {
        &self.api_url
    }

    /// Sends one request with `bearer` as its credential. Fails only when no HTTP answer came
    /// back (transient); every status is returned for the caller to classify.
    pub async fn send(
        &self,
        method: Method,
        target: &Target,
        bearer: &SecretString,
        body: Option<&serde_json::Value>,
        if_none_match: Option<&str>,
        doing: &str,
    ) -> Result<Answer, PortError> {
        let uri = match target {
            Target::Path(path) => path.clone(),
            Target::Absolute(url) => url.to_string(),
        };
        let mut authorization =
            HeaderValue::from_str(&format!("Bearer {}", bearer.expose_secret())).map_err(|_| {
                PortError::new(
                    ErrorClass::Configuration,
                    format!("{doing}: the credential is not a valid HTTP header value"),
                )
            })?;
        authorization.set_sensitive(true);
        let mut request = http::Request::builder()
            .method(method)
            .uri(uri)
            .header(AUTHORIZATION, authorization)
            .header(ACCEPT, MEDIA_TYPE);
        if let Some(etag) = if_none_match.and_then(|e| HeaderValue::from_str(e).ok()) {
            request = request.header(IF_NONE_MATCH, etag);
        }
        let request = self.octocrab.build_request(request, body).map_err(|e| {
            PortError::new(
                ErrorClass::Configuration,
                format!("{doing}: build request: {e}"),
            )
        })?;
        let exchange = async {
            let response = self
                .octocrab
                .execute(request)
                .await
                .map_err(Unanswered::Failed)?;
            let (parts, body) = response.into_parts();
            let body = http_body_util::BodyExt::collect(http_body_util::Limited::new(
                body,
                RESPONSE_BODY_MAX_BYTES,
            ))
            .await
            .map_err(|e| match e.downcast::<octocrab::Error>() {
                Ok(failed) => Unanswered::Failed(*failed),
                // The only other error `Limited` makes is its length limit.
                Err(_) => Unanswered::TooLarge,
            })?
            .to_bytes();
            let body = String::from_utf8(body.to_vec()).map_err(|_| Unanswered::BodyNotText)?;
            Ok::<_, Unanswered>(Answer {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        let answered = tokio::time::timeout(self.timeout, exchange).await;
        let status = match &answered {
            Ok(Ok(answer)) => Some(answer.status.as_u16()),
            _ => None,
        };
        crate::metrics::count_request(crate::metrics::Service::GitHub, status);
        let origin = || self.api_url.origin().ascii_serialization();
        match answered {
            Ok(Ok(answer)) => Ok(answer),
            // octocrab's errors name the failing layer and the I/O cause; they carry neither
            // the request headers nor a body.
            Ok(Err(Unanswered::Failed(e))) => Err(PortError::new(
                ErrorClass::Transient,
                format!(
                    "{doing}: GitHub at {}: request failed: {}",
                    origin(),
                    root_cause(&e)
                ),
            )),
            Ok(Err(Unanswered::TooLarge)) => Err(PortError::new(
                ErrorClass::Malformed,
                format!(
                    "{doing}: GitHub at {} answered a body over {RESPONSE_BODY_MAX_BYTES} bytes; it was not read",
                    origin()
                ),
            )),
            Ok(Err(Unanswered::BodyNotText)) => Err(PortError::new(
                ErrorClass::Malformed,
                format!(
                    "{doing}: GitHub at {} answered a body that is not UTF-8",
                    origin()
                ),
            )),
            Err(_) => Err(PortError::new(
                ErrorClass::Transient,
                format!("{doing}: timed out after {}s", self.timeout.as_secs()),
            )),
        }
    }
}

/// The `x-ratelimit-*` headers of one answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateHeaders {
    pub limit: Option<u64>,
    pub remaining: Option<u64>,
    pub reset_at: Option<DateTime<Utc>>,
}

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    header_str(headers, name).and_then(|v| v.parse().ok())
}

impl RateHeaders {
    /// Reads the primary-limit headers; `None` for an answer about another resource (search,
    /// graphql) whose budget is not the one the loop spends.
    pub fn read(headers: &HeaderMap) -> Option<RateHeaders> {
        if let Some(resource) = header_str(headers, "x-ratelimit-resource")
            && resource != "core"
        {
            return None;
        }
        let rate = RateHeaders {
            limit: header_u64(headers, "x-ratelimit-limit"),
            remaining: header_u64(headers, "x-ratelimit-remaining"),
            reset_at: header_u64(headers, "x-ratelimit-reset")
                .and_then(|s| DateTime::from_timestamp(i64::try_from(s).ok()?, 0)),
        };
        (rate != RateHeaders::default()).then_some(rate)
    }
}

#[derive(serde::Deserialize)]
struct GitHubErrorBody {
    message: Option<String>,
}

fn github_message(body: &str) -> Option<String> {
    let message = serde_json::from_str::<GitHubErrorBody>(body)
        .ok()?
        .message?;
    let mut shown: String = message.chars().take(GITHUB_MESSAGE_LEN_MAX).collect();
    if shown.len() < message.len() {
        shown.push('…');
    }
    Some(shown)
}

/// Classifies a failed answer (API-CONTRACTS §1.8, BRIEF lesson 10): a rate limit comes as
/// 403 or 429 and is told apart from a permission error by `retry-after`,
/// `x-ratelimit-remaining: 0` or the secondary-limit message. The error says the status and
/// GitHub's message; the caller adds what it was doing.
pub fn classify(
    status: StatusCode,
    headers: &HeaderMap,
    body: &str,
    now: DateTime<Utc>,
) -> PortError {
    let message = github_message(body);
    let mut text = status.to_string();
    if let Some(message) = &message {
        text.push_str(&format!(": {message:?}"));
    }
    let code = status.as_u16();
    if code == 403 || code == 429 {
        let retry_after = header_u64(headers, "retry-after");
        let exhausted = header_u64(headers, "x-ratelimit-remaining") == Some(0);
        // "abuse detection mechanism" is the older wording, still sent by some GHES releases.
        let secondary = message.as_deref().is_some_and(|m| {
            let m = m.to_ascii_lowercase();
            m.contains("secondary rate limit") || m.contains("abuse detection")
        });
        let wait_s = if let Some(seconds) = retry_after {
            Some(seconds)
        } else if exhausted {
            let reset = RateHeaders::read(headers).and_then(|r| r.reset_at);
            Some(match reset {
                Some(reset) => u64::try_from((reset - now).num_seconds())
                    .unwrap_or(0)
                    .max(1),
                None => SECONDARY_LIMIT_WAIT_S,
            })
        } else if secondary || code == 429 {
            Some(SECONDARY_LIMIT_WAIT_S)
        } else {
            None
        };
        // GitHub's order: `retry-after` when present (however short), else the reset of an
        // exhausted budget, else at least a minute.
        if let Some(wait_s) = wait_s {
            let wait_s = wait_s.min(RATE_LIMIT_WAIT_MAX_S);
            return PortError::new(
                ErrorClass::RateLimited,
                format!("{text} (retry in {wait_s}s)"),
            )
            .with_retry_after(Some(wait_s));
        }
        if let Some(accepted) = header_str(headers, "x-accepted-github-permissions") {
            text.push_str(&format!(" (the token needs {accepted})"));
        }
        return PortError::new(ErrorClass::Forbidden, text);
    }
    let class = match code {
        401 => ErrorClass::Unauthorized,
        404 => ErrorClass::NotFound,
        // Redirects are not followed (a token must not travel to another URL); GitHub
        // answers 301 for a renamed repo, so the document names the old one.
        300..=399 => ErrorClass::Configuration,
        400 | 409 | 410 | 422 => ErrorClass::Configuration,
        _ => ErrorClass::Transient,
    };
    PortError::new(class, text)
}

/// A parse failure, said without quoting the body: a body may carry a token, and serde's
/// messages quote the offending value.
pub fn malformed(doing: &str, e: &serde_json::Error) -> PortError {
    PortError::new(
        ErrorClass::Malformed,
        format!(
            "{doing}: unreadable JSON ({:?} error at line {} column {})",
            e.classify(),
            e.line(),
            e.column()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000, 0).unwrap()
    }

    #[test]
    fn exhausted_primary_limit_is_rate_limited_until_reset_for_403_and_429() {
        for status in [403, 429] {
            let e = classify(
                StatusCode::from_u16(status).unwrap(),
                &headers(&[
                    ("x-ratelimit-remaining", "0"),
                    ("x-ratelimit-reset", "1700000120"),
                ]),
                r#"{"message":"API rate limit exceeded for installation ID 1."}"#,
                now(),
            );
            assert_eq!(e.class, ErrorClass::RateLimited);
            assert_eq!(e.retry_after_s, Some(120));
        }
    }

    #[test]
    fn retry_after_wins_over_reset() {
        let e = classify(
            StatusCode::FORBIDDEN,
            &headers(&[
                ("retry-after", "30"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1700000120"),
            ]),
            "{}",
            now(),
        );
        assert_eq!(
            (e.class, e.retry_after_s),
            (ErrorClass::RateLimited, Some(30))
        );
    }

    #[test]
    fn a_secondary_limit_waits_for_retry_after_or_else_a_minute() {
        let message = r#"{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again."}"#;
        let e = classify(
            StatusCode::FORBIDDEN,
            &headers(&[("x-ratelimit-remaining", "4000"), ("retry-after", "5")]),
            message,
            now(),
        );
        assert_eq!(
            (e.class, e.retry_after_s),
            (ErrorClass::RateLimited, Some(5))
        );
        let e = classify(
            StatusCode::FORBIDDEN,
            &headers(&[("x-ratelimit-remaining", "4000")]),
            message,
            now(),
        );
        assert_eq!(
            (e.class, e.retry_after_s),
            (ErrorClass::RateLimited, Some(SECONDARY_LIMIT_WAIT_S))
        );
        // The older wording of the same limit, without retry-after: not a permission error.
        let e = classify(
            StatusCode::FORBIDDEN,
            &headers(&[("x-ratelimit-remaining", "4000")]),
            r#"{"message":"You have triggered an abuse detection mechanism. Please wait a few minutes before you try again."}"#,
            now(),
        );
        assert_eq!(
            (e.class, e.retry_after_s),
            (ErrorClass::RateLimited, Some(SECONDARY_LIMIT_WAIT_S))
        );
    }

    #[test]
    fn other_403_is_forbidden_and_names_the_permission() {
        let e = classify(
            StatusCode::FORBIDDEN,
            &headers(&[
                ("x-ratelimit-remaining", "4999"),
                ("x-accepted-github-permissions", "actions=read"),
            ]),
            r#"{"message":"Resource not accessible by integration","documentation_url":"x"}"#,
            now(),
        );
        assert_eq!(e.class, ErrorClass::Forbidden);
        assert_eq!(e.retry_after_s, None);
        assert!(e.message.contains("actions=read"), "{}", e.message);
        assert!(
            e.message
                .starts_with("403 Forbidden: \"Resource not accessible"),
            "{}",
            e.message
        );
    }

    #[test]
    fn statuses_map_to_classes() {
        for (status, class) in [
            (401, ErrorClass::Unauthorized),
            (404, ErrorClass::NotFound),
            (422, ErrorClass::Configuration),
            (301, ErrorClass::Configuration),
            (500, ErrorClass::Transient),
            (502, ErrorClass::Transient),
            (503, ErrorClass::Transient),
        ] {
            let e = classify(
                StatusCode::from_u16(status).unwrap(),
                &HeaderMap::new(),
                "",
                now(),
            );
            assert_eq!(e.class, class, "{status}");
        }
        let e = classify(StatusCode::BAD_GATEWAY, &HeaderMap::new(), "<html>", now());
        assert_eq!(e.message, "502 Bad Gateway");
    }

    #[test]
    fn absurd_rate_limit_headers_wait_at_most_an_hour() {
        let far_future = (now().timestamp() + 10 * 365 * 24 * 3600).to_string();
        let cases: &[&[(&'static str, &str)]] = &[
            &[("retry-after", "18446744073709551615")],
            &[("retry-after", "9223372036854775807")],
            &[("retry-after", "86400")],
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", &far_future),
            ],
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "18446744073709551615"),
            ],
            &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "0")],
            &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "-5")],
            &[("retry-after", "-5")],
            &[("retry-after", "soon")],
            &[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")],
        ];
        for status in [StatusCode::FORBIDDEN, StatusCode::TOO_MANY_REQUESTS] {
            for pairs in cases {
                let e = classify(
                    status,
                    &headers(pairs),
                    r#"{"message":"API rate limit exceeded"}"#,
                    now(),
                );
                let what = format!("{status} {pairs:?}: {e:?}");
                if e.class == ErrorClass::RateLimited {
                    let wait_s = e.retry_after_s.expect(&what);
                    assert!((1..=RATE_LIMIT_WAIT_MAX_S).contains(&wait_s), "{what}");
                } else {
                    // Without a usable header a 403 is a permission refusal.
                    assert_eq!(
                        (status, e.class),
                        (StatusCode::FORBIDDEN, ErrorClass::Forbidden),
                        "{what}"
                    );
                }
            }
        }
        let e = classify(
            StatusCode::TOO_MANY_REQUESTS,
            &headers(&[("retry-after", "18446744073709551615")]),
            "{}",
            now(),
        );
        assert_eq!(e.retry_after_s, Some(RATE_LIMIT_WAIT_MAX_S));
        assert!(e.message.contains("retry in 3600s"), "{}", e.message);
    }

    #[test]
    fn rate_headers_of_other_resources_are_ignored() {
        let core = headers(&[
            ("x-ratelimit-resource", "core"),
            ("x-ratelimit-remaining", "7"),
        ]);
        assert_eq!(RateHeaders::read(&core).unwrap().remaining, Some(7));
        let search = headers(&[
            ("x-ratelimit-resource", "search"),
            ("x-ratelimit-remaining", "0"),
        ]);
        assert_eq!(RateHeaders::read(&search), None);
    }
}
