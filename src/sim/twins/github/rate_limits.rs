//! Primary rate limits: a budget per token holder and hour, charged per request and reported
//! in the `x-ratelimit-*` headers, and GitHub's refusals when a budget is spent or when a test
//! forces a primary or secondary limit on (API-CONTRACTS §1.8).

use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Duration, Utc};

use super::GitHubTwin;
use super::app_auth::{Holder, bearer};
use super::requests::Reply;
use super::state::Twin;

/// Primary limit of a token per hour (installation tokens and PATs both start at 5,000).
pub const BUDGET_LIMIT_DEFAULT: u64 = 5000;
const DOCS_RATE_LIMITS: &str = "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api";

/// A rate-limit refusal the twin can be switched to give on every token request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateLimitAnswer {
    /// Primary limit exhausted: `x-ratelimit-remaining: 0`, with this status (403 or 429).
    Primary { status: u16 },
    /// Secondary limit: the documented message, optionally with `retry-after`.
    Secondary {
        status: u16,
        retry_after_s: Option<u64>,
    },
}

#[derive(Clone, Copy)]
pub(super) struct BudgetState {
    pub(super) limit: u64,
    pub(super) used: u64,
    pub(super) reset_at: DateTime<Utc>,
}

impl GitHubTwin {
    /// The primary limit per token holder and hour; applies to existing budgets too.
    pub fn set_budget_limit(&self, limit: u64) {
        let mut twin = self.lock();
        twin.budget_limit = limit;
        for budget in twin.budgets.values_mut() {
            budget.limit = limit;
        }
    }

    /// Answers every token-authenticated request with `answer` until switched off (`None`).
    pub fn force_rate_limit(&self, answer: Option<RateLimitAnswer>) {
        self.lock().forced_limit = answer;
    }

    /// The `x-ratelimit-*` headers the twin would send with an answer to a request carrying
    /// `headers`: the budget of the token's holder (or the App's, for a valid JWT) as it
    /// stands, nothing charged. `None` when the credential is unknown, expired or missing.
    /// For an answer made outside the twin (an injected fault), since GitHub sends these
    /// headers on every response (API-CONTRACTS §1.8).
    pub fn rate_limit_headers(&self, headers: &HeaderMap) -> Option<Vec<(&'static str, String)>> {
        let mut twin = self.lock();
        let now = twin.now();
        let holder = match bearer(headers).and_then(|token| twin.tokens.get(&token).cloned()) {
            Some(grant) if grant.expires_at.is_none_or(|t| t > now) => grant.holder.key(),
            Some(_) => return None,
            None if twin.verify_jwt(headers).is_ok() => "app".to_string(),
            None => return None,
        };
        let probe = twin.rate_headers(
            &holder,
            Reply {
                status: StatusCode::OK,
                headers: Vec::new(),
                body: None,
            },
        );
        Some(probe.headers)
    }
}

impl Twin {
    fn budget(&mut self, holder: &str) -> BudgetState {
        let now = self.now();
        let limit = self.budget_limit;
        let budget = self
            .budgets
            .entry(holder.to_string())
            .or_insert(BudgetState {
                limit,
                used: 0,
                reset_at: now + Duration::hours(1),
            });
        if now >= budget.reset_at {
            budget.used = 0;
            budget.reset_at = now + Duration::hours(1);
        }
        *budget
    }

    pub(super) fn rate_headers(&mut self, holder: &str, reply: Reply) -> Reply {
        let budget = self.budget(holder);
        reply
            .header("x-ratelimit-limit", budget.limit.to_string())
            .header(
                "x-ratelimit-remaining",
                budget.limit.saturating_sub(budget.used).to_string(),
            )
            .header("x-ratelimit-used", budget.used.to_string())
            .header("x-ratelimit-reset", budget.reset_at.timestamp().to_string())
            .header("x-ratelimit-resource", "core")
    }

    /// The refusal for a holder whose budget is spent or when a limit is forced on.
    pub(super) fn rate_limited(&mut self, holder: &Holder) -> Option<Reply> {
        let key = holder.key();
        let budget = self.budget(&key);
        let primary_message = match holder {
            Holder::Installation(id) => {
                format!("API rate limit exceeded for installation ID {id}.")
            }
            Holder::Pat(_) => "API rate limit exceeded for user ID 1.".to_string(),
        };
        let exhausted = |status: u16| {
            Reply::error(
                StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN),
                &primary_message,
                DOCS_RATE_LIMITS,
            )
            .header("x-ratelimit-limit", budget.limit.to_string())
            .header("x-ratelimit-remaining", "0")
            .header("x-ratelimit-used", budget.limit.to_string())
            .header("x-ratelimit-reset", budget.reset_at.timestamp().to_string())
            .header("x-ratelimit-resource", "core")
        };
        match self.forced_limit {
            Some(RateLimitAnswer::Primary { status }) => Some(exhausted(status)),
            Some(RateLimitAnswer::Secondary {
                status,
                retry_after_s,
            }) => {
                let reply = Reply::error(
                    StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN),
                    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you reach out to GitHub Support for help, please include the request ID.",
                    DOCS_RATE_LIMITS,
                );
                let reply = match retry_after_s {
                    Some(seconds) => reply.header("retry-after", seconds.to_string()),
                    None => reply,
                };
                Some(self.rate_headers(&key, reply))
            }
            None if budget.used >= budget.limit => Some(exhausted(403)),
            None => None,
        }
    }

    pub(super) fn count(&mut self, holder: &str) {
        self.budget(holder);
        if let Some(budget) = self.budgets.get_mut(holder) {
            budget.used += 1;
        }
    }
}
