//! Secrets the daemon reads at run time, and the port they come through.
//!
//! Every secret is a [`SecretString`]: its `Debug` prints `[REDACTED]` and it has no
//! `Display`, so it cannot reach a log line, an error or status output by accident.

use async_trait::async_trait;
pub use secrecy::{ExposeSecret, SecretString};

use crate::observe::PortError;

/// Reads one field of a secret. Implemented by the Vault client (KV v2).
#[async_trait]
pub trait SecretSource: Send + Sync {
    /// The string field `field` of the secret at `path` under the configured mount.
    async fn read_field(&self, path: &str, field: &str) -> Result<SecretString, PortError>;

    /// The string fields `fields` of the secret at `path`, in the order asked, from one read
    /// of it; a field the secret does not have is `None`. A source that reads one field at a
    /// time (a test's stand-in) answers each field it has with `read_field`.
    async fn read_fields(
        &self,
        path: &str,
        fields: &[&str],
    ) -> Result<Vec<Option<SecretString>>, PortError> {
        let mut read = Vec::with_capacity(fields.len());
        for field in fields {
            read.push(Some(self.read_field(path, field).await?));
        }
        Ok(read)
    }
}
