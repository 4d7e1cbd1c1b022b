//! Guards that keep the daemon from acting on a stale fact, leaking a token or over-holding a
//! scope. Each test here fails when its guard is removed.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use chrono::{DateTime, Utc};
use runner_scaler::act::execute::{PurgeOutcome, RegistrationsToDelete, carry_out};
use runner_scaler::act::{
    ChildControl, Credential, Deregistration, DispatchRequest, Dispatched, RegisteredRunners,
    Registrar, RunnerIdentity,
};
use runner_scaler::clients::github::{GitHub, GitHubSettings};
use runner_scaler::clients::http::TlsFiles;
use runner_scaler::clients::nomad::{NomadClient, NomadSettings};
use runner_scaler::config::watch::ConfigState;
use runner_scaler::config::{Mode, RepoConfig};
use runner_scaler::control_loop::{Controller, Forge, LoopSettings, Services};
use runner_scaler::model::{ChildId, ErrorClass, RunnerName};
use runner_scaler::observe::{ChildStatus, PortError, QueueSource, RepoJobs};
use runner_scaler::plan::Plan;
use runner_scaler::plan::reap::StaleRegistration;
use runner_scaler::secrets::{SecretSource, SecretString};
use runner_scaler::sim::memory::MemoryWorld;
use runner_scaler::sim::twins::nomad::{NomadTwin, PayloadRule};
use support::memory_loop::{SH, app_config, controller, repo, t0};
use support::recording::RecordingServer;

// ---- a. a child is purged only if Nomad, re-read at that moment, still says dead ----

/// Nomad whose listing said dead, but whose re-read says `status`.
struct ReReadSays {
    status: Option<ChildStatus>,
    purged: Mutex<Vec<ChildId>>,
}

#[async_trait]
impl ChildControl for ReReadSays {
    async fn dispatch(&self, _request: &DispatchRequest) -> Result<Dispatched, PortError> {
        unreachable!("the plan dispatches nothing")
    }

    async fn child_status(&self, _child: &ChildId) -> Result<Option<ChildStatus>, PortError> {
        Ok(self.status)
    }

    async fn purge(&self, child: &ChildId) -> Result<(), PortError> {
        self.purged.lock().unwrap().push(child.clone());
        Ok(())
    }

    async fn has_live_allocation(&self, _child: &ChildId) -> Result<bool, PortError> {
        unreachable!("the plan takes no runner back")
    }

    async fn stop(&self, _child: &ChildId) -> Result<(), PortError> {
        unreachable!("the plan takes no runner back")
    }
}

/// Records the Forgejo runners deleted.
#[derive(Default)]
struct DeletedRunners(Mutex<Vec<u64>>);

#[async_trait]
impl RegisteredRunners for DeletedRunners {
    async fn delete_registered(
        &self,
        _repo: &RepoConfig,
        runner_id: u64,
    ) -> Result<Deregistration, PortError> {
        self.0.lock().unwrap().push(runner_id);
        Ok(Deregistration::Deleted)
    }
}

#[tokio::test]
async fn a_child_no_longer_dead_when_re_read_is_vetoed_not_purged_and_keeps_its_runner() {
    let child = ChildId::new(
        "forgejo-build-runner/dispatch-1764536461-0000002a",
        "default",
    );
    let plan = Plan {
        purges: vec![child.clone()],
        ..Plan::default()
    };
    let config = support::twins::config(
        r#"{ "alex/s3-orchestrator": { "mode": "forgejo", "forgejoUrl": "https://forgejo.example",
             "vaultPath": "forgejo/scaler", "labels": ["build"], "defaultJob": "forgejo-build-runner" } }"#,
    );
    // The ephemeral runner this child's dispatch registered on Forgejo.
    let to_delete = RegistrationsToDelete {
        of_purged: [(
            child.clone(),
            StaleRegistration {
                repo: repo("alex/s3-orchestrator"),
                runner_id: 41,
                name: RunnerName("forgejo-build-runner-0123456789ab".into()),
            },
        )]
        .into(),
        ..Default::default()
    };
    let world = MemoryWorld::new(t0());
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1);
    for (now, outcome) in [
        (
            Some(ChildStatus::Running),
            PurgeOutcome::Vetoed(child.clone(), ChildStatus::Running),
        ),
        (
            Some(ChildStatus::Pending),
            PurgeOutcome::Vetoed(child.clone(), ChildStatus::Pending),
        ),
        (None, PurgeOutcome::Gone(child.clone())),
        (Some(ChildStatus::Dead), PurgeOutcome::Purged(child.clone())),
    ] {
        let nomad = ReReadSays {
            status: now,
            purged: Mutex::default(),
        };
        let deleted = Arc::new(DeletedRunners::default());
        let mut services = world.services();
        if let Some(forgejo) = services.forgejo.as_mut() {
            forgejo.registered = Some(deleted.clone());
        }
        let report = carry_out(&plan, &[], &to_delete, &config, &services, &nomad, &mut rng).await;
        assert_eq!(report.purges, vec![outcome], "re-read says {now:?}");
        let purged = nomad.purged.lock().unwrap().clone();
        let gone = matches!(now, None | Some(ChildStatus::Dead));
        let expected = if now == Some(ChildStatus::Dead) {
            vec![child.clone()]
        } else {
            vec![]
        };
        assert_eq!(purged, expected, "re-read says {now:?}");
        // Its runner goes only with it: never while Nomad says it may still run.
        let expected_deleted: Vec<u64> = if gone { vec![41] } else { vec![] };
        assert_eq!(
            *deleted.0.lock().unwrap(),
            expected_deleted,
            "re-read says {now:?}"
        );
    }
}

// ---- b. GitHub's next-page links are followed only on the API's own origin and path ----

const POLL_TOKEN: &str = "guards-test-poll-token-0c7d";

struct PollingToken;

#[async_trait]
impl SecretSource for PollingToken {
    async fn read_field(&self, _path: &str, _field: &str) -> Result<SecretString, PortError> {
        Ok(SecretString::from(POLL_TOKEN))
    }
}

fn vault_repo(name: &str) -> RepoConfig {
    RepoConfig {
        repo: repo(name),
        mode: Mode::Vault {
            vault_path: "github/poll".into(),
            register_vault_path: "github/admin".into(),
        },
        max_concurrent: 2,
        profiles: vec![],
        default_job: Some("ci-runner".into()),
        labels: None,
        search_labels_as_written: Default::default(),
        credential: Default::default(),
        nomad_namespace: None,
    }
}

#[tokio::test]
async fn a_next_page_link_off_the_api_is_never_followed() {
    // Stands for every other origin: it must hear nothing.
    let elsewhere = RecordingServer::start(|_| StatusCode::OK.into_response()).await;
    let other_port = elsewhere.port();
    let next: Arc<Mutex<String>> = Arc::default();
    let link = next.clone();
    let api = RecordingServer::start(move |_| {
        let mut response = (
            StatusCode::OK,
            r#"{"total_count": 300, "workflow_runs": [{"id": 1}]}"#,
        )
            .into_response();
        let value = format!(r#"<{}>; rel="next""#, link.lock().unwrap());
        response
            .headers_mut()
            .insert(header::LINK, HeaderValue::from_str(&value).unwrap());
        response
    })
    .await;
    let port = api.port();
    // A GHES-style API below a path, so that a path outside it can be tried.
    let api_url = format!("http://127.0.0.1:{port}/api/v3");
    let page = "repos/acme/api/actions/runs?status=queued&per_page=100&page=2";
    let hostile = [
        format!("http://127.0.0.1:{other_port}/api/v3/{page}"),
        format!("http://localhost:{port}/api/v3/{page}"),
        format!("http://localhost:{other_port}/api/v3/{page}"),
        format!("https://127.0.0.1:{port}/api/v3/{page}"),
        format!("http://user:pw@127.0.0.1:{port}/api/v3/{page}"),
        format!("http://:pw@127.0.0.1:{port}/api/v3/{page}"),
        format!("http://127.0.0.1:{port}/other/{page}"),
        format!("http://127.0.0.1:{port}/api/v3x/{page}"),
        format!("http://127.0.0.1:{port}/api/v3/../../{page}"),
        format!("http://evil.example/api/v3/{page}"),
        format!("//evil.example/api/v3/{page}"),
    ];
    for link in hostile {
        *next.lock().unwrap() = link.clone();
        let asked_before = api.requests().len();
        let client = GitHub::new(
            GitHubSettings {
                api_url: api_url.parse().unwrap(),
                app: None,
                request_timeout: Duration::from_secs(10),
            },
            Arc::new(PollingToken),
        )
        .unwrap();
        // A hinted read is a full one: it lists queued runs and follows their pages.
        client.hinted(&repo("acme/api"));
        let error = client
            .list_jobs(&vault_repo("acme/api"))
            .await
            .expect_err(&link);
        assert_eq!(error.class, ErrorClass::Malformed, "{link}: {error:?}");
        assert!(
            error.message.contains("the next-page link leaves the API"),
            "{link}: {}",
            error.message
        );
        assert!(!error.message.contains(POLL_TOKEN), "{link}");
        let asked: Vec<String> = api.requests()[asked_before..]
            .iter()
            .map(|r| format!("{} {}", r.host(), r.uri))
            .collect();
        assert_eq!(asked.len(), 1, "{link}: followed to {asked:?}");
        assert!(
            elsewhere.requests().is_empty(),
            "{link}: the other origin was asked"
        );
    }
    // The same listing with a link on the API is followed: the refusals above are the guard.
    *next.lock().unwrap() = format!("http://127.0.0.1:{port}/api/v3/{page}");
    let client = GitHub::new(
        GitHubSettings {
            api_url: api_url.parse().unwrap(),
            app: None,
            request_timeout: Duration::from_secs(10),
        },
        Arc::new(PollingToken),
    )
    .unwrap();
    let asked_before = api.requests().len();
    client.hinted(&repo("acme/api"));
    let _ = client.list_jobs(&vault_repo("acme/api")).await;
    assert!(api.requests().len() > asked_before + 1);
}

// ---- c. a new document retries the errors it may have fixed at once ----

/// A queue GitHub refuses (403) until the fix lands.
struct ForbiddenUntilFixed {
    inner: MemoryWorld,
    fixed: AtomicBool,
    asked: AtomicUsize,
}

#[async_trait]
impl QueueSource for ForbiddenUntilFixed {
    async fn list_jobs(&self, repo: &RepoConfig) -> Result<RepoJobs, PortError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        if !self.fixed.load(Ordering::SeqCst) {
            return Err(PortError::new(
                ErrorClass::Forbidden,
                "403 Forbidden: \"Resource not accessible by integration\"",
            ));
        }
        self.inner.list_jobs(repo).await
    }
}

/// The paused clock as wall time; counts the ticks that read it.
struct TickClock {
    start: tokio::time::Instant,
    ticks: tokio::sync::watch::Sender<u32>,
}

impl runner_scaler::clock::Clock for TickClock {
    fn now(&self) -> DateTime<Utc> {
        self.ticks.send_modify(|n| *n += 1);
        t0() + chrono::Duration::from_std(self.start.elapsed()).unwrap()
    }
}

#[tokio::test(start_paused = true)]
async fn a_new_document_retries_a_held_refusal_at_once() {
    let world = MemoryWorld::new(t0());
    world.queue_job(&repo("acme/api"), SH);
    let queue = Arc::new(ForbiddenUntilFixed {
        inner: world.clone(),
        fixed: AtomicBool::new(false),
        asked: AtomicUsize::new(0),
    });
    let mut ctl = controller(&world);
    ctl.services.github = Some(Forge {
        queue: queue.clone(),
        registrar: Arc::new(world.clone()),
        runners: None,
        registered: None,
    });
    let settings = ctl.settings.clone();
    assert!(settings.terminal_retry > settings.poll_interval * 10);
    let document = |version| ConfigState {
        config: Some(Arc::new(app_config(&[("acme/api", 2)]))),
        applied_index: Some(version),
        ..ConfigState::default()
    };
    let (config_tx, config_rx) = tokio::sync::watch::channel(document(1));
    let (ticks_tx, mut ticks) = tokio::sync::watch::channel(0);
    let clock = TickClock {
        start: tokio::time::Instant::now(),
        ticks: ticks_tx,
    };
    let asked_while_held = Arc::new(AtomicUsize::new(0));
    // The shutdown future is polled between ticks only: it drives the scenario.
    let scenario = {
        let queue = queue.clone();
        let asked_while_held = asked_while_held.clone();
        async move {
            // Refused on the first tick, then held on the next two.
            let _ = ticks.wait_for(|n| *n >= 3).await;
            asked_while_held.store(queue.asked.load(Ordering::SeqCst), Ordering::SeqCst);
            // The operator fixes the grant and saves a new document version.
            queue.fixed.store(true, Ordering::SeqCst);
            config_tx.send_replace(document(2));
            let _ = ticks.wait_for(|n| *n >= 4).await;
        }
    };
    let started = tokio::time::Instant::now();
    runner_scaler::control_loop::run(ctl, config_rx, &clock, false, scenario).await;

    assert_eq!(
        asked_while_held.load(Ordering::SeqCst),
        1,
        "asked while held"
    );
    assert_eq!(
        queue.asked.load(Ordering::SeqCst),
        2,
        "not asked again after the new document"
    );
    assert_eq!(world.dispatch_count(), 1);
    assert!(started.elapsed() < settings.terminal_retry);
}

// ---- d. a Nomad refusal about one repo's dispatch holds that repo only ----

/// Mints for `app` repos only, as GitHub does: `vault` repos' runners read their own token.
struct MintsForAppRepos(MemoryWorld);

#[async_trait]
impl Registrar for MintsForAppRepos {
    async fn mint(
        &self,
        repo: &RepoConfig,
        runner: RunnerIdentity<'_>,
    ) -> Result<Option<Credential>, PortError> {
        match repo.mode {
            Mode::App => self.0.mint(repo, runner).await,
            _ => Ok(None),
        }
    }

    fn repo_url(&self, repo: &RepoConfig) -> String {
        self.0.repo_url(repo)
    }
}

/// Nomad's answer to every dispatch attempt, by the repo it was for, in order.
struct RecordingNomad {
    nomad: Arc<NomadClient>,
    attempts: Mutex<Vec<(String, Result<(), ErrorClass>)>>,
}

#[async_trait]
impl ChildControl for RecordingNomad {
    async fn dispatch(&self, request: &DispatchRequest) -> Result<Dispatched, PortError> {
        let result = self.nomad.dispatch(request).await;
        let repo = request
            .meta
            .repo_url
            .trim_start_matches("https://github.com/");
        self.attempts.lock().unwrap().push((
            repo.to_string(),
            result.as_ref().map(|_| ()).map_err(|e| e.class),
        ));
        result
    }

    async fn child_status(&self, child: &ChildId) -> Result<Option<ChildStatus>, PortError> {
        self.nomad.child_status(child).await
    }

    async fn purge(&self, child: &ChildId) -> Result<(), PortError> {
        self.nomad.purge(child).await
    }

    async fn has_live_allocation(&self, child: &ChildId) -> Result<bool, PortError> {
        self.nomad.has_live_allocation(child).await
    }

    async fn stop(&self, child: &ChildId) -> Result<(), PortError> {
        self.nomad.stop(child).await
    }
}

impl RecordingNomad {
    fn take(&self) -> Vec<(String, Result<(), ErrorClass>)> {
        std::mem::take(&mut *self.attempts.lock().unwrap())
    }
}

#[tokio::test]
async fn a_nomad_refusal_of_one_repos_dispatch_holds_that_repo_only() {
    // ci-runner is a parent for runners that read their own token: it permits no
    // runner_token, so Nomad refuses the app repo's dispatch (which carries one) with its
    // plain-text 500, and accepts the vault repo's.
    let twin = NomadTwin::new();
    twin.register_parent(
        "ci-runner",
        &["repo_url", "runner_name"],
        &["labels", "managed_by"],
        PayloadRule::Forbidden,
    );
    let server = twin.serve().await.unwrap();
    let client = Arc::new(
        NomadClient::new(
            NomadSettings {
                addr: server.base_url().parse().unwrap(),
                token: None,
                namespace: None,
                region: None,
                tls: TlsFiles::default(),
            },
            Duration::from_secs(10),
        )
        .unwrap(),
    );
    let nomad = Arc::new(RecordingNomad {
        nomad: client.clone(),
        attempts: Mutex::default(),
    });
    let world = MemoryWorld::new(t0());
    let services = Services {
        github: Some(Forge {
            queue: Arc::new(world.clone()),
            registrar: Arc::new(MintsForAppRepos(world.clone())),
            runners: None,
            registered: None,
        }),
        forgejo: None,
        children: client,
        control: nomad.clone(),
        wrapper: None,
    };
    let mut ctl = Controller::new(
        services,
        LoopSettings::default(),
        Box::new(<rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(3)),
    );
    let (app, vault) = (repo("acme/api"), repo("acme/web"));
    let mut config = app_config(&[("acme/api", 4)]);
    config.repos.insert(vault.clone(), vault_repo("acme/web"));
    let at = |s: i64| t0() + chrono::Duration::seconds(s);

    // The app repo's job is the older one: its refused dispatch comes first.
    world.set_now(at(-60));
    world.queue_job(&app, SH);
    world.set_now(at(-30));
    world.queue_job(&vault, SH);
    ctl.tick(&config, 1, at(0), false).await;
    assert_eq!(
        nomad.take(),
        vec![
            ("acme/api".to_string(), Err(ErrorClass::Configuration)),
            ("acme/web".to_string(), Ok(())),
        ],
        "the vault repo's dispatch of the same parent was skipped"
    );

    world.queue_job(&app, SH);
    world.queue_job(&vault, SH);
    ctl.tick(&config, 1, at(15), false).await;
    assert_eq!(
        nomad.take(),
        vec![("acme/web".to_string(), Ok(()))],
        "the refused repo is held, the other is not"
    );
    assert_eq!(twin.children("ci-runner").len(), 2);
}
