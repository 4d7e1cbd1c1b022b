//! Secrets the daemon reads at run time, and the port they come through.
//!
//! Every secret is a [`SecretString`]: its `Debug` prints `[REDACTED]` and it has no
//! `Display`, so it cannot reach a log line, an error or status output by accident.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
pub use secrecy::{ExposeSecret, SecretString};

use crate::model::PortError;

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

/// Asks Vault what the daemon's own token may do on secret paths: `sys/capabilities-self`.
#[async_trait]
pub trait CapabilityProbe: Send + Sync {
    /// The capability list per secret path (under the KV v2 mount), and the API path a
    /// policy names it by.
    async fn capabilities(
        &self,
        paths: &[String],
    ) -> Result<BTreeMap<String, Vec<String>>, PortError>;

    fn api_path(&self, path: &str) -> String;
}

/// Whether a capability list from `sys/capabilities-self` lets the token read the secret.
pub fn grants_read(capabilities: &[String]) -> bool {
    capabilities.iter().any(|c| c == "read" || c == "root")
}

/// Reads a secret from `VAR`, or from the file `VAR_FILE` names. `Ok(None)` when neither is
/// set; an error (naming the variable, never the value) when both are, or the file is
/// unreadable or empty.
pub fn read_secret(var: &str) -> Result<Option<SecretString>, String> {
    let direct = std::env::var(var).ok().filter(|v| !v.is_empty());
    let file_var = format!("{var}_FILE");
    let file = std::env::var_os(&file_var).filter(|v| !v.is_empty());
    match (direct, file) {
        (Some(_), Some(_)) => Err(format!("set {var} or {file_var}, not both")),
        (Some(value), None) => Ok(Some(SecretString::from(value))),
        (None, Some(path)) => read_secret_file(&PathBuf::from(path), &file_var).map(Some),
        (None, None) => Ok(None),
    }
}

/// Reads a secret file, trimming the trailing newline editors add.
pub fn read_secret_file(path: &Path, what: &str) -> Result<SecretString, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("read {what} {}: {e}", path.display()))?;
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(format!("{what} {} is empty", path.display()));
    }
    Ok(SecretString::from(trimmed.to_string()))
}
