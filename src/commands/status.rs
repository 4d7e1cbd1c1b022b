//! `status`: the running daemon's own view of its last tick (`GET /status`), or a fresh
//! dry-run tick when no daemon answers.

use std::process::ExitCode;

use secrecy::ExposeSecret;

use crate::cli::DaemonArgs;
use crate::clients::http::TlsFiles;

/// How long `status` waits for the running daemon before showing a dry-run tick instead.
const LIVE_STATUS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// `status`: the running daemon's own view (`GET /status` at `addr`), or, when none answers,
/// a fresh dry-run tick, saying that it cannot know the daemon's backoffs and readings.
pub async fn status(args: DaemonArgs, json: bool, addr: url::Url) -> ExitCode {
    match live_status(&addr, json).await {
        Ok(body) => {
            print!("{body}");
            if json {
                println!();
            }
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!(
                "no daemon answered at {addr} ({why}); showing a fresh dry-run tick instead, \
                 which cannot know a running daemon's backoffs, holds or readings"
            );
            super::once::once(args, true, json).await
        }
    }
}

/// The live status as the daemon renders it: JSON, or the text table.
async fn live_status(addr: &url::Url, json: bool) -> Result<String, String> {
    let client = crate::clients::http::build_client(
        "runner-scaler",
        &TlsFiles::default(),
        LIVE_STATUS_TIMEOUT,
    )?;
    let mut url = addr.join("status").map_err(|e| e.to_string())?;
    if !json {
        url.set_query(Some("format=text"));
    }
    let doing = format!("read the status at {}", url.path());
    let mut request = client.get(url);
    if let Some(token) = crate::secrets::read_secret(crate::cli::LISTEN_TOKEN_VAR)? {
        // A sensitive header value: never shown by a Debug of the request.
        let mut bearer =
            reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.expose_secret()))
                .map_err(|_| {
                    format!(
                        "{} is not a valid header value",
                        crate::cli::LISTEN_TOKEN_VAR
                    )
                })?;
        bearer.set_sensitive(true);
        request = request.header(reqwest::header::AUTHORIZATION, bearer);
    }
    let response = request
        .send()
        .await
        .map_err(|e| crate::clients::http::transport_error("runner-scaler", &doing, &e).message)?;
    let status = response.status();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return Err(format!(
            "{doing}: 401: the daemon requires its listen token: set {}_FILE to the file the \
             daemon reads",
            crate::cli::LISTEN_TOKEN_VAR
        ));
    }
    if !status.is_success() {
        return Err(format!("{doing}: {status}"));
    }
    response
        .text()
        .await
        .map_err(|e| crate::clients::http::transport_error("runner-scaler", &doing, &e).message)
}
