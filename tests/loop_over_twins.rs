//! The control loop with the real clients against the HTTP twins: ticks are driven one by
//! one with explicit times, and the world is moved between them through the twins' handles.

mod support;

use axum::http::StatusCode;
use chrono::{DateTime, Duration, Utc};
use runner_scaler::observe::ChildStatus;
use runner_scaler::report::TickView;
use support::twins::{Twins, config};

/// Tick `n`, a poll interval apart from `t0`.
fn at(t0: DateTime<Utc>, n: i64) -> DateTime<Utc> {
    t0 + Duration::seconds(15 * n)
}

/// The error of `repo`'s dispatch in `view`, which Nomad refused.
fn refused_dispatch<'v>(view: &'v TickView, repo: &str) -> &'v str {
    let refused = view
        .dispatches
        .iter()
        .find(|d| d.repo == repo)
        .unwrap_or_else(|| panic!("{repo}'s dispatch was not attempted"));
    assert_eq!(refused.outcome, "dispatch_failed");
    refused.error.as_deref().unwrap_or_default()
}

fn started_for(view: &TickView, repo: &str) -> usize {
    view.dispatches
        .iter()
        .filter(|d| d.repo == repo && d.outcome == "dispatched")
        .count()
}

#[tokio::test]
async fn a_full_cluster_gets_one_child_per_job_and_no_more_across_eight_ticks() {
    let twins = Twins::start().await;
    let acme = twins.add_app_repo("acme/api");
    twins.register_token_parent("ci-runner");
    let config = config(r#"{ "acme/api": { "mode": "app", "maxConcurrent": 5 } }"#);
    twins.github.add_run(&acme, vec![vec!["self-hosted"]; 3]);
    let mut ctl = twins.controller();
    let t0 = Utc::now();

    for tick in 0..8 {
        let view = ctl.tick(&config, 1, at(t0, tick), false).await;
        assert!(view.gaps.is_empty(), "tick {tick}: {:?}", view.gaps);
        assert_eq!(view.queued, 3, "tick {tick}");
        if tick == 0 {
            assert_eq!((view.active, view.started), (0, 3));
        } else {
            // Unplaced children still occupy their slots.
            assert_eq!(
                (view.active, view.started),
                (3, 0),
                "tick {tick} dispatched again"
            );
        }
    }

    let children = twins.our_children("ci-runner");
    assert_eq!(children.len(), 3);
    assert!(children.iter().all(|c| c.status == ChildStatus::Pending));
    assert_eq!(twins.dispatch_requests("ci-runner"), 3);
}

#[tokio::test]
async fn a_second_push_gets_a_runner_in_the_very_next_tick_while_the_first_build_runs() {
    let twins = Twins::start().await;
    let acme = twins.add_app_repo("acme/api");
    twins.register_token_parent("ci-runner");
    let config = config(r#"{ "acme/api": { "mode": "app", "maxConcurrent": 3 } }"#);
    let first = twins
        .github
        .add_run(&acme, vec![vec!["self-hosted"]])
        .job_ids[0];
    let mut ctl = twins.controller();
    let t0 = Utc::now();

    assert_eq!(ctl.tick(&config, 1, at(t0, 0), false).await.started, 1);
    let child = twins.our_children("ci-runner").remove(0);
    let runner_name = child.meta["runner_name"].clone();
    twins.nomad.place(&child.id).unwrap();
    twins
        .github
        .register_runner(&acme, &runner_name, &["self-hosted"]);
    twins.github.start_job(&acme, first, &runner_name).unwrap();
    twins.github.add_run(&acme, vec![vec!["self-hosted"]]);

    let view = ctl.tick(&config, 1, at(t0, 1), false).await;
    assert!(view.gaps.is_empty(), "{:?}", view.gaps);
    assert_eq!(view.started, 1, "{view:#?}");
    let bucket = &view.buckets[0];
    assert_eq!(
        (bucket.queued, bucket.in_progress, bucket.in_flight),
        (1, 1, 1)
    );
    assert_eq!(twins.our_children("ci-runner").len(), 2);

    // Both runners are accounted for: nothing more next tick.
    let view = ctl.tick(&config, 1, at(t0, 2), false).await;
    assert_eq!((view.active, view.started), (2, 0));
    assert_eq!(twins.dispatch_requests("ci-runner"), 2);
}

#[tokio::test]
async fn nomad_down_dispatches_nothing_reports_a_gap_and_the_next_tick_recovers() {
    let twins = Twins::start().await;
    let acme = twins.add_app_repo("acme/api");
    twins.register_token_parent("ci-runner");
    let config = config(r#"{ "acme/api": { "mode": "app", "maxConcurrent": 3 } }"#);
    twins.github.add_run(&acme, vec![vec!["self-hosted"]]);
    let mut ctl = twins.controller();
    let t0 = Utc::now();

    twins.nomad.set_unavailable(true);
    let view = ctl.tick(&config, 1, at(t0, 0), false).await;
    assert_eq!(view.started, 0);
    assert_eq!(view.queued, 1, "the queue was read: only Nomad is down");
    assert!(
        view.gaps.iter().any(|g| g.starts_with("ci-runner: ")),
        "{:?}",
        view.gaps
    );
    assert!(view.buckets[0].reason.is_some(), "{view:#?}");
    assert_eq!(twins.dispatch_requests("ci-runner"), 0);

    twins.nomad.set_unavailable(false);
    let view = ctl.tick(&config, 1, at(t0, 1), false).await;
    assert!(view.gaps.is_empty(), "{:?}", view.gaps);
    assert_eq!(view.started, 1);
    assert_eq!(twins.our_children("ci-runner").len(), 1);
}

/// Two app repos of different owners; `alpha` answers `status` on every Actions route.
async fn one_repo_failing(status: StatusCode) -> (Twins, runner_scaler::config::Config) {
    let twins = Twins::start().await;
    let alpha = twins.add_app_repo("alpha/api");
    let beta = twins.add_app_repo("beta/api");
    twins.register_token_parent("ci-runner");
    twins.github.add_run(&alpha, vec![vec!["self-hosted"]]);
    twins.github.add_run(&beta, vec![vec!["self-hosted"]]);
    twins.github_faults.fail_repo(&alpha, status);
    let config = config(
        r#"{
          "alpha/api": { "mode": "app", "maxConcurrent": 2 },
          "beta/api": { "mode": "app", "maxConcurrent": 2 }
        }"#,
    );
    (twins, config)
}

#[tokio::test]
async fn a_github_5xx_on_one_repo_does_not_stop_another_repo_in_the_same_tick() {
    let (twins, config) = one_repo_failing(StatusCode::BAD_GATEWAY).await;
    let alpha = support::twins::repo("alpha/api");
    let mut ctl = twins.controller();
    let t0 = Utc::now();

    let view = ctl.tick(&config, 1, at(t0, 0), false).await;
    assert_eq!(started_for(&view, "beta/api"), 1, "{view:#?}");
    assert_eq!(started_for(&view, "alpha/api"), 0);
    assert_eq!(view.gaps.len(), 1, "{:?}", view.gaps);
    assert!(view.gaps[0].starts_with("alpha/api: "), "{:?}", view.gaps);
    assert!(view.gaps[0].contains("502"), "{:?}", view.gaps);
    assert!(twins.github_faults.hits(&alpha) > 0);
    let children = twins.our_children("ci-runner");
    assert_eq!(children.len(), 1);
    assert!(children[0].meta["repo_url"].ends_with("/beta/api"));

    // A transient error is retried at the next tick: once healed, alpha is served.
    twins.github_faults.heal(&alpha);
    let view = ctl.tick(&config, 1, at(t0, 1), false).await;
    assert!(view.gaps.is_empty(), "{:?}", view.gaps);
    assert_eq!(started_for(&view, "alpha/api"), 1, "{view:#?}");
    assert_eq!(started_for(&view, "beta/api"), 0);
}

#[tokio::test]
async fn a_github_401_on_one_repo_does_not_stop_another_and_is_retried_slowly() {
    let (twins, config) = one_repo_failing(StatusCode::UNAUTHORIZED).await;
    let alpha = support::twins::repo("alpha/api");
    let mut ctl = twins.controller();
    let t0 = Utc::now();

    let view = ctl.tick(&config, 1, at(t0, 0), false).await;
    assert_eq!(started_for(&view, "beta/api"), 1, "{view:#?}");
    assert_eq!(view.gaps.len(), 1, "{:?}", view.gaps);
    assert!(view.gaps[0].starts_with("alpha/api: "), "{:?}", view.gaps);
    let hits = twins.github_faults.hits(&alpha);
    // A 401 drops the token and re-mints once: two tries, never a loop.
    assert_eq!(hits, 2, "requests answered 401");

    // A terminal error is held (not asked again at the next poll), and the other repo goes on.
    twins
        .github
        .add_run(&support::twins::repo("beta/api"), vec![vec!["self-hosted"]]);
    let view = ctl.tick(&config, 1, at(t0, 1), false).await;
    assert_eq!(
        twins.github_faults.hits(&alpha),
        hits,
        "asked again at once"
    );
    assert!(view.gaps.iter().any(|g| g.starts_with("alpha/api: ")));
    assert_eq!(started_for(&view, "beta/api"), 1, "{view:#?}");
}

#[tokio::test]
async fn a_hostile_label_is_never_dispatched_and_shows_as_unroutable() {
    let twins = Twins::start().await;
    let acme = twins.add_app_repo("acme/api");
    twins.register_token_parent("ci-runner");
    let config = config(r#"{ "acme/api": { "mode": "app", "maxConcurrent": 3 } }"#);
    let hostile = twins
        .github
        .add_run(&acme, vec![vec!["self-hosted", "$(id)"]])
        .job_ids[0];
    twins.github.add_run(&acme, vec![vec!["self-hosted"]]);
    let mut ctl = twins.controller();
    let t0 = Utc::now();

    for tick in 0..3 {
        let view = ctl.tick(&config, 1, at(t0, tick), false).await;
        assert!(
            view.unroutable
                .iter()
                .any(|u| u.repo == "acme/api" && u.job_id == hostile),
            "tick {tick}: {:?}",
            view.unroutable
        );
        assert!(
            view.buckets.iter().all(|b| !b.labels.contains('$')),
            "{:?}",
            view.buckets
        );
    }
    // The well-formed job was served; the hostile one never reached Nomad.
    let children = twins.our_children("ci-runner");
    assert_eq!(children.len(), 1);
    assert_eq!(children[0].meta["labels"], "self-hosted");
    assert_eq!(twins.dispatch_requests("ci-runner"), 1);
}

#[tokio::test]
async fn a_dispatch_refused_for_unpermitted_meta_is_held_while_another_parent_dispatches() {
    let twins = Twins::start().await;
    let alpha = twins.add_app_repo("alpha/api");
    let beta = twins.add_app_repo("beta/api");
    twins.register_token_parent("ci-runner");
    // Registered without `managed_by` among its optional meta: Nomad refuses our dispatch.
    twins.nomad.register_parent(
        "alpha-runner",
        support::twins::TOKEN_PARENT_META_REQUIRED,
        &["labels"],
        runner_scaler::sim::twins::nomad::PayloadRule::Forbidden,
    );
    let config = config(
        r#"{
          "alpha/api": { "mode": "app", "maxConcurrent": 2, "defaultJob": "alpha-runner" },
          "beta/api": { "mode": "app", "maxConcurrent": 2 }
        }"#,
    );
    twins.github.add_run(&alpha, vec![vec!["self-hosted"]]);
    twins.github.add_run(&beta, vec![vec!["self-hosted"]]);
    let mut ctl = twins.controller();
    let t0 = Utc::now();

    let view = ctl.tick(&config, 1, at(t0, 0), false).await;
    let message = refused_dispatch(&view, "alpha/api");
    assert!(
        message.contains("Dispatch request included unpermitted metadata keys: [managed_by]"),
        "{message}"
    );
    assert_eq!(started_for(&view, "beta/api"), 1);
    assert_eq!(twins.dispatch_requests("alpha-runner"), 1);

    // Next tick: alpha's parent is held, not tried again; beta's new job still dispatches.
    twins.github.add_run(&beta, vec![vec!["self-hosted"]]);
    let view = ctl.tick(&config, 1, at(t0, 1), false).await;
    assert!(
        view.dispatches.iter().all(|d| d.repo != "alpha/api"),
        "{:?}",
        view.dispatches
    );
    let alpha_bucket = view
        .buckets
        .iter()
        .find(|b| b.repo == "alpha/api")
        .expect("alpha's bucket");
    assert_eq!(alpha_bucket.to_dispatch, 0);
    assert!(alpha_bucket.reason.is_some(), "{alpha_bucket:?}");
    assert_eq!(
        twins.dispatch_requests("alpha-runner"),
        1,
        "retried at once"
    );
    assert_eq!(started_for(&view, "beta/api"), 1, "{view:#?}");
    assert!(twins.nomad.children("alpha-runner").is_empty());
    assert_eq!(twins.our_children("ci-runner").len(), 2);
}

/// GET requests for the parent job `parent` itself (not its children's listing).
fn parent_reads(twins: &Twins, parent: &str) -> usize {
    let path = format!("/v1/job/{parent}");
    twins
        .nomad
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == path)
        .count()
}

fn mints(twins: &Twins) -> usize {
    twins
        .github
        .request_log()
        .iter()
        .filter(|r| r.path.ends_with("/actions/runners/generate-jitconfig"))
        .count()
}

#[tokio::test]
async fn a_forgotten_parent_is_dispatched_to_within_one_poll_of_being_registered() {
    let twins = Twins::start().await;
    let alpha = twins.add_app_repo("alpha/api");
    let config = config(
        r#"{ "alpha/api": { "mode": "app", "maxConcurrent": 2, "defaultJob": "alpha-runner" } }"#,
    );
    twins.github.add_run(&alpha, vec![vec!["self-hosted"]]);
    let mut ctl = twins.controller();
    let t0 = Utc::now();

    let view = ctl.tick(&config, 1, at(t0, 0), false).await;
    let message = refused_dispatch(&view, "alpha/api");
    assert!(message.contains("parameterized job not found"), "{message}");
    let minted = mints(&twins);

    // Still missing: each poll reads the parent once, and mints and dispatches nothing.
    for n in 1..=3 {
        let view = ctl.tick(&config, 1, at(t0, n), false).await;
        assert!(view.dispatches.is_empty(), "{:?}", view.dispatches);
        let bucket = view.buckets.iter().find(|b| b.repo == "alpha/api").unwrap();
        let reason = bucket.reason.as_deref().unwrap_or_default();
        assert!(reason.contains("read again every poll"), "{reason}");
        assert_eq!(parent_reads(&twins, "alpha-runner"), n as usize);
    }
    assert_eq!(mints(&twins), minted, "a held dispatch mints nothing");
    assert_eq!(twins.dispatch_requests("alpha-runner"), 1);

    // The operator runs the forgotten `nomad job run`: served at the next poll, not ten
    // minutes later.
    twins.register_token_parent("alpha-runner");
    let view = ctl.tick(&config, 1, at(t0, 4), false).await;
    assert_eq!(started_for(&view, "alpha/api"), 1, "{:?}", view.dispatches);
    assert_eq!(twins.our_children("alpha-runner").len(), 1);
}

#[tokio::test]
async fn a_parent_fixed_in_place_is_dispatched_to_at_the_next_poll() {
    let twins = Twins::start().await;
    let alpha = twins.add_app_repo("alpha/api");
    // Without `managed_by` among its optional meta: refused, and its reading says why.
    twins.nomad.register_parent(
        "alpha-runner",
        support::twins::TOKEN_PARENT_META_REQUIRED,
        &["labels"],
        runner_scaler::sim::twins::nomad::PayloadRule::Forbidden,
    );
    let config = config(
        r#"{ "alpha/api": { "mode": "app", "maxConcurrent": 2, "defaultJob": "alpha-runner" } }"#,
    );
    twins.github.add_run(&alpha, vec![vec!["self-hosted"]]);
    let mut ctl = twins.controller();
    let t0 = Utc::now();
    ctl.tick(&config, 1, at(t0, 0), false).await;
    ctl.tick(&config, 1, at(t0, 1), false).await;
    assert_eq!(twins.dispatch_requests("alpha-runner"), 1);

    // Fixed with a new `nomad job run` of the same parent.
    twins.register_token_parent("alpha-runner");
    let view = ctl.tick(&config, 1, at(t0, 2), false).await;
    assert_eq!(started_for(&view, "alpha/api"), 1, "{:?}", view.dispatches);
}

#[tokio::test]
async fn a_wrapped_credential_lives_no_longer_than_placement_and_boot_need() {
    for (placement_timeout_s, expected_ttl_s) in [(50 * 60, 3600), (10 * 60, 20 * 60)] {
        let twins = Twins::start().await;
        twins.provision_one_queued_job("acme/api", "ci-runner");
        let config = config(r#"{ "acme/api": { "mode": "app", "maxConcurrent": 2 } }"#);
        let mut ctl = twins.controller();
        ctl.settings.plan.reap.placement_timeout =
            std::time::Duration::from_secs(placement_timeout_s);
        let view = ctl.tick(&config, 1, Utc::now(), false).await;
        assert_eq!(view.started, 1, "{:?}", view.dispatches);
        let child = twins.our_children("ci-runner").remove(0);
        let token = &child.meta["runner_token"];
        assert_eq!(
            twins.vault.wrap_ttl_s(token),
            Some(expected_ttl_s),
            "placement timeout {placement_timeout_s} s"
        );
    }
}
