//! The words of the domain (see README "Words"): repos, label sets, buckets, runner names,
//! and the classification every port error maps into.

use std::fmt;
use std::sync::Arc;

/// `owner/name` on GitHub or on a Forgejo instance, normalised to lower case because both
/// forges compare them case-insensitively and the Consul document keys them that way.
///
/// Shared, not copied: the planner keys maps by it for thousands of jobs per tick.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RepoName {
    /// `owner/name`, lower-case.
    full: Arc<str>,
    /// Index of the `/`.
    slash: usize,
}

impl RepoName {
    /// Parses `owner/name`; `None` unless both halves are non-empty and made of the characters
    /// GitHub and Forgejo allow in owner and repository names.
    pub fn parse(raw: &str) -> Option<RepoName> {
        let (owner, name) = raw.trim().split_once('/')?;
        let valid = |part: &str| {
            !part.is_empty()
                && part.len() <= 100
                && part != "."
                && part != ".."
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        if !valid(owner) || !valid(name) {
            return None;
        }
        Some(RepoName {
            full: format!(
                "{}/{}",
                owner.to_ascii_lowercase(),
                name.to_ascii_lowercase()
            )
            .into(),
            slash: owner.len(),
        })
    }

    pub fn owner(&self) -> &str {
        &self.full[..self.slash]
    }

    pub fn name(&self) -> &str {
        &self.full[self.slash + 1..]
    }
}

impl fmt::Display for RepoName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

/// At most this many labels on one job; more is untrusted input (BRIEF "Words").
pub const LABELS_PER_JOB_MAX: usize = 16;
/// Longest label accepted, matching `^[a-z0-9][a-z0-9._:-]{0,63}$`.
pub const LABEL_LEN_MAX: usize = 64;

/// Label lists longer than this are refused before any work is spent on them.
const RAW_LABELS_MAX: usize = 1024;

/// A job's `runs-on` labels: trimmed, lower-cased, de-duplicated, sorted. Shared, not copied:
/// every bucket key and planned dispatch carries one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LabelSet(Arc<[String]>);

/// Why a label set taken from a workflow file was refused.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LabelRejection {
    TooMany { count: usize },
    Invalid { label: String },
    Empty,
}

impl fmt::Display for LabelRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LabelRejection::TooMany { count } => {
                write!(
                    f,
                    "{count} labels (at most {LABELS_PER_JOB_MAX} are accepted)"
                )
            }
            // The label comes from a workflow file: print it escaped so that a hostile value
            // cannot forge log lines or terminal sequences.
            LabelRejection::Invalid { label } => write!(f, "label {:?} is not accepted", label),
            LabelRejection::Empty => write!(f, "no labels"),
        }
    }
}

/// At most `max` characters of `text`. Cutting a `String` at a byte count panics inside a
/// multi-byte character, and what is cut here is untrusted input (labels, error bodies).
pub fn clip_chars(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// True when `label` (already lower-cased and trimmed) matches `^[a-z0-9][a-z0-9._:-]{0,63}$`.
pub fn is_valid_label(label: &str) -> bool {
    let mut chars = label.chars();
    match chars.next() {
        Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit() => {}
        _ => return false,
    }
    label.len() <= LABEL_LEN_MAX
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._:-".contains(c))
}

impl LabelSet {
    /// Normalises labels as they come from a forge; rejects the set when any label fails the
    /// pattern or there are too many. The input is untrusted (it is a workflow file's
    /// `runs-on`), so nothing here trusts its length or content.
    pub fn parse<S: AsRef<str>>(raw: &[S]) -> Result<LabelSet, LabelRejection> {
        if raw.len() > RAW_LABELS_MAX {
            return Err(LabelRejection::TooMany { count: raw.len() });
        }
        let mut labels = Vec::with_capacity(raw.len());
        for label in raw {
            let label = label.as_ref().trim().to_ascii_lowercase();
            if !is_valid_label(&label) {
                return Err(LabelRejection::Invalid {
                    label: clip_chars(&label, 80),
                });
            }
            labels.push(label);
        }
        labels.sort_unstable();
        labels.dedup();
        if labels.len() > LABELS_PER_JOB_MAX {
            return Err(LabelRejection::TooMany { count: raw.len() });
        }
        if labels.is_empty() {
            return Err(LabelRejection::Empty);
        }
        Ok(LabelSet(labels.into()))
    }

    /// Parses the `labels` meta of one of our children (`a,b,c`).
    pub fn from_meta(meta: &str) -> Result<LabelSet, LabelRejection> {
        let parts: Vec<&str> = meta.split(',').filter(|s| !s.trim().is_empty()).collect();
        LabelSet::parse(&parts)
    }

    /// The form carried in dispatch meta: lower-case, sorted, comma-separated.
    pub fn to_meta(&self) -> String {
        self.0.join(",")
    }

    pub fn contains(&self, label: &str) -> bool {
        self.0
            .binary_search_by(|probe| probe.as_str().cmp(label))
            .is_ok()
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True when every label of `self` is among `other`'s: a runner with `other` labels can
    /// take a job with `self` labels.
    pub fn is_subset(&self, other: &LabelSet) -> bool {
        self.0.iter().all(|label| other.contains(label))
    }
}

impl fmt::Display for LabelSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}]", self.to_meta())
    }
}

/// The unit of demand and supply: one repo and one label set. Never a job id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BucketKey {
    pub repo: RepoName,
    pub labels: LabelSet,
}

impl fmt::Display for BucketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.repo, self.labels)
    }
}

/// One dispatched child job: `.0` its id, `<parent>/dispatch-[<prefix>-]<unix>-<8 hex>`,
/// and `.1` the Nomad namespace it lives in. Ids are unique only within a namespace, and
/// every read, stop and purge of a child names its namespace, so the two travel together.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChildId(pub String, pub String);

impl ChildId {
    pub fn new(id: impl Into<String>, namespace: impl Into<String>) -> ChildId {
        ChildId(id.into(), namespace.into())
    }

    /// The job id, as `nomad job status` takes it.
    pub fn id(&self) -> &str {
        &self.0
    }

    pub fn namespace(&self) -> &str {
        &self.1
    }
}

/// The job id alone: log lines name the namespace where it matters (the Nomad client's
/// errors do).
impl fmt::Display for ChildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Nomad's namespace when a request names none.
pub const NOMAD_DEFAULT_NAMESPACE: &str = "default";

/// Value of the `managed_by` meta key that marks a child as ours.
pub const MANAGED_BY: &str = "runner-scaler";

/// Longest runner name GitHub accepts for a runner.
pub const RUNNER_NAME_LEN_MAX: usize = 64;

/// A runner's name, chosen by the daemon before dispatch so that GitHub's `runner_name` on a
/// job joins to the child running it without asking Nomad again.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunnerName(pub String);

impl RunnerName {
    /// `<parent>-<12 hex>`, with the parent reduced to `[a-z0-9-]` and cut so the whole name
    /// stays within 64 characters. `suffix` must be 12 lower-case hex digits of randomness.
    pub fn for_parent(parent: &str, suffix: &str) -> RunnerName {
        let mut stem: String = parent
            .chars()
            .map(|c| {
                let c = c.to_ascii_lowercase();
                if c.is_ascii_lowercase() || c.is_ascii_digit() {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        stem.truncate(RUNNER_NAME_LEN_MAX - suffix.len() - 1);
        let stem = stem.trim_matches('-');
        let stem = if stem.is_empty() { "runner" } else { stem };
        RunnerName(format!("{stem}-{suffix}"))
    }
}

impl fmt::Display for RunnerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The longest a service's word can make the loop wait: `retry-after`, a rate-limit reset.
/// Those values come from the network, and a broken proxy or a hostile answer could otherwise
/// park a repo for years or overflow a timestamp. GitHub's primary rate-limit window is one
/// hour, so no honest answer asks for more; after an hour the loop asks again and hears the
/// current word.
pub const RATE_LIMIT_WAIT_MAX_S: u64 = 60 * 60;

/// How a failed call to a service should be treated. Every port error maps into one of these
/// so that the loop decides retries the same way for every service (BRIEF lesson 10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorClass {
    /// Network error, timeout, most 5xx: retry soon, with backoff.
    Transient,
    /// 429 or a rate-limit 403: wait as the service asked.
    RateLimited,
    /// 401: the credential is wrong or expired.
    Unauthorized,
    /// Any other 403: the credential lacks a permission; retry slowly.
    Forbidden,
    /// 404: the resource is absent or this credential may not see it.
    NotFound,
    /// The service refused what we asked because of how it or we are configured (Nomad's
    /// dispatch validation 500s, an old Forgejo): report once per config version, retry slowly.
    Configuration,
    /// The service answered with a body we could not read.
    Malformed,
}

impl ErrorClass {
    pub fn is_transient(self) -> bool {
        matches!(self, ErrorClass::Transient | ErrorClass::RateLimited)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::RateLimited => "rate_limited",
            ErrorClass::Unauthorized => "unauthorized",
            ErrorClass::Forbidden => "forbidden",
            ErrorClass::NotFound => "not_found",
            ErrorClass::Configuration => "configuration",
            ErrorClass::Malformed => "malformed",
        }
    }
}

/// A failure of one port call, classified so the loop can decide what to do about it. The
/// message says what was being done and to what; it never carries a secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct PortError {
    pub class: ErrorClass,
    pub message: String,
    /// Seconds the service asked us to wait (`retry-after`, or until a rate-limit reset).
    pub retry_after_s: Option<u64>,
}

impl PortError {
    pub fn new(class: ErrorClass, message: impl Into<String>) -> PortError {
        PortError {
            class,
            message: message.into(),
            retry_after_s: None,
        }
    }

    pub fn with_retry_after(mut self, seconds: Option<u64>) -> PortError {
        self.retry_after_s = seconds;
        self
    }

    /// Prefixes the message with what the caller was doing: `list jobs for acme/api: <cause>`.
    pub fn context(mut self, doing: impl fmt::Display) -> PortError {
        self.message = format!("{doing}: {}", self.message);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_sets_are_normalised_and_deduplicated() {
        let set = LabelSet::parse(&[" Linux", "self-hosted", "LINUX", "go"]).unwrap();
        assert_eq!(set.to_meta(), "go,linux,self-hosted");
    }

    #[test]
    fn hostile_labels_are_rejected() {
        for hostile in ["$(id)", "a b", "-lead", "", "x;rm", "ä", &"a".repeat(65)] {
            assert!(
                LabelSet::parse(&["self-hosted", hostile]).is_err(),
                "{hostile:?} accepted"
            );
        }
        assert!(LabelSet::parse(&["a".repeat(64)]).is_ok());
    }

    #[test]
    fn long_non_ascii_labels_are_rejected_not_a_panic() {
        let label = format!("a{}", "é".repeat(50));
        match LabelSet::parse(&["self-hosted", label.as_str()]) {
            Err(LabelRejection::Invalid { label: shown }) => {
                assert_eq!(shown.chars().count(), 51)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn more_than_sixteen_labels_are_rejected() {
        let many: Vec<String> = (0..17).map(|i| format!("l{i}")).collect();
        assert!(matches!(
            LabelSet::parse(&many),
            Err(LabelRejection::TooMany { .. })
        ));
        assert!(LabelSet::parse(&many[..16]).is_ok());
    }

    #[test]
    fn repo_names_compare_case_insensitively() {
        assert_eq!(RepoName::parse("Acme/API"), RepoName::parse("acme/api"));
        for bad in ["acme", "/api", "acme/", "a/b/c", "acme/a b", "../x"] {
            assert!(RepoName::parse(bad).is_none(), "{bad} accepted");
        }
    }

    #[test]
    fn runner_names_fit_github_limits() {
        let name = RunnerName::for_parent(&"Very_Long.Parent".repeat(10), "3f9c2a1b7d04");
        assert!(name.0.len() <= RUNNER_NAME_LEN_MAX);
        assert!(name.0.ends_with("-3f9c2a1b7d04"));
        assert!(
            name.0
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
        assert_eq!(
            RunnerName::for_parent("ci-runner", "3f9c2a1b7d04").0,
            "ci-runner-3f9c2a1b7d04"
        );
    }
}
