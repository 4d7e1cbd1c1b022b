//! Consul sessions and the lock key, implementing [`LockStore`] for the leader lock.
//!
//! consulrs 0.1 has no session calls, so these requests go through the same reqwest 0.11
//! client [`ConsulKv`] built (no redirects followed, the same TLS settings), with the token in
//! `X-Consul-Token`, never in the URL. That client has no timeout of its own: the leader lock
//! bounds every call (`leader::within`).

use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::clients::consul::{ConsulKv, check_key};
use crate::clients::http::{class_of_status, redirect_refused};
use crate::leader::{LockError, LockKey, LockStore, SessionId, SessionRequest};
use crate::model::ErrorClass;
use crate::observe::PortError;

/// Consul's leader lock calls.
pub struct ConsulLock {
    http: reqwest_0_11::Client,
    address: String,
    token: Option<SecretString>,
}

#[derive(Deserialize)]
struct Created {
    #[serde(rename = "ID")]
    id: String,
}

#[derive(Deserialize)]
struct KvPair {
    #[serde(rename = "Key")]
    key: String,
    #[serde(rename = "Value")]
    value: Option<String>,
    #[serde(rename = "Session")]
    session: Option<String>,
}

/// Go duration syntax: whole seconds when exact, milliseconds otherwise (`1.5s` as `1500ms`).
pub fn duration_string(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Consul's short plain-text error bodies, on one line and cut short.
fn one_line(body: &str) -> String {
    body.trim()
        .chars()
        .take(200)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// A session id as Consul makes them (a UUID); anything else is not put into a URL.
fn check_session(session: &SessionId) -> Result<(), LockError> {
    if !session.0.is_empty()
        && session.0.len() <= 64
        && session.0.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
    {
        Ok(())
    } else {
        Err(LockError::Port(PortError::new(
            ErrorClass::Malformed,
            format!(
                "Consul returned a session id that is not a UUID: {:?}",
                session.0
            ),
        )))
    }
}

impl ConsulLock {
    /// The lock calls through `kv`'s HTTP client, with the token `kv` was built with.
    pub fn new(kv: &ConsulKv, token: Option<SecretString>) -> ConsulLock {
        ConsulLock {
            http: kv.http_client(),
            address: kv.address().to_string(),
            token: token.filter(|t| !t.expose_secret().trim().is_empty()),
        }
    }

    fn request(&self, method: reqwest_0_11::Method, path: &str) -> reqwest_0_11::RequestBuilder {
        let mut builder = self.http.request(method, format!("{}{path}", self.address));
        if let Some(token) = &self.token {
            builder = builder.header("X-Consul-Token", token.expose_secret().trim());
        }
        builder
    }

    /// Sends, and returns the status, the `X-Consul-Index` header and the body; a transport
    /// failure or a redirect is an error.
    async fn send(
        &self,
        doing: &str,
        builder: reqwest_0_11::RequestBuilder,
    ) -> Result<(u16, Option<u64>, String), LockError> {
        let response = builder.send().await.map_err(|e| {
            PortError::new(
                ErrorClass::Transient,
                format!("{doing}: request failed: {e}"),
            )
        })?;
        let status = response.status().as_u16();
        let index = response
            .headers()
            .get("X-Consul-Index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let body = response.text().await.map_err(|e| {
            PortError::new(
                ErrorClass::Transient,
                format!("{doing}: read the answer: {e}"),
            )
        })?;
        if (300..400).contains(&status) {
            let status = reqwest::StatusCode::from_u16(status)
                .unwrap_or(reqwest::StatusCode::MULTIPLE_CHOICES);
            return Err(redirect_refused("Consul", doing, status).into());
        }
        Ok((status, index, body))
    }

    fn failed(doing: &str, status: u16, body: &str) -> LockError {
        let status = reqwest::StatusCode::from_u16(status)
            .unwrap_or(reqwest::StatusCode::INTERNAL_SERVER_ERROR);
        LockError::Port(PortError::new(
            class_of_status(status),
            format!("{doing}: {status}: {}", one_line(body)),
        ))
    }

    fn boolean(doing: &str, status: u16, body: &str) -> Result<bool, LockError> {
        if status != 200 {
            return Err(Self::failed(doing, status, body));
        }
        match body.trim() {
            "true" => Ok(true),
            "false" => Ok(false),
            other => Err(LockError::Port(PortError::new(
                ErrorClass::Malformed,
                format!(
                    "{doing}: expected true or false, got {:?}",
                    other.chars().take(40).collect::<String>()
                ),
            ))),
        }
    }
}

#[async_trait]
impl LockStore for ConsulLock {
    async fn create_session(&self, request: &SessionRequest) -> Result<SessionId, LockError> {
        let ttl = duration_string(request.ttl);
        let doing = format!("create a Consul session (TTL {ttl}) at {}", self.address);
        // `Checks: []` and `NodeChecks: []` replace the default serfHealth check: the
        // session lives by its TTL alone, not by the health of the agent's node.
        let body = serde_json::json!({
            "Name": request.name,
            "TTL": ttl,
            "LockDelay": duration_string(request.lock_delay),
            "Behavior": "release",
            "Checks": [],
            "NodeChecks": [],
        });
        let builder = self
            .request(reqwest_0_11::Method::PUT, "/v1/session/create")
            .header("Content-Type", "application/json")
            .body(body.to_string());
        let (status, _, body) = self.send(&doing, builder).await?;
        if status == 500 && body.contains("Invalid Session TTL") {
            return Err(LockError::TtlRefused(format!(
                "{doing}: Consul refused the TTL: {}",
                one_line(&body)
            )));
        }
        if status != 200 {
            return Err(Self::failed(&doing, status, &body));
        }
        let created: Created = serde_json::from_str(&body).map_err(|e| {
            PortError::new(
                ErrorClass::Malformed,
                format!("{doing}: the answer is not {{\"ID\"}}: {e}"),
            )
        })?;
        let session = SessionId(created.id);
        check_session(&session)?;
        Ok(session)
    }

    async fn renew_session(&self, session: &SessionId) -> Result<(), LockError> {
        check_session(session)?;
        let doing = format!("renew Consul session {session} at {}", self.address);
        let builder = self.request(
            reqwest_0_11::Method::PUT,
            &format!("/v1/session/renew/{session}"),
        );
        let (status, _, body) = self.send(&doing, builder).await?;
        match status {
            200 => Ok(()),
            404 => Err(LockError::SessionGone(format!(
                "{doing}: {}",
                one_line(&body)
            ))),
            _ => Err(Self::failed(&doing, status, &body)),
        }
    }

    async fn destroy_session(&self, session: &SessionId) -> Result<(), LockError> {
        check_session(session)?;
        let doing = format!("destroy Consul session {session} at {}", self.address);
        let builder = self.request(
            reqwest_0_11::Method::PUT,
            &format!("/v1/session/destroy/{session}"),
        );
        let (status, _, body) = self.send(&doing, builder).await?;
        Self::boolean(&doing, status, &body).map(|_| ())
    }

    async fn acquire(
        &self,
        key: &str,
        session: &SessionId,
        value: &[u8],
    ) -> Result<bool, LockError> {
        check_session(session)?;
        check_key(key).map_err(|e| PortError::new(ErrorClass::Configuration, e))?;
        let doing = format!("acquire the lock {key} at {}", self.address);
        let builder = self
            .request(
                reqwest_0_11::Method::PUT,
                &format!("/v1/kv/{key}?acquire={session}"),
            )
            .body(value.to_vec());
        let (status, _, body) = self.send(&doing, builder).await?;
        Self::boolean(&doing, status, &body)
    }

    async fn release(
        &self,
        key: &str,
        session: &SessionId,
        value: &[u8],
    ) -> Result<bool, LockError> {
        check_session(session)?;
        check_key(key).map_err(|e| PortError::new(ErrorClass::Configuration, e))?;
        let doing = format!("release the lock {key} at {}", self.address);
        // A release writes its body as the key's value, as any PUT does.
        let builder = self
            .request(
                reqwest_0_11::Method::PUT,
                &format!("/v1/kv/{key}?release={session}"),
            )
            .body(value.to_vec());
        let (status, _, body) = self.send(&doing, builder).await?;
        Self::boolean(&doing, status, &body)
    }

    async fn read_key(&self, key: &str, index: u64, wait: Duration) -> Result<LockKey, LockError> {
        check_key(key).map_err(|e| PortError::new(ErrorClass::Configuration, e))?;
        let doing = format!("read the lock {key} at {}", self.address);
        let path = if index > 0 {
            format!(
                "/v1/kv/{key}?index={index}&wait={}",
                duration_string(wait.min(crate::clients::consul::BLOCKING_WAIT_MAX))
            )
        } else {
            format!("/v1/kv/{key}")
        };
        let builder = self.request(reqwest_0_11::Method::GET, &path);
        let (status, index, body) = self.send(&doing, builder).await?;
        match status {
            // A missing key: unheld; the index still lets a blocking read wait for it.
            404 if body.trim().is_empty() => Ok(LockKey {
                index: index.unwrap_or(0),
                session: None,
                value: None,
            }),
            200 => {
                let pairs: Vec<KvPair> = serde_json::from_str(&body).map_err(|e| {
                    PortError::new(
                        ErrorClass::Malformed,
                        format!("{doing}: not a KV answer: {e}"),
                    )
                })?;
                let pair = pairs.into_iter().find(|p| p.key == key);
                let value = match pair.as_ref().and_then(|p| p.value.as_deref()) {
                    None => None,
                    Some(encoded) => Some(BASE64.decode(encoded).map_err(|e| {
                        PortError::new(
                            ErrorClass::Malformed,
                            format!("{doing}: Value is not base64: {e}"),
                        )
                    })?),
                };
                Ok(LockKey {
                    index: index.unwrap_or(0),
                    session: pair.and_then(|p| p.session).filter(|s| !s.is_empty()),
                    value,
                })
            }
            _ => Err(Self::failed(&doing, status, &body)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_written_exactly() {
        assert_eq!(duration_string(Duration::from_secs(15)), "15s");
        assert_eq!(duration_string(Duration::from_millis(1667)), "1667ms");
    }

    #[test]
    fn session_ids_that_are_not_uuids_never_reach_a_url() {
        assert!(check_session(&SessionId("adf4238a-882b-9ddc-4a9d-5b6758e4159e".into())).is_ok());
        for bad in ["", "../kv/x", "a?b", "a/b"] {
            assert!(check_session(&SessionId(bad.into())).is_err(), "{bad:?}");
        }
    }
}
