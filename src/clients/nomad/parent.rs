//! A parent job as Nomad has it: missing, not parameterized, or what its `ParameterizedJob`
//! requires and permits. Asked by `config check --live`, and each poll for a parent whose
//! dispatch is held for a configuration error; not part of the children's listing.

use super::NomadClient;
use super::wire::ParentWire;
use crate::model::ErrorClass;
use crate::observe::{ParentJob, PortError};

impl NomadClient {
    /// `GET /v1/job/<id>` in `namespace`, else where dispatches go: what
    /// [`ChildSource::read_parent`](crate::observe::ChildSource::read_parent) answers.
    pub(super) async fn read_parent_job(
        &self,
        job: &str,
        namespace: Option<&str>,
    ) -> Result<ParentJob, PortError> {
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
}
