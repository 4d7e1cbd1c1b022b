//! The query string as the listings read it: the runs listing's `status` filter and search
//! cap, and GitHub's `per_page`/`page` pagination with its `Link` header. The seeded world's
//! in-memory GitHub pages its listings with the same code, so both page alike.

use super::requests::Reply;

/// Results of a filtered run listing are capped at 1,000 (API-CONTRACTS §1.1).
pub const RUN_SEARCH_CAP: usize = 1000;

/// The parts of a request's query the routes read (also the seeded world's in-memory GitHub's).
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    /// From the raw query string, `None` when the URI has none.
    pub(crate) fn parse(raw: Option<&str>) -> Query {
        Query(
            url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn number(&self, key: &str, default: usize) -> usize {
        self.get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    /// Whether a run of `status` and `conclusion` is listed under the runs listing's `status`
    /// filter, which takes a status or a conclusion (`status=success` lists the completed runs
    /// that succeeded: API-CONTRACTS §1.1); every run when there is no filter.
    pub(crate) fn run_status_matches(&self, status: &str, conclusion: Option<&str>) -> bool {
        self.get("status")
            .is_none_or(|wanted| wanted == status || Some(wanted) == conclusion)
    }

    /// Whether a runs listing is a search, whose results GitHub caps at [`RUN_SEARCH_CAP`]:
    /// any of these filters makes it one (API-CONTRACTS §1.1, gotcha 1).
    pub(crate) fn is_run_search(&self) -> bool {
        [
            "actor",
            "branch",
            "check_suite_id",
            "created",
            "event",
            "head_sha",
            "status",
        ]
        .iter()
        .any(|k| self.get(k).is_some())
    }

    /// `per_page`/`page` of `total` items: the range shown and GitHub's `Link` header, with
    /// `next`/`last` when more pages follow and `prev`/`first` after the first; none when
    /// everything fits on one page.
    pub(crate) fn page(
        &self,
        total: usize,
        link_base: &str,
    ) -> (std::ops::Range<usize>, Option<String>) {
        let per_page = self.number("per_page", 30).clamp(1, 100);
        let page = self.number("page", 1).max(1);
        let last = total.div_ceil(per_page).max(1);
        let start = (page - 1).saturating_mul(per_page).min(total);
        let end = (start + per_page).min(total);
        let mut kept: Vec<String> = self
            .0
            .iter()
            .filter(|(k, _)| k != "page" && k != "per_page")
            .map(|(k, v)| {
                format!(
                    "{k}={}",
                    url::form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>()
                )
            })
            .collect();
        kept.push(format!("per_page={per_page}"));
        let url = |p: usize| format!("<{link_base}?{}&page={p}>", kept.join("&"));
        let mut rels = Vec::new();
        if page > 1 {
            rels.push(format!("{}; rel=\"prev\"", url((page - 1).min(last))));
        }
        if page < last {
            rels.push(format!("{}; rel=\"next\"", url(page + 1)));
            rels.push(format!("{}; rel=\"last\"", url(last)));
        }
        if page > 1 {
            rels.push(format!("{}; rel=\"first\"", url(1)));
        }
        (start..end, (!rels.is_empty()).then(|| rels.join(", ")))
    }
}

/// Slices `items` for `per_page`/`page`, with GitHub's `Link` header (see [`Query::page`]).
pub(super) fn paginate<T: Clone>(
    items: &[T],
    query: &Query,
    link_base: &str,
) -> (Vec<T>, Option<String>) {
    let (range, link) = query.page(items.len(), link_base);
    (items[range].to_vec(), link)
}

/// Adds GitHub's `Link` header when the listing has more than one page.
pub(super) fn with_link(reply: Reply, link: Option<String>) -> Reply {
    match link {
        Some(link) => reply.header("link", link),
        None => reply,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pagination_links_follow_github() {
        let items: Vec<u32> = (0..250).collect();
        let query = Query(vec![
            ("status".into(), "queued".into()),
            ("per_page".into(), "100".into()),
            ("page".into(), "2".into()),
        ]);
        let (page, link) = paginate(&items, &query, "http://h/repositories/1/actions/runs");
        assert_eq!(page.first(), Some(&100));
        assert_eq!(page.len(), 100);
        let link = link.unwrap();
        assert!(link.contains(r#"<http://h/repositories/1/actions/runs?status=queued&per_page=100&page=3>; rel="next""#), "{link}");
        assert!(link.contains(r#"page=3>; rel="last""#), "{link}");
        assert!(link.contains(r#"page=1>; rel="prev""#), "{link}");
        assert!(link.contains(r#"page=1>; rel="first""#), "{link}");

        let (_, link) = paginate(&items[..5], &Query(vec![]), "http://h/x");
        assert_eq!(link, None, "one page: no Link header");
    }

    #[test]
    fn pages_link_to_the_next_and_last_page() {
        let query = Query::parse(Some("status=queued&per_page=2&page=2"));
        let (range, link) = query.page(5, "https://api.github.com/repositories/1/actions/runs");
        assert_eq!(range, 2..4);
        let link = link.expect("more pages");
        assert!(
            link.contains("<https://api.github.com/repositories/1/actions/runs?status=queued&per_page=2&page=3>; rel=\"next\""),
            "{link}"
        );
        assert!(link.contains("page=3>; rel=\"last\""), "{link}");
        assert_eq!(Query::parse(Some("per_page=100")).page(5, "x").1, None);
    }
}
