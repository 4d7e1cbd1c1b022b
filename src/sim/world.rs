//! The simulated world behind `runner-scaler simulate`: twins of every service on loopback,
//! the real daemon (real clients, config watcher, control loop) against them, and a world
//! that plays the part of the cluster and of the runners.
//!
//! The world is honest about how GitHub hands out work: an idle registered runner is given
//! the oldest queued job whose labels are all among its own, not the job it was dispatched
//! for. A runner with more labels can therefore take another bucket's job.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::json;

use crate::config::watch::{WatchSettings, spawn as spawn_watcher};
use crate::config::{Config, ConfigDefaults, Route, parse_document};
use crate::control_loop::{Controller, LoopSettings};
use crate::model::{LabelSet, MANAGED_BY, RepoName};
use crate::observe::ChildStatus;
use crate::sim::daemon_clients::{DaemonClients, TwinAddresses, TwinCredentials};
use crate::sim::twins::TwinServer;
use crate::sim::twins::consul::ConsulTwin;
use crate::sim::twins::forgejo::ForgejoTwin;
use crate::sim::twins::github::{GitHubTwin, TEST_APP_ID, TEST_APP_PRIVATE_KEY_PEM, TwinJobStatus};
use crate::sim::twins::nomad::{NomadTwin, PayloadRule};
use crate::sim::twins::vault::{VaultPolicy, VaultTwin};

/// The document of BRIEF.md ("The configuration users edit"), with `FORGEJO_URL` standing for
/// the Forgejo twin's address.
pub const BRIEF_DOCUMENT_TEMPLATE: &str = r#"{
  "afreidah/munchbox": { "maxConcurrent": 3, "mode": "app" },
  "alex/s3-orchestrator": {
    "mode": "forgejo", "forgejoUrl": "FORGEJO_URL",
    "maxConcurrent": 1, "vaultPath": "forgejo/scaler",
    "profiles": [ { "job": "forgejo-build-runner", "label": "build", "maxConcurrent": 1 } ]
  },
  "ev-the-dev/moat": {
    "mode": "vault", "vaultPath": "github/moat-poll", "registerVaultPath": "github/moat-runner",
    "profiles": [
      { "job": "github-runner-moat-vm", "label": "vm", "maxConcurrent": 1 },
      { "job": "go-ci-runner", "label": "go", "maxConcurrent": 3 }
    ]
  }
}"#;

const CONFIG_KEY: &str = "runners/config";
/// Meta of a parent job that gets a registration token from the daemon, as in
/// `nomad/ci-runner.nomad.hcl`.
pub const TOKEN_PARENT_META_REQUIRED: &[&str] = &["repo_url", "runner_token", "runner_name"];
/// Meta every runner parent permits on top of its required keys.
pub const PARENT_META_OPTIONAL: &[&str] = &["labels", "managed_by"];
const NOMAD_TOKEN: &str = "sim-nomad-token";
const VAULT_TOKEN: &str = "sim-vault-token";
const CONSUL_TOKEN: &str = "sim-consul-token";
const POLL_TOKEN: &str = "sim-github-poll-token";
const FORGEJO_TOKEN: &str = "sim-forgejo-api-token";

/// How the world moves. Times are real: the twins talk HTTP on loopback.
#[derive(Clone, Debug)]
pub struct WorldOptions {
    pub seed: u64,
    /// The daemon's poll interval.
    pub poll_interval: Duration,
    /// How often the world moves.
    pub step: Duration,
    /// Allocations the cluster can run at once; more children stay pending, unplaced.
    pub cluster_slots: usize,
    pub boot_ms: (u64, u64),
    pub job_ms: (u64, u64),
    /// An idle runner gives up and exits after this long (the runner's own idle timeout).
    pub runner_idle_timeout: Duration,
    /// The run fails if the burst is not served by then.
    pub deadline: Duration,
}

impl Default for WorldOptions {
    fn default() -> Self {
        WorldOptions {
            seed: 1,
            poll_interval: Duration::from_millis(300),
            step: Duration::from_millis(50),
            cluster_slots: 6,
            boot_ms: (300, 1200),
            job_ms: (800, 2500),
            runner_idle_timeout: Duration::from_secs(6),
            deadline: Duration::from_secs(50),
        }
    }
}

/// What a run of the world showed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WorldSummary {
    pub seed: u64,
    pub jobs_total: usize,
    pub jobs_served: usize,
    pub dispatches: usize,
    pub purges: usize,
    /// Children of ours still in Nomad, dead, at the end: the daemon never purges a `vault`
    /// mode child (its namespace grants no `submit-job`); Nomad's batch GC removes them.
    pub left_to_nomad_gc: usize,
    /// Times a runner took a job of another bucket (a runner with more labels).
    pub cross_bucket_takes: usize,
    /// Runners that exited without ever running a job.
    pub runners_left_idle: usize,
    /// Highest count of our in-flight children seen, per cap, with the cap.
    pub in_flight_max: BTreeMap<String, (u32, u32)>,
    pub cap_violations: Vec<String>,
    pub ticks: usize,
    pub wall_time_ms: u128,
    pub timed_out: bool,
}

impl WorldSummary {
    pub fn ok(&self) -> bool {
        !self.timed_out && self.jobs_served == self.jobs_total && self.cap_violations.is_empty()
    }

    pub fn render_text(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!("\nsimulation summary (seed {})\n", self.seed));
        out.push_str(&format!(
            "  jobs served          {}/{}\n",
            self.jobs_served, self.jobs_total
        ));
        out.push_str(&format!("  dispatches           {}\n", self.dispatches));
        out.push_str(&format!("  purges               {}\n", self.purges));
        out.push_str(&format!(
            "  left to Nomad's GC   {} (vault mode: dead, never purged by the daemon)\n",
            self.left_to_nomad_gc
        ));
        out.push_str(&format!(
            "  superset takes       {} (a runner with more labels took another bucket's job)\n",
            self.cross_bucket_takes
        ));
        out.push_str(&format!(
            "  runners left idle    {} (exited on their idle timeout without a job)\n",
            self.runners_left_idle
        ));
        out.push_str("  highest in flight per cap:\n");
        for (cap, (seen, limit)) in &self.in_flight_max {
            out.push_str(&format!("    {cap:<44} {seen} of {limit}\n"));
        }
        if self.cap_violations.is_empty() {
            out.push_str("  cap violations       none\n");
        } else {
            for v in &self.cap_violations {
                out.push_str(&format!("  CAP VIOLATION        {v}\n"));
            }
        }
        out.push_str(&format!("  ticks                {}\n", self.ticks));
        out.push_str(&format!(
            "  wall time            {} ms\n",
            self.wall_time_ms
        ));
        if self.timed_out {
            out.push_str("  TIMED OUT before every job was served\n");
        }
        out
    }
}

/// A runner the world is running, in one child.
struct Runner {
    child: String,
    repo: RepoName,
    forgejo: bool,
    labels: LabelSet,
    name: String,
    ready_at: Instant,
    registered: bool,
    job: Option<(u64, Instant, bool)>,
    idle_since: Option<Instant>,
    ran_a_job: bool,
}

/// The credentials the simulated daemon presents, which [`SimTwins::provision`] makes the
/// twins accept.
pub const SIM_CREDENTIALS: TwinCredentials = TwinCredentials {
    nomad_token: NOMAD_TOKEN,
    consul_token: CONSUL_TOKEN,
    vault_token: VAULT_TOKEN,
    github_app_id: TEST_APP_ID,
    github_app_private_key_pem: TEST_APP_PRIVATE_KEY_PEM,
    config_key: CONFIG_KEY,
};

/// The five twins on loopback; dropping this stops their servers.
pub struct SimTwins {
    pub github: GitHubTwin,
    pub forgejo: ForgejoTwin,
    pub nomad: NomadTwin,
    pub consul: ConsulTwin,
    pub vault: VaultTwin,
    pub addresses: TwinAddresses,
    _servers: Vec<TwinServer>,
}

impl SimTwins {
    /// Starts every twin on loopback with nothing provisioned.
    pub async fn start() -> Result<SimTwins, String> {
        let io = |e: std::io::Error| format!("start a twin on loopback: {e}");
        let github = GitHubTwin::new();
        let forgejo = ForgejoTwin::new();
        // A Forgejo that registers one ephemeral runner per dispatch, deleted after its child.
        forgejo.set_version("15.0.0+gitea-1.22.0");
        let nomad = NomadTwin::with_seed(1);
        let consul = ConsulTwin::with_token(CONSUL_TOKEN);
        let vault = VaultTwin::new();
        let github_server = github.start().await.map_err(io)?;
        let forgejo_server = forgejo.serve().await.map_err(io)?;
        let nomad_server = nomad.serve().await.map_err(io)?;
        let consul_server = TwinServer::start(consul.router()).await.map_err(io)?;
        let vault_server = vault.serve().await.map_err(io)?;
        let addresses = TwinAddresses {
            github: github_server.base_url(),
            forgejo: forgejo_server.base_url(),
            nomad: nomad_server.base_url(),
            consul: consul_server.base_url(),
            vault: vault_server.base_url(),
        };
        Ok(SimTwins {
            github,
            forgejo,
            nomad,
            consul,
            vault,
            addresses,
            _servers: vec![
                github_server,
                forgejo_server,
                nomad_server,
                consul_server,
                vault_server,
            ],
        })
    }

    /// Sets the world of BRIEF.md up the way an operator would: parents registered, secrets
    /// stored, the App installed, the document written, every twin accepting
    /// [`SIM_CREDENTIALS`]. Returns the document.
    pub fn provision(&self) -> String {
        self.github.install_app("afreidah");
        self.github.add_repo(&repo("afreidah/munchbox"));
        self.github.add_repo(&repo("ev-the-dev/moat"));
        self.github.add_pat(
            POLL_TOKEN,
            "moat-poller",
            Some(&[repo("ev-the-dev/moat")]),
            &[("actions", "read")],
        );
        self.forgejo.add_token(FORGEJO_TOKEN);
        self.forgejo.add_repo("alex/s3-orchestrator");
        self.vault.add_token(
            VAULT_TOKEN,
            VaultPolicy::read_only(["secret/data/github/moat-poll", "secret/data/forgejo/scaler"]),
        );
        self.vault
            .put_secret("secret", "github/moat-poll", json!({ "token": POLL_TOKEN }));
        self.vault.put_secret(
            "secret",
            "forgejo/scaler",
            // The token goes only to the Forgejo its secret names.
            json!({ "token": FORGEJO_TOKEN, "url": self.addresses.forgejo }),
        );
        self.vault.put_secret(
            "secret",
            "github/moat-runner",
            json!({ "token": "admin-only" }),
        );
        self.nomad.set_acl_token(Some(NOMAD_TOKEN));
        // Parents that get a registration token from the daemon.
        for parent in ["ci-runner", "forgejo-build-runner"] {
            self.nomad.register_parent(
                parent,
                TOKEN_PARENT_META_REQUIRED,
                PARENT_META_OPTIONAL,
                PayloadRule::Forbidden,
            );
        }
        // Vault-mode parents read their admin token themselves: no runner_token in meta.
        for parent in ["github-runner-moat-vm", "go-ci-runner"] {
            self.nomad.register_parent(
                parent,
                &["repo_url", "runner_name"],
                PARENT_META_OPTIONAL,
                PayloadRule::Forbidden,
            );
        }
        let document = BRIEF_DOCUMENT_TEMPLATE.replace("FORGEJO_URL", &self.addresses.forgejo);
        self.consul.set(CONFIG_KEY, document.clone());
        document
    }

    /// Sets a fleet of `repos` GitHub repos up (`fleet/repo-000`, …), every one `app` mode
    /// on one installation of the App, served by the one parent `ci-runner` with a small
    /// cap each, the way an operator with a big organisation would. Returns the document.
    pub fn provision_fleet(&self, repos: usize) -> String {
        self.github.install_app(FLEET_OWNER);
        // GitHub scales an installation's hourly budget with its repos (5,000 plus 50 per
        // repo past 20), up to 12,500 on a plan without Enterprise Cloud.
        self.github.set_budget_limit(FLEET_INSTALLATION_BUDGET);
        for i in 0..repos {
            self.github.add_repo(&repo(&fleet_repo(i)));
        }
        // The daemon's Vault token only wraps credentials for dispatch meta: no secret to read.
        self.vault
            .add_token(VAULT_TOKEN, VaultPolicy::read_only(Vec::<String>::new()));
        self.nomad.set_acl_token(Some(NOMAD_TOKEN));
        self.nomad.register_parent(
            FLEET_PARENT,
            TOKEN_PARENT_META_REQUIRED,
            PARENT_META_OPTIONAL,
            PayloadRule::Forbidden,
        );
        let document = fleet_document(repos);
        self.consul.set(CONFIG_KEY, document.clone());
        document
    }
}

/// The owner of every fleet repo: one installation of the App covers them all.
pub const FLEET_OWNER: &str = "fleet";
/// The one parent job of the fleet: `ci-runner`, the daemon's default job.
const FLEET_PARENT: &str = "ci-runner";
/// Each fleet repo's cap: small, as most repos of a big organisation need.
pub const FLEET_REPO_MAX: u32 = 2;
/// The installation's primary budget per hour: GitHub's ceiling for a scaled installation.
const FLEET_INSTALLATION_BUDGET: u64 = 12_500;

/// The `i`th repo of the fleet: `fleet/repo-007`.
pub fn fleet_repo(i: usize) -> String {
    format!("{FLEET_OWNER}/repo-{i:03}")
}

/// The document of a fleet of `repos` `app` repos, each with a small cap and the default
/// parent, in the shape an operator writes it.
pub fn fleet_document(repos: usize) -> String {
    let entries: serde_json::Map<String, serde_json::Value> = (0..repos)
        .map(|i| {
            (
                fleet_repo(i),
                json!({ "mode": "app", "maxConcurrent": FLEET_REPO_MAX }),
            )
        })
        .collect();
    serde_json::to_string_pretty(&serde_json::Value::Object(entries))
        .expect("a JSON object serialises")
}

fn repo(name: &str) -> RepoName {
    RepoName::parse(name).expect("a valid repo name")
}

/// The repos the BRIEF document serves from Forgejo; the others are on GitHub.
const FORGEJO_REPO: &str = "alex/s3-orchestrator";

/// The burst: (repo, labels) per job, GitHub jobs first. The superset pair is in moat: a
/// `[go, vm]` job whose runner may take the `[go]` job.
pub fn burst() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut jobs = Vec::new();
    for _ in 0..5 {
        jobs.push(("afreidah/munchbox", vec!["self-hosted"]));
    }
    jobs.push(("ev-the-dev/moat", vec!["self-hosted", "go"]));
    jobs.push(("ev-the-dev/moat", vec!["self-hosted", "go", "vm"]));
    for _ in 0..3 {
        jobs.push(("ev-the-dev/moat", vec!["self-hosted", "go"]));
    }
    for _ in 0..3 {
        jobs.push((FORGEJO_REPO, vec!["build"]));
    }
    jobs
}

/// The cluster and the runners around the daemon: it places the children the daemon
/// dispatches, boots runners in them that take work the way the forges hand it out, and
/// ends the children when their runners exit. It moves only when [`World::step`] is called.
pub struct World<'t> {
    twins: &'t SimTwins,
    config: Config,
    parents: BTreeSet<String>,
    options: WorldOptions,
    rng: StdRng,
    github_jobs: BTreeMap<(RepoName, u64), LabelSet>,
    forgejo_jobs: BTreeMap<u64, LabelSet>,
    runners: BTreeMap<String, Runner>,
    seen_children: BTreeSet<String>,
    served: BTreeSet<(String, u64)>,
    in_flight_now: usize,
    summary: WorldSummary,
}

impl<'t> World<'t> {
    /// A world over provisioned `twins` serving `config`, with no job queued yet.
    pub fn new(twins: &'t SimTwins, config: Config, options: WorldOptions) -> World<'t> {
        let mut summary = WorldSummary {
            seed: options.seed,
            ..WorldSummary::default()
        };
        caps_at_zero(&config, &mut summary);
        World {
            twins,
            parents: config.parents(),
            config,
            rng: StdRng::seed_from_u64(options.seed),
            summary,
            options,
            github_jobs: BTreeMap::new(),
            forgejo_jobs: BTreeMap::new(),
            runners: BTreeMap::new(),
            seen_children: BTreeSet::new(),
            served: BTreeSet::new(),
            in_flight_now: 0,
        }
    }

    /// Queues one job on `repo_name`'s forge (Forgejo for the BRIEF's Forgejo repo, GitHub
    /// for the others), asking for `labels`.
    pub fn queue_job(&mut self, repo_name: &str, labels: &[&str]) -> Result<(), String> {
        let label_set = LabelSet::parse(labels)
            .map_err(|e| format!("queue a job on {repo_name} with labels {labels:?}: {e:?}"))?;
        if repo_name == FORGEJO_REPO {
            let id = self.twins.forgejo.add_job(repo_name, "build", labels);
            self.forgejo_jobs.insert(id, label_set);
        } else {
            let name = RepoName::parse(repo_name)
                .ok_or_else(|| format!("queue a job: {repo_name:?} is not owner/name"))?;
            let ids = self.twins.github.add_run(&name, vec![labels.to_vec()]);
            self.github_jobs.insert((name, ids.job_ids[0]), label_set);
        }
        self.summary.jobs_total += 1;
        Ok(())
    }

    /// Jobs queued so far.
    pub fn jobs_queued(&self) -> usize {
        self.summary.jobs_total
    }

    /// Every queued job served, none of our children in flight, no runner left.
    pub fn settled(&self) -> bool {
        self.served.len() == self.summary.jobs_total
            && self.in_flight_now == 0
            && self.runners.is_empty()
    }

    /// What the world showed so far; the purge count is as of the last step.
    pub fn summary(&self) -> &WorldSummary {
        &self.summary
    }

    /// Moves the world once: counts the daemon's dispatches and purges, checks the caps,
    /// places pending children while the cluster has room, and moves every runner.
    pub fn step(&mut self) {
        let now = Instant::now();
        // Nomad: children appear when dispatched and disappear when purged.
        let children = self.children();
        let twins = self.twins;
        let options = &self.options;
        let summary = &mut self.summary;
        let present: BTreeSet<String> = children.iter().map(|c| c.id.clone()).collect();
        for c in &children {
            if self.seen_children.insert(c.id.clone())
                && c.meta.get("managed_by").map(String::as_str) == Some(MANAGED_BY)
            {
                summary.dispatches += 1;
            }
        }
        summary.purges = self.seen_children.difference(&present).count();

        // Caps, counting every in-flight child of ours, placed or not.
        check_caps(&self.config, &children, summary);

        // The cluster places pending children while it has room.
        let running = self.runners.len();
        let mut room = options.cluster_slots.saturating_sub(running);
        for c in &children {
            if c.status != ChildStatus::Pending || self.runners.contains_key(&c.id) || room == 0 {
                continue;
            }
            let (Some(repo_url), Some(labels), Some(name)) = (
                c.meta.get("repo_url"),
                c.meta.get("labels"),
                c.meta.get("runner_name"),
            ) else {
                continue;
            };
            let Some(repo_name) = repo_of_url(repo_url) else {
                continue;
            };
            let _ = twins.nomad.place(&c.id);
            room -= 1;
            let boot = self.rng.random_range(options.boot_ms.0..=options.boot_ms.1);
            self.runners.insert(
                c.id.clone(),
                Runner {
                    child: c.id.clone(),
                    forgejo: repo_name.to_string() == FORGEJO_REPO,
                    repo: repo_name,
                    labels: LabelSet::from_meta(labels).unwrap_or_default(),
                    name: name.clone(),
                    ready_at: now + Duration::from_millis(boot),
                    registered: false,
                    job: None,
                    idle_since: None,
                    ran_a_job: false,
                },
            );
        }

        // Runners boot, register, take work the way the forge hands it out, and exit.
        let mut exited = Vec::new();
        for runner in self.runners.values_mut() {
            if now < runner.ready_at {
                continue;
            }
            if !runner.registered {
                runner.registered = true;
                runner.idle_since = Some(now);
                if !runner.forgejo {
                    let labels: Vec<&str> = runner.labels.iter().collect();
                    twins
                        .github
                        .register_runner(&runner.repo, &runner.name, &labels);
                }
            }
            match runner.job {
                Some((job, until, started)) if now >= until => {
                    if runner.forgejo {
                        if !started {
                            twins.forgejo.start(job);
                            runner.job =
                                Some((job, now + job_duration(&mut self.rng, options), true));
                            continue;
                        }
                        twins.forgejo.finish(job);
                    } else {
                        let _ = twins.github.complete_job(&runner.repo, job, "success");
                        twins.github.remove_runner(&runner.repo, &runner.name);
                    }
                    self.served.insert((runner.repo.to_string(), job));
                    exited.push(runner.child.clone());
                }
                Some(_) => {}
                None => {
                    let taken = if runner.forgejo {
                        take_forgejo_job(twins, runner, &self.forgejo_jobs)
                    } else {
                        take_github_job(twins, runner, &self.github_jobs)
                    };
                    match taken {
                        Some((job, job_labels)) => {
                            if job_labels != runner.labels {
                                summary.cross_bucket_takes += 1;
                            }
                            runner.ran_a_job = true;
                            // Forgejo: the claimed job still reads `waiting` for a step.
                            let until = if runner.forgejo {
                                now + options.step
                            } else {
                                now + job_duration(&mut self.rng, options)
                            };
                            runner.job = Some((job, until, !runner.forgejo));
                        }
                        None => {
                            if runner
                                .idle_since
                                .is_some_and(|since| now - since >= options.runner_idle_timeout)
                            {
                                if !runner.forgejo {
                                    twins.github.remove_runner(&runner.repo, &runner.name);
                                }
                                summary.runners_left_idle += 1;
                                exited.push(runner.child.clone());
                            }
                        }
                    }
                }
            }
        }
        for child in exited {
            self.runners.remove(&child);
            let _ = twins.nomad.finish(&child, true);
        }

        self.in_flight_now = children
            .iter()
            .filter(|c| c.status != ChildStatus::Dead && present.contains(&c.id))
            .count();
        summary.jobs_served = self.served.len();
    }

    /// Ends the world's watch: the purges are counted against Nomad as it is now.
    pub fn finish(mut self) -> WorldSummary {
        let children = self.children();
        let present: BTreeSet<String> = children.iter().map(|c| c.id.clone()).collect();
        self.summary.purges = self.seen_children.difference(&present).count();
        self.summary.left_to_nomad_gc = children
            .iter()
            .filter(|c| c.meta.get("managed_by").map(String::as_str) == Some(MANAGED_BY))
            .filter(|c| c.status == crate::observe::ChildStatus::Dead)
            .count();
        self.summary.jobs_served = self.served.len();
        self.summary
    }

    /// The children of every parent the document names, ours or not.
    fn children(&self) -> Vec<crate::sim::twins::nomad::TwinJob> {
        let mut children = Vec::new();
        for parent in &self.parents {
            children.extend(self.twins.nomad.children(parent));
        }
        children
    }
}

/// Runs the demo world once and reports what it showed.
pub async fn run_world(options: WorldOptions) -> Result<WorldSummary, String> {
    let started = Instant::now();
    let twins = SimTwins::start().await?;
    let document = twins.provision();
    let config: Config = parse_document(document.as_bytes(), &ConfigDefaults::default())
        .map_err(|errors| format!("the demo document is invalid: {errors:?}"))?;

    let DaemonClients { services, consul } = twins
        .addresses
        .clients(&SIM_CREDENTIALS, Duration::from_secs(5))?;
    let mut controller = Controller::new(
        services,
        LoopSettings::default(),
        Box::new(StdRng::from_os_rng()),
    );
    controller.settings.poll_interval = options.poll_interval;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let shutdown = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let (config_rx, watcher) = spawn_watcher(
        consul,
        ConfigDefaults::default(),
        WatchSettings {
            wait: Duration::from_secs(2),
            ..WatchSettings::default()
        },
        StdRng::from_os_rng(),
        shutdown(stop_rx.clone()),
    );
    let daemon = tokio::spawn({
        let shutdown = shutdown(stop_rx.clone());
        async move {
            crate::control_loop::run(
                controller,
                config_rx,
                &crate::clock::SystemClock,
                false,
                shutdown,
            )
            .await;
        }
    });

    // The burst arrives at once.
    let mut world = World::new(&twins, config, options.clone());
    for (name, labels) in burst() {
        world.queue_job(name, &labels)?;
    }

    let mut timed_out = false;
    loop {
        tokio::time::sleep(options.step).await;
        world.step();
        if world.settled() {
            // One more poll so the last purges and the idle tick line are seen.
            tokio::time::sleep(options.poll_interval * 2).await;
            break;
        }
        if started.elapsed() > options.deadline {
            timed_out = true;
            break;
        }
    }

    let _ = stop_tx.send(true);
    let _ = daemon.await;
    let _ = watcher.await;
    let mut summary = world.finish();
    summary.timed_out = timed_out;
    summary.ticks =
        (started.elapsed().as_millis() / options.poll_interval.as_millis().max(1)) as usize;
    summary.wall_time_ms = started.elapsed().as_millis();
    Ok(summary)
}

fn job_duration(rng: &mut StdRng, options: &WorldOptions) -> Duration {
    Duration::from_millis(rng.random_range(options.job_ms.0..=options.job_ms.1))
}

/// GitHub gives an idle runner the oldest queued job whose labels are all among its own.
fn take_github_job(
    twins: &SimTwins,
    runner: &Runner,
    jobs: &BTreeMap<(RepoName, u64), LabelSet>,
) -> Option<(u64, LabelSet)> {
    let candidate = jobs
        .iter()
        .filter(|((repo, _), labels)| repo == &runner.repo && labels.is_subset(&runner.labels))
        .find(|((repo, id), _)| {
            twins
                .github
                .job_status(repo, *id)
                .is_some_and(|j| j.status == TwinJobStatus::Queued)
        })?;
    let ((repo, id), labels) = candidate;
    twins.github.start_job(repo, *id, &runner.name).ok()?;
    Some((*id, labels.clone()))
}

/// Forgejo: a runner claims a waiting job whose labels it carries.
fn take_forgejo_job(
    twins: &SimTwins,
    runner: &Runner,
    jobs: &BTreeMap<u64, LabelSet>,
) -> Option<(u64, LabelSet)> {
    let waiting: BTreeSet<u64> = twins
        .forgejo
        .jobs()
        .into_iter()
        .filter(|j| j.task_id == 0)
        .map(|j| j.id)
        .collect();
    let (id, labels) = jobs
        .iter()
        .find(|(id, labels)| waiting.contains(id) && labels.is_subset(&runner.labels))?;
    twins.forgejo.claim(*id);
    Some((*id, labels.clone()))
}

/// `owner/name` of a child's `repo_url` (`https://github.com/owner/name`, or a Forgejo's).
fn repo_of_url(url: &str) -> Option<RepoName> {
    let mut segments = url.trim_end_matches('/').rsplit('/');
    let name = segments.next()?;
    let owner = segments.next()?;
    RepoName::parse(&format!("{owner}/{name}"))
}

/// Every cap of the document at zero in flight, so the summary shows each even if it never
/// held a child; [`check_caps`] then records only the caps that hold some.
fn caps_at_zero(config: &Config, summary: &mut WorldSummary) {
    for repo_config in config.repos.values() {
        let name = repo_config.repo.to_string();
        record(
            summary,
            format!("{name} repo"),
            0,
            repo_config.max_concurrent,
        );
        for profile in &repo_config.profiles {
            if let Some(cap) = profile.max_concurrent {
                record(summary, format!("{name} profile {}", profile.label), 0, cap);
            }
        }
    }
}

/// Counts our in-flight children per repo and per profile against their caps. The work is
/// per child, not per repo: a fleet has hundreds of repos and few children.
fn check_caps(
    config: &Config,
    children: &[crate::sim::twins::nomad::TwinJob],
    summary: &mut WorldSummary,
) {
    let mut per_repo: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    let mut per_profile: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    for c in children {
        if c.status == ChildStatus::Dead
            || c.meta.get("managed_by").map(String::as_str) != Some(MANAGED_BY)
        {
            continue;
        }
        let Some(repo_config) = c
            .meta
            .get("repo_url")
            .and_then(|url| repo_of_url(url))
            .and_then(|name| config.repos.get(&name))
        else {
            continue;
        };
        per_repo
            .entry(repo_config.repo.to_string())
            .or_insert((0, repo_config.max_concurrent))
            .0 += 1;
        if let Some(labels) = c
            .meta
            .get("labels")
            .and_then(|l| LabelSet::from_meta(l).ok())
            && let Ok(Route {
                profile: Some(index),
                ..
            }) = repo_config.route(&labels)
        {
            let profile = &repo_config.profiles[index];
            if let Some(cap) = profile.max_concurrent {
                let key = format!("{} profile {}", repo_config.repo, profile.label);
                per_profile.entry(key).or_insert((0, cap)).0 += 1;
            }
        }
    }
    for (name, (seen, cap)) in per_repo {
        record(summary, format!("{name} repo"), seen, cap);
    }
    for (key, (seen, cap)) in per_profile {
        record(summary, key, seen, cap);
    }
}

fn record(summary: &mut WorldSummary, key: String, seen: u32, cap: u32) {
    let entry = summary.in_flight_max.entry(key.clone()).or_insert((0, cap));
    entry.0 = entry.0.max(seen);
    if seen > cap {
        summary
            .cap_violations
            .push(format!("{key}: {seen} in flight, cap {cap}"));
    }
}
