//! The documentation examples in `tests/fixtures/github/` that every body is built from,
//! parsed once, and the time format GitHub writes. The seeded world's in-memory GitHub builds
//! its bodies from the same examples.

use std::sync::LazyLock;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value;

/// The documentation examples the responses are built from (also the seeded world's
/// in-memory GitHub's).
pub(crate) struct Templates {
    pub(crate) run: Value,
    pub(crate) job: Value,
    pub(crate) installation: Value,
    pub(crate) access_token: Value,
    pub(crate) token_repository: Value,
    pub(super) registration_token: Value,
    pub(super) runner: Value,
    pub(super) jit_config: Value,
}

pub(crate) static TEMPLATES: LazyLock<Templates> = LazyLock::new(|| {
    let parse = |text: &str| -> Value { serde_json::from_str(text).expect("fixture is JSON") };
    let runs = parse(include_str!(
        "../../../../tests/fixtures/github/list-workflow-runs-for-repo.response.json"
    ));
    let jobs = parse(include_str!(
        "../../../../tests/fixtures/github/list-jobs-for-workflow-run.response.json"
    ));
    let access_token = parse(include_str!(
        "../../../../tests/fixtures/github/create-installation-access-token.response.json"
    ));
    Templates {
        run: runs["workflow_runs"][0].clone(),
        job: jobs["jobs"][0].clone(),
        installation: parse(include_str!(
            "../../../../tests/fixtures/github/get-installation.response.json"
        )),
        token_repository: access_token["repositories"][0].clone(),
        access_token,
        registration_token: parse(include_str!(
            "../../../../tests/fixtures/github/create-registration-token.response.json"
        )),
        runner: parse(include_str!(
            "../../../../tests/fixtures/github/get-runner-for-repo.response.json"
        )),
        jit_config: parse(include_str!(
            "../../../../tests/fixtures/github/generate-jitconfig.response.json"
        )),
    }
});

pub(super) fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}
