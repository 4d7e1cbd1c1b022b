//! The seed's trace over the HTTP twins with the real clients: the tick lines an operator
//! sees for one job, from dispatch to purge.
//!
//! Alone in its binary: a thread-scoped subscriber must not race other tests' callsites.

mod support;

use chrono::{Duration, Utc};
use runner_scaler::observe::ChildStatus;
use support::LogCapture;
use support::twins::{NOMAD_TOKEN, Twins, VAULT_TOKEN, config};

#[tokio::test]
async fn one_job_is_dispatched_counted_while_unplaced_then_purged_once_finished() {
    let logs = LogCapture::default();
    let _guard = tracing::subscriber::set_default(logs.subscriber(tracing::Level::INFO));
    let twins = Twins::start().await;
    let munchbox = twins.add_app_repo("afreidah/munchbox");
    twins.register_token_parent("ci-runner");
    let config = config(r#"{ "afreidah/munchbox": { "maxConcurrent": 3, "mode": "app" } }"#);
    let job = twins
        .github
        .add_run(&munchbox, vec![vec!["self-hosted"]])
        .job_ids[0];
    let mut ctl = twins.controller();
    let t0 = Utc::now();

    // Tick 1: one job queued, one runner dispatched.
    let view = ctl.tick(&config, 1, t0, false).await;
    assert_eq!((view.queued, view.active, view.started), (1, 0, 1));
    let dispatch = &view.dispatches[0];
    assert_eq!(dispatch.outcome, "dispatched");
    assert_eq!(dispatch.minted, Some(true));
    let children = twins.our_children("ci-runner");
    assert_eq!(children.len(), 1);
    let child = children[0].clone();
    assert_eq!(dispatch.child.as_deref(), Some(child.id.as_str()));
    let runner_name = child.meta["runner_name"].clone();
    assert_eq!(dispatch.runner_name.as_deref(), Some(runner_name.as_str()));

    // Tick 2: the cluster has not placed the child; it already counts as active.
    let view = ctl
        .tick(&config, 1, t0 + Duration::seconds(15), false)
        .await;
    assert_eq!((view.queued, view.active, view.started), (1, 1, 0));
    assert!(view.purges.is_empty());

    // The world: Nomad places the child, its runner takes the job and finishes it, and the
    // allocation ends.
    twins.nomad.place(&child.id).unwrap();
    twins
        .github
        .register_runner(&munchbox, &runner_name, &["self-hosted"]);
    twins
        .github
        .start_job(&munchbox, job, &runner_name)
        .unwrap();
    twins
        .github
        .complete_job(&munchbox, job, "success")
        .unwrap();
    twins.github.remove_runner(&munchbox, &runner_name);
    twins.nomad.finish(&child.id, true).unwrap();
    assert_eq!(
        twins.nomad.job(&child.id).unwrap().status,
        ChildStatus::Dead
    );

    // Tick 3: the finished child is purged and nothing is left to do.
    let view = ctl
        .tick(&config, 1, t0 + Duration::seconds(30), false)
        .await;
    assert_eq!((view.queued, view.active, view.started), (0, 0, 0));
    assert_eq!(view.purges.len(), 1, "{:?}", view.purges);
    assert_eq!(view.purges[0].child, child.id);
    assert_eq!(view.purges[0].outcome, "purged");
    assert!(
        twins.nomad.job(&child.id).is_none(),
        "the twin still has it"
    );
    assert!(twins.nomad.children("ci-runner").is_empty());

    assert_eq!(
        logs.tick_lines(),
        vec![
            "poll complete queued=1 active=0 started=1",
            "poll complete queued=1 active=1 started=0",
            "poll complete queued=0 active=0 started=0",
        ]
    );
    let text = logs.text();
    let dispatched = text
        .lines()
        .find(|l| l.contains("dispatched ephemeral runner"))
        .unwrap_or_else(|| panic!("no dispatch line in {text}"));
    for field in [
        "repo=afreidah/munchbox",
        "job=ci-runner",
        "labels=[self-hosted]",
        &format!("runner_name={runner_name}"),
        &format!("child={}", child.id),
        "minted=true",
    ] {
        assert!(
            dispatched.contains(field),
            "{field} missing in {dispatched}"
        );
    }
    assert!(
        text.contains(&format!("purged finished runner child={}", child.id)),
        "{text}"
    );
    // Nothing the daemon was trusted with, or minted, was logged.
    let mut secrets = twins.github.issued_secrets();
    secrets.extend([NOMAD_TOKEN.to_string(), VAULT_TOKEN.to_string()]);
    secrets.push(child.meta["runner_token"].clone());
    for secret in secrets {
        assert!(!text.contains(&secret), "a secret was logged");
    }
}
