//! The Nomad client: lists a parent job's children, dispatches, re-reads and purges them.
//!
//! Wire types stay in this file. The listing asks for `meta=true`, so Nomad hands back every
//! dispatch meta key, including the `runner_token` the daemon passed in (BRIEF lesson 9): the
//! wire type of a job's meta has fields for the four keys the daemon reads and nothing else,
//! so serde skips every other key without ever storing it.
//!
//! Namespaces: children are listed across all of them (`namespace=*`), so every child of
//! ours is found whatever the document says, and each one carries its namespace, to which
//! its reads, stop and purge go. Dispatches go to the repo's namespace (`nomadNamespace`),
//! else to `--runner-namespace`.
//!
//! `NOMAD_ADDR` may be `unix:///path/api.sock`, the task API socket Nomad (1.5 or later)
//! gives a task with a workload identity; requests then go over that socket.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use url::Url;

use crate::act::{ChildControl, DispatchRequest, Dispatched};
use crate::clients::http::{
    TlsFiles, class_of_status, client_builder, redirect_refused, transport_error,
    transport_error_at,
};
use crate::model::{ChildId, ErrorClass, MANAGED_BY, NOMAD_DEFAULT_NAMESPACE, RunnerName};
use crate::observe::{Child, ChildSource, ChildStatus, Placement, PortError};

/// The header Nomad reads the ACL token from.
const TOKEN_HEADER: &str = "X-Nomad-Token";
/// Header carrying the token of the next page of a list response; absent on the last page.
const NEXT_TOKEN_HEADER: &str = "X-Nomad-NextToken";
/// A parent has at most a few dozen children; a listing that keeps paging past this is a
/// server bug or a loop, not a real answer.
const LIST_PAGES_MAX: usize = 50;
/// Nomad's error bodies are one line of text; anything longer is cut before it reaches a log.
const ERROR_BODY_CHARS_MAX: usize = 300;

/// Substrings of the plain-text 500s Nomad returns when it refuses a dispatch for reasons of
/// configuration (nomad/job_endpoint.go `Dispatch` and `validateDispatchRequest`). They may
/// arrive prefixed with `rpc error: ` when the agent forwards the request, so match anywhere.
const DISPATCH_CONFIGURATION_ERRORS: &[&str] = &[
    "parameterized job not found",
    "is not a parameterized job",
    "is stopped",
    "Dispatch request included unpermitted metadata keys",
    "Dispatch did not provide required meta keys",
    "Payload is not provided but required",
    "Payload provided but forbidden",
    "Payload exceeds maximum size",
    "missing parameterized job ID",
    "Duplicate key",
    "dispatch job priority must be between",
];

/// Where and how to reach Nomad: `NOMAD_ADDR`, `NOMAD_TOKEN`, `NOMAD_REGION`,
/// `NOMAD_CACERT`, `NOMAD_CLIENT_CERT`, `NOMAD_CLIENT_KEY`, and `--runner-namespace`.
#[derive(Clone, Debug)]
pub struct NomadSettings {
    /// `http(s)://…`, or `unix:///path` for Nomad's task API socket.
    pub addr: Url,
    pub token: Option<SecretString>,
    /// Where the parents of a repo that names no `nomadNamespace` live (`--runner-namespace`);
    /// Nomad's `default` namespace when `None`. Never `NOMAD_NAMESPACE`: Nomad sets that in
    /// every task to the task's own namespace, the daemon's, not its runners'.
    pub namespace: Option<String>,
    /// Sent as `?region=` on every call; the agent's own region when `None`.
    pub region: Option<String>,
    pub tls: TlsFiles,
}

impl NomadSettings {
    /// Settings for `addr` with no token, namespace, region or TLS files.
    pub fn new(addr: Url) -> NomadSettings {
        NomadSettings {
            addr,
            token: None,
            namespace: None,
            region: None,
            tls: TlsFiles::default(),
        }
    }
}

/// A typed client of the Nomad HTTP API, for the calls the daemon makes.
#[derive(Clone)]
pub struct NomadClient {
    http: reqwest::Client,
    settings: NomadSettings,
    /// Where requests go: `addr`, or for a Unix socket a stand-in origin the socket ignores.
    base: Url,
    /// The socket's path when `addr` is `unix://…`, named in transport errors.
    socket: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for NomadClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NomadClient")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

// ---- wire types: `GET /v1/jobs` stubs ----

#[derive(Deserialize)]
struct JobStubWire {
    #[serde(rename = "ID")]
    id: String,
    #[serde(rename = "ParentID", default)]
    parent_id: String,
    #[serde(rename = "Status")]
    status: String,
    #[serde(rename = "JobSummary", default)]
    job_summary: Option<JobSummaryWire>,
    /// Nanoseconds since the Unix epoch.
    #[serde(rename = "SubmitTime", default)]
    submit_time: Option<i64>,
    #[serde(rename = "Meta", default)]
    meta: Option<ChildMetaWire>,
    /// Present on every stub; a Nomad without namespaces (before 1.0 open source) has only
    /// `default`.
    #[serde(rename = "Namespace", default)]
    namespace: Option<String>,
}

#[derive(Deserialize)]
struct JobSummaryWire {
    #[serde(rename = "Summary", default)]
    summary: Option<BTreeMap<String, TaskGroupSummaryWire>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TaskGroupSummaryWire {
    #[serde(rename = "Queued")]
    queued: u64,
    #[serde(rename = "Complete")]
    complete: u64,
    #[serde(rename = "Failed")]
    failed: u64,
    #[serde(rename = "Running")]
    running: u64,
    #[serde(rename = "Starting")]
    starting: u64,
    #[serde(rename = "Lost")]
    lost: u64,
    /// Allocations on a disconnected client (Nomad ≥ 1.3).
    #[serde(rename = "Unknown")]
    unknown: u64,
}

/// The only dispatch meta keys the daemon reads. There is deliberately no field for
/// `runner_token` or any other key: serde skips unknown keys without keeping their values.
#[derive(Deserialize, Default)]
#[serde(default)]
struct ChildMetaWire {
    repo_url: Option<String>,
    labels: Option<String>,
    runner_name: Option<String>,
    managed_by: Option<String>,
}

// ---- wire types: dispatch ----

#[derive(Serialize)]
struct DispatchBodyWire<'a> {
    #[serde(rename = "Meta")]
    meta: DispatchMetaWire<'a>,
    /// Put by Nomad (1.4.2 or later) between `dispatch-` and the time in the child's id, so an
    /// operator reads the repo off `nomad job status`. An older Nomad decodes the body without
    /// refusing unknown fields (`decodeBody` in command/agent/http.go) and ignores it: the id
    /// keeps its plain form, which the daemon recognises the same way.
    #[serde(rename = "IdPrefixTemplate", skip_serializing_if = "str::is_empty")]
    id_prefix_template: &'a str,
}

/// Borrowed for the one serialisation of the request body; never `Debug`.
#[derive(Serialize)]
struct DispatchMetaWire<'a> {
    repo_url: &'a str,
    labels: &'a str,
    runner_name: &'a str,
    managed_by: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    runner_token: Option<&'a str>,
}

#[derive(Deserialize)]
struct DispatchResponseWire {
    #[serde(rename = "DispatchedJobID")]
    dispatched_job_id: String,
    #[serde(rename = "EvalID", default)]
    eval_id: String,
    #[serde(rename = "EvalCreateIndex", default)]
    eval_create_index: u64,
}

// ---- wire types: allocations of a job ----

#[derive(Deserialize)]
struct AllocStubWire {
    #[serde(rename = "ClientStatus")]
    client_status: String,
    #[serde(rename = "CreateIndex", default)]
    create_index: u64,
    #[serde(rename = "TaskStates", default)]
    task_states: Option<BTreeMap<String, TaskStateWire>>,
}

#[derive(Deserialize)]
struct TaskStateWire {
    #[serde(rename = "Events", default)]
    events: Option<Vec<TaskEventWire>>,
}

#[derive(Deserialize)]
struct TaskEventWire {
    #[serde(rename = "Type", default)]
    kind: String,
    #[serde(rename = "Time", default)]
    time: i64,
    #[serde(rename = "ExitCode", default)]
    exit_code: i32,
}

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

/// Terminal client statuses of an allocation (API-CONTRACTS: complete, failed, lost). Any
/// other, `unknown` (a disconnected client) and statuses a newer Nomad may add included,
/// may still run a runner.
fn allocation_is_live(client_status: &str) -> bool {
    !matches!(client_status, "complete" | "failed" | "lost")
}

// ---- wire types: read job ----

#[derive(Deserialize)]
struct JobWire {
    #[serde(rename = "Status")]
    status: String,
}

fn parse_status(raw: &str) -> Option<ChildStatus> {
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

/// Longest `IdPrefixTemplate` sent: the repo is for reading, the time and random suffix keep
/// the id unique.
const ID_PREFIX_CHARS_MAX: usize = 40;

/// The repo of `repo_url` as a piece of a Nomad job id: `acme-api` for
/// `https://github.com/acme/api`. Only `[a-z0-9-]`, so the child id has no `/` after
/// `dispatch-` (the listing's fallback for stubs without `ParentID` relies on that) and
/// nothing that needs escaping in a URL or a shell.
fn id_prefix_of(repo_url: &str) -> String {
    let mut prefix = String::new();
    for c in repo_of(repo_url).chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            prefix.push(c);
        } else if !prefix.is_empty() && !prefix.ends_with('-') {
            prefix.push('-');
        }
        if prefix.len() >= ID_PREFIX_CHARS_MAX {
            break;
        }
    }
    prefix.trim_end_matches('-').to_string()
}

/// Classifies a Nomad error response. Nomad answers dispatch validation failures with HTTP
/// 500 and a plain-text message (BRIEF lesson 10): those are configuration errors that no
/// retry fixes; any other 500 is transient.
fn class_of_response(status: StatusCode, body: &str) -> ErrorClass {
    match status.as_u16() {
        400 => ErrorClass::Configuration,
        403 => ErrorClass::Forbidden,
        500 if DISPATCH_CONFIGURATION_ERRORS
            .iter()
            .any(|needle| body.contains(needle)) =>
        {
            ErrorClass::Configuration
        }
        _ => class_of_status(status),
    }
}

/// Nomad's error text, one line, cut short, with control characters removed so that a body
/// cannot forge log lines.
fn shown_body(status: StatusCode, body: &str) -> String {
    let mut shown: String = body
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(ERROR_BODY_CHARS_MAX)
        .collect();
    if body.trim().chars().count() > ERROR_BODY_CHARS_MAX {
        shown.push('…');
    }
    if shown.is_empty() {
        shown = status.canonical_reason().unwrap_or("").to_string();
    }
    format!("{} {shown}", status.as_u16())
}

/// `acme/api` from `https://github.com/acme/api`, for error messages; the URL itself if it
/// has no such path.
fn repo_of(repo_url: &str) -> String {
    let segments: Vec<&str> = repo_url.trim_end_matches('/').rsplit('/').take(2).collect();
    match segments.as_slice() {
        [name, owner] if !name.is_empty() && !owner.is_empty() && !owner.contains(':') => {
            format!("{owner}/{name}")
        }
        _ => repo_url.to_string(),
    }
}

/// The socket of a `unix:///path` address: an absolute path, no host.
fn unix_socket_path(addr: &Url) -> Result<std::path::PathBuf, String> {
    let path = addr.path();
    if addr.host_str().is_some_and(|h| !h.is_empty()) || !path.starts_with('/') || path == "/" {
        return Err(format!(
            "NOMAD_ADDR {addr} does not name a socket by its absolute path \
             (unix:///path/to/api.sock)"
        ));
    }
    Ok(std::path::PathBuf::from(path))
}

impl NomadClient {
    /// Builds the client; fails when the address is neither an http(s) URL nor a `unix:///`
    /// socket path, or the TLS files cannot be read.
    pub fn new(settings: NomadSettings, timeout: Duration) -> Result<NomadClient, String> {
        let builder = client_builder("Nomad", &settings.tls, timeout)?;
        let (builder, base, socket) = match settings.addr.scheme() {
            "http" | "https" if !settings.addr.cannot_be_a_base() => {
                (builder, settings.addr.clone(), None)
            }
            "unix" => {
                let path = unix_socket_path(&settings.addr)?;
                // The socket answers whatever the Host; the origin only shapes the requests.
                let base = Url::parse("http://localhost/").expect("a valid URL");
                (builder.unix_socket(path.as_path()), base, Some(path))
            }
            _ => {
                return Err(format!(
                    "NOMAD_ADDR {} is not an http://, https:// or unix:// address",
                    settings.addr
                ));
            }
        };
        let http = builder
            .build()
            .map_err(|e| format!("build Nomad HTTP client: {e}"))?;
        Ok(NomadClient {
            http,
            settings,
            base,
            socket,
        })
    }

    /// Where a dispatch goes when the request names no namespace.
    fn default_namespace(&self) -> &str {
        self.settings
            .namespace
            .as_deref()
            .unwrap_or(NOMAD_DEFAULT_NAMESPACE)
    }

    pub fn settings(&self) -> &NomadSettings {
        &self.settings
    }

    /// `<addr>/v1/<segments…>`, each segment path-escaped (a child id's `/` becomes `%2F`).
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        {
            let mut path = url
                .path_segments_mut()
                .expect("checked in NomadClient::new: an http(s) URL has a path");
            path.pop_if_empty().push("v1");
            for segment in segments {
                path.push(segment);
            }
        }
        url
    }

    /// A request with the token header and the namespace and region parameters: `*` lists
    /// across every namespace the token may see.
    fn request(
        &self,
        method: reqwest::Method,
        url: Url,
        namespace: &str,
    ) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .request(method, url)
            .query(&[("namespace", namespace)]);
        if let Some(token) = &self.settings.token {
            request = request.header(TOKEN_HEADER, token.expose_secret());
        }
        if let Some(region) = &self.settings.region {
            request = request.query(&[("region", region)]);
        }
        request
    }

    /// Sends `request`; a non-2xx status becomes a classified error naming `doing`.
    async fn send(
        &self,
        doing: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, PortError> {
        let response = request.send().await;
        crate::metrics::count_request(
            crate::metrics::Service::Nomad,
            response.as_ref().ok().map(|r| r.status().as_u16()),
        );
        let response = response.map_err(|e| self.transport_error(doing, &e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        if status.is_redirection() {
            return Err(redirect_refused("Nomad", doing, status));
        }
        let body = response.text().await.unwrap_or_default();
        Err(PortError::new(
            class_of_response(status, &body),
            format!("{doing}: {}", shown_body(status, &body)),
        ))
    }

    fn transport_error(&self, doing: &str, e: &reqwest::Error) -> PortError {
        match &self.socket {
            Some(path) => transport_error_at(
                "Nomad",
                &format!("unix socket {}", path.display()),
                doing,
                e,
            ),
            None => transport_error("Nomad", doing, e),
        }
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        doing: &str,
        response: reqwest::Response,
    ) -> Result<T, PortError> {
        let bytes = response
            .bytes()
            .await
            .map_err(|e| self.transport_error(doing, &e))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: unreadable response: {e}"),
            )
        })
    }
}

/// The `namespace` of the listings: every namespace the token may list jobs in.
const ALL_NAMESPACES: &str = "*";

/// `<id> in namespace <ns>`, what an operator needs for `nomad job status -namespace`.
fn shown_child(child: &ChildId) -> String {
    format!("{} in namespace {}", child.id(), child.namespace())
}

/// Nomad's filter for the children the daemon dispatched (go-bexpr, evaluated by the server
/// on the full job): a dispatched child has a parent, and the marker comes with its meta.
const OUR_CHILDREN_FILTER: &str = "ParentID != \"\" and Meta[\"managed_by\"] == \"runner-scaler\"";

#[derive(Deserialize)]
struct ParentOfWire {
    #[serde(rename = "ParentID", default)]
    parent_id: String,
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
        use crate::observe::ParentJob;
        #[derive(Deserialize)]
        struct ParentWire {
            #[serde(rename = "Stop", default)]
            stop: bool,
            #[serde(rename = "JobModifyIndex", default)]
            modify_index: u64,
            #[serde(rename = "ParameterizedJob", default)]
            parameterized: Option<ParameterizedWire>,
        }
        #[derive(Deserialize)]
        struct ParameterizedWire {
            #[serde(rename = "Payload", default)]
            payload: Option<String>,
            #[serde(rename = "MetaRequired", default)]
            meta_required: Option<Vec<String>>,
            #[serde(rename = "MetaOptional", default)]
            meta_optional: Option<Vec<String>>,
        }
        let namespace = namespace.unwrap_or_else(|| self.default_namespace());
        let doing = format!("read parent job {job} in namespace {namespace}");
        let request = self.request(reqwest::Method::GET, self.url(&["job", job]), namespace);
        let response = match self.send(&doing, request).await {
            Ok(response) => response,
            Err(e) if e.class == ErrorClass::NotFound => return Ok(ParentJob::Missing),
            Err(e) => return Err(e),
        };
        let wire: ParentWire = self.json(&doing, response).await?;
        Ok(match wire.parameterized {
            None => ParentJob::NotParameterized,
            Some(spec) => ParentJob::Parameterized {
                stopped: wire.stop,
                payload_required: spec.payload.as_deref() == Some("required"),
                meta_required: spec.meta_required.unwrap_or_default().into_iter().collect(),
                meta_optional: spec.meta_optional.unwrap_or_default().into_iter().collect(),
                modify_index: wire.modify_index,
            },
        })
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

#[async_trait]
impl ChildControl for NomadClient {
    #[tracing::instrument(skip_all, fields(parent = %request.parent))]
    async fn dispatch(&self, request: &DispatchRequest) -> Result<Dispatched, PortError> {
        let meta = &request.meta;
        let namespace = request
            .namespace
            .as_deref()
            .unwrap_or_else(|| self.default_namespace());
        let doing = format!(
            "dispatch {} in namespace {namespace} for {}",
            request.parent,
            repo_of(&meta.repo_url)
        );
        let id_prefix_template = id_prefix_of(&meta.repo_url);
        let body = DispatchBodyWire {
            id_prefix_template: &id_prefix_template,
            meta: DispatchMetaWire {
                repo_url: &meta.repo_url,
                labels: &meta.labels,
                runner_name: &meta.runner_name.0,
                managed_by: MANAGED_BY,
                runner_token: meta
                    .runner_token
                    .as_ref()
                    .map(|token| token.expose_secret()),
            },
        };
        let http_request = self
            .request(
                reqwest::Method::POST,
                self.url(&["job", &request.parent, "dispatch"]),
                namespace,
            )
            .query(&[("idempotency_token", request.idempotency_token.as_str())])
            .json(&body);
        let response = self.send(&doing, http_request).await?;
        let reply: DispatchResponseWire = self.json(&doing, response).await?;
        if reply.dispatched_job_id.is_empty() {
            return Err(PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: response names no dispatched job"),
            ));
        }
        // Nomad answers a token it has seen (on a child not yet garbage-collected) with the
        // existing child and returns before creating an evaluation: EvalID stays "" and
        // EvalCreateIndex 0. A new dispatch of a non-periodic parent always creates one. (A
        // periodic parameterized parent creates no eval either; runner parents never are.)
        let deduplicated = reply.eval_id.is_empty() && reply.eval_create_index == 0;
        Ok(Dispatched {
            child: ChildId(reply.dispatched_job_id, namespace.to_string()),
            deduplicated,
        })
    }

    #[tracing::instrument(skip_all, fields(child = %child))]
    async fn child_status(&self, child: &ChildId) -> Result<Option<ChildStatus>, PortError> {
        let doing = format!("read child {}", shown_child(child));
        let request = self.request(
            reqwest::Method::GET,
            self.url(&["job", child.id()]),
            child.namespace(),
        );
        let response = match self.send(&doing, request).await {
            Ok(response) => response,
            // `job not found`: purged or garbage-collected, i.e. gone.
            Err(e) if e.class == ErrorClass::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        // The full job carries every meta key, secrets included; only `Status` is read.
        let job: JobWire = self.json(&doing, response).await?;
        parse_status(&job.status).map(Some).ok_or_else(|| {
            PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: unknown status {:?}", job.status),
            )
        })
    }

    #[tracing::instrument(skip_all, fields(child = %child))]
    async fn purge(&self, child: &ChildId) -> Result<(), PortError> {
        let doing = format!("purge child {}", shown_child(child));
        let request = self
            .request(
                reqwest::Method::DELETE,
                self.url(&["job", child.id()]),
                child.namespace(),
            )
            .query(&[("purge", "true")]);
        self.send(&doing, request).await?;
        Ok(())
    }

    #[tracing::instrument(skip_all, fields(child = %child))]
    async fn has_live_allocation(&self, child: &ChildId) -> Result<bool, PortError> {
        let doing = format!("read allocations of {}", shown_child(child));
        let request = self.request(
            reqwest::Method::GET,
            self.url(&["job", child.id(), "allocations"]),
            child.namespace(),
        );
        let response = self.send(&doing, request).await?;
        let allocations: Vec<AllocStubWire> = self.json(&doing, response).await?;
        Ok(allocations
            .iter()
            .any(|a| allocation_is_live(&a.client_status)))
    }

    #[tracing::instrument(skip_all, fields(child = %child))]
    async fn stop(&self, child: &ChildId) -> Result<(), PortError> {
        let doing = format!("stop child {}", shown_child(child));
        let request = self.request(
            reqwest::Method::DELETE,
            self.url(&["job", child.id()]),
            child.namespace(),
        );
        self.send(&doing, request).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST_JOBS_FULL_STUB: &str =
        include_str!("../../tests/fixtures/nomad/list-jobs-full-stub.response.json");
    const LIST_JOBS: &str = include_str!("../../tests/fixtures/nomad/list-jobs.response.json");

    #[test]
    fn the_runner_exit_code_is_the_newest_allocations_last_terminated_event() {
        let documented: Vec<AllocStubWire> = serde_json::from_str(include_str!(
            "../../tests/fixtures/nomad/list-job-allocations.response.json"
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
    fn dispatch_validation_500s_are_configuration_errors() {
        let server_error = StatusCode::INTERNAL_SERVER_ERROR;
        for body in [
            "parameterized job not found",
            "rpc error: parameterized job not found",
            "Specified job \"ci\" is not a parameterized job",
            "Specified job \"ci\" is stopped",
            "Dispatch request included unpermitted metadata keys: [foo]",
            "Dispatch did not provide required meta keys: [runner_token]",
            "Payload is not provided but required by parameterized job",
        ] {
            assert_eq!(
                class_of_response(server_error, body),
                ErrorClass::Configuration,
                "{body}"
            );
        }
        assert_eq!(
            class_of_response(server_error, "No cluster leader"),
            ErrorClass::Transient
        );
        assert_eq!(
            class_of_response(StatusCode::FORBIDDEN, "Permission denied"),
            ErrorClass::Forbidden
        );
        assert_eq!(
            class_of_response(StatusCode::BAD_REQUEST, "Job ID does not match"),
            ErrorClass::Configuration
        );
    }

    #[test]
    fn error_bodies_are_one_short_line() {
        let shown = shown_body(StatusCode::INTERNAL_SERVER_ERROR, "line\nforged\x1b[0m");
        assert_eq!(shown, "500 line forged [0m");
        let long = "x".repeat(1000);
        assert!(
            shown_body(StatusCode::INTERNAL_SERVER_ERROR, &long)
                .chars()
                .count()
                < 320
        );
        assert_eq!(shown_body(StatusCode::BAD_GATEWAY, ""), "502 Bad Gateway");
    }

    #[test]
    fn only_http_addresses_are_accepted() {
        let client = |addr: &str| {
            NomadClient::new(
                NomadSettings::new(addr.parse().unwrap()),
                Duration::from_secs(1),
            )
        };
        assert!(client("mailto:ops@example.com").is_err());
        let socket = client("unix:///secrets/api.sock").unwrap();
        assert_eq!(
            socket.socket.as_deref(),
            Some(std::path::Path::new("/secrets/api.sock"))
        );
        assert_eq!(
            socket.url(&["jobs"]).as_str(),
            "http://localhost/v1/jobs",
            "the socket ignores the origin; only the path travels"
        );
        for relative in ["unix://secrets/api.sock", "unix:///"] {
            let error = client(relative).unwrap_err();
            assert!(error.contains("absolute path"), "{relative}: {error}");
        }
        let base = client("https://nomad.example:4646/prefix/").unwrap();
        assert_eq!(
            base.url(&["job", "ci/dispatch-1-a"]).as_str(),
            "https://nomad.example:4646/prefix/v1/job/ci%2Fdispatch-1-a"
        );
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

    #[test]
    fn repo_of_names_owner_and_repo() {
        assert_eq!(repo_of("https://github.com/acme/api"), "acme/api");
        assert_eq!(repo_of("https://github.com/acme/api/"), "acme/api");
        assert_eq!(repo_of("weird"), "weird");
    }
}
