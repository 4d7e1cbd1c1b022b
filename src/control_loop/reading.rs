//! What one tick reads: every due repo's queue (at most `list_concurrency_max` at once),
//! every parent's children and the parents of our children found from Nomad alone, the
//! first sightings of Forgejo jobs, and how runners that just ended exited. A source that
//! cannot be read is a gap in the snapshot, never an abort.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use tracing::{debug, warn};

use super::failures::Scope;
use super::{Controller, polls};
use crate::config::Config;
use crate::model::{ChildId, ErrorClass, RepoName};
use crate::observe::{ChildSource, Gap, PortError, QueueSource, RepoJobs, Snapshot};

/// Runs `read` on each repo with its port, at most `concurrency` at once; each answer with
/// its repo, in the order they come. Every read is boxed so the tick's future stays `Send`
/// (see `Controller::observe`).
pub(super) fn read_each_repo<P: Send + 'static, T: Send + 'static>(
    to_read: Vec<(crate::config::RepoConfig, P)>,
    concurrency: usize,
    read: fn(crate::config::RepoConfig, P) -> futures::future::BoxFuture<'static, T>,
) -> impl std::future::Future<Output = Vec<(RepoName, T)>> + Send {
    let reads: Vec<futures::future::BoxFuture<'static, (RepoName, T)>> = to_read
        .into_iter()
        .map(|(repo, port)| {
            let name = repo.repo.clone();
            let answer = read(repo, port);
            let read: futures::future::BoxFuture<'static, (RepoName, T)> =
                Box::pin(async move { (name, answer.await) });
            read
        })
        .collect();
    futures::stream::iter(reads)
        .buffer_unordered(concurrency.max(1))
        .collect::<Vec<_>>()
}

/// How the runners of children that just ended with a failed allocation exited: one
/// allocation listing per such child, only in the tick it turned dead. A code that cannot be
/// read leaves the end judged as before: a failed start.
pub(super) async fn read_exit_codes(
    children: Arc<dyn ChildSource>,
    ended: Vec<ChildId>,
) -> BTreeMap<ChildId, i32> {
    let mut codes = BTreeMap::new();
    for child in ended {
        match children.runner_exit_code(&child).await {
            Ok(Some(code)) => {
                codes.insert(child, code);
            }
            Ok(None) => {}
            Err(e) => debug!("{e}"),
        }
    }
    codes
}

impl Controller {
    pub(super) async fn observe(
        &mut self,
        config: &Config,
        config_version: u64,
        now: DateTime<Utc>,
    ) -> Snapshot {
        let mut snapshot = Snapshot::default();
        for repo in config.repos.values() {
            if let Some(forge) = self.services.forge(&repo.mode) {
                let url = forge.registrar.repo_url(repo);
                snapshot
                    .repo_urls
                    .insert(url.trim_end_matches('/').to_string(), repo.repo.clone());
            }
        }
        self.discover_parents(now, &mut snapshot).await;
        let parents: BTreeSet<String> = config
            .parents()
            .into_iter()
            .chain(self.memory.lingering_parents.iter().cloned())
            .collect();

        let children = self.services.children.clone();
        // Boxed so the tick's future stays `Send` (closures returning async blocks inside
        // stream adapters trip rustc's higher-ranked lifetime inference otherwise).
        type Listing = (String, Result<Vec<crate::observe::Child>, PortError>);
        let listings: Vec<futures::future::BoxFuture<'static, Listing>> = parents
            .into_iter()
            .map(|parent| {
                let children = children.clone();
                let listing: futures::future::BoxFuture<'static, Listing> = Box::pin(async move {
                    let result = children.list_children(&parent).await;
                    (parent, result)
                });
                listing
            })
            .collect();
        let listings = futures::stream::iter(listings)
            .buffer_unordered(self.settings.list_concurrency_max)
            .collect::<Vec<_>>();

        for forge in [&self.services.github, &self.services.forgejo]
            .into_iter()
            .flatten()
        {
            let served: Vec<&crate::config::RepoConfig> = config
                .repos
                .values()
                .filter(|r| {
                    self.services
                        .forge(&r.mode)
                        .is_some_and(|f| Arc::ptr_eq(&f.queue, &forge.queue))
                })
                .collect();
            forge.queue.serving(&served);
        }
        // Repos whose queue is backing off are not asked this tick, nor are those that the
        // poll schedule does not find due: they keep their last reading.
        let mut to_ask = Vec::new();
        let intervals = self.poll_intervals();
        self.memory.polls.begin_tick(now, intervals);
        let mut stretched = BTreeMap::new();
        let mut first_reads_left = polls::first_reads_per_tick(config.repos.len(), intervals);
        let mut due = Vec::new();
        for repo in config.repos.values() {
            let scope = Scope::Queue(repo.repo.clone());
            // A budget running low stretches the intervals of every repo that shares it.
            let budget = self
                .services
                .forge(&repo.mode)
                .and_then(|f| f.queue.budget(repo));
            let stretch = budget
                .as_ref()
                .map_or(1.0, |b| polls::budget_stretch(b, now));
            if let Some(budget) = budget.filter(|_| stretch > 1.0) {
                stretched.insert(budget.owner.clone(), (budget, stretch));
            }
            let carried = self
                .memory
                .polls
                .next_read_at(&repo.repo, now, intervals, stretch)
                .and_then(|_| self.memory.polls.read_at(&repo.repo))
                .zip(self.memory.readings.get(&repo.repo));
            if let Some((read_at, reading)) = carried {
                snapshot
                    .repos
                    .insert(repo.repo.clone(), Ok(reading.clone()));
                snapshot.unpolled.insert(repo.repo.clone(), read_at);
                continue;
            }
            if self.memory.polls.first_read_pending(&repo.repo) {
                if first_reads_left == 0 {
                    snapshot.repos.insert(
                        repo.repo.clone(),
                        Err(Gap {
                            class: ErrorClass::RateLimited,
                            message: format!(
                                "not read yet: first reads are spread over the idle poll interval ({})",
                                humantime::format_duration(intervals.idle)
                            ),
                        }),
                    );
                    continue;
                }
                first_reads_left -= 1;
            }
            match self.memory.failures.get(&scope) {
                Some(f) if f.retry_at > now => {
                    snapshot.repos.insert(
                        repo.repo.clone(),
                        Err(Gap {
                            class: f.class,
                            message: format!("{} (next attempt at {})", f.message, f.retry_at),
                        }),
                    );
                }
                _ => match self.services.forge(&repo.mode) {
                    Some(forge) => {
                        due.push(polls::DueRead {
                            urgent: self.memory.polls.urgent(&repo.repo, now),
                            read_at: self.memory.polls.read_at(&repo.repo),
                            points: forge.queue.read_points(repo),
                        });
                        to_ask.push((repo.clone(), forge.queue.clone()));
                    }
                    None => {
                        snapshot.repos.insert(
                            repo.repo.clone(),
                            Err(Gap {
                                class: ErrorClass::Configuration,
                                message: format!("no {} client is configured", repo.mode.as_str()),
                            }),
                        );
                    }
                },
            }
        }
        self.report_stretched(stretched);
        // Idle reads past their owner's points for the minute keep their turn for a later tick.
        let (_, waiting) = polls::within_read_points(&due);
        for i in waiting.iter().rev() {
            let (repo, _) = to_ask.remove(*i);
            let carried = self
                .memory
                .polls
                .read_at(&repo.repo)
                .zip(self.memory.readings.get(&repo.repo));
            match carried {
                Some((read_at, reading)) => {
                    snapshot
                        .repos
                        .insert(repo.repo.clone(), Ok(reading.clone()));
                    snapshot.unpolled.insert(repo.repo.clone(), read_at);
                }
                None => {
                    snapshot.repos.insert(
                        repo.repo.clone(),
                        Err(Gap {
                            class: ErrorClass::RateLimited,
                            message: "not read yet: GitHub's per-minute request points are spent on busier repos this minute".into(),
                        }),
                    );
                }
            }
        }
        if !waiting.is_empty() {
            debug!(
                repos = waiting.len(),
                "idle reads wait for the next minute's request points"
            );
        }
        let queues = read_each_repo(
            to_ask,
            self.settings.list_concurrency_max,
            |repo, queue: Arc<dyn QueueSource>| {
                Box::pin(async move { queue.list_jobs(&repo).await })
            },
        );

        let (listings, queues) = futures::join!(listings, queues);

        self.memory.lingering_parents.clear();
        let mut listed = BTreeSet::new();
        for (parent, result) in listings {
            match result {
                Ok(mut children) => {
                    for child in children.iter_mut().filter(|c| c.ours) {
                        listed.insert(child.id.clone());
                        if child.placement.is_placed() {
                            child.placed_at = Some(
                                *self
                                    .memory
                                    .placed_seen
                                    .entry(child.id.clone())
                                    .or_insert(now),
                            );
                        } else {
                            child.placed_at = self.memory.placed_seen.get(&child.id).copied();
                        }
                    }
                    if children.iter().any(|c| c.ours) {
                        self.memory.lingering_parents.insert(parent.clone());
                    }
                    snapshot.parents.insert(parent, Ok(children));
                }
                Err(e) => {
                    warn!(parent = %parent, class = e.class.as_str(), "list children of {parent}: {}", e.message);
                    self.memory.lingering_parents.insert(parent.clone());
                    snapshot.parents.insert(parent, Err(e.into()));
                }
            }
        }

        if snapshot.parents.values().all(Result::is_ok) {
            self.memory.placed_seen.retain(|id, _| listed.contains(id));
        }
        let mut seen: BTreeSet<(RepoName, u64)> = BTreeSet::new();
        let mut listed_repos = BTreeSet::new();
        for (repo, result) in queues {
            match result {
                Ok(mut jobs) => {
                    self.succeeded(&Scope::Queue(repo.clone()));
                    listed_repos.insert(repo.clone());
                    self.fill_first_sightings(&repo, &mut jobs, now, &mut seen);
                    self.memory.polls.read(&repo, now, !jobs.jobs.is_empty());
                    self.memory.readings.insert(repo.clone(), jobs.clone());
                    if jobs.truncated {
                        warn!(repo = %repo, "run listing reached GitHub's 1,000-result search cap: queued demand may be larger than seen");
                    }
                    snapshot.repos.insert(repo, Ok(jobs));
                }
                Err(e) => {
                    let e = e.context(format!("list jobs for {repo}"));
                    self.failed(Scope::Queue(repo.clone()), &e, config_version, now);
                    snapshot.repos.insert(repo, Err(e.into()));
                }
            }
        }
        // A repo with children of ours in flight is busy, whatever its last reading said.
        let with_children: BTreeSet<RepoName> =
            snapshot.our_children().filter_map(|c| c.repo).collect();
        for repo in &with_children {
            self.memory.polls.children_in_flight(repo);
        }
        let configured: BTreeSet<&RepoName> = config.repos.keys().collect();
        self.memory.polls.retain(&configured);
        self.memory
            .readings
            .retain(|repo, _| configured.contains(repo));
        // Forget sightings of jobs that are gone from repos that were read.
        self.memory
            .first_seen
            .retain(|key, _| !listed_repos.contains(&key.0) || seen.contains(key));
        self.memory.reported_unroutable.retain(|(repo, id)| {
            !listed_repos.contains(repo) || seen.contains(&(repo.clone(), *id))
        });
        snapshot
    }

    /// Finds every parent with children of ours from Nomad alone, on the first tick and then
    /// every `discovery_interval`: after a restart or an edit of the document, children of a
    /// parent the document no longer names still count against their repo's cap and
    /// `--max-in-flight`, and are purged when dead. Until it has succeeded once, nothing is
    /// dispatched (the counts could be short).
    pub(super) async fn discover_parents(&mut self, now: DateTime<Utc>, snapshot: &mut Snapshot) {
        let due = self.memory.discovered_at.is_none_or(|at| {
            (now - at).to_std().unwrap_or_default() >= self.settings.discovery_interval
        });
        if !due {
            return;
        }
        match self.services.children.parents_with_our_children().await {
            Ok(parents) => {
                for parent in parents {
                    if self.memory.lingering_parents.insert(parent.clone()) {
                        debug!(parent = %parent, "found a parent with children of ours");
                    }
                }
                self.memory.discovered_at = Some(now);
            }
            Err(e) => {
                warn!(class = e.class.as_str(), "{}", e.message);
                if self.memory.discovered_at.is_none() {
                    snapshot.undiscovered = Some(e.into());
                }
            }
        }
    }

    pub(super) fn fill_first_sightings(
        &mut self,
        repo: &RepoName,
        jobs: &mut RepoJobs,
        now: DateTime<Utc>,
        seen: &mut BTreeSet<(RepoName, u64)>,
    ) {
        for job in &mut jobs.jobs {
            let key = (repo.clone(), job.id);
            seen.insert(key.clone());
            if job.queued_at.is_none() {
                job.queued_at = Some(*self.memory.first_seen.entry(key).or_insert(now));
            }
        }
    }
}
