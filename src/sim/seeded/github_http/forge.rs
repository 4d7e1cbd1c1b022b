//! The ports the loop calls on the seeded world's GitHub: [`GitHubForge`], the real client
//! over [`GitHubHttp`] (queue reads, runner registrations, JIT mints), which tells the service
//! which of the loop's calls a request serves, and [`SimSecrets`], Vault as the polling
//! tokens of the `vault` repos see it.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use secrecy::SecretString;

use super::auth::APP_PRIVATE_KEY_PEM;
use super::{API_URL, APP_BUDGET, GitHubHttp, REQUEST_TIMEOUT, polling_token, virtual_now};
use crate::act::{Credential, Deregistration, Registrar, RunnerIdentity, RunnerRegistry};
use crate::clients::github::{AppCredentials, GitHub, GitHubSettings, POLLING_TOKEN_FIELD};
use crate::config::{Mode, RepoConfig};
use crate::model::ErrorClass;
use crate::observe::{PortError, QueueSource, RepoJobs, RunnerRegistration};
use crate::secrets::SecretSource;
use crate::sim::seeded::options::Service;
use crate::sim::seeded::ports::{Scope, Shared, budget_of, lock, repo_url};
use crate::sim::twins::github::TEST_APP_ID;

/// Vault as the `vault` repos' polling tokens see it: a fixed fake token, and a transient
/// failure while the seed has Vault out (recorded against the queues of the repos whose
/// token lives at that path).
pub struct SimSecrets(pub Shared);

#[async_trait]
impl SecretSource for SimSecrets {
    async fn read_field(&self, path: &str, field: &str) -> Result<SecretString, PortError> {
        let mut sim = lock(&self.0);
        if sim.options.outage_at(Service::Vault, sim.t).is_some() {
            let e = PortError::new(
                ErrorClass::Transient,
                format!("read secret/data/{path}: 503 Vault is sealed"),
            );
            let scopes: Vec<Scope> = sim
                .config
                .repos
                .values()
                .filter(|r| matches!(&r.mode, Mode::Vault { vault_path, .. } if vault_path == path))
                .map(|r| Scope::Queue(r.repo.clone()))
                .collect();
            for scope in &scopes {
                sim.record_fault(scope, Service::Vault, &e);
            }
            sim.faults.injected_total += 1;
            return Err(e);
        }
        if field != POLLING_TOKEN_FIELD {
            return Err(PortError::new(
                ErrorClass::NotFound,
                format!("read secret/data/{path}: no field {field:?}"),
            ));
        }
        Ok(SecretString::from(polling_token(path)))
    }
}

/// The GitHub forge of the seeded world: the real client over [`GitHubHttp`]. The client is
/// built at its first call, inside the runtime that drives the ticks (octocrab spawns its
/// buffer worker there).
pub struct GitHubForge {
    shared: Shared,
    http: GitHubHttp,
    conditional_requests: bool,
    client: OnceLock<GitHub>,
    /// The daemon whose calls these are (`None`: a baseline or a test, which holds no lock).
    writer: Option<usize>,
}

/// Marks a mint in flight for as long as it lives, however the mint ends.
struct Minting<'a>(&'a GitHubHttp);

impl<'a> Minting<'a> {
    fn start(http: &'a GitHubHttp) -> Minting<'a> {
        http.state().minting += 1;
        Minting(http)
    }
}

impl Drop for Minting<'_> {
    fn drop(&mut self) {
        self.0.state().minting -= 1;
    }
}

/// Marks a runner registration read or deletion in flight for as long as it lives.
struct ManagingRunners<'a>(&'a GitHubHttp);

impl<'a> ManagingRunners<'a> {
    fn start(http: &'a GitHubHttp) -> ManagingRunners<'a> {
        http.state().managing_runners += 1;
        ManagingRunners(http)
    }
}

impl Drop for ManagingRunners<'_> {
    fn drop(&mut self) {
        self.0.state().managing_runners -= 1;
    }
}

impl GitHubForge {
    pub fn new(shared: &Shared, conditional_requests: bool) -> GitHubForge {
        GitHubForge::over(shared, GitHubHttp::new(shared), conditional_requests)
    }

    /// A client of its own (a daemon's: its token cache, ETags and budget readings) over
    /// `http`, GitHub's side, which every daemon of the world shares.
    pub fn over(shared: &Shared, http: GitHubHttp, conditional_requests: bool) -> GitHubForge {
        GitHubForge {
            shared: shared.clone(),
            http,
            conditional_requests,
            client: OnceLock::new(),
            writer: None,
        }
    }

    /// Judges this client's writes against `writer`'s lease.
    pub fn with_writer(mut self, writer: Option<usize>) -> GitHubForge {
        self.writer = writer;
        self
    }

    /// The service the client talks to.
    pub fn http(&self) -> &GitHubHttp {
        &self.http
    }

    /// The real client, built on first use (inside a tokio runtime).
    pub fn client(&self) -> &GitHub {
        self.client.get_or_init(|| {
            let settings = GitHubSettings {
                api_url: url::Url::parse(API_URL).expect("a valid URL"),
                app: Some(AppCredentials {
                    app_id: TEST_APP_ID.into(),
                    private_key: SecretString::from(APP_PRIVATE_KEY_PEM),
                    installation_id: None,
                }),
                request_timeout: REQUEST_TIMEOUT,
            };
            let clock = self.shared.clone();
            let client = GitHub::over_service(
                settings,
                self.http.clone(),
                Arc::new(SimSecrets(self.shared.clone())),
            )
            .expect("the test App key is valid")
            .with_clock(Arc::new(move || virtual_now(lock(&clock).t)));
            if self.conditional_requests {
                client
            } else {
                // The seed poller of the field report: every listing billed, and no holding
                // back short of GitHub's secondary limit either.
                client
                    .without_conditional_requests()
                    .with_read_points_per_minute(u32::MAX)
            }
        })
    }

    /// The client refuses on its own, without a request, while a budget it was told about is
    /// spent. That holds a scope back as a fault does, when the world agrees the budget is
    /// out; a refusal the world does not justify is left for the invariants to catch.
    fn held_back(&self, scope: Scope, repo: &RepoConfig, result: &Result<impl Sized, PortError>) {
        let Err(e) = result else { return };
        if e.class != ErrorClass::RateLimited {
            return;
        }
        let mut sim = lock(&self.shared);
        let t = sim.t;
        let mut holders = vec![budget_of(repo)];
        if matches!(repo.mode, Mode::App) {
            holders.push(APP_BUDGET.to_string());
        }
        let spent = holders
            .iter()
            .any(|h| sim.faults.exhausted.get(h).is_some_and(|reset| *reset > t));
        if spent && !sim.faults.injected_now.contains(&scope) {
            sim.record_fault(&scope, Service::GitHub, e);
        }
    }
}

#[async_trait]
impl QueueSource for GitHubForge {
    fn budget(&self, repo: &RepoConfig) -> Option<crate::observe::BudgetReading> {
        self.client().budget(repo)
    }

    fn serving(&self, repos: &[&RepoConfig]) {
        self.client().serving(repos);
    }

    fn read_points(&self, repo: &RepoConfig) -> Option<crate::observe::ReadPoints> {
        self.client().read_points(repo)
    }

    fn hinted(&self, repo: &crate::model::RepoName) {
        self.client().hinted(repo);
    }

    async fn list_jobs(&self, repo: &RepoConfig) -> Result<RepoJobs, PortError> {
        let result = self.client().list_jobs(repo).await;
        self.held_back(Scope::Queue(repo.repo.clone()), repo, &result);
        if let Ok(reading) = &result {
            lock(&self.shared).queue_read(&repo.repo, reading.jobs.len());
        }
        result
    }
}

#[async_trait]
impl RunnerRegistry for GitHubForge {
    async fn list_runners(&self, repo: &RepoConfig) -> Result<Vec<RunnerRegistration>, PortError> {
        let _managing = ManagingRunners::start(&self.http);
        self.client().list_runners(repo).await
    }

    async fn get_runner(
        &self,
        repo: &RepoConfig,
        runner_id: u64,
    ) -> Result<Option<RunnerRegistration>, PortError> {
        let _managing = ManagingRunners::start(&self.http);
        self.client().get_runner(repo, runner_id).await
    }

    async fn delete_runner(
        &self,
        repo: &RepoConfig,
        runner_id: u64,
    ) -> Result<Deregistration, PortError> {
        {
            let mut sim = lock(&self.shared);
            sim.write_sent(self.writer, "a registration delete");
            let t = sim.t;
            sim.world.delete_sent(runner_id, t);
        }
        let _managing = ManagingRunners::start(&self.http);
        self.client().delete_runner(repo, runner_id).await
    }
}

#[async_trait]
impl Registrar for GitHubForge {
    async fn mint(
        &self,
        repo: &RepoConfig,
        runner: RunnerIdentity<'_>,
    ) -> Result<Option<Credential>, PortError> {
        lock(&self.shared).write_sent(self.writer, "a mint");
        let result = {
            let _minting = Minting::start(&self.http);
            self.client().mint(repo, runner).await
        };
        self.held_back(Scope::Mint(repo.repo.clone()), repo, &result);
        result
    }

    fn repo_url(&self, repo: &RepoConfig) -> String {
        repo_url(repo)
    }
}
