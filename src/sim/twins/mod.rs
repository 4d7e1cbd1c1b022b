//! In-process HTTP twins of GitHub, Forgejo, Nomad, Consul KV and Vault KV v2.
//!
//! Each twin implements exactly the endpoints the daemon uses, with the real status codes,
//! headers, pagination, error bodies and JSON shapes (checked against `tests/fixtures/`). Its
//! state sits behind a shared handle so that the simulated world and tests can move it.

pub mod consul;
pub mod forgejo;
pub mod github;
pub mod nomad;
pub mod vault;

use std::net::SocketAddr;

use tokio::sync::oneshot;

/// A twin listening on loopback. Dropping it stops the server.
pub struct TwinServer {
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
}

impl TwinServer {
    /// Serves `router` on `127.0.0.1` on a free port.
    pub async fn start(router: axum::Router) -> std::io::Result<TwinServer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(TwinServer {
            addr,
            shutdown: Some(tx),
        })
    }

    /// `http://127.0.0.1:<port>`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for TwinServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}
