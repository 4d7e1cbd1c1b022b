//! The runner routes: registration tokens (canaries the world can trace), JIT configurations
//! (checked as the twin checks them, and registered in the world under the name asked for),
//! and the runner listing (filtered by name, paged) and deletion (refused while the runner is
//! busy).

use chrono::{DateTime, SecondsFormat};
use http::StatusCode;
use serde_json::{Value, json};

use super::serve::{DOCS_REST, Reply, repo_id};
use super::{API_URL, TOKEN_LIFETIME_S};
use crate::model::{RepoName, RunnerName};
use crate::sim::seeded::ports::Sim;
use crate::sim::seeded::world::EPOCH_UNIX;
use crate::sim::twins::github::{
    DOCS_JIT, JIT_NAME_TAKEN, JitRequest, Query, jit_config_json, runner_labels_json,
};

/// `POST …/actions/runners/registration-token`: a canary token, valid for an hour.
pub(super) fn registration_token(sim: &mut Sim, t: u64) -> Reply {
    sim.requests.github_token_mints += 1;
    let token = sim.mint_canary();
    let body = json!({
        "token": secrecy::ExposeSecret::expose_secret(&token),
        "expires_at": DateTime::from_timestamp(EPOCH_UNIX + (t + TOKEN_LIFETIME_S) as i64, 0)
            .expect("simulated time is in range")
            .to_rfc3339_opts(SecondsFormat::Millis, true),
    });
    Reply::json(StatusCode::CREATED, body.to_string())
}

/// `POST …/actions/runners/generate-jitconfig`: registers the runner in the world under the
/// name asked for and answers its configuration (a canary); 409 when the name is taken.
pub(super) fn generate_jit_config(sim: &mut Sim, repo: &RepoName, body: &[u8], t: u64) -> Reply {
    match JitRequest::parse(body) {
        // The twin's checks: without `runner_group_id`, among others, GitHub answers
        // 422 (gotcha 5), and the refusal is billed like any answer.
        Err((status, message)) => Reply::error(status, &message, DOCS_JIT),
        Ok(request) => {
            let config = sim.mint_canary();
            let Sim { world, trace, .. } = &mut *sim;
            match world.register_jit(t, repo, &RunnerName(request.name.clone()), trace) {
                Some(id) => {
                    sim.requests.github_token_mints += 1;
                    let body = jit_config_json(
                        id,
                        &request.name,
                        &request.labels,
                        secrecy::ExposeSecret::expose_secret(&config),
                    );
                    Reply::json(StatusCode::CREATED, body.to_string())
                }
                None => Reply::error(StatusCode::CONFLICT, JIT_NAME_TAKEN, DOCS_JIT),
            }
        }
    }
}

/// `GET …/actions/runners`.
/// `readable`: the body reaches the client whole (not cut off by a fault), so what it
/// shows counts as read.
pub(super) fn list_runners(
    sim: &mut Sim,
    repo: &RepoName,
    query: &Query,
    t: u64,
    readable: bool,
) -> Reply {
    // `name` filters (exactly, as the twin does); `per_page`/`page` slice, with
    // the `Link` header when more than one page: a fleet of more than 100 runners
    // takes the client several requests, each billed.
    let wanted = query.get("name");
    let registrations: Vec<(u64, RunnerName, bool, bool)> = sim
        .world
        .registrations_of(repo, t)
        .into_iter()
        .filter(|(_, name, ..)| wanted.is_none_or(|w| w == name.0))
        .collect();
    let total = registrations.len();
    let base = format!(
        "{API_URL}/repositories/{}/actions/runners",
        repo_id(sim, repo)
    );
    let (range, link) = query.page(total, &base);
    let served = &registrations[range];
    if readable {
        sim.world.registrations_served(
            &served
                .iter()
                .map(|(id, .., busy)| (*id, *busy))
                .collect::<Vec<_>>(),
            t,
        );
    }
    let runners: Vec<Value> = served.iter().map(runner_json).collect();
    let body = json!({ "total_count": total, "runners": runners });
    let reply = Reply::json(StatusCode::OK, body.to_string());
    match link {
        Some(link) => reply.header("link", link),
        None => reply,
    }
}

/// A runner as GitHub lists it. The world keeps no runner's labels: every one shows
/// `self-hosted`.
fn runner_json((id, name, online, busy): &(u64, RunnerName, bool, bool)) -> Value {
    json!({
        "id": id, "name": name.0, "os": "linux",
        "status": if *online { "online" } else { "offline" },
        "busy": busy, "ephemeral": true,
        "labels": runner_labels_json(&["self-hosted"]),
    })
}

/// `GET …/actions/runners/{runner_id}`: one registration, or 404.
pub(super) fn get_runner(sim: &mut Sim, repo: &RepoName, id: u64, t: u64, readable: bool) -> Reply {
    match sim.world.registration_of(repo, id, t) {
        Some(runner) => {
            if readable {
                sim.world.registrations_served(&[(runner.0, runner.3)], t);
            }
            Reply::json(StatusCode::OK, runner_json(&runner).to_string())
        }
        None => Reply::not_found(),
    }
}

/// `DELETE …/actions/runners/{runner_id}`.
pub(super) fn delete_runner(sim: &mut Sim, repo: &RepoName, id: u64, t: u64) -> Reply {
    let Sim {
        world,
        trace,
        options,
        ..
    } = &mut *sim;
    match world.delete_registration(t, repo, id, options, trace) {
        Some(true) => Reply {
            status: StatusCode::NO_CONTENT,
            headers: Vec::new(),
            body: String::new(),
        },
        Some(false) => Reply::error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("Bad request - Runner {id} is still running a job"),
            DOCS_REST,
        ),
        None => Reply::not_found(),
    }
}
