//! The in-memory GitHub driven through the forge port and the real client, on a quiet seeded
//! world: conditional requests, budgets and the client's pause, Vault outages, transient
//! faults, JIT mints, runner pages and the runs filter. They exercise every piece together.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use http::{Method, StatusCode};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::Value;

use super::auth::Grant;
use super::service::Served;
use super::{BUDGET_LIMIT, BUDGET_WINDOW_S, GitHubForge, GitHubHttp, virtual_now};
use crate::act::{Registrar, RunnerIdentity, RunnerRegistry};
use crate::config::{ConfigDefaults, RepoConfig, parse_document};
use crate::model::{ErrorClass, RepoName, RunnerName};
use crate::observe::{JobState, QueueSource, RepoJobs};
use crate::sim::seeded::options::{FaultRates, ForgeKind, Outage, Service};
use crate::sim::seeded::ports::{CANARY, Scope, Shared, Sim, budget_of, lock, repo_url};
use crate::sim::seeded::scenarios::Scenario;
use crate::sim::seeded::trace::Trace;
use crate::sim::seeded::world::{Visible, World};

const APP_REPO: &str = "afreidah/munchbox";
const VAULT_REPO: &str = "ev-the-dev/moat";

/// A world without random faults, with work queued on every repo and the status lag
/// caught up.
fn quiet_world() -> Shared {
    let mut rng = StdRng::seed_from_u64(7);
    let mut options = Scenario::Steady.options(&mut rng);
    options.faults = BTreeMap::new();
    options.outages.clear();
    options.burst_runs = 12;
    options.stale_jobs = 0;
    options.cancel_per_s = 0.0;
    options.runs_per_hour = 0.0;
    let config = parse_document(options.document().as_bytes(), &ConfigDefaults::default())
        .expect("a valid document");
    let repo_urls = config
        .repos
        .values()
        .map(|r| (repo_url(r), r.repo.clone()))
        .collect();
    let world = World::new(&options, repo_urls);
    let sim = Sim::new(
        options,
        config,
        world,
        StdRng::seed_from_u64(8),
        StdRng::seed_from_u64(9),
        Trace::new(false),
    );
    let shared = Arc::new(Mutex::new(sim));
    for t in 0..=5 {
        lock(&shared).advance(t);
    }
    shared
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

fn repo(shared: &Shared, name: &str) -> RepoConfig {
    let name = RepoName::parse(name).expect("a repo name");
    lock(shared).config.repos[&name].clone()
}

/// The jobs the world shows for `repo`: (id, queued?, runner).
fn shown(shared: &Shared, repo: &RepoName) -> BTreeSet<(u64, bool, Option<String>)> {
    lock(shared)
        .world
        .jobs
        .iter()
        .filter(|(_, j)| j.repo == *repo)
        .filter_map(|(id, j)| match &j.visible {
            Visible::Hidden => None,
            Visible::Queued => Some((*id, true, None)),
            Visible::Running(r) => Some((*id, false, Some(r.0.clone()))),
        })
        .collect()
}

fn listed(jobs: &RepoJobs) -> BTreeSet<(u64, bool, Option<String>)> {
    jobs.jobs
        .iter()
        .map(|j| match &j.state {
            JobState::InProgress { runner } => (j.id, false, runner.as_ref().map(|r| r.0.clone())),
            _ => (j.id, true, None),
        })
        .collect()
}

fn billed(shared: &Shared) -> (u64, u64) {
    let sim = lock(shared);
    (
        sim.requests.github_primary,
        sim.requests.github_not_modified,
    )
}

#[test]
fn an_unchanged_listing_is_answered_not_modified_and_spends_nothing() {
    let shared = quiet_world();
    let forge = GitHubForge::new(&shared, true);
    runtime().block_on(async {
        for name in [APP_REPO, VAULT_REPO] {
            let repo = repo(&shared, name);
            let first = forge.list_jobs(&repo).await.expect("listed");
            assert!(!first.jobs.is_empty(), "{name}: the burst queued work here");
            assert_eq!(listed(&first), shown(&shared, &repo.repo), "{name}");
            let (spent, not_modified) = billed(&shared);
            let second = forge.list_jobs(&repo).await.expect("listed again");
            assert_eq!(listed(&second), listed(&first), "{name}");
            let (spent_after, not_modified_after) = billed(&shared);
            assert_eq!(spent_after, spent, "{name}: a 304 is free");
            // Two run listings (queued, in progress) and one job listing per run.
            assert!(not_modified_after >= not_modified + 3, "{name}");
        }
    });
    let sim = lock(&shared);
    assert_eq!(
        sim.requests.github_primary,
        sim.requests.github_primary_by_repo.values().sum::<u64>()
    );
}

#[test]
fn without_conditional_requests_every_listing_is_billed() {
    let shared = quiet_world();
    let forge = GitHubForge::new(&shared, false);
    runtime().block_on(async {
        let repo = repo(&shared, VAULT_REPO);
        forge.list_jobs(&repo).await.expect("listed");
        let (spent, _) = billed(&shared);
        let requests = forge.http().requests();
        forge.list_jobs(&repo).await.expect("listed again");
        let (spent_after, not_modified) = billed(&shared);
        assert_eq!(spent_after - spent, forge.http().requests() - requests);
        assert!(spent_after >= spent + 3);
        assert_eq!(not_modified, 0);
    });
}

#[test]
fn a_spent_budget_answers_403_and_pauses_the_holder_in_the_client() {
    let shared = quiet_world();
    let forge = GitHubForge::new(&shared, true);
    let repo = repo(&shared, APP_REPO);
    let holder = budget_of(&repo);
    runtime().block_on(async {
        forge.list_jobs(&repo).await.expect("listed");
        forge.http().spend(&holder, BUDGET_LIMIT);
        let e = forge
            .list_jobs(&repo)
            .await
            .expect_err("the budget is spent");
        assert_eq!(e.class, ErrorClass::RateLimited, "{}", e.message);
        assert!(e.message.contains("installation ID"), "{}", e.message);
        // The window began at t=5 with the first request; now is t=5.
        assert_eq!(e.retry_after_s, Some(BUDGET_WINDOW_S));
        let reset = virtual_now(5 + BUDGET_WINDOW_S);
        assert_eq!(forge.client().paused_until(&repo), Some(reset));
        // Paused: the client refuses without asking, and the world excuses the hold.
        let requests = forge.http().requests();
        let again = forge.list_jobs(&repo).await.expect_err("still paused");
        assert_eq!(again.class, ErrorClass::RateLimited);
        assert_eq!(forge.http().requests(), requests);
        {
            let sim = lock(&shared);
            assert_eq!(
                sim.faults.exhausted.get(&holder),
                Some(&(5 + BUDGET_WINDOW_S))
            );
            assert!(
                sim.faults
                    .failing
                    .contains(&Scope::Queue(repo.repo.clone()))
            );
        }
        // A new window: listed again, and the failure is over.
        lock(&shared).t = 5 + BUDGET_WINDOW_S;
        forge.list_jobs(&repo).await.expect("a new window");
        assert!(
            !lock(&shared)
                .faults
                .failing
                .contains(&Scope::Queue(repo.repo.clone()))
        );
    });
}

#[test]
fn an_injected_exhaustion_reaches_the_client_through_the_headers() {
    let shared = quiet_world();
    let forge = GitHubForge::new(&shared, true);
    let repo = repo(&shared, VAULT_REPO);
    lock(&shared)
        .faults
        .exhausted
        .insert(budget_of(&repo), 5 + 120);
    runtime().block_on(async {
        let e = forge.list_jobs(&repo).await.expect_err("exhausted");
        assert_eq!(
            (e.class, e.retry_after_s),
            (ErrorClass::RateLimited, Some(120)),
            "{}",
            e.message
        );
        assert_eq!(forge.client().paused_until(&repo), Some(virtual_now(125)));
    });
    assert_eq!(lock(&shared).requests.github_primary, 0);
}

#[test]
fn a_vault_outage_fails_the_polling_token_read_and_is_recorded() {
    let shared = quiet_world();
    lock(&shared).options.outages.push(Outage {
        service: Service::Vault,
        start_s: 0,
        end_s: 60,
    });
    let forge = GitHubForge::new(&shared, true);
    let repo = repo(&shared, VAULT_REPO);
    runtime().block_on(async {
        let e = forge.list_jobs(&repo).await.expect_err("Vault is out");
        assert_eq!(e.class, ErrorClass::Transient, "{}", e.message);
        assert_eq!(forge.http().requests(), 0);
        assert!(
            lock(&shared)
                .faults
                .failing
                .contains(&Scope::Queue(repo.repo.clone()))
        );
        lock(&shared).t = 60;
        forge.list_jobs(&repo).await.expect("Vault is back");
    });
}

#[test]
fn transient_faults_fail_each_call_as_transient_timeouts_included() {
    let shared = quiet_world();
    lock(&shared).options.faults.insert(
        Service::GitHub,
        FaultRates {
            transient: 1.0,
            ..Default::default()
        },
    );
    let forge = GitHubForge::new(&shared, true);
    let repo = repo(&shared, VAULT_REPO);
    runtime().block_on(async {
        let mut messages = Vec::new();
        for _ in 0..12 {
            let e = forge.list_jobs(&repo).await.expect_err("faulted");
            assert_eq!(e.class, ErrorClass::Transient, "{}", e.message);
            messages.push(e.message);
        }
        // Each kind came up: a 502, a reset connection, no answer at all (the client's
        // timeout ends the wait on the paused clock).
        for kind in ["502 Bad Gateway", "connection reset", "timed out after 10s"] {
            assert!(
                messages.iter().any(|m| m.contains(kind)),
                "{kind}: {messages:#?}"
            );
        }
    });
    let sim = lock(&shared);
    assert!(
        sim.faults
            .failing
            .contains(&Scope::Queue(repo.repo.clone()))
    );
    assert_eq!(sim.faults.injected_total, 12);
    assert_eq!(sim.requests.github_primary, 0);
}

#[test]
fn app_repos_mint_canary_jit_configs_and_vault_repos_mint_nothing() {
    let shared = quiet_world();
    let forge = GitHubForge::new(&shared, true);
    let app = repo(&shared, APP_REPO);
    let vault = repo(&shared, VAULT_REPO);
    let name = RunnerName("ci-runner-0123456789ab".into());
    let labels = crate::model::LabelSet::parse(&["self-hosted"]).unwrap();
    let runner = RunnerIdentity {
        name: &name,
        labels: &labels,
    };
    runtime().block_on(async {
        let minted = forge
            .mint(&app, runner)
            .await
            .expect("minted")
            .expect("a config");
        assert!(secrecy::ExposeSecret::expose_secret(&minted.plain()).starts_with(CANARY));
        let id = minted.runner_id().expect("a JIT config names its runner");
        let registered = lock(&shared).world.registrations_of(&app.repo, 0);
        assert_eq!(registered, vec![(id, name.clone(), false, false)]);
        assert!(
            forge
                .mint(&vault, runner)
                .await
                .expect("nothing to mint")
                .is_none()
        );
        assert_eq!(forge.client().repo_url(&app), forge.repo_url(&app));
    });
}

/// Serves one request to `http` with an installation token for `repo` that may do
/// everything the daemon does: the status, the `Link` header and the body.
fn call(
    http: &GitHubHttp,
    method: Method,
    uri: &str,
    repo: &RepoName,
    body: Option<Value>,
) -> (StatusCode, Option<String>, Value) {
    let token = "ghs_test_token";
    http.state().tokens.insert(
        token.to_string(),
        Grant {
            repos: BTreeSet::from([repo.clone()]),
            permissions: BTreeMap::from([
                ("actions".to_string(), "read".to_string()),
                ("administration".to_string(), "write".to_string()),
            ]),
            expires_s: u64::MAX,
        },
    );
    let (parts, ()) = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .expect("a request")
        .into_parts();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let Served::Answer(response) = http.serve(&parts, body.as_bytes()) else {
        panic!("no faults in a quiet world");
    };
    let link = response
        .headers()
        .get("link")
        .map(|v| v.to_str().expect("text").to_string());
    let status = response.status();
    let body = serde_json::from_str(response.body()).unwrap_or(Value::Null);
    (status, link, body)
}

#[test]
fn runners_are_listed_by_page_with_a_link_and_filtered_by_name() {
    let shared = quiet_world();
    let forge = GitHubForge::new(&shared, true);
    let app = repo(&shared, APP_REPO);
    {
        let mut sim = lock(&shared);
        let Sim { world, trace, .. } = &mut *sim;
        for i in 0..150 {
            let name = RunnerName(format!("ci-runner-{i:03}"));
            world
                .register_jit(5, &app.repo, &name, trace)
                .expect("a new name");
        }
    }
    let listed = runtime()
        .block_on(forge.list_runners(&app))
        .expect("listed");
    assert_eq!(listed.len(), 150, "both pages walked");
    let pages = lock(&shared).requests.github_primary_by_kind["GET runners"];
    assert_eq!(pages, 2, "one billed request per page of 100");

    let path = format!("/repos/{}/actions/runners", app.repo);
    let (status, link, body) = call(
        forge.http(),
        Method::GET,
        &format!("{path}?per_page=100&page=2"),
        &app.repo,
        None,
    );
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["total_count"], 150);
    assert_eq!(body["runners"].as_array().expect("runners").len(), 50);
    let link = link.expect("two pages: a Link header");
    assert!(
        link.contains("per_page=100&page=1>; rel=\"prev\""),
        "{link}"
    );
    assert!(!link.contains("rel=\"next\""), "{link}");

    let (status, link, body) = call(
        forge.http(),
        Method::GET,
        &format!("{path}?name=ci-runner-042"),
        &app.repo,
        None,
    );
    assert_eq!((status, link), (StatusCode::OK, None));
    assert_eq!(body["total_count"], 1);
    assert_eq!(body["runners"][0]["name"], "ci-runner-042");
}

#[test]
fn a_jit_config_follows_its_example_and_needs_a_runner_group() {
    let shared = quiet_world();
    let forge = GitHubForge::new(&shared, true);
    let app = repo(&shared, APP_REPO);
    let path = format!("/repos/{}/actions/runners/generate-jitconfig", app.repo);
    let example: Value = serde_json::from_str(include_str!(
        "../../../../tests/fixtures/github/generate-jitconfig.request.json"
    ))
    .expect("JSON");
    let mut without_group = example.clone();
    without_group
        .as_object_mut()
        .expect("an object")
        .remove("runner_group_id");
    let (status, _, body) = call(
        forge.http(),
        Method::POST,
        &path,
        &app.repo,
        Some(without_group),
    );
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["message"],
        "Invalid request.\n\n\"runner_group_id\" wasn't supplied."
    );
    assert!(
        lock(&shared)
            .world
            .registrations_of(&app.repo, 0)
            .is_empty()
    );

    let (status, _, body) = call(forge.http(), Method::POST, &path, &app.repo, Some(example));
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let documented: Value = serde_json::from_str(include_str!(
        "../../../../tests/fixtures/github/generate-jitconfig.response.json"
    ))
    .expect("JSON");
    // The example runner but for the ids: no `ephemeral`, `macOS` read-only.
    let without_ids = |runner: &Value| {
        let mut runner = runner.clone();
        runner.as_object_mut().expect("an object").remove("id");
        for label in runner["labels"].as_array_mut().expect("labels") {
            label.as_object_mut().expect("an object").remove("id");
        }
        runner
    };
    assert_eq!(
        without_ids(&body["runner"]),
        without_ids(&documented["runner"])
    );
    assert!(
        body["encoded_jit_config"]
            .as_str()
            .is_some_and(|c| c.starts_with(CANARY))
    );
}

#[test]
fn the_run_status_filter_takes_conclusions_and_a_search_is_capped_at_1000() {
    let shared = quiet_world();
    let forge = GitHubForge::new(&shared, true);
    let app = repo(&shared, APP_REPO);
    {
        let mut sim = lock(&shared);
        let job = sim
            .world
            .jobs
            .values()
            .find(|j| j.repo == app.repo && j.forge == ForgeKind::GitHub)
            .expect("the burst queued work here")
            .clone();
        for i in 0..1200 {
            let mut job = job.clone();
            job.run = 9_000_000 + i;
            job.visible = Visible::Queued;
            sim.world.jobs.insert(8_000_000 + i, job);
        }
    }
    let total = |query: &str| {
        let uri = format!("/repos/{}/actions/runs?{query}", app.repo);
        let (status, _, body) = call(forge.http(), Method::GET, &uri, &app.repo, None);
        assert_eq!(status, StatusCode::OK, "{query}: {body}");
        body["total_count"].as_u64().expect("a count")
    };
    assert_eq!(total("status=queued&per_page=1"), 1000, "a search");
    assert!(total("per_page=1") > 1200, "no filter: no search, no cap");
    // The world lists unfinished runs only: no conclusion to match.
    assert_eq!(total("status=success&per_page=1"), 0);
}
