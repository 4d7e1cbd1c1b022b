//! A tiny HTTP server on loopback that answers with a closure and records every request it
//! receives: a hostile or broken service, or the "other origin" a token must never reach.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::response::Response;
use runner_scaler::sim::twins::TwinServer;

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    /// Path and query.
    pub uri: String,
    pub headers: HeaderMap,
}

impl Recorded {
    /// The `Host` header the client sent.
    pub fn host(&self) -> &str {
        self.headers
            .get("host")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }
}

type Answer = dyn Fn(&Recorded) -> Response + Send + Sync;

/// Dropping it stops the server.
pub struct RecordingServer {
    server: TwinServer,
    requests: Arc<Mutex<Vec<Recorded>>>,
}

impl RecordingServer {
    /// Serves every method and path with `answer`.
    pub async fn start(
        answer: impl Fn(&Recorded) -> Response + Send + Sync + 'static,
    ) -> RecordingServer {
        let requests: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let answer: Arc<Answer> = Arc::new(answer);
        let recorded = requests.clone();
        let router = Router::new().fallback(move |request: Request| {
            let recorded = recorded.clone();
            let answer = answer.clone();
            async move {
                let seen = Recorded {
                    method: request.method().to_string(),
                    uri: request
                        .uri()
                        .path_and_query()
                        .map(|p| p.to_string())
                        .unwrap_or_default(),
                    headers: request.headers().clone(),
                };
                let response = answer(&seen);
                recorded.lock().unwrap().push(seen);
                response
            }
        });
        let server = TwinServer::start(router)
            .await
            .expect("bind a loopback port");
        RecordingServer { server, requests }
    }

    /// `http://127.0.0.1:<port>`, without a trailing slash.
    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    pub fn port(&self) -> u16 {
        self.server.addr.port()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}
