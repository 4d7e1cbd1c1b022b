//! A host the daemon must never talk to: it accepts TCP connections on loopback and keeps
//! every byte it is sent, so a test can check on that host's side that no token arrived.

use std::sync::{Arc, Mutex};

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

#[derive(Default)]
struct Seen {
    connections: usize,
    bytes: Vec<u8>,
}

pub struct Bystander {
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<Seen>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Bystander {
    pub async fn start() -> Bystander {
        Bystander::listen(false).await
    }

    /// A host that closes every connection as soon as it is accepted: an address of the
    /// test's own where no HTTP server answers, unlike a fixed port, which anything on the
    /// machine may be listening on.
    pub async fn hanging_up() -> Bystander {
        Bystander::listen(true).await
    }

    async fn listen(hang_up: bool) -> Bystander {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let keep = seen.clone();
        let accepting = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                keep.lock().unwrap().connections += 1;
                if hang_up {
                    drop(stream);
                    continue;
                }
                let keep = keep.clone();
                // Reads whatever comes and never answers: a request gets no reply to react to.
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        keep.lock().unwrap().bytes.extend_from_slice(&buf[..n]);
                    }
                });
            }
        });
        Bystander {
            addr,
            seen,
            accepting,
        }
    }

    /// `http://127.0.0.1:PORT`
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn connections(&self) -> usize {
        self.seen.lock().unwrap().connections
    }

    /// Whether `needle` arrived in any connection.
    pub fn received(&self, needle: &str) -> bool {
        let seen = self.seen.lock().unwrap();
        seen.bytes
            .windows(needle.len().max(1))
            .any(|w| w == needle.as_bytes())
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}
