//! Dispatches held for a configuration error, and when a read of their parent job lets them go
//! again.
//!
//! A dispatch Nomad refuses for its configuration (a parent not registered yet, stopped, or
//! whose `parameterized` block refuses our meta) is held for the terminal retry, ten minutes by
//! default, so a broken setup costs no mint per poll. But the usual fix is one `nomad job run`,
//! and an operator who just ran it should not wait those ten minutes: each poll reads a held
//! parent once (`GET /v1/job/<parent>`, no mint, no dispatch), and a parent that now reads
//! right is dispatched to in the same tick.
//!
//! A parent that reads right but was refused anyway (a refusal its reading cannot explain) is
//! retried once per change of its reading, not once per poll: the reading it was last retried
//! on is kept, and only a different one (Nomad's `JobModifyIndex` moves with every register)
//! lets it go again before the terminal retry does.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use tracing::{debug, info};

use super::Controller;
use super::failures::Scope;
use crate::config::Config;
use crate::model::ErrorClass;

use crate::model::RepoName;
use crate::observe::ParentJob;

/// What a read of a held parent says about its held dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recheck {
    /// The parent reads right, and not as it did when its dispatch was last retried: the
    /// hold ends and the dispatch goes out this tick.
    Retry,
    /// Still wrong, or unchanged since a retry that was refused: held until the terminal
    /// retry or a change.
    Hold,
}

/// Decides one held dispatch from its parent's reading: `problems` are what
/// [`crate::observe::parent_problems`] finds in it for the repo, `retried_on` the reading the
/// hold last ended on, if it ended before.
pub fn recheck(
    reading: &ParentJob,
    problems: &[String],
    retried_on: Option<&ParentJob>,
) -> Recheck {
    if problems.is_empty() && retried_on != Some(reading) {
        Recheck::Retry
    } else {
        Recheck::Hold
    }
}

/// The readings held dispatches were last let go on, per (parent, repo); forgotten when a
/// dispatch to that parent succeeds or the document changes. Lost on a restart, which only
/// means one more retry of a parent that reads right.
#[derive(Debug, Default)]
pub struct HeldParents {
    retried_on: BTreeMap<(String, RepoName), ParentJob>,
}

impl HeldParents {
    pub fn retried_on(&self, parent: &str, repo: &RepoName) -> Option<&ParentJob> {
        self.retried_on.get(&(parent.to_string(), repo.clone()))
    }

    pub fn retrying(&mut self, parent: &str, repo: &RepoName, reading: ParentJob) {
        self.retried_on
            .insert((parent.to_string(), repo.clone()), reading);
    }

    pub fn dispatched(&mut self, parent: &str, repo: &RepoName) {
        self.retried_on.remove(&(parent.to_string(), repo.clone()));
    }

    pub fn forget_all(&mut self) {
        self.retried_on.clear();
    }
}

impl Controller {
    /// Reads each parent whose dispatch is held for a configuration error, once per tick, and
    /// ends the hold of those that now read right (see `control_loop/held_parents.rs`).
    pub(super) async fn recheck_held_parents(&mut self, config: &Config, now: DateTime<Utc>) {
        let held: Vec<(String, RepoName)> = self
            .memory
            .failures
            .iter()
            .filter(|(_, f)| {
                f.retry_at > now
                    && matches!(f.class, ErrorClass::Configuration | ErrorClass::NotFound)
            })
            .filter_map(|(scope, _)| match scope {
                Scope::Dispatch(parent, repo) => Some((parent.clone(), repo.clone())),
                _ => None,
            })
            .collect();
        // One read per parent and namespace, however many repos wait on it.
        let mut readings: BTreeMap<(Option<String>, String), Option<crate::observe::ParentJob>> =
            BTreeMap::new();
        for (parent, repo) in held {
            let Some(repo_config) = config.repos.get(&repo) else {
                continue;
            };
            let namespace = repo_config.nomad_namespace.clone();
            let key = (namespace.clone(), parent.clone());
            if !readings.contains_key(&key) {
                let read = self
                    .services
                    .children
                    .read_parent(&parent, namespace.as_deref())
                    .await;
                if let Err(e) = &read {
                    debug!("re-check of a held dispatch: {e}");
                }
                readings.insert(key.clone(), read.ok());
            }
            let Some(reading) = &readings[&key] else {
                continue;
            };
            let problems = crate::observe::parent_problems(repo_config, &parent, reading);
            let retried_on = self.memory.held_parents.retried_on(&parent, &repo);
            if recheck(reading, &problems, retried_on) == Recheck::Retry {
                info!(
                    repo = %repo,
                    parent = %parent,
                    "parent job {parent} now reads right for {repo}: its held dispatch goes again"
                );
                self.memory
                    .failures
                    .remove(&Scope::Dispatch(parent.clone(), repo.clone()));
                self.memory
                    .held_parents
                    .retrying(&parent, &repo, reading.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parameterized(modify_index: u64) -> ParentJob {
        ParentJob::Parameterized {
            stopped: false,
            payload_required: false,
            meta_required: Default::default(),
            meta_optional: Default::default(),
            modify_index,
        }
    }

    #[test]
    fn a_held_dispatch_goes_again_only_on_a_parent_that_reads_right_and_changed() {
        let wrong = vec!["o/a: parent job ci-runner is stopped".to_string()];
        let right: Vec<String> = vec![];
        let missing = ParentJob::Missing;
        for (reading, problems, retried_on, expected) in [
            // The forgotten `nomad job run`: missing, then there.
            (&missing, &wrong, None, Recheck::Hold),
            (&parameterized(12), &right, None, Recheck::Retry),
            // Still wrong: held, whatever came before.
            (&parameterized(12), &wrong, None, Recheck::Hold),
            (
                &parameterized(13),
                &wrong,
                Some(parameterized(12)),
                Recheck::Hold,
            ),
            // Refused although it read right: not again on the same reading...
            (
                &parameterized(12),
                &right,
                Some(parameterized(12)),
                Recheck::Hold,
            ),
            // ...but again once the job was registered anew.
            (
                &parameterized(13),
                &right,
                Some(parameterized(12)),
                Recheck::Retry,
            ),
        ] {
            assert_eq!(
                recheck(reading, problems, retried_on.as_ref()),
                expected,
                "{reading:?} {problems:?} {retried_on:?}"
            );
        }
    }
}
