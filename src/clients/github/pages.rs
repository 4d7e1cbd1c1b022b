//! One paged listing: every page from the first path, through `Link: rel="next"` on the
//! API's own origin only, conditionally (`If-None-Match`) when the caller collects bodies.
//!
//! Not part of the queue reads: the runner listing walks pages too, without the conditional
//! cache (its answer must be today's).

use std::collections::HashMap;

use http::{HeaderMap, Method, StatusCode};
use serde::de::DeserializeOwned;
use url::Url;

use super::app_auth::Permission;
use super::calls::Payload;
use super::transport::{Target, malformed};
use super::{GitHub, wire};
use crate::config::RepoConfig;
use crate::model::ErrorClass;
use crate::observe::PortError;

/// GitHub's largest page.
pub const PER_PAGE: usize = 100;
/// Pages followed per listing at most. A status-filtered run listing is a search capped at
/// 1000 results (10 pages); a run has at most 256 matrix jobs per job definition.
pub const PAGES_MAX: usize = 20;

/// A listing body kept for conditional requests: a `304 Not Modified` answer costs nothing
/// against the primary rate limit, and the body is reused.
#[derive(Clone)]
pub(super) struct Conditional {
    etag: String,
    body: String,
    /// The page's `Link` header: a `304` need not repeat it (RFC 9110 §15.4.5 lists what it
    /// must), and without it the walk would guess the next page's URL, a different cache key.
    link: Option<http::HeaderValue>,
}

/// One page of a listing.
pub(super) trait Page: DeserializeOwned {
    type Item;
    fn total_count(&self) -> u64;
    fn into_items(self) -> Vec<Self::Item>;
}

impl Page for wire::RunsPage {
    type Item = wire::Run;
    fn total_count(&self) -> u64 {
        self.total_count
    }
    fn into_items(self) -> Vec<wire::Run> {
        self.workflow_runs
    }
}

impl Page for wire::RunnersPage {
    type Item = wire::Runner;
    fn total_count(&self) -> u64 {
        self.total_count
    }
    fn into_items(self) -> Vec<wire::Runner> {
        self.runners
    }
}

impl Page for wire::JobsPage {
    type Item = wire::Job;
    fn total_count(&self) -> u64 {
        self.total_count
    }
    fn into_items(self) -> Vec<wire::Job> {
        self.jobs
    }
}

pub(super) struct Listing<T> {
    pub(super) items: Vec<T>,
    /// The largest `total_count` any page reported.
    pub(super) total_count: u64,
    /// Stopped at [`PAGES_MAX`] with pages left.
    pub(super) capped: bool,
    /// Pages requested.
    pub(super) pages: u32,
}

impl GitHub {
    /// GETs one listing page, conditionally when its body is cached and `seen` is given.
    async fn get_page(
        &self,
        repo: &RepoConfig,
        permission: Permission,
        target: &Target,
        doing: &str,
        seen: Option<&mut HashMap<String, Conditional>>,
    ) -> Result<(HeaderMap, String), PortError> {
        let key = target.as_key();
        let Some(seen) = seen.filter(|_| self.conditional_requests) else {
            let answer = self
                .repo_call(
                    repo,
                    permission,
                    Method::GET,
                    target,
                    Payload::Nothing,
                    doing,
                )
                .await?;
            if answer.status == StatusCode::NOT_MODIFIED {
                return Err(PortError::new(
                    ErrorClass::Malformed,
                    format!("{doing}: 304 Not Modified to an unconditional request"),
                ));
            }
            return Ok((answer.headers, answer.body));
        };
        let cached = {
            let conditional = self.conditional.lock().expect("conditional cache lock");
            conditional
                .get(&repo.repo)
                .and_then(|pages| pages.get(&key))
                .cloned()
        };
        let answer = self
            .repo_call(
                repo,
                permission,
                Method::GET,
                target,
                cached
                    .as_ref()
                    .map_or(Payload::Nothing, |c| Payload::IfNoneMatch(&c.etag)),
                doing,
            )
            .await?;
        let mut headers = answer.headers;
        let body = if answer.status == StatusCode::NOT_MODIFIED {
            match cached {
                Some(cached) => {
                    crate::metrics::count_conditional_hit();
                    let body = cached.body.clone();
                    if let Some(link) = &cached.link
                        && !headers.contains_key(http::header::LINK)
                    {
                        headers.insert(http::header::LINK, link.clone());
                    }
                    seen.insert(key, cached);
                    body
                }
                None => {
                    return Err(PortError::new(
                        ErrorClass::Malformed,
                        format!("{doing}: 304 Not Modified to an unconditional request"),
                    ));
                }
            }
        } else {
            if let Some(etag) = headers
                .get(http::header::ETAG)
                .and_then(|v| v.to_str().ok())
            {
                seen.insert(
                    key,
                    Conditional {
                        etag: etag.to_string(),
                        body: answer.body.clone(),
                        link: headers.get(http::header::LINK).cloned(),
                    },
                );
            }
            answer.body
        };
        Ok((headers, body))
    }

    /// Follows every page of a listing that starts at `first` (a path with `per_page=100`),
    /// with a credential for `permission`; conditionally when `seen` collects the bodies.
    pub(super) async fn walk<P: Page>(
        &self,
        repo: &RepoConfig,
        permission: Permission,
        first: &str,
        doing: &str,
        mut seen: Option<&mut HashMap<String, Conditional>>,
    ) -> Result<Listing<P::Item>, PortError> {
        let mut listing = Listing {
            items: Vec::new(),
            total_count: 0,
            capped: false,
            pages: 0,
        };
        let mut target = Target::Path(first.to_string());
        for page_number in 1..=PAGES_MAX {
            let (headers, body) = self
                .get_page(repo, permission, &target, doing, seen.as_deref_mut())
                .await?;
            listing.pages += 1;
            let page: P = serde_json::from_str(&body).map_err(|e| malformed(doing, &e))?;
            listing.total_count = listing.total_count.max(page.total_count());
            let page_total = page.total_count();
            let items = page.into_items();
            let full = items.len() >= PER_PAGE;
            listing.items.extend(items);
            let link = headers
                .get(http::header::LINK)
                .map(|v| v.to_str().unwrap_or_default());
            target = match link {
                Some(link) => match next_link(link) {
                    Some(next) => Target::Absolute(self.same_origin(&next, doing)?),
                    None => return Ok(listing),
                },
                // No `Link` header: GitHub omits it when everything fit on one page. A full
                // page short of `total_count` still means there is more.
                None if full && (listing.items.len() as u64) < page_total => {
                    Target::Path(format!("{first}&page={}", page_number + 1))
                }
                None => return Ok(listing),
            };
        }
        listing.capped = true;
        Ok(listing)
    }

    /// A `Link` URL is followed only on the API's own origin and path: the request carries a
    /// token, and a body or proxy must not be able to send it elsewhere.
    fn same_origin(&self, next: &str, doing: &str) -> Result<Url, PortError> {
        let api = self.transport.api_url();
        let refuse = || {
            PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: the next-page link leaves the API at {api}"),
            )
        };
        let url = Url::parse(next).map_err(|_| refuse())?;
        let base_path = api.path().trim_end_matches('/');
        // `/api/v3x` is not under `/api/v3`: the base must end at a segment boundary.
        let under_base = url.path() == base_path
            || url
                .path()
                .strip_prefix(base_path)
                .is_some_and(|rest| rest.starts_with('/'));
        if url.scheme() != api.scheme()
            || url.host_str() != api.host_str()
            || url.port_or_known_default() != api.port_or_known_default()
            || !under_base
            || url.username() != ""
            || url.password().is_some()
        {
            return Err(refuse());
        }
        Ok(url)
    }
}

/// The `rel="next"` URL of a `Link` header.
fn next_link(link: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (url, params) = part.trim().split_once(';')?;
        let is_next = params
            .split(';')
            .any(|p| p.trim().replace(' ', "") == "rel=\"next\"");
        let url = url.trim().strip_prefix('<')?.strip_suffix('>')?;
        is_next.then(|| url.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_links_are_read_from_any_position() {
        let link = r#"<https://api.github.com/repositories/1/actions/runs?page=1&per_page=100>; rel="prev", <https://api.github.com/repositories/1/actions/runs?page=3&per_page=100>; rel="next", <https://api.github.com/repositories/1/actions/runs?page=5&per_page=100>; rel="last""#;
        assert_eq!(
            next_link(link).as_deref(),
            Some("https://api.github.com/repositories/1/actions/runs?page=3&per_page=100")
        );
        assert_eq!(next_link(r#"<https://x/a?page=1>; rel="first""#), None);
    }
}
