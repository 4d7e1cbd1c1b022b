//! The part of go-bexpr (Nomad's `filter` query parameter) the twin evaluates: matches of a
//! selector against a quoted string with `==` or `!=`, joined by `and`. That covers the
//! daemon's own filter (`ParentID != "" and Meta["managed_by"] == "runner-scaler"`).
//!
//! Semantics follow go-bexpr's `evaluate.go`: `and` short-circuits; a key missing from a map
//! is not an error but the operator's "not present" answer (`==` false, `!=` true), so a job
//! without meta simply does not match; a selector naming no field of the job is an error
//! ("error finding value in datum"), raised only when a job is actually evaluated.
//!
//! Anything outside that subset (`or`, `not`, parentheses, `in`, `matches`, `is empty`,
//! unquoted values) is refused at parse time, as Nomad refuses an expression it cannot
//! parse, rather than guessed at: a test that needs more should extend this evaluator.

use super::jobs::TwinJob;

/// A parsed filter: every match must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Filter {
    matches: Vec<Match>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Match {
    /// The selector's parts: `Meta["k"]` and `Meta.k` are both `["Meta", "k"]`.
    path: Vec<String>,
    equal: bool,
    value: String,
}

/// What a selector found on a job.
enum Found<'a> {
    Text(&'a str),
    /// The parent of the missing leaf is a map: go-bexpr's "not present" disposition.
    MissingMapKey,
}

impl Filter {
    /// Parses `expression`; `Err` is the reason, for Nomad's
    /// `failed to read filter expression: <reason>`.
    pub(super) fn parse(expression: &str) -> Result<Filter, String> {
        let tokens = tokenize(expression)?;
        let mut matches = Vec::new();
        let mut rest = tokens.as_slice();
        loop {
            let (found, after) = parse_match(rest)?;
            matches.push(found);
            match after {
                [] => break,
                [Token::Word(word), tail @ ..] if word == "and" => rest = tail,
                [other, ..] => {
                    return Err(format!(
                        "unsupported by the twin: {other:?} (only `and` joins matches)"
                    ));
                }
            }
        }
        Ok(Filter { matches })
    }

    /// Whether `job` matches; `Err` is go-bexpr's evaluation error, for Nomad's
    /// `failed to read result page: <error>`.
    pub(super) fn matches(&self, job: &TwinJob) -> Result<bool, String> {
        for m in &self.matches {
            let holds = match select(job, &m.path)? {
                Found::Text(text) => (text == m.value) == m.equal,
                // go-bexpr's NotPresentDisposition: `==` false, `!=` true.
                Found::MissingMapKey => !m.equal,
            };
            if !holds {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// The value of `path` on `job`, by the field names of Nomad's `structs.Job` (go-bexpr reads
/// the full job, not the list stub).
fn select<'a>(job: &'a TwinJob, path: &[String]) -> Result<Found<'a>, String> {
    let not_found = |part: usize| {
        format!(
            "error finding value in datum: /{} at part {part}: couldn't find key",
            path.join("/")
        )
    };
    let text = |value: &'a str| -> Result<Found<'a>, String> {
        match path.len() {
            1 => Ok(Found::Text(value)),
            _ => Err(not_found(1)),
        }
    };
    match path.first().map(String::as_str) {
        Some("ID") | Some("Name") => text(&job.id),
        Some("ParentID") => text(&job.parent_id),
        Some("Namespace") => text(&job.namespace),
        Some("Status") => text(job.status.as_str()),
        Some("Type") => text("batch"),
        Some("Meta") => match path {
            [_, key] => Ok(job
                .meta
                .get(key)
                .map_or(Found::MissingMapKey, |v| Found::Text(v))),
            [_] => Err(
                "unable to find suitable primitive comparison function for matching".to_string(),
            ),
            _ => Err(not_found(2)),
        },
        _ => Err(not_found(0)),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    /// An identifier or keyword.
    Word(String),
    /// A quoted string, unescaped.
    Text(String),
    Dot,
    Open,
    Close,
    Equal,
    NotEqual,
    /// Anything else the grammar has and the twin does not evaluate (`(`, `)`, …).
    Other(char),
}

fn tokenize(expression: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut chars = expression.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '.' => tokens.push(Token::Dot),
            '[' => tokens.push(Token::Open),
            ']' => tokens.push(Token::Close),
            '=' | '!' if chars.peek() == Some(&'=') => {
                chars.next();
                tokens.push(if c == '=' {
                    Token::Equal
                } else {
                    Token::NotEqual
                });
            }
            '"' => {
                let mut text = String::new();
                loop {
                    match chars.next() {
                        None => return Err("unterminated string".to_string()),
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(escaped @ ('"' | '\\')) => text.push(escaped),
                            Some('n') => text.push('\n'),
                            Some('t') => text.push('\t'),
                            other => return Err(format!("invalid escape {other:?}")),
                        },
                        Some(c) => text.push(c),
                    }
                }
                tokens.push(Token::Text(text));
            }
            '`' => {
                let mut text = String::new();
                loop {
                    match chars.next() {
                        None => return Err("unterminated raw string".to_string()),
                        Some('`') => break,
                        Some(c) => text.push(c),
                    }
                }
                tokens.push(Token::Text(text));
            }
            c if c.is_ascii_alphanumeric() || c == '_' => {
                let mut word = c.to_string();
                while let Some(&next) = chars.peek() {
                    if next.is_ascii_alphanumeric() || next == '_' || next == '-' {
                        word.push(next);
                        chars.next();
                    } else {
                        break;
                    }
                }
                tokens.push(Token::Word(word));
            }
            other => tokens.push(Token::Other(other)),
        }
    }
    Ok(tokens)
}

/// One `selector ==|!= "value"` at the start of `tokens`, and what follows it.
fn parse_match(tokens: &[Token]) -> Result<(Match, &[Token]), String> {
    let mut path = Vec::new();
    let mut rest = match tokens {
        [Token::Word(first), rest @ ..] if !is_keyword(first) => {
            path.push(first.clone());
            rest
        }
        [] => return Err("expected a selector, found the end".to_string()),
        [other, ..] => return Err(format!("expected a selector, found {other:?}")),
    };
    loop {
        match rest {
            [Token::Dot, Token::Word(part), tail @ ..] => {
                path.push(part.clone());
                rest = tail;
            }
            [Token::Open, Token::Text(key), Token::Close, tail @ ..] => {
                path.push(key.clone());
                rest = tail;
            }
            _ => break,
        }
    }
    match rest {
        [Token::Equal, Token::Text(value), tail @ ..] => Ok((
            Match {
                path,
                equal: true,
                value: value.clone(),
            },
            tail,
        )),
        [Token::NotEqual, Token::Text(value), tail @ ..] => Ok((
            Match {
                path,
                equal: false,
                value: value.clone(),
            },
            tail,
        )),
        [Token::Equal | Token::NotEqual, other, ..] => Err(format!(
            "unsupported by the twin: value {other:?} (only quoted strings)"
        )),
        [other, ..] => Err(format!(
            "unsupported by the twin: {other:?} after a selector (only == and !=)"
        )),
        [] => Err("expected an operator, found the end".to_string()),
    }
}

fn is_keyword(word: &str) -> bool {
    matches!(
        word,
        "and" | "or" | "not" | "in" | "is" | "contains" | "matches" | "empty"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::ChildStatus;
    use std::collections::BTreeMap;

    fn job(parent: &str, meta: &[(&str, &str)]) -> TwinJob {
        TwinJob {
            id: if parent.is_empty() {
                "ci-runner".to_string()
            } else {
                format!("{parent}/dispatch-1-00000000")
            },
            namespace: "default".to_string(),
            parent_id: parent.to_string(),
            status: ChildStatus::Pending,
            stop: false,
            meta: meta
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            parameterized: None,
            dispatched: !parent.is_empty(),
            dispatch_idempotency_token: String::new(),
            payload: Vec::new(),
            summary: Default::default(),
            allocation: None,
            submit_time_ns: 0,
            create_index: 0,
            modify_index: 0,
            job_modify_index: 0,
        }
    }

    const DAEMONS_FILTER: &str = r#"ParentID != "" and Meta["managed_by"] == "runner-scaler""#;

    #[test]
    fn the_daemons_filter_finds_only_marked_children() {
        let filter = Filter::parse(DAEMONS_FILTER).unwrap();
        let ours = job("ci-runner", &[("managed_by", "runner-scaler")]);
        let by_hand = job("ci-runner", &[("runner_name", "x")]);
        let without_meta = job("ci-runner", &[]);
        let marked_parent = job("", &[("managed_by", "runner-scaler")]);
        assert_eq!(filter.matches(&ours), Ok(true));
        assert_eq!(filter.matches(&by_hand), Ok(false));
        assert_eq!(filter.matches(&without_meta), Ok(false));
        assert_eq!(filter.matches(&marked_parent), Ok(false));
    }

    #[test]
    fn a_missing_map_key_is_not_present_rather_than_an_error() {
        let plain = job("ci-runner", &[]);
        let eq = Filter::parse(r#"Meta.owner == "x""#).unwrap();
        let ne = Filter::parse(r#"Meta["owner"] != `x`"#).unwrap();
        assert_eq!(eq.matches(&plain), Ok(false));
        assert_eq!(ne.matches(&plain), Ok(true));
    }

    #[test]
    fn an_unknown_field_is_an_error_only_when_evaluated() {
        let filter = Filter::parse(r#"ParentID != "" and Colour == "blue""#).unwrap();
        // Short-circuit: a parent never reaches the second match.
        assert_eq!(filter.matches(&job("", &[])), Ok(false));
        let error = filter.matches(&job("ci-runner", &[])).unwrap_err();
        assert!(error.starts_with("error finding value in datum"), "{error}");
    }

    #[test]
    fn expressions_outside_the_subset_are_refused() {
        for expression in [
            "",
            "ParentID",
            r#"ParentID == "" or ParentID != """#,
            r#"not ParentID == """#,
            r#"(ParentID == "")"#,
            r#""x" in Meta"#,
            r#"ParentID matches "ci""#,
            "ParentID == ci",
            r#"ParentID == "unterminated"#,
            r#"ParentID == "" and"#,
        ] {
            assert!(Filter::parse(expression).is_err(), "{expression:?}");
        }
    }
}
