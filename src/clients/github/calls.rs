//! One call on GitHub as the budgets see it: refused while its holder's budget is spent or
//! its reads are over the secondary limit, counted before it is sent, recorded after; a 401
//! drops the credential and the call is made once more.
//!
//! Every request the client sends goes through `repo_call_answering` or, for the
//! App's own JWT calls, `app_call` (in `tokens`), which charge the same budgets.

use chrono::{DateTime, Utc};
use http::{Method, StatusCode};
use tracing::{debug, warn};

use super::GitHub;
use super::app_auth::Permission;
use super::budget::{
    self, BudgetHolder, CONTENT_REQUESTS_PER_HOUR, CONTENT_REQUESTS_PER_MINUTE, creates_content,
};
use super::transport::{Answer, RateHeaders, Target, classify};
use crate::config::RepoConfig;
use crate::model::{ErrorClass, RATE_LIMIT_WAIT_MAX_S};
use crate::observe::PortError;

/// What a call carries besides its method and target: a GET may be conditional, a POST may
/// have a body, never both.
#[derive(Clone, Copy)]
pub(super) enum Payload<'a> {
    Nothing,
    IfNoneMatch(&'a str),
    Json(&'a serde_json::Value),
}

impl GitHub {
    pub(super) fn record(&self, holder: &BudgetHolder, answer: &Answer) {
        if let Some(rate) = RateHeaders::read(&answer.headers) {
            if let Some(remaining) = rate.remaining {
                crate::metrics::set_rate_limit_remaining(&holder.metric_label(), remaining);
            }
            self.budgets.record(holder, rate, self.now());
        }
    }

    /// The classified error for a failed answer; a rate limit also pauses the budget.
    pub(super) fn refusal(&self, holder: &BudgetHolder, answer: &Answer, doing: &str) -> PortError {
        let now = self.now();
        let error = classify(answer.status, &answer.headers, &answer.body, now).context(doing);
        if let (ErrorClass::RateLimited, Some(wait_s)) = (error.class, error.retry_after_s) {
            self.budgets
                .pause(holder, budget::wait_until(now, wait_s), now);
        }
        error
    }

    pub(super) fn refuse_while_paused(
        &self,
        holder: &BudgetHolder,
        doing: &str,
    ) -> Result<(), PortError> {
        let now = self.now();
        match self.budgets.paused_until(holder, now) {
            Some(until) => Err(rate_limited_until(
                format!(
                    "{doing}: the rate-limit budget of {holder} is spent until {}",
                    until.to_rfc3339()
                ),
                until,
                now,
            )),
            None => Ok(()),
        }
    }

    /// Counts a request about to be sent against its holder's secondary limit.
    /// A content-creating one is counted for GitHub's content limits too, and the crossing of
    /// either limit is said once: it is not held back (see [`CONTENT_REQUESTS_PER_HOUR`]).
    pub(super) fn spend_points(&self, holder: &BudgetHolder, method: &Method) {
        let now = self.now();
        let points = self.secondary.spend(holder, method, now);
        let owner = holder.metric_label();
        crate::metrics::set_secondary_points(&owner, points);
        if !creates_content(method) {
            return;
        }
        let count = self.content.record(holder, now);
        crate::metrics::set_content_requests(&owner, count.last_minute, count.last_hour);
        if count.last_minute == CONTENT_REQUESTS_PER_MINUTE
            || count.last_hour == CONTENT_REQUESTS_PER_HOUR
        {
            warn!(
                owner = %owner,
                last_minute = count.last_minute,
                last_hour = count.last_hour,
                "{holder} reached GitHub's content-creation limit ({CONTENT_REQUESTS_PER_MINUTE} a minute, {CONTENT_REQUESTS_PER_HOUR} an hour): its mints may be refused for a while; spread its repos over more installations if this recurs"
            );
        }
    }

    /// GitHub's secondary limit (900 points a minute) answers 403 or 429 and may block an
    /// integration that keeps going; reads stop short of it, leaving room for the writes that
    /// serve jobs. A read held back is a rate limit like any other: its repo waits until the
    /// oldest points leave the minute.
    fn refuse_reads_over_points(
        &self,
        holder: &BudgetHolder,
        doing: &str,
    ) -> Result<(), PortError> {
        let now = self.now();
        let Some(until) =
            self.secondary
                .read_refused_until(holder, self.read_points_refused_at, now)
        else {
            return Ok(());
        };
        Err(rate_limited_until(
            format!(
                "{doing}: {holder} spent {} points of GitHub's secondary limit in the last minute; reads wait until {}",
                self.read_points_refused_at,
                until.to_rfc3339()
            ),
            until,
            now,
        ))
    }

    /// One call on a repo with a credential for `permission`. A 401 drops the credential and
    /// the call is made once more with a fresh one (a token can be revoked or expire early).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn repo_call(
        &self,
        repo: &RepoConfig,
        permission: Permission,
        method: Method,
        target: &Target,
        payload: Payload<'_>,
        doing: &str,
    ) -> Result<Answer, PortError> {
        self.repo_call_answering(repo, permission, method, target, payload, &[], doing)
            .await
    }

    /// [`GitHub::repo_call`], returning the answer for the `answered` statuses too instead of
    /// classifying them as a failure (a 422 that vetoes a deletion is an outcome).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn repo_call_answering(
        &self,
        repo: &RepoConfig,
        permission: Permission,
        method: Method,
        target: &Target,
        payload: Payload<'_>,
        answered: &[StatusCode],
        doing: &str,
    ) -> Result<Answer, PortError> {
        let (body, if_none_match) = match payload {
            Payload::Nothing => (None, None),
            Payload::IfNoneMatch(etag) => (None, Some(etag)),
            Payload::Json(body) => (Some(body), None),
        };
        let mut retried = false;
        loop {
            let credential = self.credential(repo, permission).await?;
            self.refuse_while_paused(&credential.holder, doing)?;
            if method == Method::GET {
                self.refuse_reads_over_points(&credential.holder, doing)?;
            }
            self.spend_points(&credential.holder, &method);
            let answer = self
                .transport
                .send(
                    method.clone(),
                    target,
                    &credential.token,
                    body,
                    if_none_match,
                    doing,
                )
                .await?;
            self.record(&credential.holder, &answer);
            if answer.status == StatusCode::UNAUTHORIZED && !retried {
                debug!(repo = %repo.repo, "GitHub answered 401; dropping the cached credential");
                self.forget(repo, permission, &credential).await;
                retried = true;
                continue;
            }
            if answer.is_success()
                || answer.status == StatusCode::NOT_MODIFIED
                || answered.contains(&answer.status)
            {
                return Ok(answer);
            }
            return Err(self.refusal(&credential.holder, &answer, doing));
        }
    }
}

/// A request the client refuses to send before `until`, as a rate limit with the wait.
fn rate_limited_until(message: String, until: DateTime<Utc>, now: DateTime<Utc>) -> PortError {
    let wait_s = u64::try_from((until - now).num_seconds())
        .unwrap_or(0)
        .clamp(1, RATE_LIMIT_WAIT_MAX_S);
    PortError::new(ErrorClass::RateLimited, message).with_retry_after(Some(wait_s))
}
