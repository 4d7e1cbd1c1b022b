//! Carries out the dispatches and purges of a plan, one after another (GitHub and Nomad both
//! prefer serialised writes), and reports what reality said.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand::RngCore;

use super::{
    ChildControl, Credential, Deregistration, DispatchMeta, DispatchRequest, Registrars,
    RunnerIdentity,
};
use crate::config::Config;
use crate::model::{BucketKey, ChildId, ErrorClass, RepoName, RunnerName};
use crate::observe::{ChildStatus, PortError};
use crate::plan::Plan;
use crate::plan::reap::{Allocation, Judgement, Outcome, StaleRegistration, TearDown};

/// Attempts of one dispatch request when Nomad answers with a transient error; every attempt
/// reuses the same idempotency token, so a request that did land is not dispatched twice.
pub const DISPATCH_ATTEMPTS_MAX: u32 = 3;
/// Pause before the second attempt; doubled for each further one.
pub const DISPATCH_RETRY_DELAY: Duration = Duration::from_millis(250);

/// What happened to one planned dispatch.
#[derive(Debug)]
pub enum DispatchOutcome {
    Dispatched {
        bucket: BucketKey,
        parent: String,
        runner_name: RunnerName,
        child: ChildId,
        /// What was minted for the runner ("JIT config", "registration token"), if anything.
        credential: Option<&'static str>,
        /// The runner's registration id, where the credential bound one (a JIT config).
        runner_id: Option<u64>,
        deduplicated: bool,
    },
    /// Minting a registration credential failed; nothing was dispatched.
    MintFailed {
        bucket: BucketKey,
        parent: String,
        error: PortError,
    },
    /// Nomad refused or could not be reached.
    DispatchFailed {
        bucket: BucketKey,
        parent: String,
        error: PortError,
    },
    /// Not attempted because an earlier failure this tick makes it pointless.
    Skipped {
        bucket: BucketKey,
        parent: String,
        why: String,
    },
}

/// What happened to one planned purge.
#[derive(Debug, PartialEq, Eq)]
pub enum PurgeOutcome {
    Purged(ChildId),
    /// Re-read at the moment of purging, it was no longer dead: reality vetoed.
    Vetoed(ChildId, ChildStatus),
    /// Already gone.
    Gone(ChildId),
    Failed(ChildId, PortError),
}

/// What happened to one teardown the decision asked for.
#[derive(Debug, PartialEq, Eq)]
pub enum ReapOutcome {
    /// Stopped, after its registration (if it had one) was deleted.
    Stopped {
        child: ChildId,
        outcome: Outcome,
        reason: &'static str,
        deregistered: Option<u64>,
    },
    /// At the moment of acting, reality said no: an allocation appeared, GitHub refused to
    /// delete a registration whose runner runs a job (422), or answered 404 for one this
    /// tick's listing showed (unknown, held).
    Kept {
        child: ChildId,
        outcome: Outcome,
        why: String,
    },
    /// Its runner's registration was deleted and the child left running: an idle runner
    /// leaves by itself, and one that took a job GitHub still showed as idle (its busy flag
    /// lags, and a delete has succeeded on a busy runner) finishes it. The child is stopped at
    /// a later tick, once its registration has been read absent for the idle confirmation and
    /// no job names its runner.
    Deregistered {
        child: ChildId,
        outcome: Outcome,
        runner_id: u64,
    },
    /// Could not be carried out; judged again next tick if still nominated.
    Failed { child: ChildId, error: PortError },
}

/// Registrations the act step deletes this tick.
#[derive(Debug, Default)]
pub struct RegistrationsToDelete {
    /// Offline registrations of our runners that no child of ours runs any more.
    pub stale: Vec<StaleRegistration>,
    /// The runner a planned purge's child registered (a Forgejo ephemeral runner): deleted
    /// once Nomad, re-read, confirmed the child dead and it is purged or already gone, never
    /// while it might run.
    pub of_purged: BTreeMap<ChildId, StaleRegistration>,
}

#[derive(Debug, Default)]
pub struct ActReport {
    pub dispatches: Vec<DispatchOutcome>,
    pub reaps: Vec<ReapOutcome>,
    /// Stale registrations and what deleting them said.
    pub deregistrations: Vec<(StaleRegistration, Result<Deregistration, PortError>)>,
    /// The runners purged children had registered (Forgejo 15), and what deleting them said.
    pub retired: Vec<(StaleRegistration, Result<Deregistration, PortError>)>,
    pub purges: Vec<PurgeOutcome>,
}

impl ActReport {
    /// New children this tick (deduplicated replays are not new).
    pub fn started(&self) -> u32 {
        self.dispatches
            .iter()
            .filter(|d| {
                matches!(
                    d,
                    DispatchOutcome::Dispatched {
                        deduplicated: false,
                        ..
                    }
                )
            })
            .count() as u32
    }
}

fn random_hex(rng: &mut (dyn RngCore + Send), len: usize) -> String {
    let mut bytes = vec![0u8; len.div_ceil(2)];
    rng.fill_bytes(&mut bytes);
    let mut hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    hex.truncate(len);
    hex
}

/// Carries out `plan`: mints and dispatches, tears down what the judgements say, then
/// re-reads and purges.
pub async fn carry_out(
    plan: &Plan,
    judgements: &[Judgement],
    to_delete: &RegistrationsToDelete,
    config: &Config,
    registrars: &dyn Registrars,
    control: &dyn ChildControl,
    rng: &mut (dyn RngCore + Send),
) -> ActReport {
    let mut report = ActReport::default();
    // Failures that make the rest of a repo's or a parent's dispatches pointless this tick.
    let mut failed_repos: BTreeSet<RepoName> = BTreeSet::new();
    let mut failed_parents: BTreeSet<(String, Option<RepoName>)> = BTreeSet::new();

    for planned in &plan.dispatches {
        let bucket = planned.bucket.clone();
        let parent = planned.parent.clone();
        let skip = if failed_repos.contains(&bucket.repo) {
            Some(format!(
                "an earlier mint for {} failed this tick",
                bucket.repo
            ))
        } else if failed_parents.contains(&(parent.clone(), None))
            || failed_parents.contains(&(parent.clone(), Some(bucket.repo.clone())))
        {
            Some(format!("an earlier dispatch of {parent} failed this tick"))
        } else {
            None
        };
        if let Some(why) = skip {
            report.dispatches.push(DispatchOutcome::Skipped {
                bucket,
                parent,
                why,
            });
            continue;
        }
        let Some(repo) = config.repos.get(&bucket.repo) else {
            continue;
        };
        let Some(registrar) = registrars.for_mode(&repo.mode) else {
            report.dispatches.push(DispatchOutcome::Skipped {
                bucket,
                parent,
                why: format!("no client for {} mode", repo.mode.as_str()),
            });
            continue;
        };
        let runner_name = RunnerName::for_parent(&parent, &random_hex(rng, 12));
        let runner = RunnerIdentity {
            name: &runner_name,
            labels: &bucket.labels,
        };
        let credential = match registrar.mint(repo, runner).await {
            Ok(credential) => credential,
            Err(error) => {
                failed_repos.insert(bucket.repo.clone());
                let error = error.context(format!(
                    "mint a credential for runner {runner_name} of {}",
                    bucket.repo
                ));
                report.dispatches.push(DispatchOutcome::MintFailed {
                    bucket,
                    parent,
                    error,
                });
                continue;
            }
        };
        // With Vault, what Nomad stores is a single-use wrapping token, never the credential;
        // without it the plain credential goes (the daemon warned at startup). A credential
        // that cannot be wrapped is not sent plain instead.
        let runner_token = match (&credential, registrars.wrapper()) {
            (None, _) => None,
            (Some(credential), None) => Some(credential.plain()),
            (Some(credential), Some(wrapper)) => {
                match wrapper
                    .wrap(&credential.wrapped_fields(), plan.credential_ttl)
                    .await
                {
                    Ok(token) => Some(token),
                    Err(error) => {
                        failed_repos.insert(bucket.repo.clone());
                        let error = error.context(format!(
                            "wrap the {} of runner {runner_name} of {}",
                            credential.kind(),
                            bucket.repo
                        ));
                        report.dispatches.push(DispatchOutcome::MintFailed {
                            bucket,
                            parent,
                            error,
                        });
                        continue;
                    }
                }
            }
        };
        let request = DispatchRequest {
            parent: parent.clone(),
            namespace: repo.nomad_namespace.clone(),
            meta: DispatchMeta {
                repo_url: registrar.repo_url(repo),
                labels: bucket.labels.to_meta(),
                runner_name,
                runner_token,
            },
            idempotency_token: random_hex(rng, 32),
        };
        match dispatch_with_retries(control, &request).await {
            Ok(dispatched) => report.dispatches.push(DispatchOutcome::Dispatched {
                bucket,
                parent,
                runner_name: request.meta.runner_name.clone(),
                child: dispatched.child,
                credential: credential.as_ref().map(Credential::kind),
                runner_id: credential.as_ref().and_then(Credential::runner_id),
                deduplicated: dispatched.deduplicated,
            }),
            Err(error) => {
                // A refusal that names the parent (missing, stopped, meta not permitted) is
                // about this parent for this repo's meta; anything else about Nomad itself.
                let scope = if error.class == ErrorClass::Configuration {
                    Some(bucket.repo.clone())
                } else {
                    None
                };
                failed_parents.insert((parent.clone(), scope));
                let error = error.context(format!("dispatch {parent} for {}", bucket.repo));
                report.dispatches.push(DispatchOutcome::DispatchFailed {
                    bucket,
                    parent,
                    error,
                });
            }
        }
    }

    for judgement in judgements {
        if let Some(tear_down) = judgement.decision.tear_down {
            report
                .reaps
                .push(take_back(judgement, tear_down, config, registrars, control).await);
        }
    }

    for registration in &to_delete.stale {
        let Some(repo) = config.repos.get(&registration.repo) else {
            continue;
        };
        let Some(registry) = registrars.runners_for(&repo.mode) else {
            continue;
        };
        let answer = registry
            .delete_runner(repo, registration.runner_id)
            .await
            .map_err(|e| {
                e.context(format!(
                    "delete the stale registration of {} in {}",
                    registration.name, registration.repo
                ))
            });
        report.deregistrations.push((registration.clone(), answer));
    }

    for child in &plan.purges {
        let purge = purge_if_still_dead(control, child).await;
        let child_is_gone = matches!(purge, PurgeOutcome::Purged(_) | PurgeOutcome::Gone(_));
        report.purges.push(purge);
        let Some(registration) = to_delete.of_purged.get(child).filter(|_| child_is_gone) else {
            continue;
        };
        let Some(repo) = config.repos.get(&registration.repo) else {
            continue;
        };
        let Some(runners) = registrars.registered_runners(&repo.mode) else {
            continue;
        };
        let answer = runners
            .delete_registered(repo, registration.runner_id)
            .await
            .map_err(|e| {
                e.context(format!(
                    "delete runner {} of {}, registered for {child}",
                    registration.name, registration.repo
                ))
            });
        report.retired.push((registration.clone(), answer));
    }
    report
}

/// Takes one runner back, checking ground truth at the moment of acting: a child without an
/// allocation is re-read first (one may have appeared); a registered runner's registration is
/// deleted first and the child stopped only once it is gone (GitHub refuses with 422 while a
/// job runs). An escape (`force`) stops the child whatever the deletion said.
async fn take_back(
    judgement: &Judgement,
    tear_down: TearDown,
    config: &Config,
    registrars: &dyn Registrars,
    control: &dyn ChildControl,
) -> ReapOutcome {
    let nominated = &judgement.nominated;
    let child = nominated.child.clone();
    let decision = &judgement.decision;
    let keep = |outcome: Outcome, why: String| ReapOutcome::Kept {
        child: child.clone(),
        outcome,
        why,
    };
    let mut deregistered = None;
    if nominated.allocation == Allocation::None {
        match control.has_live_allocation(&child).await {
            Ok(false) => {}
            Ok(true) => {
                return keep(
                    Outcome::Vetoed,
                    "an allocation appeared since the listing: its runner may exist".into(),
                );
            }
            // The client's error already names the child and what it was doing.
            Err(error) => return ReapOutcome::Failed { child, error },
        }
    } else if tear_down.deregister_first {
        let repo = nominated.repo.as_ref().and_then(|r| config.repos.get(r));
        let registry = repo.and_then(|r| registrars.runners_for(&r.mode));
        let deleted = match (repo, registry, judgement.runner_id) {
            (Some(repo), Some(registry), Some(id)) => {
                // The judgement's reading is from the start of the tick; the runner may have
                // taken a job since. Read it once more as the last call before the delete, so
                // the window in which a lagging busy flag can hide a job is one round trip.
                if !tear_down.force {
                    match registry.get_runner(repo, id).await {
                        Ok(Some(now)) if now.busy => {
                            return keep(
                                Outcome::Vetoed,
                                "its registration reads busy on the reading just before the delete: the runner took a job"
                                    .into(),
                            );
                        }
                        Ok(Some(_)) => {}
                        Ok(None) => {
                            return keep(
                                Outcome::Held,
                                "GitHub answered 404 for a registration this tick's listing showed: unknown, held".into(),
                            );
                        }
                        Err(error) => {
                            let error = error.context(format!(
                                "read the registration of {child}'s runner before deleting it"
                            ));
                            return ReapOutcome::Failed { child, error };
                        }
                    }
                }
                registry
                    .delete_runner(repo, id)
                    .await
                    .map(|answer| (answer, id))
                    .map_err(|e| e.context(format!("delete the registration of {child}'s runner")))
            }
            _ => Err(PortError::new(
                ErrorClass::Configuration,
                format!("delete the registration of {child}'s runner: no runner API for its repo"),
            )),
        };
        match deleted {
            // Forced (wedged past the hard bound): the stop follows at once.
            Ok((Deregistration::Deleted, id)) if tear_down.force => deregistered = Some(id),
            // Never stopped in the tick that deleted its registration: the reading that found it
            // idle may be a minute old in truth.
            Ok((Deregistration::Deleted, runner_id)) => {
                return ReapOutcome::Deregistered {
                    child,
                    outcome: decision.outcome,
                    runner_id,
                };
            }
            _ if tear_down.force => {}
            Ok((Deregistration::StillBusy, _)) => {
                return keep(
                    Outcome::Vetoed,
                    "GitHub refused to delete its registration: the runner is still running a job"
                        .into(),
                );
            }
            Ok((Deregistration::NotFound, _)) => {
                return keep(
                    Outcome::Held,
                    "GitHub answered 404 for a registration this tick's listing showed: unknown, held".into(),
                );
            }
            Err(error) => return ReapOutcome::Failed { child, error },
        }
    }
    match control.stop(&child).await {
        Ok(()) => ReapOutcome::Stopped {
            child,
            outcome: decision.outcome,
            reason: decision.reason,
            deregistered,
        },
        Err(error) => ReapOutcome::Failed { child, error },
    }
}

async fn dispatch_with_retries(
    control: &dyn ChildControl,
    request: &DispatchRequest,
) -> Result<super::Dispatched, PortError> {
    let mut delay = DISPATCH_RETRY_DELAY;
    let mut attempt = 1;
    loop {
        match control.dispatch(request).await {
            Err(e) if e.class == ErrorClass::Transient && attempt < DISPATCH_ATTEMPTS_MAX => {
                attempt += 1;
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            result => return result,
        }
    }
}

/// Rules nominate, reality vetoes: the listing said dead; purge only if Nomad still says so.
async fn purge_if_still_dead(control: &dyn ChildControl, child: &ChildId) -> PurgeOutcome {
    match control.child_status(child).await {
        Ok(None) => PurgeOutcome::Gone(child.clone()),
        Ok(Some(ChildStatus::Dead)) => match control.purge(child).await {
            Ok(()) => PurgeOutcome::Purged(child.clone()),
            Err(e) => PurgeOutcome::Failed(child.clone(), e.context(format!("purge {child}"))),
        },
        Ok(Some(status)) => PurgeOutcome::Vetoed(child.clone(), status),
        Err(e) => PurgeOutcome::Failed(
            child.clone(),
            e.context(format!("re-read {child} before purging")),
        ),
    }
}
