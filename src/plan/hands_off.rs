//! The children the daemon never stops or purges: those of `vault` mode repos, unless Nomad
//! can grant it that without `submit-job`.
//!
//! A `vault` mode parent's prestart task holds a Vault role that reads an admin token, so its
//! namespace (`ci-runners-vault` in the shipped setup) must never grant the daemon
//! `submit-job`: with it the daemon could register its own task under that role and read the
//! token. Before Nomad 1.11.2, stopping or purging a job needed `submit-job`, so such children
//! are left alone: dead ones to Nomad's batch garbage collection (`job_gc_threshold`; nothing
//! usable is in them, the credential each minted was single use), running ones to their runner,
//! which ends by itself (one job, or the idle timeout).
//!
//! Nomad 1.11.2 split `submit-job` (hashicorp/nomad#27287): `deregister-job` stops a job and
//! `purge-job` also purges it, neither registers one. With `--vault-children-cleanup` (which
//! the operator sets together with Terraform's `nomad_vault_children_cleanup`, granting
//! `purge-job` in those namespaces) nothing is covered here: dead children are purged, and
//! unplaced surplus ones stopped, like any other. A runner whose allocation runs is still never
//! stopped in `vault` mode: the daemon has no signal of whether it runs a job
//! (`plan::reap::decide`). The daemon does not guess the capability from Nomad's version: a
//! cluster on 1.11.2 may still run the old policy, and a refused purge would then be a
//! configuration error every tick.

use std::collections::BTreeSet;

use crate::config::{Config, Mode, RepoConfig};
use crate::model::ChildId;

/// Knows which children are left to Nomad, from the document.
#[derive(Debug)]
pub struct HandsOff<'a> {
    /// The namespaces the document names for `vault` mode repos: nothing there is stopped or
    /// purged, so a child of a repo that left the document stays untouched while another
    /// `vault` repo still names its namespace.
    vault_namespaces: BTreeSet<&'a str>,
    /// `--vault-children-cleanup`: nothing is left alone.
    cleanup_allowed: bool,
}

impl<'a> HandsOff<'a> {
    pub fn new(config: &'a Config, cleanup_allowed: bool) -> HandsOff<'a> {
        HandsOff {
            cleanup_allowed,
            vault_namespaces: config
                .repos
                .values()
                .filter(|repo| is_vault(repo))
                .filter_map(|repo| repo.nomad_namespace.as_deref())
                .collect(),
        }
    }

    /// True when `child`, of `repo` (the document's repo its meta names, if any), must never
    /// be stopped or purged by the daemon.
    pub fn covers(&self, repo: Option<&RepoConfig>, child: &ChildId) -> bool {
        !self.cleanup_allowed
            && (repo.is_some_and(is_vault) || self.vault_namespaces.contains(child.namespace()))
    }
}

fn is_vault(repo: &RepoConfig) -> bool {
    matches!(repo.mode, Mode::Vault { .. })
}

#[cfg(test)]
mod tests {
    //! The rule as a table, through the whole planner: deleting the check in `plan` (purges
    //! or nominations) turns a "left" row into a teardown and fails here.

    use chrono::{Duration, TimeZone, Utc};

    use crate::config::{Config, Mode, RepoConfig};
    use crate::model::{ChildId, RepoName, RunnerName};
    use crate::observe::{Child, ChildStatus, Placement, RepoJobs, Snapshot};
    use crate::plan::{Holds, PlanInput, PlanSettings, plan};

    const VAULT_NS: &str = "ci-runners-vault";

    fn repo(name: &str, vault: bool, namespace: Option<&str>) -> RepoConfig {
        RepoConfig {
            repo: RepoName::parse(name).unwrap(),
            mode: if vault {
                Mode::Vault {
                    vault_path: "github/poll".into(),
                    register_vault_path: "github/admin".into(),
                }
            } else {
                Mode::App
            },
            max_concurrent: 4,
            profiles: vec![],
            default_job: Some("runner".into()),
            labels: None,
            search_labels_as_written: Default::default(),
            credential: Default::default(),
            nomad_namespace: namespace.map(str::to_string),
        }
    }

    #[derive(Clone, Copy, Debug)]
    enum State {
        /// Dead: a purge candidate.
        Dead,
        /// Pending, never placed, past the placement timeout: a stop candidate.
        Stuck,
        /// Running past the hard bound: a stop candidate.
        Wedged,
    }

    /// Whether the plan tears the child down: purges it, or nominates it for a stop.
    fn torn_down(repos: Vec<RepoConfig>, child_repo: &str, namespace: &str, state: State) -> bool {
        let (purged, nominated) = planned(repos, child_repo, namespace, state, false);
        purged || nominated.is_some()
    }

    /// Whether the plan purges the child, and the decision on its nomination, if nominated
    /// (`decide` with nothing asked, as for a mode without a runner API).
    fn planned(
        repos: Vec<RepoConfig>,
        child_repo: &str,
        namespace: &str,
        state: State,
        vault_children_cleanup: bool,
    ) -> (bool, Option<crate::plan::reap::Decision>) {
        let now = Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).unwrap();
        let mut config = Config::default();
        let mut snapshot = Snapshot::default();
        for r in repos {
            snapshot
                .repos
                .insert(r.repo.clone(), Ok(RepoJobs::default()));
            snapshot
                .repo_urls
                .insert(format!("https://github.com/{}", r.repo), r.repo.clone());
            config.repos.insert(r.repo.clone(), r);
        }
        let (status, placement) = match state {
            State::Dead => (ChildStatus::Dead, Placement::Finished),
            State::Stuck => (ChildStatus::Pending, Placement::Unplaced),
            State::Wedged => (ChildStatus::Running, Placement::Placed),
        };
        let id = ChildId::new("runner/dispatch-1764590000-0000002a", namespace);
        let child = Child {
            id: id.clone(),
            parent: "runner".into(),
            status,
            placement,
            ours: true,
            repo_url: Some(format!("https://github.com/{child_repo}")),
            labels: Some("self-hosted".into()),
            runner_name: Some(RunnerName("runner-0123456789ab".into())),
            submitted_at: Some(now - Duration::days(6)),
            placed_at: Some(now - Duration::days(6)),
        };
        snapshot.parents.insert("runner".into(), Ok(vec![child]));
        let planned = plan(PlanInput {
            config: &config,
            snapshot: &snapshot,
            settings: PlanSettings {
                vault_children_cleanup,
                ..PlanSettings::default()
            },
            holds: &Holds::default(),
            now,
        });
        let decision = planned.nominations.iter().find(|n| n.child == id).map(|n| {
            crate::plan::reap::decide(&crate::plan::reap::ReapInput {
                nomination: n.nomination,
                api: n.api,
                allocation: n.allocation,
                verdict: crate::plan::reap::Verdict::NotAsked,
                age: n.age,
                running_for: n.running_for,
                policy: n.policy,
            })
        });
        (planned.purges.contains(&id), decision)
    }

    #[test]
    fn with_cleanup_allowed_vault_children_are_purged_and_stopped_only_without_a_runner() {
        let vault_here = || repo("acme/secure", true, Some(VAULT_NS));
        for (what, state, purged, stopped) in [
            ("dead", State::Dead, true, false),
            ("stuck unplaced", State::Stuck, false, true),
            // Running: no signal says whether it runs a job, so it is never stopped.
            ("wedged, allocation running", State::Wedged, false, false),
        ] {
            let (was_purged, decision) =
                planned(vec![vault_here()], "acme/secure", VAULT_NS, state, true);
            assert_eq!(was_purged, purged, "{what}");
            let was_stopped = decision.is_some_and(|d| d.tear_down.is_some());
            assert_eq!(was_stopped, stopped, "{what}: {decision:?}");
        }
        // Without the setting, none of them.
        for state in [State::Dead, State::Stuck, State::Wedged] {
            let (was_purged, decision) =
                planned(vec![vault_here()], "acme/secure", VAULT_NS, state, false);
            assert!(!was_purged && decision.is_none(), "{state:?}");
        }
    }

    /// What, the document's repos, the child's repo, its namespace, its state, torn down.
    type Row = (
        &'static str,
        Vec<RepoConfig>,
        &'static str,
        &'static str,
        State,
        bool,
    );

    #[test]
    fn children_of_vault_repos_are_never_stopped_or_purged_wherever_they_live() {
        let app = || repo("acme/api", false, None);
        let vault_here = || repo("acme/secure", true, Some(VAULT_NS));
        let vault_default = || repo("acme/secure", true, None);
        #[rustfmt::skip]
        let table: Vec<Row> = vec![
            // what,                                   repos,                    child of,      namespace,    state,         torn down
            ("app child, dead",                        vec![app()],                "acme/api",    "ci-runners", State::Dead,   true),
            ("app child, stuck unplaced",              vec![app()],                "acme/api",    "ci-runners", State::Stuck,  true),
            ("app child, wedged",                      vec![app()],                "acme/api",    "ci-runners", State::Wedged, true),
            ("vault child in its namespace, dead",     vec![vault_here()],         "acme/secure", VAULT_NS,     State::Dead,   false),
            ("vault child in its namespace, stuck",    vec![vault_here()],         "acme/secure", VAULT_NS,     State::Stuck,  false),
            ("vault child in its namespace, wedged",   vec![vault_here()],         "acme/secure", VAULT_NS,     State::Wedged, false),
            ("vault child elsewhere, dead",            vec![vault_default()],      "acme/secure", "ci-runners", State::Dead,   false),
            ("vault child elsewhere, stuck",           vec![vault_default()],      "acme/secure", "ci-runners", State::Stuck,  false),
            ("gone repo's child in a vault namespace", vec![app(), vault_here()],  "gone/repo",   VAULT_NS,     State::Dead,   false),
            ("app child in a vault namespace",         vec![app(), vault_here()],  "acme/api",    VAULT_NS,     State::Dead,   false),
            ("gone repo's child elsewhere, dead",      vec![app(), vault_here()],  "gone/repo",   "ci-runners", State::Dead,   true),
            ("gone repo's child elsewhere, wedged",    vec![app(), vault_here()],  "gone/repo",   "ci-runners", State::Wedged, true),
        ];
        for (what, repos, child_repo, namespace, state, expected) in table {
            assert_eq!(
                torn_down(repos, child_repo, namespace, state),
                expected,
                "{what}"
            );
        }
    }
}
