//! The [`QueueSource`] side: a repo's queued and running self-hosted jobs, read as deep as
//! its last read calls for (quick, deep or full), and the cost of its next read.
//!
//! The one part of the client that decides anything: which repos are quiet, and how few
//! requests keep them watched.

use std::collections::{BTreeSet, HashMap, HashSet};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use http::{Method, StatusCode};
use tracing::instrument;

use super::app_auth::Permission;
use super::calls::Payload;
use super::pages::PER_PAGE;
use super::transport::{Target, malformed};
use super::{GitHub, not_github, wire};
use crate::config::{Mode, RepoConfig};
use crate::model::{ErrorClass, RepoName, RunnerName};
use crate::observe::{ForgeJob, JobState, PortError, QueueSource, ReadPoints, RepoJobs};

/// The run statuses whose runs can hold a queued job.
pub const RUN_STATUSES_WITH_QUEUED_JOBS: [&str; 5] =
    ["queued", "in_progress", "waiting", "pending", "requested"];
/// GitHub returns at most this many results for a filtered run listing.
pub const RUN_SEARCH_CAP: u64 = 1000;
/// A repo whose last read found no run that could hold a queued job is read with one request
/// (its newest runs, conditionally) until one of them is not completed, and its `queued` and
/// `in_progress` runs are listed once in this long: a run re-run from further back than the
/// newest [`PER_PAGE`] is found then (or at once by a webhook hint). Each repo's first such
/// listing comes at its own offset within the interval, so a fleet's do not bunch up.
pub const DEEP_READ_INTERVAL: chrono::Duration = chrono::Duration::hours(1);
/// What a deep read of a quiet repo lists: a re-run run is `queued`, or `in_progress` once a
/// job of it started. (Runs held at a gate were there before and were seen busy.)
const DEEP_READ_STATUSES: [&str; 2] = ["queued", "in_progress"];
/// A full read of a repo not read in full before: one listing per status, and at least one
/// run's jobs (it was hinted at, so something moved).
const FULL_READ_REQUESTS_AT_LEAST: u32 = RUN_STATUSES_WITH_QUEUED_JOBS.len() as u32 + 1;
/// How long a run shown active on the newest page but listed by no status search is taken
/// for the search index lagging it (seconds in practice; GitHub documents no bound), and the
/// repo read in full again each tick, before the run is taken for one in a status that holds
/// no queued job (`action_required`) and the repo quiet until its newest page moves.
const SEARCH_LAG_ALLOWANCE: chrono::Duration = chrono::Duration::minutes(2);

/// What the last read of a repo's queue found, which decides how the next one reads it.
#[derive(Clone)]
pub(super) enum LastRead {
    /// Runs that can hold a queued job: read in full, which took this many requests.
    Busy { requests: u32 },
    /// None: read quickly until something moves.
    Quiet(Quiet),
}

impl LastRead {
    fn into_quiet(self) -> Option<Quiet> {
        match self {
            LastRead::Busy { .. } => None,
            LastRead::Quiet(quiet) => Some(quiet),
        }
    }
}

#[derive(Clone)]
pub(super) struct Quiet {
    /// When a full read last found no run that could hold a queued job (or the first quick
    /// read found none among the newest runs).
    deep_read_at: DateTime<Utc>,
    /// The ETag of the newest-runs page at the last quick read, and whether that page showed
    /// a run not completed. The body itself is not kept.
    newest: Option<(String, bool)>,
    /// Since when that page has shown an active run that no status search lists.
    searches_behind_since: Option<DateTime<Utc>>,
}

/// How deep a read of a repo's queue goes.
enum Depth {
    /// Every status that can hold a queued job, and each such run's jobs; the requests the
    /// last full read of the repo took, if it had one.
    Full { last_requests: Option<u32> },
    /// The `queued` and `in_progress` runs of a quiet repo, hourly.
    Deep,
    /// The newest runs, conditionally, from what the last quick read saw.
    Quick(Option<Quiet>),
}

/// What a quick read found.
enum QuickRead {
    /// No run among the newest is active: nothing can be queued there.
    Quiet,
    /// A run among the newest is not completed: read in full.
    Active,
}

/// Where in [`DEEP_READ_INTERVAL`] `repo`'s deep reads fall: fixed per repo (std's
/// `DefaultHasher::new` has fixed keys), spread over the interval across a fleet.
fn deep_read_offset(repo: &RepoName) -> chrono::Duration {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    repo.to_string().to_ascii_lowercase().hash(&mut hasher);
    let span = DEEP_READ_INTERVAL.num_seconds().max(1) as u64;
    chrono::Duration::seconds((hasher.finish() % span) as i64)
}

fn parse_time(raw: Option<&str>) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(raw?)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// A GitHub job as demand: self-hosted jobs that are queued or in progress, nothing else.
fn forge_job(job: wire::Job) -> Option<ForgeJob> {
    if !job
        .labels
        .iter()
        .any(|l| l.trim().eq_ignore_ascii_case("self-hosted"))
    {
        return None;
    }
    let state = match job.status.as_str() {
        "queued" => JobState::Queued,
        "in_progress" => JobState::InProgress {
            runner: job
                .runner_name
                .filter(|name| !name.is_empty())
                .map(RunnerName),
        },
        _ => return None,
    };
    let queued_at =
        parse_time(job.created_at.as_deref()).or_else(|| parse_time(job.started_at.as_deref()));
    Some(ForgeJob {
        id: job.id,
        labels: job.labels,
        state,
        queued_at,
    })
}

#[async_trait]
impl QueueSource for GitHub {
    fn budget(&self, repo: &RepoConfig) -> Option<crate::observe::BudgetReading> {
        let holder = self.holder_of(repo)?;
        let budget = self
            .budgets
            .snapshot()
            .into_iter()
            .find(|(h, _)| *h == holder)?
            .1;
        Some(crate::observe::BudgetReading {
            owner: holder.metric_label(),
            limit: budget.limit?,
            remaining: budget.remaining?,
            reset_at: budget.reset_at?,
        })
    }

    fn read_points(&self, repo: &RepoConfig) -> Option<ReadPoints> {
        let holder = self.holder_of(repo)?;
        let now = self.now();
        let spent = self.secondary.spent(&holder, now);
        Some(ReadPoints {
            owner: holder.metric_label(),
            left: self.read_points_per_minute_max.saturating_sub(spent),
            next_read: self.next_read_requests(&repo.repo, now),
        })
    }

    fn serving(&self, repos: &[&RepoConfig]) {
        let mut sets: HashMap<String, BTreeSet<String>> = HashMap::new();
        for repo in repos.iter().filter(|r| matches!(r.mode, Mode::App)) {
            sets.entry(repo.repo.owner().to_ascii_lowercase())
                .or_default()
                .insert(repo.repo.name().to_string());
        }
        *self.read_sets.lock().expect("read sets lock") = sets;
        let served: HashSet<&RepoName> = repos.iter().map(|r| &r.repo).collect();
        self.last_reads
            .lock()
            .expect("last reads lock")
            .retain(|repo, _| served.contains(repo));
    }

    fn hinted(&self, repo: &RepoName) {
        self.hinted
            .lock()
            .expect("hinted repos lock")
            .insert(repo.clone());
    }

    /// BRIEF step 2: GitHub has no "list queued jobs" call, so walk the runs that can hold a
    /// queued job, list each run's latest jobs, keep the self-hosted ones, de-duplicate by job
    /// id. A run is `in_progress` while one of its jobs still waits, and `waiting`,
    /// `pending` or `requested` while it sits at a gate (an environment's approval, a
    /// concurrency group) with other jobs already queued. An unchanged listing answers 304,
    /// which costs no rate limit.
    ///
    /// A repo where that walk found no such run is read with one request instead of five
    /// (`quick_read`) until one of its newest runs is active, a webhook hints at it, or
    /// its hourly deep read is due ([`DEEP_READ_INTERVAL`]): most repos of a fleet are idle most of the time, and
    /// GitHub's secondary limit counts every request, `304`s included.
    #[instrument(level = "debug", skip_all, fields(repo = %repo.repo))]
    async fn list_jobs(&self, repo: &RepoConfig) -> Result<RepoJobs, PortError> {
        if !repo.mode.is_github() {
            return Err(not_github(repo));
        }
        let now = self.now();
        let hinted = self
            .hinted
            .lock()
            .expect("hinted repos lock")
            .remove(&repo.repo);
        let last = self
            .last_reads
            .lock()
            .expect("last reads lock")
            .get(&repo.repo)
            .cloned();
        let statuses: &[&str] = match self.depth(last, hinted, now) {
            Depth::Full { .. } => &RUN_STATUSES_WITH_QUEUED_JOBS,
            Depth::Deep => &DEEP_READ_STATUSES,
            Depth::Quick(quiet) => match self.quick_read(repo, quiet, now).await? {
                QuickRead::Quiet => return Ok(RepoJobs::default()),
                QuickRead::Active => &RUN_STATUSES_WITH_QUEUED_JOBS,
            },
        };
        let (jobs, no_runs, requests) = self.full_read(repo, statuses).await?;
        let mut last_reads = self.last_reads.lock().expect("last reads lock");
        let found = if no_runs {
            let quiet = last_reads.remove(&repo.repo).and_then(LastRead::into_quiet);
            let (newest, searches_behind_since) = match quiet {
                Some(Quiet {
                    newest: Some((etag, true)),
                    searches_behind_since,
                    ..
                }) => {
                    // Active on the newest page, in no search: the index may lag the run, so
                    // the page stays active (read in full again) for a while; after that the
                    // run is in a status that holds no queued job, and the page is quiet
                    // until it moves.
                    let since = searches_behind_since.unwrap_or(now);
                    if now - since < SEARCH_LAG_ALLOWANCE {
                        (Some((etag, true)), Some(since))
                    } else {
                        (Some((etag, false)), None)
                    }
                }
                quiet => (quiet.and_then(|q| q.newest), None),
            };
            LastRead::Quiet(Quiet {
                deep_read_at: now,
                newest,
                searches_behind_since,
            })
        } else {
            LastRead::Busy { requests }
        };
        last_reads.insert(repo.repo.clone(), found);
        Ok(jobs)
    }
}

impl GitHub {
    /// How deep the next read of a repo goes, from its last read and whether a webhook hinted
    /// at it: the one decision both [`QueueSource::list_jobs`] and its cost estimate follow.
    fn depth(&self, last: Option<LastRead>, hinted: bool, now: DateTime<Utc>) -> Depth {
        match last {
            Some(LastRead::Busy { requests }) => Depth::Full {
                last_requests: Some(requests),
            },
            _ if hinted || !self.conditional_requests => Depth::Full {
                last_requests: None,
            },
            Some(LastRead::Quiet(quiet)) if now - quiet.deep_read_at >= DEEP_READ_INTERVAL => {
                Depth::Deep
            }
            // The first read of a repo is quick too: at a restart, hundreds of repos are read
            // within minutes, at one request each instead of five.
            quiet_or_unread => Depth::Quick(quiet_or_unread.and_then(LastRead::into_quiet)),
        }
    }

    /// The requests `repo`'s next [`QueueSource::list_jobs`] will likely take: a full read
    /// as many as the last one, a deep read one per status, a quick read one.
    fn next_read_requests(&self, repo: &RepoName, now: DateTime<Utc>) -> u32 {
        let hinted = self
            .hinted
            .lock()
            .expect("hinted repos lock")
            .contains(repo);
        let last = self
            .last_reads
            .lock()
            .expect("last reads lock")
            .get(repo)
            .cloned();
        match self.depth(last, hinted, now) {
            Depth::Full { last_requests } => last_requests.unwrap_or(FULL_READ_REQUESTS_AT_LEAST),
            Depth::Deep => DEEP_READ_STATUSES.len() as u32,
            Depth::Quick(_) => 1,
        }
    }

    /// `GET …/actions/runs?per_page=100`, conditionally: one request (a `304` when nothing
    /// changed) that says whether any of the newest runs is still active.
    async fn quick_read(
        &self,
        repo: &RepoConfig,
        quiet: Option<Quiet>,
        now: DateTime<Utc>,
    ) -> Result<QuickRead, PortError> {
        let doing = format!("list the newest runs of {}", repo.repo);
        let path = format!(
            "/repos/{}/{}/actions/runs?per_page={PER_PAGE}",
            repo.repo.owner(),
            repo.repo.name()
        );
        let known = quiet.as_ref().and_then(|q| q.newest.clone());
        let answer = self
            .repo_call(
                repo,
                Permission::Read,
                Method::GET,
                &Target::Path(path),
                known
                    .as_ref()
                    .map_or(Payload::Nothing, |(etag, _)| Payload::IfNoneMatch(etag)),
                &doing,
            )
            .await?;
        let unchanged = answer.status == StatusCode::NOT_MODIFIED;
        let (etag, active) = if unchanged {
            crate::metrics::count_conditional_hit();
            known.ok_or_else(|| {
                PortError::new(
                    ErrorClass::Malformed,
                    format!("{doing}: 304 Not Modified to an unconditional request"),
                )
            })?
        } else {
            let page: wire::RunsPage =
                serde_json::from_str(&answer.body).map_err(|e| malformed(&doing, &e))?;
            let active = page
                .workflow_runs
                .iter()
                .any(|run| run.status.as_deref() != Some("completed"));
            let etag = answer
                .headers
                .get(http::header::ETAG)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            (etag, active)
        };
        let searches_behind_since = quiet
            .as_ref()
            .and_then(|q| q.searches_behind_since)
            .filter(|_| unchanged);
        let deep_read_at =
            quiet.map_or_else(|| now - deep_read_offset(&repo.repo), |q| q.deep_read_at);
        let newest = (!etag.is_empty()).then_some((etag, active));
        self.last_reads.lock().expect("last reads lock").insert(
            repo.repo.clone(),
            LastRead::Quiet(Quiet {
                deep_read_at,
                newest,
                searches_behind_since,
            }),
        );
        Ok(if active {
            QuickRead::Active
        } else {
            QuickRead::Quiet
        })
    }

    /// BRIEF step 2 in full; also says whether no run could hold a queued job, and how many
    /// requests the read took.
    async fn full_read(
        &self,
        repo: &RepoConfig,
        statuses: &[&str],
    ) -> Result<(RepoJobs, bool, u32), PortError> {
        let (owner, name) = (repo.repo.owner(), repo.repo.name());
        let mut seen = HashMap::new();
        let mut truncated = false;
        let mut runs = Vec::new();
        let mut run_ids = HashSet::new();
        let mut requests = 0;
        for status in statuses {
            let doing = format!("list {status} runs of {}", repo.repo);
            let first =
                format!("/repos/{owner}/{name}/actions/runs?status={status}&per_page={PER_PAGE}");
            let listing = self
                .walk::<wire::RunsPage>(repo, Permission::Read, &first, &doing, Some(&mut seen))
                .await?;
            requests += listing.pages;
            truncated |= listing.capped || listing.total_count >= RUN_SEARCH_CAP;
            for run in listing.items {
                if run_ids.insert(run.id) {
                    runs.push(run.id);
                }
            }
        }
        let no_runs = runs.is_empty();
        let mut jobs = Vec::new();
        let mut job_ids = HashSet::new();
        for run in runs {
            let doing = format!("list jobs for run {run} in {}", repo.repo);
            let first = format!(
                "/repos/{owner}/{name}/actions/runs/{run}/jobs?filter=latest&per_page={PER_PAGE}"
            );
            let listing = match self
                .walk::<wire::JobsPage>(repo, Permission::Read, &first, &doing, Some(&mut seen))
                .await
            {
                Ok(listing) => listing,
                // The run was deleted between the two listings: it has no jobs left to run.
                Err(e) if e.class == ErrorClass::NotFound => {
                    requests += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            requests += listing.pages;
            truncated |= listing.capped;
            for job in listing.items {
                if job_ids.insert(job.id)
                    && let Some(job) = forge_job(job)
                {
                    jobs.push(job);
                }
            }
        }
        // Keep only the bodies of pages this walk touched, so the cache follows the set of
        // active runs instead of growing with every run ever seen.
        self.conditional
            .lock()
            .expect("conditional cache lock")
            .insert(repo.repo.clone(), seen);
        Ok((RepoJobs { jobs, truncated }, no_runs, requests))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(status: &str, labels: &[&str]) -> wire::Job {
        wire::Job {
            id: 1,
            status: status.to_string(),
            labels: labels.iter().map(|l| l.to_string()).collect(),
            runner_name: Some("ci-runner-3f9c2a1b7d04".into()),
            created_at: Some("2020-01-22T11:33:08-08:00".into()),
            started_at: None,
        }
    }

    #[test]
    fn only_self_hosted_queued_or_running_jobs_are_demand() {
        assert!(forge_job(job("queued", &["ubuntu-latest"])).is_none());
        assert!(forge_job(job("completed", &["self-hosted"])).is_none());
        assert!(forge_job(job("waiting", &["self-hosted"])).is_none());
        let queued = forge_job(job("queued", &["Self-Hosted", "linux"])).unwrap();
        assert_eq!(queued.state, JobState::Queued);
        assert_eq!(
            queued.queued_at,
            DateTime::parse_from_rfc3339("2020-01-22T19:33:08Z")
                .ok()
                .map(|t| t.with_timezone(&Utc))
        );
        let running = forge_job(job("in_progress", &["self-hosted"])).unwrap();
        assert_eq!(
            running.state,
            JobState::InProgress {
                runner: Some(RunnerName("ci-runner-3f9c2a1b7d04".into()))
            }
        );
    }
}
