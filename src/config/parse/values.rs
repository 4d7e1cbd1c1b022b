//! One value's own check, whatever entry it is in: a string, a cap, a Nomad job id or
//! namespace, a Vault path, a Forgejo URL. Each reports its problem naming the field and
//! returns `None`, so the entry goes on to its other fields.

use url::Url;

use super::Report;
use super::json::{Json, Number};
use crate::model::is_valid_label;

/// Longest Nomad job id accepted. Nomad itself allows more, but a parent's id becomes part of
/// every child id (`<parent>/dispatch-<unix>-<8 hex>`) and of runner names; 128 is ample.
pub const JOB_ID_LEN_MAX: usize = 128;

/// The longest `hardBoundMinutes` accepted: GitHub's 5-day job limit is far below it, and a
/// larger value is more likely a unit mistake than a wish.
const HARD_BOUND_MINUTES_MAX: u64 = 30 * 24 * 60;

pub(super) fn label_value(report: &mut Report<'_>, field: &str, raw: &str) -> Option<String> {
    let label = raw.trim().to_ascii_lowercase();
    if is_valid_label(&label) {
        Some(label)
    } else {
        report.field(
            field,
            format!("{raw:?} is not a valid label: expected ^[a-z0-9][a-z0-9._:-]{{0,63}}$"),
        );
        None
    }
}

pub(super) fn string<'j>(report: &mut Report<'_>, field: &str, value: &'j Json) -> Option<&'j str> {
    match value {
        Json::String(s) => Some(s),
        other => {
            report.field(field, format!("expected a string, found {}", other.kind()));
            None
        }
    }
}

pub(super) fn boolean(report: &mut Report<'_>, field: &str, value: &Json) -> Option<bool> {
    match value {
        Json::Bool(b) => Some(*b),
        other => {
            report.field(
                field,
                format!("expected true or false, found {}", other.kind()),
            );
            None
        }
    }
}

/// A profile's hard bound: whole minutes, at least 1.
pub(super) fn hard_bound_minutes(
    report: &mut Report<'_>,
    field: &str,
    value: &Json,
) -> Option<std::time::Duration> {
    let message = match value {
        Json::Number(Number::Unsigned(n)) if (1..=HARD_BOUND_MINUTES_MAX).contains(n) => {
            return Some(std::time::Duration::from_secs(n * 60));
        }
        Json::Number(Number::Unsigned(n)) if *n == 0 => {
            "0 would tear down every runner at once: expected whole minutes of at least 1"
                .to_string()
        }
        Json::Number(Number::Unsigned(n)) => {
            format!("{n} is too large (at most {HARD_BOUND_MINUTES_MAX} minutes)")
        }
        Json::Number(Number::Signed(n)) => format!("{n} is negative: expected whole minutes"),
        Json::Number(Number::Float(n)) => format!("{n} is not a whole number of minutes"),
        other => format!("expected whole minutes, found {}", other.kind()),
    };
    report.field(field, message);
    None
}

/// A runner group id: a whole number of at least 1 (1 is the group every repo has).
pub(super) fn runner_group_id(report: &mut Report<'_>, value: &Json) -> Option<u64> {
    let message = match value {
        Json::Number(Number::Unsigned(n)) if *n >= 1 => return Some(*n),
        Json::Number(Number::Unsigned(_)) | Json::Number(Number::Signed(_)) => {
            "expected a runner group id of at least 1 (1 is the repo's Default group)".to_string()
        }
        Json::Number(Number::Float(n)) => format!("{n} is not a whole number"),
        other => format!("expected a whole number, found {}", other.kind()),
    };
    report.field("runnerGroupId", message);
    None
}

/// A cap: a whole number from 0 (pauses) to u32::MAX.
pub(super) fn cap(report: &mut Report<'_>, field: &str, value: &Json) -> Option<u32> {
    let message = match value {
        Json::Number(Number::Unsigned(n)) => match u32::try_from(*n) {
            Ok(n) => return Some(n),
            Err(_) => format!("{n} is too large (at most {})", u32::MAX),
        },
        Json::Number(Number::Signed(n)) => {
            format!("{n} is negative: expected a whole number of at least 0 (0 pauses)")
        }
        Json::Number(Number::Float(n)) => format!("{n} is not a whole number"),
        other => format!("expected a whole number, found {}", other.kind()),
    };
    report.field(field, message);
    None
}

/// A Nomad job id: what Nomad accepts in a URL path segment without escaping, and what we can
/// safely put in a child id prefix and a runner name.
pub(super) fn job_id(report: &mut Report<'_>, field: &str, job: &str) -> Option<String> {
    let problem = if job.is_empty() {
        Some("must not be empty".to_string())
    } else if job.len() > JOB_ID_LEN_MAX {
        Some(format!("is longer than {JOB_ID_LEN_MAX} characters"))
    } else if job
        .chars()
        .any(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        Some("may only contain A-Z, a-z, 0-9, '_', '.', '-'".to_string())
    } else if job == "." || job == ".." {
        Some("is not a job id".to_string())
    } else {
        None
    };
    match problem {
        None => Some(job.to_string()),
        Some(problem) => {
            report.field(
                field,
                format!("{job:?} is not a Nomad job id: it {problem}"),
            );
            None
        }
    }
}

/// Longest Nomad namespace name (`validNamespaceName` in nomad/structs/structs.go).
const NAMESPACE_LEN_MAX: usize = 128;

/// A Nomad namespace name: 1 to 128 of `[a-zA-Z0-9-]`, as Nomad accepts; `*` and the like
/// would address many namespaces at once.
pub(super) fn namespace_name(report: &mut Report<'_>, field: &str, name: &str) -> Option<String> {
    match namespace_name_problem(name) {
        None => Some(name.to_string()),
        Some(problem) => {
            report.field(
                field,
                format!("{name:?} is not a Nomad namespace: it {problem}"),
            );
            None
        }
    }
}

/// Why `name` is not a Nomad namespace name, if it is not.
pub fn namespace_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        Some("must not be empty".to_string())
    } else if name.len() > NAMESPACE_LEN_MAX {
        Some(format!("is longer than {NAMESPACE_LEN_MAX} characters"))
    } else if name
        .chars()
        .any(|c| !(c.is_ascii_alphanumeric() || c == '-'))
    {
        Some("may only contain A-Z, a-z, 0-9 and '-'".to_string())
    } else {
        None
    }
}

/// A Vault path under the KV mount, normalised without leading or trailing slashes. Globs and
/// traversal are refused: the daemon's Vault policy must name exact paths (BRIEF `vault`
/// mode), and a path with `..` or `//` could address a different secret than it reads as.
pub(super) fn checked_vault_path(
    report: &mut Report<'_>,
    field: &str,
    value: &Json,
) -> Option<String> {
    let raw = string(report, field, value)?;
    let path = raw.trim_matches('/');
    let problem = if path.is_empty() {
        Some("must not be empty")
    } else if path.contains(['*', '+']) {
        Some("must not contain a glob ('*' or '+'): name the exact secret")
    } else if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("must not contain whitespace or control characters")
    } else if path.split('/').any(|s| s.is_empty()) {
        Some("must not contain empty segments ('//')")
    } else if path.split('/').any(|s| s == "." || s == "..") {
        Some("must not contain '.' or '..' segments")
    } else {
        None
    };
    match problem {
        None => Some(path.to_string()),
        Some(problem) => {
            report.field(field, format!("{raw:?} {problem}"));
            None
        }
    }
}

pub(super) fn forgejo_url(report: &mut Report<'_>, value: &Json) -> Option<Url> {
    let raw = string(report, "forgejoUrl", value)?;
    let url = match Url::parse(raw.trim()) {
        Ok(url) => url,
        Err(e) => {
            report.field("forgejoUrl", format!("{raw:?} is not a URL: {e}"));
            return None;
        }
    };
    let problem = if !matches!(url.scheme(), "http" | "https") {
        Some("must be an http:// or https:// URL")
    } else if url.host_str().is_none_or(str::is_empty) {
        Some("must name a host")
    } else if !url.username().is_empty() || url.password().is_some() {
        // A credential here would end up in logs and status output; the token comes from Vault.
        Some("must not carry credentials (the API token is read from Vault at vaultPath)")
    } else if url.query().is_some() || url.fragment().is_some() {
        Some("must not have a query or fragment")
    } else {
        None
    };
    match problem {
        None => Some(url),
        Some(problem) => {
            // The URL was refused, possibly for carrying credentials: do not echo it.
            report.field("forgejoUrl", problem);
            None
        }
    }
}
