//! The [`ChildSource`] side: a parent's children, listed across every namespace with their
//! meta and told ours from foreign ones; the parents our children belong to; how a runner
//! ended.
//!
//! Reads only: nothing here changes a job.

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::wire::{AllocStubWire, JobStubWire, JobSummaryWire, ParentOfWire, TaskGroupSummaryWire};
use super::{NomadClient, shown_child};
use crate::model::{ChildId, ErrorClass, MANAGED_BY, NOMAD_DEFAULT_NAMESPACE, RunnerName};
use crate::observe::{Child, ChildSource, ChildStatus, Placement, PortError};

/// Header carrying the token of the next page of a list response; absent on the last page.
const NEXT_TOKEN_HEADER: &str = "X-Nomad-NextToken";
/// A parent has at most a few dozen children; a listing that keeps paging past this is a
/// server bug or a loop, not a real answer.
const LIST_PAGES_MAX: usize = 50;
/// The `namespace` of the listings: every namespace the token may list jobs in.
const ALL_NAMESPACES: &str = "*";

/// Nomad's filter for the children the daemon dispatched (go-bexpr, evaluated by the server
/// on the full job): a dispatched child has a parent, and the marker comes with its meta.
const OUR_CHILDREN_FILTER: &str = "ParentID != \"\" and Meta[\"managed_by\"] == \"runner-scaler\"";

/// The exit code of the newest allocation's last `Terminated` task event. A prestart task
/// that exited 0 before the runner task ended is older, so the runner's code wins.
fn runner_exit_code(allocations: &[AllocStubWire]) -> Option<i32> {
    let newest = allocations.iter().max_by_key(|a| a.create_index)?;
    newest
        .task_states
        .iter()
        .flatten()
        .flat_map(|(_, task)| task.events.iter().flatten())
        .filter(|e| e.kind == "Terminated")
        .max_by_key(|e| e.time)
        .map(|e| e.exit_code)
}

pub(super) fn parse_status(raw: &str) -> Option<ChildStatus> {
    match raw {
        "pending" => Some(ChildStatus::Pending),
        "running" => Some(ChildStatus::Running),
        "dead" => Some(ChildStatus::Dead),
        _ => None,
    }
}

/// Placement from the job summary's allocation counts, summed over task groups.
fn placement_of(summary: Option<&JobSummaryWire>) -> Placement {
    let mut total = TaskGroupSummaryWire::default();
    for group in summary
        .and_then(|s| s.summary.as_ref())
        .into_iter()
        .flat_map(BTreeMap::values)
    {
        total.queued += group.queued;
        total.complete += group.complete;
        total.failed += group.failed;
        total.running += group.running;
        total.starting += group.starting;
        total.lost += group.lost;
        total.unknown += group.unknown;
    }
    // An allocation on a disconnected client may still run a runner: count it as placed, so
    // nothing treats that runner as absent.
    if total.starting + total.running + total.unknown > 0 {
        Placement::Placed
    } else if total.queued > 0 {
        Placement::Unplaced
    } else if total.failed > 0 && total.complete == 0 {
        Placement::Failed
    } else if total.complete + total.failed + total.lost > 0 {
        Placement::Finished
    } else {
        // No allocation ever: an evaluation that has not placed (or could not place) it.
        Placement::Unplaced
    }
}

/// True when `stub` is a child of `parent` and nothing else. A prefix listing for
/// `ci/dispatch-` also returns the children of a parent named `ci/dispatch-x` (their ids start
/// `ci/dispatch-x/dispatch-`), so the stub's `ParentID` must name the parent exactly; stubs of
/// Nomad versions without `ParentID` fall back to the id having no further `/`.
fn is_child_of(stub: &JobStubWire, parent: &str, prefix: &str) -> bool {
    let Some(rest) = stub.id.strip_prefix(prefix) else {
        return false;
    };
    if stub.parent_id.is_empty() {
        !rest.contains('/')
    } else {
        stub.parent_id == parent
    }
}

fn child_from_stub(parent: &str, stub: JobStubWire) -> Result<Child, String> {
    let status = parse_status(&stub.status)
        .ok_or_else(|| format!("child {}: unknown status {:?}", stub.id, stub.status))?;
    let meta = stub.meta.unwrap_or_default();
    Ok(Child {
        placement: placement_of(stub.job_summary.as_ref()),
        id: ChildId(
            stub.id,
            stub.namespace
                .filter(|ns| !ns.is_empty())
                .unwrap_or_else(|| NOMAD_DEFAULT_NAMESPACE.to_string()),
        ),
        parent: parent.to_string(),
        status,
        ours: meta.managed_by.as_deref() == Some(MANAGED_BY),
        repo_url: meta.repo_url,
        labels: meta.labels,
        runner_name: meta.runner_name.map(RunnerName),
        submitted_at: stub
            .submit_time
            .filter(|ns| *ns > 0)
            .map(DateTime::<Utc>::from_timestamp_nanos),
        placed_at: None,
    })
}

/// The children of `parent` among one page of stubs.
fn children_of(parent: &str, stubs: Vec<JobStubWire>) -> Result<Vec<Child>, String> {
    let prefix = dispatch_prefix(parent);
    let stubs: Vec<JobStubWire> = stubs
        .into_iter()
        .filter(|stub| is_child_of(stub, parent, &prefix))
        .collect();
    // Every child of a runner parent carries meta (the parent requires it). A listing in which
    // none does was answered without `meta=true`: a Nomad older than 1.4.3, or a proxy that
    // dropped the query. Our children cannot be told from foreign ones then, and reading them
    // all as foreign would stop counting them against the caps: fail closed instead.
    if !stubs.is_empty() && stubs.iter().all(|stub| stub.meta.is_none()) {
        return Err(format!(
            "{} child(ren) listed without any meta: Nomad 1.4.3 or later is needed for \
             meta=true (or a proxy dropped the query parameter), so our children cannot be \
             told from foreign ones",
            stubs.len()
        ));
    }
    stubs
        .into_iter()
        .map(|stub| child_from_stub(parent, stub))
        .collect()
}

fn dispatch_prefix(parent: &str) -> String {
    format!("{parent}/dispatch-")
}

#[async_trait]
impl ChildSource for NomadClient {
    /// The parent job `job` as Nomad has it (`GET /v1/job/<id>`): missing, not
    /// parameterized, or what its `ParameterizedJob` requires and permits. Only those fields
    /// are read: the full job may carry secrets in its meta. Asked by `config check --live`,
    /// and each poll for a parent whose dispatch is held for a configuration error.
    async fn read_parent(
        &self,
        job: &str,
        namespace: Option<&str>,
    ) -> Result<crate::observe::ParentJob, PortError> {
        self.read_parent_job(job, namespace).await
    }

    #[tracing::instrument(skip_all, fields(child = %child))]
    async fn runner_exit_code(&self, child: &ChildId) -> Result<Option<i32>, PortError> {
        let doing = format!("read how the runner of {} ended", shown_child(child));
        let request = self.request(
            reqwest::Method::GET,
            self.url(&["job", child.id(), "allocations"]),
            child.namespace(),
        );
        let response = self.send(&doing, request).await?;
        let allocations: Vec<AllocStubWire> = self.json(&doing, response).await?;
        Ok(runner_exit_code(&allocations))
    }

    #[tracing::instrument(skip_all)]
    async fn parents_with_our_children(&self) -> Result<BTreeSet<String>, PortError> {
        let doing = "list the parents of our children";
        let mut parents = BTreeSet::new();
        let mut next_token: Option<String> = None;
        for _ in 0..LIST_PAGES_MAX {
            let mut request = self
                .request(reqwest::Method::GET, self.url(&["jobs"]), ALL_NAMESPACES)
                .query(&[("filter", OUR_CHILDREN_FILTER)]);
            if let Some(token) = &next_token {
                request = request.query(&[("next_token", token.as_str())]);
            }
            let response = self.send(doing, request).await?;
            next_token = response
                .headers()
                .get(NEXT_TOKEN_HEADER)
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_string);
            let stubs: Vec<ParentOfWire> = self.json(doing, response).await?;
            parents.extend(
                stubs
                    .into_iter()
                    .map(|s| s.parent_id)
                    .filter(|p| !p.is_empty()),
            );
            if next_token.is_none() {
                return Ok(parents);
            }
        }
        Err(PortError::new(
            ErrorClass::Malformed,
            format!("{doing}: still paging after {LIST_PAGES_MAX} pages"),
        ))
    }

    #[tracing::instrument(skip_all, fields(parent = %parent))]
    async fn list_children(&self, parent: &str) -> Result<Vec<Child>, PortError> {
        let doing = format!("list children of {parent}");
        let prefix = dispatch_prefix(parent);
        let mut children = Vec::new();
        let mut next_token: Option<String> = None;
        for _ in 0..LIST_PAGES_MAX {
            let mut request = self
                .request(reqwest::Method::GET, self.url(&["jobs"]), ALL_NAMESPACES)
                .query(&[("prefix", prefix.as_str()), ("meta", "true")]);
            if let Some(token) = &next_token {
                request = request.query(&[("next_token", token.as_str())]);
            }
            let response = self.send(&doing, request).await?;
            next_token = response
                .headers()
                .get(NEXT_TOKEN_HEADER)
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_string);
            let stubs: Vec<JobStubWire> = self.json(&doing, response).await?;
            let missing_meta = !stubs.is_empty() && stubs.iter().all(|s| s.meta.is_none());
            children.extend(children_of(parent, stubs).map_err(|e| {
                // A Nomad without `meta=true` stays so: held like a configuration error,
                // reported once, retried slowly.
                let class = if missing_meta {
                    ErrorClass::Configuration
                } else {
                    ErrorClass::Malformed
                };
                PortError::new(class, format!("{doing}: {e}"))
            })?);
            if next_token.is_none() {
                return Ok(children);
            }
        }
        Err(PortError::new(
            ErrorClass::Malformed,
            format!("{doing}: still paging after {LIST_PAGES_MAX} pages"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::control::{ID_PREFIX_CHARS_MAX, id_prefix_of};
    use super::*;

    const LIST_JOBS_FULL_STUB: &str =
        include_str!("../../../tests/fixtures/nomad/list-jobs-full-stub.response.json");
    const LIST_JOBS: &str = include_str!("../../../tests/fixtures/nomad/list-jobs.response.json");

    #[test]
    fn the_runner_exit_code_is_the_newest_allocations_last_terminated_event() {
        let documented: Vec<AllocStubWire> = serde_json::from_str(include_str!(
            "../../../tests/fixtures/nomad/list-job-allocations.response.json"
        ))
        .unwrap();
        assert_eq!(
            runner_exit_code(&documented),
            None,
            "the example never ended"
        );
        let ended: Vec<AllocStubWire> = serde_json::from_value(serde_json::json!([
            { "ClientStatus": "failed", "CreateIndex": 7, "TaskStates": {
                "mint": { "Events": [ { "Type": "Terminated", "Time": 10, "ExitCode": 0 } ] },
                "runner": { "Events": [
                    { "Type": "Received", "Time": 5, "ExitCode": 0 },
                    { "Type": "Terminated", "Time": 20, "ExitCode": 3 }
                ] }
            } },
            { "ClientStatus": "failed", "CreateIndex": 3, "TaskStates": {
                "runner": { "Events": [ { "Type": "Terminated", "Time": 99, "ExitCode": 1 } ] }
            } }
        ]))
        .unwrap();
        assert_eq!(runner_exit_code(&ended), Some(3));
        assert_eq!(runner_exit_code(&[]), None);
    }

    fn stubs(body: &str) -> Vec<JobStubWire> {
        serde_json::from_str(body).expect("fixture parses as job stubs")
    }

    #[test]
    fn full_stub_fixture_parses_status_placement_and_submit_time() {
        let parsed = stubs(LIST_JOBS_FULL_STUB);
        assert_eq!(parsed.len(), 2);
        let countdash = &parsed[0];
        assert_eq!(countdash.id, "countdash");
        assert_eq!(parse_status(&countdash.status), Some(ChildStatus::Pending));
        assert_eq!(
            placement_of(countdash.job_summary.as_ref()),
            Placement::Unplaced
        );
        assert_eq!(countdash.submit_time, Some(1645230445788556000));
        assert!(countdash.meta.is_none());
        let example = &parsed[1];
        assert_eq!(parse_status(&example.status), Some(ChildStatus::Running));
        assert_eq!(
            placement_of(example.job_summary.as_ref()),
            Placement::Placed
        );
    }

    #[test]
    fn reduced_stub_fixture_parses() {
        let parsed = stubs(LIST_JOBS);
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].submit_time, None);
        // Queued 1 and Complete 1, nothing running: not placed.
        assert_eq!(
            placement_of(parsed[0].job_summary.as_ref()),
            Placement::Unplaced
        );
    }

    /// The fixture's first stub re-addressed as a child of `parent`, with `meta`.
    fn child_stub(id: &str, parent: &str, meta: serde_json::Value) -> serde_json::Value {
        let mut stub: Vec<serde_json::Value> = serde_json::from_str(LIST_JOBS_FULL_STUB).unwrap();
        let mut stub = stub.remove(0);
        stub["ID"] = id.into();
        stub["ParentID"] = parent.into();
        stub["Meta"] = meta;
        stub
    }

    #[test]
    fn children_keep_only_the_meta_the_daemon_reads() {
        let body = serde_json::json!([child_stub(
            "ci-runner/dispatch-1700000000-0a1b2c3d",
            "ci-runner",
            serde_json::json!({
                "repo_url": "https://github.com/acme/api",
                "labels": "linux,self-hosted",
                "runner_name": "ci-runner-3f9c2a1b7d04",
                "managed_by": "runner-scaler",
                "runner_token": "CANARY-TOKEN-VALUE",
            }),
        )]);
        let children = children_of("ci-runner", stubs(&body.to_string())).unwrap();
        assert_eq!(children.len(), 1);
        let child = &children[0];
        assert!(child.ours);
        assert_eq!(
            child.repo_url.as_deref(),
            Some("https://github.com/acme/api")
        );
        assert_eq!(child.labels.as_deref(), Some("linux,self-hosted"));
        assert_eq!(
            child.runner_name,
            Some(RunnerName("ci-runner-3f9c2a1b7d04".into()))
        );
        assert_eq!(
            child.submitted_at.unwrap().timestamp_nanos_opt(),
            Some(1645230445788556000)
        );
        assert!(!format!("{children:?}").contains("CANARY"));
    }

    /// Nomad reads a stopped job `dead` as soon as its allocation is told to stop; the job
    /// summary counts that allocation running until the client reports the task ended.
    #[test]
    fn a_dead_child_whose_summary_still_counts_a_running_allocation_is_stopping() {
        let mut stub = child_stub(
            "ci-runner/dispatch-1700000000-0a1b2c3d",
            "ci-runner",
            serde_json::json!({ "managed_by": "runner-scaler" }),
        );
        stub["Status"] = "dead".into();
        stub["JobSummary"]["Summary"] = serde_json::json!({
            "runner": { "Queued": 0, "Complete": 0, "Failed": 0, "Running": 1,
                        "Starting": 0, "Lost": 0, "Unknown": 0 }
        });
        let stopping = children_of("ci-runner", stubs(&serde_json::json!([stub]).to_string()))
            .unwrap()
            .remove(0);
        assert_eq!(stopping.status, ChildStatus::Dead);
        assert!(stopping.is_stopping() && stopping.holds_slot());
        stub["JobSummary"]["Summary"]["runner"]["Running"] = 0.into();
        stub["JobSummary"]["Summary"]["runner"]["Complete"] = 1.into();
        let ended = children_of("ci-runner", stubs(&serde_json::json!([stub]).to_string()))
            .unwrap()
            .remove(0);
        assert!(!ended.is_stopping() && !ended.holds_slot());
    }

    #[test]
    fn a_listing_without_any_meta_is_a_gap_not_foreign_children() {
        // The full-stub fixture re-addressed as children, with `Meta` dropped as a Nomad
        // older than 1.4.3 (or a proxy stripping `meta=true`) answers.
        let mut bare = child_stub("ci/dispatch-1-aaaaaaaa", "ci", serde_json::json!({}));
        bare.as_object_mut().unwrap().remove("Meta");
        let body = serde_json::json!([bare.clone(), bare]);
        let problem = children_of("ci", stubs(&body.to_string())).unwrap_err();
        assert!(problem.contains("1.4.3"), "{problem}");

        // One child with meta among bare ones: the listing did carry meta; the bare one is a
        // foreign child dispatched by hand.
        let mut bare = child_stub("ci/dispatch-1-aaaaaaaa", "ci", serde_json::json!({}));
        bare.as_object_mut().unwrap().remove("Meta");
        let ours = child_stub(
            "ci/dispatch-2-bbbbbbbb",
            "ci",
            serde_json::json!({"managed_by": "runner-scaler"}),
        );
        let children = children_of("ci", stubs(&serde_json::json!([bare, ours]).to_string()))
            .expect("a listing with meta");
        assert_eq!(
            children.iter().map(|c| c.ours).collect::<Vec<_>>(),
            [false, true]
        );
        assert!(children_of("ci", Vec::new()).unwrap().is_empty());
    }

    #[test]
    fn children_of_a_similarly_named_parent_are_not_ours() {
        let body = serde_json::json!([
            child_stub("ci/dispatch-1-aaaaaaaa", "ci", serde_json::json!({})),
            child_stub(
                "ci/dispatch-x/dispatch-1-bbbbbbbb",
                "ci/dispatch-x",
                serde_json::json!({})
            ),
        ]);
        let children = children_of("ci", stubs(&body.to_string())).unwrap();
        let ids: Vec<&str> = children.iter().map(|c| c.id.0.as_str()).collect();
        assert_eq!(ids, ["ci/dispatch-1-aaaaaaaa"]);
        assert!(!children[0].ours);
    }

    #[test]
    fn placement_follows_the_summary() {
        let summary = |groups: serde_json::Value| -> JobSummaryWire {
            serde_json::from_value(serde_json::json!({ "Summary": groups })).unwrap()
        };
        let cases = [
            (serde_json::json!({}), Placement::Unplaced),
            (serde_json::json!({"r": {"Queued": 1}}), Placement::Unplaced),
            (serde_json::json!({"r": {"Starting": 1}}), Placement::Placed),
            (
                serde_json::json!({"r": {"Queued": 1}, "s": {"Running": 1}}),
                Placement::Placed,
            ),
            (serde_json::json!({"r": {"Failed": 1}}), Placement::Failed),
            (
                serde_json::json!({"r": {"Failed": 1, "Complete": 1}}),
                Placement::Finished,
            ),
            (
                serde_json::json!({"r": {"Complete": 1, "Lost": 1}}),
                Placement::Finished,
            ),
            (serde_json::json!({"r": {"Unknown": 1}}), Placement::Placed),
        ];
        for (groups, expected) in cases {
            assert_eq!(
                placement_of(Some(&summary(groups.clone()))),
                expected,
                "{groups}"
            );
        }
        assert_eq!(placement_of(None), Placement::Unplaced);
    }

    #[test]
    fn the_id_prefix_is_the_repo_in_a_form_nomad_ids_and_the_listing_take() {
        assert_eq!(id_prefix_of("https://github.com/acme/api"), "acme-api");
        assert_eq!(
            id_prefix_of("https://code.example/Ev-The-Dev/my_repo.rs/"),
            "ev-the-dev-my-repo-rs"
        );
        assert_eq!(id_prefix_of("weird"), "weird");
        assert_eq!(id_prefix_of("https://github.com/--/__"), "");
        let long = id_prefix_of(&format!("https://github.com/acme/{}", "a".repeat(100)));
        assert!(long.len() <= ID_PREFIX_CHARS_MAX, "{long}");
        assert!(!long.ends_with('-'));
        // A child id carrying the prefix is still a child of its parent, with or without
        // `ParentID` on the stub.
        let id = format!(
            "ci/dispatch-{}-1700000000-0a1b2c3d",
            id_prefix_of("https://github.com/acme/api")
        );
        let mut stub = child_stub(
            &id,
            "ci",
            serde_json::json!({"managed_by": "runner-scaler"}),
        );
        assert_eq!(
            children_of("ci", stubs(&serde_json::json!([stub.clone()]).to_string()))
                .unwrap()
                .len(),
            1
        );
        stub["ParentID"] = "".into();
        assert_eq!(
            children_of("ci", stubs(&serde_json::json!([stub]).to_string()))
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn children_carry_the_namespace_of_their_stub() {
        let mut stub = child_stub(
            "ci/dispatch-1-aaaaaaaa",
            "ci",
            serde_json::json!({"managed_by": "runner-scaler"}),
        );
        stub["Namespace"] = "ci-runners-vault".into();
        let children = children_of("ci", stubs(&serde_json::json!([stub]).to_string())).unwrap();
        assert_eq!(
            children[0].id,
            ChildId::new("ci/dispatch-1-aaaaaaaa", "ci-runners-vault")
        );
    }
}
