//! Webhooks as hints (`--webhook-listen`): `POST /webhook/github` and `POST /webhook/forgejo`.
//!
//! A verified delivery that may change a repo's queue (GitHub's `workflow_job`; Forgejo's
//! pushes, pull requests, dispatches and action-run ends, since Forgejo sends no job event)
//! for a repo of the document becomes a [`Hints`] entry: "look at this repo now". Nothing is decided from the event's content; the loop polls the
//! forge and acts on what the poll finds, so a lost, late, forged-but-rejected or replayed
//! webhook costs at most a poll interval, never a wrong dispatch.
//!
//! - [`signature`]: HMAC-SHA256 over the raw body, in constant time;
//! - [`deliveries`]: delivery ids and body digests seen in the last ten minutes;
//! - [`hints`]: the schedule of re-polls and the port the control loop consumes;
//! - [`receiver`]: the axum routes.

pub mod deliveries;
pub mod hints;
pub mod receiver;
pub mod signature;

pub use hints::{Hints, Offered, WebhookForge};
pub use receiver::{Receiver, WEBHOOK_BODY_MAX_BYTES, bind, router};

use secrecy::SecretString;

/// The secrets webhook deliveries are signed with, one per forge. A forge without one has
/// no route: its deliveries get 404.
#[derive(Debug, Default, Clone)]
pub struct WebhookSecrets {
    pub github: Option<SecretString>,
    pub forgejo: Option<SecretString>,
}

impl WebhookSecrets {
    pub fn is_empty(&self) -> bool {
        self.github.is_none() && self.forgejo.is_none()
    }

    /// The paths served: one per forge with a secret.
    pub fn routes(&self) -> Vec<&'static str> {
        [
            self.github.as_ref().map(|_| receiver::GITHUB_PATH),
            self.forgejo.as_ref().map(|_| receiver::FORGEJO_PATH),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// Reads the webhook secrets: `GITHUB_WEBHOOK_SECRET` or `GITHUB_WEBHOOK_SECRET_FILE` (or
/// `from_vault`, the `webhook_secret` field at `GITHUB_APP_VAULT_PATH`), and
/// `FORGEJO_WEBHOOK_SECRET` or `FORGEJO_WEBHOOK_SECRET_FILE`. The error names the
/// variables, never a value; at least one secret is required (`--webhook-listen` would
/// otherwise serve nothing but 404s).
pub fn read_secrets(from_vault: Option<SecretString>) -> Result<WebhookSecrets, String> {
    let github = match (
        crate::secrets::read_secret("GITHUB_WEBHOOK_SECRET")?,
        from_vault,
    ) {
        (Some(_), Some(_)) => {
            return Err(
                "set GITHUB_WEBHOOK_SECRET (or GITHUB_WEBHOOK_SECRET_FILE) or a \
                 webhook_secret field at GITHUB_APP_VAULT_PATH, not both"
                    .into(),
            );
        }
        (env, vault) => env.or(vault),
    };
    let secrets = WebhookSecrets {
        github,
        forgejo: crate::secrets::read_secret("FORGEJO_WEBHOOK_SECRET")?,
    };
    if secrets.is_empty() {
        return Err(
            "--webhook-listen (RUNNER_SCALER_WEBHOOK_LISTEN) is set but no webhook \
             secret is: set GITHUB_WEBHOOK_SECRET, GITHUB_WEBHOOK_SECRET_FILE, a webhook_secret \
             field at GITHUB_APP_VAULT_PATH, FORGEJO_WEBHOOK_SECRET or \
             FORGEJO_WEBHOOK_SECRET_FILE"
                .into(),
        );
    }
    Ok(secrets)
}
