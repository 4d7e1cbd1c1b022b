//! Forgejo 15 and later: every dispatch registers one ephemeral runner of its own, Nomad holds
//! only a single-use wrapping token of its uuid and token, and the runner is deleted once its
//! child is purged. Older instances keep the repo's shared registration token. The control
//! loop runs with the real clients against the HTTP twins, ticks driven by hand.

mod support;

use chrono::{DateTime, Duration, Utc};
use runner_scaler::sim::twins::vault::WRAPPING_TOKEN_INVALID;
use support::twins::{Twins, config};

const REPO: &str = "alex/s3-orchestrator";
const PARENT: &str = "forgejo-build-runner";

fn at(t0: DateTime<Utc>, n: i64) -> DateTime<Utc> {
    t0 + Duration::seconds(15 * n)
}

/// The brief's world with one queued Forgejo job, on a Forgejo reporting `version`: the
/// document and the job's id.
fn forgejo_world(twins: &Twins, version: &str) -> (runner_scaler::config::Config, u64) {
    let document = twins.provision_brief_world();
    twins.forgejo.set_version(version);
    let job = twins.forgejo.add_job(REPO, "build", &["build"]);
    (config(&document), job)
}

#[tokio::test]
async fn on_forgejo_15_a_dispatch_registers_its_own_ephemeral_runner_and_nomad_holds_a_wrapping_token()
 {
    let twins = Twins::start().await;
    let (config, _) = forgejo_world(&twins, "15.0.1+gitea-1.22.0");
    let mut ctl = twins.controller();

    let view = ctl.tick(&config, 1, Utc::now(), false).await;
    assert!(view.gaps.is_empty(), "{:?}", view.gaps);
    assert!(
        view.weaker_credentials.is_empty(),
        "{:?}",
        view.weaker_credentials
    );
    let children = twins.our_children(PARENT);
    assert_eq!(children.len(), 1);
    let child = &children[0];

    let registered = twins.forgejo.registered_runners();
    assert_eq!(registered.len(), 1, "one runner for one dispatch");
    let runner = &registered[0];
    assert!(runner.ephemeral, "registered without ephemeral: true");
    assert_eq!(runner.name, child.meta["runner_name"]);
    assert!(
        twins
            .forgejo
            .requests()
            .iter()
            .all(|r| !r.path.ends_with("/registration-token")),
        "the shared registration token was asked for on Forgejo 15"
    );

    // Nomad holds a wrapping token, neither the uuid nor the token.
    let meta = serde_json::to_string(&child.meta).unwrap();
    assert!(!meta.contains(&runner.token) && !meta.contains(&runner.uuid));
    let wrapping = &child.meta["runner_token"];
    assert!(twins.vault.wrapping_tokens().contains(wrapping));
    let (status, first) = twins.unwrap_as_runner(wrapping).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["data"]["runner_uuid"], runner.uuid.as_str());
    assert_eq!(first["data"]["runner_token"], runner.token.as_str());
    assert_eq!(first["data"].as_object().unwrap().len(), 2);
    let (status, second) = twins.unwrap_as_runner(wrapping).await;
    assert_eq!(status, 400);
    assert_eq!(second["errors"][0], WRAPPING_TOKEN_INVALID);
}

#[tokio::test]
async fn the_runner_a_dispatch_registered_is_deleted_once_its_child_is_purged_not_before() {
    let twins = Twins::start().await;
    let (config, job) = forgejo_world(&twins, "15.0.0");
    let mut ctl = twins.controller();
    let t0 = Utc::now();

    assert_eq!(ctl.tick(&config, 1, at(t0, 0), false).await.started, 1);
    let child = twins.our_children(PARENT).remove(0);
    assert_eq!(twins.forgejo.registered_runners().len(), 1);

    // While its child runs, the runner stays registered, tick after tick.
    twins.nomad.place(&child.id).unwrap();
    twins.forgejo.claim(job);
    twins.forgejo.start(job);
    for n in 1..4 {
        ctl.tick(&config, 1, at(t0, n), false).await;
        assert_eq!(twins.forgejo.registered_runners().len(), 1, "tick {n}");
    }

    // The runner did its job and exited: the child is purged, and its runner deleted.
    twins.forgejo.finish(job);
    twins.nomad.finish(&child.id, true).unwrap();
    let view = ctl.tick(&config, 1, at(t0, 4), false).await;
    assert!(view.gaps.is_empty(), "{:?}", view.gaps);
    assert!(
        twins.our_children(PARENT).is_empty(),
        "the dead child was not purged"
    );
    assert!(
        twins.forgejo.registered_runners().is_empty(),
        "the purged child's runner is still registered"
    );
    let deletes: Vec<_> = twins
        .forgejo
        .requests()
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .collect();
    assert_eq!(deletes.len(), 1);
    assert_eq!(deletes[0].status, 204);
}

#[tokio::test]
async fn before_forgejo_15_a_repo_that_does_not_opt_in_dispatches_nothing_and_says_why() {
    let twins = Twins::start().await;
    let (config, _) = forgejo_world(&twins, "11.0.3+gitea-1.22.0");
    let mut ctl = twins.controller();

    let t0 = Utc::now();
    let view = ctl.tick(&config, 1, at(t0, 0), false).await;
    assert_eq!(view.started, 0, "{:?}", view.dispatches);
    let refused = &view.dispatches[0];
    assert_eq!(refused.outcome, "mint_failed");
    let error = refused.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("allowSharedRegistrationToken") && error.contains("11.0.3"),
        "{error}"
    );
    // Held afterwards, and `status` says why.
    for n in 1..3 {
        let view = ctl.tick(&config, 1, at(t0, n), false).await;
        assert!(view.dispatches.is_empty(), "{:?}", view.dispatches);
        let text = view.render_text();
        assert!(
            text.contains("allowSharedRegistrationToken") && text.contains(REPO),
            "{text}"
        );
    }
    assert!(twins.our_children(PARENT).is_empty());
    assert!(
        twins
            .forgejo
            .requests()
            .iter()
            .all(|r| !r.path.ends_with("/registration-token")),
        "the shared token was asked for without the opt-in"
    );
}

#[tokio::test]
async fn before_forgejo_15_a_repo_that_opts_in_gets_the_shared_registration_token() {
    let twins = Twins::start().await;
    let document = twins.provision_brief_world().replace(
        r#""mode": "forgejo","#,
        r#""mode": "forgejo", "allowSharedRegistrationToken": true,"#,
    );
    assert!(document.contains("allowSharedRegistrationToken"));
    twins.forgejo.set_version("11.0.3+gitea-1.22.0");
    twins.forgejo.add_job(REPO, "build", &["build"]);
    let config = config(&document);
    let mut ctl = twins.controller();

    let view = ctl.tick(&config, 1, Utc::now(), false).await;
    assert_eq!(view.started, 1);
    // The status says plainly that this is weaker.
    assert_eq!(
        view.weaker_credentials.len(),
        1,
        "{:?}",
        view.weaker_credentials
    );
    let weaker = &view.weaker_credentials[0];
    assert!(
        weaker.starts_with(REPO) && weaker.contains("shared registration token"),
        "{weaker}"
    );
    assert!(
        view.render_text()
            .contains("weaker credential: alex/s3-orchestrator")
    );
    let child = twins.our_children(PARENT).remove(0);
    assert!(twins.forgejo.registered_runners().is_empty());
    let (status, unwrapped) = twins.unwrap_as_runner(&child.meta["runner_token"]).await;
    assert_eq!(status, 200, "{unwrapped}");
    assert_eq!(
        unwrapped["data"]["registration_token"].as_str(),
        twins.forgejo.registration_token(REPO).as_deref()
    );
    assert!(
        twins.forgejo.requests().iter().all(|r| r.method == "GET"),
        "an older Forgejo has no runner registration API"
    );
}
