//! Adaptive polling with the real clients against the HTTP twins, ticks driven by hand a
//! poll interval apart: a repo with work is read every tick, an idle one once per idle
//! interval, a webhook hint has it read at the next tick, and a repo not read in a tick is
//! shown from its last reading but never dispatched for.

mod support;

use chrono::{DateTime, Duration, Utc};
use runner_scaler::model::RepoName;
use support::twins::{Twins, config};

fn at(t0: DateTime<Utc>, n: i64) -> DateTime<Utc> {
    t0 + Duration::seconds(15 * n)
}

/// The full reads of `repo`'s queue GitHub answered so far: its listings of queued runs.
fn reads_of(twins: &Twins, repo: &RepoName) -> usize {
    let runs = format!("/repos/{repo}/actions/runs?");
    twins
        .github
        .request_log()
        .iter()
        .filter(|r| r.path.starts_with(&runs) && r.path.contains("status=queued"))
        .count()
}

/// The quick reads of `repo`'s queue: one listing of its newest runs, whatever their status.
fn quick_reads_of(twins: &Twins, repo: &RepoName) -> usize {
    let runs = format!("/repos/{repo}/actions/runs?");
    twins
        .github
        .request_log()
        .iter()
        .filter(|r| r.path.starts_with(&runs) && !r.path.contains("status="))
        .count()
}

const DOCUMENT: &str = r#"{ "acme/api": { "mode": "app", "maxConcurrent": 3 },
                           "acme/web": { "mode": "app", "maxConcurrent": 3 } }"#;

#[tokio::test]
async fn a_busy_repo_is_read_every_tick_and_an_idle_one_once_a_minute() {
    let twins = Twins::start().await;
    let api = twins.add_app_repo("acme/api");
    let web = twins.add_app_repo("acme/web");
    twins.register_token_parent("ci-runner");
    let config = config(DOCUMENT);
    // acme/api has a job queued for the whole run (its child is never placed); acme/web has
    // nothing.
    twins.github.add_run(&api, vec![vec!["self-hosted"]]);
    let mut ctl = twins.controller();
    let t0 = Utc::now();

    for n in 0..9 {
        let view = ctl.tick(&config, 1, at(t0, n), false).await;
        assert!(view.gaps.is_empty(), "tick {n}: {:?}", view.gaps);
    }
    // Nine ticks over two minutes: the busy repo nine full reads (after a quick first read
    // that found its run active), the idle one a quick read at 0 s, 60 s and 120 s: one
    // request each, never the five listings of a full read.
    assert_eq!(reads_of(&twins, &api), 9, "busy repo");
    assert_eq!(quick_reads_of(&twins, &api), 1, "busy repo");
    assert_eq!(quick_reads_of(&twins, &web), 3, "idle repo");
    assert_eq!(reads_of(&twins, &web), 0, "idle repo");
}

#[tokio::test]
async fn a_job_in_an_idle_repo_waits_for_its_next_read_or_a_hint_brings_it_forward() {
    for hinted in [false, true] {
        let twins = Twins::start().await;
        let web = twins.add_app_repo("acme/web");
        twins.add_app_repo("acme/api");
        twins.register_token_parent("ci-runner");
        let config = config(DOCUMENT);
        let mut ctl = twins.controller();
        let t0 = Utc::now();
        ctl.tick(&config, 1, at(t0, 0), false).await;

        // A push at 10 s; its webhook (if any) arrives at once.
        twins.github.add_run(&web, vec![vec!["self-hosted"]]);
        if hinted {
            ctl.hint(&web, t0 + Duration::seconds(10));
        }
        let view = ctl.tick(&config, 1, at(t0, 1), false).await;
        if hinted {
            assert_eq!(view.started, 1, "the hint did not bring the read forward");
            continue;
        }
        assert_eq!(view.started, 0, "an idle repo was read before its time");
        // Shown from the reading of 0 s, not dispatched for.
        let bucket = view.buckets.iter().find(|b| b.repo == "acme/web");
        assert!(bucket.is_none_or(|b| b.queued == 0), "{bucket:?}");
        for n in 2..4 {
            assert_eq!(ctl.tick(&config, 1, at(t0, n), false).await.started, 0);
        }
        // The idle read at 60 s sees the job and dispatches for it.
        assert_eq!(ctl.tick(&config, 1, at(t0, 4), false).await.started, 1);
    }
}

#[tokio::test]
async fn a_repo_not_read_this_tick_is_never_dispatched_for_on_its_old_reading() {
    let twins = Twins::start().await;
    let api = twins.add_app_repo("acme/api");
    let web = twins.add_app_repo("acme/web");
    twins.register_token_parent("ci-runner");
    let config = config(DOCUMENT);
    let job = twins
        .github
        .add_run(&api, vec![vec!["self-hosted"]])
        .job_ids[0];
    let mut ctl = twins.controller();
    let t0 = Utc::now();
    assert_eq!(ctl.tick(&config, 1, at(t0, 0), false).await.started, 1);

    // Within seconds its runner takes the job, runs it and exits: the reading of 0 s still
    // shows the job queued, Nomad shows the child dead. A webhook for acme/web wakes a tick
    // at 3 s, in which acme/api is not due.
    let child = twins.our_children("ci-runner").remove(0);
    twins.nomad.place(&child.id).unwrap();
    let runner = child.meta["runner_name"].clone();
    twins
        .github
        .register_runner(&api, &runner, &["self-hosted"]);
    twins.github.start_job(&api, job, &runner).unwrap();
    twins.github.complete_job(&api, job, "success").unwrap();
    twins.nomad.finish(&child.id, true).unwrap();
    ctl.hint(&web, t0 + Duration::seconds(3));
    let view = ctl.tick(&config, 1, t0 + Duration::seconds(3), false).await;
    let bucket = view.buckets.iter().find(|b| b.repo == "acme/api").unwrap();
    assert_eq!(bucket.queued, 1, "the old reading is shown");
    assert_eq!(
        view.started, 0,
        "dispatched on a reading from an earlier tick"
    );
    assert!(
        bucket
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("queue not polled this tick")),
        "{bucket:?}"
    );
    // At its own read the job is gone and nothing goes out either.
    assert_eq!(ctl.tick(&config, 1, at(t0, 1), false).await.started, 0);
    assert_eq!(reads_of(&twins, &api), 2);
}

#[tokio::test]
async fn a_budget_running_low_stretches_its_repos_reads_and_says_so() {
    let twins = Twins::start().await;
    let api = twins.add_app_repo("acme/api");
    twins.add_app_repo("acme/web");
    twins.register_token_parent("ci-runner");
    let config = config(DOCUMENT);
    twins.github.add_run(&api, vec![vec!["self-hosted"]]);
    // The installation's hour is almost spent by the first tick's reads and mint.
    twins.github.set_budget_limit(13);
    let mut ctl = twins.controller();
    let t0 = Utc::now();

    let first = ctl.tick(&config, 1, at(t0, 0), false).await;
    assert!(first.gaps.is_empty(), "{:?}", first.gaps);
    let view = ctl.tick(&config, 1, at(t0, 1), false).await;
    assert_eq!(
        view.stretched_budgets.len(),
        1,
        "{:?}",
        view.stretched_budgets
    );
    assert!(
        view.stretched_budgets[0].starts_with("installation-"),
        "{:?}",
        view.stretched_budgets
    );
    assert!(view.render_text().contains("budget low: installation-"));
    for n in 2..6 {
        ctl.tick(&config, 1, at(t0, n), false).await;
    }
    // Busy as it is, acme/api was read once, not six times: the budget lasts to its reset.
    assert_eq!(reads_of(&twins, &api), 1);
}

/// After a start, a fleet's first reads are spread over one idle interval (here 40 repos,
/// 16 a tick at the least): a repo not read yet shows as such and gets nothing dispatched;
/// a webhook hint reads its repo at once all the same.
#[tokio::test]
async fn first_reads_are_spread_and_a_hint_jumps_the_line() {
    let twins = Twins::start().await;
    twins.register_token_parent("ci-runner");
    let names: Vec<String> = (0..40).map(|i| format!("acme/r{i:02}")).collect();
    let repos: Vec<RepoName> = names.iter().map(|n| twins.add_app_repo(n)).collect();
    let document = format!(
        "{{ {} }}",
        names
            .iter()
            .map(|n| format!(r#""{n}": {{ "mode": "app", "maxConcurrent": 1 }}"#))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let config = config(&document);
    // The last repo by name has a job queued, and a webhook says so.
    let last = repos.last().unwrap();
    twins.github.add_run(last, vec![vec!["self-hosted"]]);
    let mut ctl = twins.controller();
    let t0 = Utc::now();
    ctl.hint(last, t0);

    let first = ctl.tick(&config, 1, at(t0, 0), false).await;
    let read: Vec<usize> = repos.iter().map(|r| quick_reads_of(&twins, r)).collect();
    assert_eq!(read.iter().sum::<usize>(), 16, "16 first reads, quick");
    assert_eq!(
        reads_of(&twins, last),
        1,
        "the hinted repo was read, in full"
    );
    assert_eq!(first.started, 1, "and dispatched for");
    let waiting = first
        .gaps
        .iter()
        .filter(|g| g.contains("not read yet"))
        .count();
    assert_eq!(waiting, 23, "{:?}", first.gaps);

    ctl.tick(&config, 1, at(t0, 1), false).await;
    let third = ctl.tick(&config, 1, at(t0, 2), false).await;
    for repo in &repos[..39] {
        let reads = quick_reads_of(&twins, repo);
        assert_eq!(reads, 1, "{repo} read once within three ticks");
    }
    assert!(third.gaps.is_empty(), "{:?}", third.gaps);
}
