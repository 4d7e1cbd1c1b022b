//! The seed's faults as GitHub would show them: a 503 while the service is out, a 502 with
//! an HTML body, a connection reset, a request that never answers (the client's timeout has
//! to fire on the paused clock), a primary refusal (403, `x-ratelimit-remaining: 0`) or a
//! secondary one (429 with `retry-after`). A malformed body is cut later, once rendered.

use http::StatusCode;

use super::BUDGET_LIMIT;
use super::billing::{Billing, DOCS_RATE_LIMITS, exhausted};
use super::serve::{DOCS_REST, Reply};
use super::service::{Served, Window};
use crate::sim::seeded::ports::{Fault, Transient};

const SECONDARY_MESSAGE: &str = "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you reach out to GitHub Support for help, please include the request ID.";

/// How a request that met `fault` ends, or `None` when it goes on to be answered (no fault,
/// or a malformed body, which is cut once the answer is rendered).
pub(super) fn faulted(
    fault: Option<Fault>,
    billing: &Billing,
    window: Window,
    t: u64,
) -> Option<Served> {
    let reply = match fault? {
        Fault::Malformed => return None,
        Fault::Outage | Fault::VaultOutage => Reply::error(
            StatusCode::SERVICE_UNAVAILABLE,
            "Service Unavailable",
            DOCS_REST,
        ),
        Fault::Transient(Transient::BadGateway) => {
            let mut reply = Reply::json(
                StatusCode::BAD_GATEWAY,
                "<html><body><h1>502 Bad Gateway</h1></body></html>".into(),
            );
            reply.headers = vec![("content-type", "text/html".into())];
            reply
        }
        Fault::Transient(Transient::ConnectionReset) => return Some(Served::Reset),
        Fault::Transient(Transient::TimedOut) => return Some(Served::Hang),
        Fault::Exhausted { wait_s }
        | Fault::RateLimited {
            wait_s,
            secondary: false,
        } => exhausted(billing, t + wait_s),
        Fault::RateLimited {
            wait_s,
            secondary: true,
        } => Reply::error(
            StatusCode::TOO_MANY_REQUESTS,
            SECONDARY_MESSAGE,
            DOCS_RATE_LIMITS,
        )
        .header("retry-after", wait_s.to_string())
        .rate(BUDGET_LIMIT, window.used, window.reset_s()),
    };
    Some(Served::Answer(reply.into_response()))
}
