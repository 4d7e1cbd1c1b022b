//! The [`ChildControl`] side: dispatch a child (with an idempotency token and the runner's
//! meta), and stop, purge and re-read the children the act step hands back.
//!
//! The only file that changes anything in Nomad.

use async_trait::async_trait;
use secrecy::ExposeSecret;

use super::children::parse_status;
use super::wire::{
    AllocStubWire, DispatchBodyWire, DispatchMetaWire, DispatchResponseWire, JobWire,
};
use super::{NomadClient, shown_child};
use crate::act::{ChildControl, DispatchRequest, Dispatched};
use crate::model::{ChildId, ErrorClass, MANAGED_BY};
use crate::observe::{ChildStatus, PortError};

/// Longest `IdPrefixTemplate` sent: the repo is for reading, the time and random suffix keep
/// the id unique.
pub(super) const ID_PREFIX_CHARS_MAX: usize = 40;

/// The repo of `repo_url` as a piece of a Nomad job id: `acme-api` for
/// `https://github.com/acme/api`. Only `[a-z0-9-]`, so the child id has no `/` after
/// `dispatch-` (the listing's fallback for stubs without `ParentID` relies on that) and
/// nothing that needs escaping in a URL or a shell.
pub(super) fn id_prefix_of(repo_url: &str) -> String {
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

/// Terminal client statuses of an allocation (API-CONTRACTS: complete, failed, lost). Any
/// other, `unknown` (a disconnected client) and statuses a newer Nomad may add included,
/// may still run a runner.
fn allocation_is_live(client_status: &str) -> bool {
    !matches!(client_status, "complete" | "failed" | "lost")
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

    #[test]
    fn repo_of_names_owner_and_repo() {
        assert_eq!(repo_of("https://github.com/acme/api"), "acme/api");
        assert_eq!(repo_of("https://github.com/acme/api/"), "acme/api");
        assert_eq!(repo_of("weird"), "weird");
    }
}
