//! How a runner left decides what its end means (the runner contract's exit codes, read from
//! the `Terminated` event of its allocation): an idle exit (3) is no failed start, a credential
//! someone else unwrapped first (4) is reported as a possible theft at ERROR, and any other
//! failure is a failed start that backs the bucket off. The control loop runs with the real
//! clients against the HTTP twins, ticks driven one by one with explicit times.

mod support;

use chrono::{DateTime, Duration, Utc};
use support::LogCapture;
use support::twins::{Twins, config};

fn at(t0: DateTime<Utc>, n: i64) -> DateTime<Utc> {
    t0 + Duration::seconds(15 * n)
}

struct Case {
    exit_code: i32,
    /// The bucket backs off: no replacement at the next tick.
    backs_off: bool,
    theft_reported: bool,
}

#[tokio::test]
async fn the_runners_exit_code_tells_a_failed_start_from_an_idle_exit_and_a_theft() {
    let cases = [
        Case {
            exit_code: 3,
            backs_off: false,
            theft_reported: false,
        },
        Case {
            exit_code: 4,
            backs_off: false,
            theft_reported: true,
        },
        Case {
            exit_code: 1,
            backs_off: true,
            theft_reported: false,
        },
    ];
    for case in cases {
        let logs = LogCapture::default();
        let _logging = tracing::subscriber::set_default(logs.subscriber(tracing::Level::DEBUG));
        let twins = Twins::start().await;
        let acme = twins.add_app_repo("acme/api");
        twins.register_token_parent("ci-runner");
        let config = config(r#"{ "acme/api": { "mode": "app", "maxConcurrent": 3 } }"#);
        // Queued throughout: each tick would serve it.
        twins.github.add_run(&acme, vec![vec!["self-hosted"]]);
        let mut ctl = twins.controller();
        let t0 = Utc::now();

        assert_eq!(ctl.tick(&config, 1, at(t0, 0), false).await.started, 1);
        let child = twins.our_children("ci-runner").remove(0);
        twins.nomad.place(&child.id).unwrap();
        twins
            .nomad
            .finish_with_exit(&child.id, case.exit_code)
            .unwrap();

        let view = ctl.tick(&config, 1, at(t0, 1), false).await;
        let code = case.exit_code;
        let backoff = view.buckets[0].crash_backoff.as_ref();
        assert_eq!(backoff.is_some(), case.backs_off, "exit {code}: {view:#?}");
        assert_eq!(
            view.started,
            usize::from(!case.backs_off) as u32,
            "exit {code}: a replacement goes out unless the bucket backs off"
        );
        let text = logs.text();
        assert_eq!(
            text.contains("possible credential theft") && text.contains("ERROR"),
            case.theft_reported,
            "exit {code}: {text}"
        );
        assert_eq!(
            text.contains("failed start: the runner exited"),
            case.backs_off,
            "exit {code}: {text}"
        );
    }
}
