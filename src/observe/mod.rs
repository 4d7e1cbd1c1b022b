//! Observe: ask every source what the world looks like right now.
//!
//! The ports below are what the loop needs from the forges and from Nomad, nothing more. A
//! source that cannot be read becomes a [`Gap`] in the [`Snapshot`], never an abort: the
//! planner then holds back exactly what depended on the missing facts.

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::config::{Mode, RepoConfig};
use crate::model::{ChildId, ErrorClass, LabelSet, RepoName, RunnerName};

/// A port call's failure is a word of the model: the config watcher, secret reading and every
/// client speak it too, below this layer.
pub use crate::model::PortError;

/// Where a forge job stands, as far as the daemon cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for a runner: new demand.
    Queued,
    /// Running on the named runner (GitHub names it; it may be anyone's runner).
    InProgress { runner: Option<RunnerName> },
    /// Claimed or running on a runner the forge does not name (Forgejo). Assumed to run on one
    /// of its bucket's in-flight children, up to their number.
    Claimed,
}

/// One self-hosted job of a repo, as a forge reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForgeJob {
    pub id: u64,
    /// The job's `runs-on` labels exactly as the forge returned them: untrusted.
    pub labels: Vec<String>,
    pub state: JobState,
    /// When the job was queued: GitHub's `created_at`. `None` from Forgejo, whose jobs carry
    /// no timestamps; the control loop fills in its first sighting before planning.
    pub queued_at: Option<DateTime<Utc>>,
}

/// What a forge said about one repo this tick.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RepoJobs {
    pub jobs: Vec<ForgeJob>,
    /// Set when a run listing reached GitHub's 1,000-result search cap: demand may be larger.
    pub truncated: bool,
}

/// Reads one repo's queue. Implemented by the GitHub and Forgejo clients.
#[async_trait]
pub trait QueueSource: Send + Sync {
    /// Lists the repo's self-hosted jobs that are queued or in progress. The planner joins
    /// in-progress jobs to our runners by name, so the forges can be asked while Nomad is.
    async fn list_jobs(&self, repo: &RepoConfig) -> Result<RepoJobs, PortError>;

    /// The primary rate-limit budget `repo`'s reads draw on, as the forge last reported it;
    /// `None` where there is none or nothing is known yet.
    fn budget(&self, _repo: &RepoConfig) -> Option<BudgetReading> {
        None
    }

    /// Whose per-minute request points `repo`'s reads spend, how many that owner may still
    /// spend on reads in the current minute, and what `repo`'s next read will likely cost;
    /// `None` where no such limit applies or its owner is not known yet.
    fn read_points(&self, _repo: &RepoConfig) -> Option<ReadPoints> {
        None
    }

    /// The repos of this source in the document, told before each tick's reads: a source
    /// whose credential covers many repos at once mints it for these.
    fn serving(&self, _repos: &[&RepoConfig]) {}

    /// A webhook said something happened in `repo`: its next read is a full one, never a
    /// shortcut from an earlier reading.
    fn hinted(&self, _repo: &RepoName) {}
}

/// A repo's read against its owner's per-minute request points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadPoints {
    /// Whose points the read spends (a metric label: `installation-42`).
    pub owner: String,
    /// What that owner may still spend on reads in the current minute.
    pub left: u32,
    /// What the repo's next read will likely cost: the requests its last read of the same
    /// depth took.
    pub next_read: u32,
}

/// One rate-limit budget as last reported (`x-ratelimit-*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetReading {
    /// Whose budget it is, as the rate-limit metric labels it (`installation-7`): never a
    /// credential.
    pub owner: String,
    pub limit: u64,
    pub remaining: u64,
    pub reset_at: DateTime<Utc>,
}

/// A child job's status in Nomad.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChildStatus {
    Pending,
    Running,
    Dead,
}

impl ChildStatus {
    /// `pending` or `running`, with or without an allocation: occupies a slot.
    pub fn is_in_flight(self) -> bool {
        !matches!(self, ChildStatus::Dead)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ChildStatus::Pending => "pending",
            ChildStatus::Running => "running",
            ChildStatus::Dead => "dead",
        }
    }
}

/// Whether a child's allocation exists, from the job summary in Nomad's listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Placement {
    /// No allocation yet: the cluster could not place it, so no runner exists.
    Unplaced,
    /// An allocation is starting or running.
    Placed,
    /// Its allocations have all finished, none of them failed.
    Finished,
    /// Its allocations have all finished and one failed: the runner exited with an error or
    /// could not start (a bad image, a bad credential). A failed start unless its runner was
    /// seen taking a job.
    Failed,
}

impl Placement {
    /// Whether an allocation may run a runner right now.
    pub fn is_placed(self) -> bool {
        matches!(self, Placement::Placed)
    }
}

/// One child of a parent job, keeping only the meta the daemon uses. Secrets in meta (a
/// `runner_token`) are dropped at the parse boundary and never reach this type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Child {
    pub id: ChildId,
    pub parent: String,
    pub status: ChildStatus,
    pub placement: Placement,
    /// False for a child dispatched by hand (no `managed_by=runner-scaler`): shown, never
    /// counted, never purged.
    pub ours: bool,
    pub repo_url: Option<String>,
    /// The `labels` meta, unparsed.
    pub labels: Option<String>,
    pub runner_name: Option<RunnerName>,
    /// Nomad's `SubmitTime`.
    pub submitted_at: Option<DateTime<Utc>>,
    /// When the loop first saw it placed (Nomad's listing carries no allocation times); filled
    /// in by the loop from its memory, so after a restart it counts from the first tick.
    pub placed_at: Option<DateTime<Utc>>,
}

impl Child {
    /// Stopped, its job already reads `dead`, while its allocation still runs: Nomad counts
    /// an allocation told to stop as terminal at once, but the task has its `kill_timeout`
    /// to end, and the slot is free only once the client reports it gone (the job summary
    /// still counts it running).
    pub fn is_stopping(&self) -> bool {
        !self.status.is_in_flight() && self.placement.is_placed()
    }

    /// Holds a slot under the caps and on the cluster: in flight, or stopping.
    pub fn holds_slot(&self) -> bool {
        self.status.is_in_flight() || self.is_stopping()
    }
}

/// A runner registration as the forge lists it (GitHub `GET …/actions/runners`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerRegistration {
    pub id: u64,
    pub name: RunnerName,
    /// `status == "online"`: the runner's listener is connected.
    pub online: bool,
    /// The forge's `busy` flag. Seen to read false for up to a minute after a job started
    /// (BRIEF lesson 2), so it is one signal among several, never the verdict alone.
    pub busy: bool,
}

/// A parent job as Nomad has it, as far as dispatching to it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParentJob {
    Missing,
    NotParameterized,
    Parameterized {
        stopped: bool,
        /// `payload = "required"`: every dispatch without one is refused, and the daemon
        /// sends none.
        payload_required: bool,
        meta_required: BTreeSet<String>,
        meta_optional: BTreeSet<String>,
        /// Nomad's `JobModifyIndex`: moves whenever the job is registered anew, so a held
        /// dispatch can tell a parent that was changed from one that was only read again.
        modify_index: u64,
    },
}

/// The dispatch meta keys the daemon sends for a repo in `mode`, as the Nomad client writes
/// them (`DispatchMetaWire` in `clients/nomad/wire.rs`): `runner_token` goes with every runner
/// the daemon mints a credential for, which in `vault` mode it never does (the runner job
/// reads its admin token itself).
pub fn meta_sent(mode: &Mode) -> BTreeSet<&'static str> {
    let mut keys: BTreeSet<&'static str> = ["repo_url", "labels", "runner_name", "managed_by"]
        .into_iter()
        .collect();
    if !matches!(mode, Mode::Vault { .. }) {
        keys.insert("runner_token");
    }
    keys
}

/// What is wrong with dispatching `repo`'s runners to `parent`, one line each.
pub fn parent_problems(repo: &RepoConfig, parent: &str, job: &ParentJob) -> Vec<String> {
    let who = format!("{}: parent job {parent}", repo.repo);
    let (stopped, required, optional) = match job {
        ParentJob::Missing => {
            return vec![format!(
                "{who} does not exist in Nomad (in NOMAD_NAMESPACE): register it, or route the \
                 repo to a parent that exists"
            )];
        }
        ParentJob::NotParameterized => {
            return vec![format!(
                "{who} is not a parameterized job: give it a parameterized block, or it cannot \
                 be dispatched"
            )];
        }
        ParentJob::Parameterized {
            stopped,
            payload_required,
            meta_required,
            meta_optional,
            ..
        } => (*stopped, (*payload_required, meta_required), meta_optional),
    };
    let (payload_required, required) = required;
    let mut problems = Vec::new();
    if payload_required {
        problems.push(format!(
            "{who} requires a payload, which the daemon never sends: set payload = \"optional\" \
             or \"forbidden\" in its parameterized block, or Nomad refuses every dispatch"
        ));
    }
    if stopped {
        problems.push(format!(
            "{who} is stopped: Nomad refuses to dispatch it; run it again"
        ));
    }
    let sent = meta_sent(&repo.mode);
    let mode = repo.mode.as_str();
    for key in &sent {
        if !required.contains(*key) && !optional.contains(*key) {
            problems.push(format!(
                "{who} does not permit meta key {key}, which {mode} mode sends: add it to \
                 meta_required or meta_optional of its parameterized block, or Nomad refuses \
                 every dispatch (unpermitted metadata keys)"
            ));
        }
    }
    for key in required {
        if !sent.contains(key.as_str()) {
            problems.push(format!(
                "{who} requires meta key {key}, which {mode} mode never sends: remove it from \
                 meta_required (make it optional), or Nomad refuses every dispatch (required \
                 meta keys missing)"
            ));
        }
    }
    problems
}

/// Lists a parent job's children. Implemented by the Nomad client.
#[async_trait]
pub trait ChildSource: Send + Sync {
    /// All children of `parent` (ours and foreign) in one request.
    async fn list_children(&self, parent: &str) -> Result<Vec<Child>, PortError>;

    /// Every parent that has children of ours, whatever the document names: what a daemon
    /// started after an edit of the document (or a restart) needs to count and purge them.
    async fn parents_with_our_children(&self) -> Result<BTreeSet<String>, PortError>;

    /// How a dead child's runner ended: the exit code of the last task that reported one in
    /// a `Terminated` event of its allocation (the runner contract: 3 idle, 4 a credential
    /// already used). `None` when none did (it never started). Read once per dead child
    /// whose allocation failed.
    async fn runner_exit_code(&self, _child: &ChildId) -> Result<Option<i32>, PortError> {
        Ok(None)
    }

    /// The parent job `parent` as Nomad has it (in `namespace`, the repo's `nomadNamespace`;
    /// `None` for the runner namespace): one read, to see whether a dispatch held for a
    /// configuration error can go again. A source that cannot say answers an error, which
    /// keeps the hold.
    async fn read_parent(
        &self,
        parent: &str,
        _namespace: Option<&str>,
    ) -> Result<ParentJob, PortError> {
        Err(PortError::new(
            ErrorClass::Transient,
            format!("read parent job {parent}: this Nomad source cannot read parent jobs"),
        ))
    }
}

/// A fact the tick could not read. Whatever depends on it is held back this tick.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gap {
    pub class: ErrorClass,
    pub message: String,
}

impl From<PortError> for Gap {
    fn from(e: PortError) -> Gap {
        Gap {
            class: e.class,
            message: e.message,
        }
    }
}

/// Everything observed in one tick: plain data for the planner.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Per repo of the document: its jobs, or why they could not be read.
    pub repos: BTreeMap<RepoName, Result<RepoJobs, Gap>>,
    /// Repos whose queue was not polled this tick, with when their reading in `repos` was
    /// taken: shown, never dispatched for or reaped on.
    pub unpolled: BTreeMap<RepoName, DateTime<Utc>>,
    /// Per parent job listed: its children, or why they could not be listed.
    pub parents: BTreeMap<String, Result<Vec<Child>, Gap>>,
    /// `repo_url` meta value → repo, for every repo of the document.
    pub repo_urls: BTreeMap<String, RepoName>,
    /// Why the parents of our children could not be found from Nomad alone, as long as they
    /// never were since the daemon started: children of a parent the document no longer names
    /// may be missing from every count, so nothing is dispatched.
    pub undiscovered: Option<Gap>,
    /// Children whose runner's registration the daemon deleted (filled in by the loop), with
    /// when the delete had been answered by: no job comes to them any more.
    pub deregistered: BTreeMap<ChildId, DateTime<Utc>>,
}

/// A child attributed to its bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OurChild<'a> {
    pub child: &'a Child,
    pub repo: Option<RepoName>,
    pub labels: Option<LabelSet>,
}

impl Snapshot {
    /// Our children of every listed parent, attributed to a repo (by `repo_url`) and a label
    /// set (by `labels` meta) where those can be read.
    pub fn our_children(&self) -> impl Iterator<Item = OurChild<'_>> {
        self.our_listed_children().map(|child| OurChild {
            child,
            repo: self.repo_of(child).cloned(),
            labels: child
                .labels
                .as_deref()
                .and_then(|meta| LabelSet::from_meta(meta).ok()),
        })
    }

    /// Our children of every listed parent, in listing order, not yet attributed: for callers
    /// that attribute thousands of children and parse each distinct `labels` meta once.
    pub fn our_listed_children(&self) -> impl Iterator<Item = &Child> {
        self.parents
            .values()
            .filter_map(|listing| listing.as_ref().ok())
            .flatten()
            .filter(|child| child.ours)
    }

    /// The repo of the document a child's `repo_url` meta names, if any.
    pub fn repo_of(&self, child: &Child) -> Option<&RepoName> {
        child
            .repo_url
            .as_ref()
            .and_then(|url| self.repo_urls.get(url.trim_end_matches('/')))
    }

    /// The runner names of our in-flight children of `repo`.
    pub fn runner_names_of(&self, repo: &RepoName) -> BTreeSet<RunnerName> {
        self.our_children()
            .filter(|c| c.repo.as_ref() == Some(repo) && c.child.status.is_in_flight())
            .filter_map(|c| c.child.runner_name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigDefaults, parse_document};

    fn repo_of(document: &str) -> RepoConfig {
        let config = parse_document(document.as_bytes(), &ConfigDefaults::default()).unwrap();
        config.repos.into_values().next().unwrap()
    }

    fn parameterized(required: &[&str], optional: &[&str]) -> ParentJob {
        ParentJob::Parameterized {
            stopped: false,
            payload_required: false,
            meta_required: required.iter().map(|s| s.to_string()).collect(),
            meta_optional: optional.iter().map(|s| s.to_string()).collect(),
            modify_index: 7,
        }
    }

    #[test]
    fn vault_mode_sends_no_runner_token_and_the_others_do() {
        let app = repo_of(r#"{"o/a": {"mode": "app"}}"#);
        let vault = repo_of(
            r#"{"o/v": {"mode": "vault", "vaultPath": "p", "registerVaultPath": "r", "defaultJob": "j"}}"#,
        );
        assert!(meta_sent(&app.mode).contains("runner_token"));
        assert!(!meta_sent(&vault.mode).contains("runner_token"));
        let exact = parameterized(&["repo_url", "runner_name"], &["labels", "managed_by"]);
        assert_eq!(parent_problems(&vault, "j", &exact), Vec::<String>::new());
        // The same parent refuses an app repo's token: not permitted.
        let problems = parent_problems(&app, "ci-runner", &exact);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0]
                .starts_with("o/a: parent job ci-runner does not permit meta key runner_token"),
            "{problems:?}"
        );
        // A parent that requires a token a vault repo never sends.
        let token = parameterized(
            &["repo_url", "runner_name", "runner_token"],
            &["labels", "managed_by"],
        );
        let problems = parent_problems(&vault, "j", &token);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("requires meta key runner_token"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_missing_stopped_or_plain_parent_is_a_problem() {
        let app = repo_of(r#"{"o/a": {"mode": "app"}}"#);
        for job in [ParentJob::Missing, ParentJob::NotParameterized] {
            assert_eq!(parent_problems(&app, "ci-runner", &job).len(), 1, "{job:?}");
        }
        // A parent that takes every key app mode sends, stopped or wanting a payload.
        let taking_all = |stopped, payload_required| ParentJob::Parameterized {
            stopped,
            payload_required,
            meta_required: BTreeSet::new(),
            meta_optional: meta_sent(&app.mode)
                .into_iter()
                .map(str::to_string)
                .collect(),
            modify_index: 7,
        };
        for (job, problem) in [
            (taking_all(true, false), "is stopped"),
            (taking_all(false, true), "requires a payload"),
        ] {
            let problems = parent_problems(&app, "ci-runner", &job);
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(problems[0].contains(problem), "{problems:?}");
        }
        assert!(parent_problems(&app, "ci-runner", &taking_all(false, false)).is_empty());
    }
}
