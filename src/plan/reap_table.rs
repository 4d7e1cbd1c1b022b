//! [`decide`] as a full table: every (mode × allocation × verdict × age band) cell of a
//! surplus nomination, then the cells where the other nominations differ.
//!
//! A cell reads `outcome`, `+dereg` when the registration is deleted before the child is
//! stopped, `!` when an escape stops it whatever the deletion says.

use std::time::Duration;

use super::reap::*;

const POLICY: ReapPolicy = ReapPolicy {
    orphan_grace: Duration::from_secs(600),
    idle_confirm: Duration::from_secs(120),
    job_listing_lag: JOB_LISTING_LAG,
    hard_bound: Duration::from_secs(5 * 24 * 3600 + 1800),
    placement_timeout: Duration::from_secs(3000),
};

/// Age bands: younger than the grace window, past it, past the hard bound.
fn age(band: &str) -> Duration {
    match band {
        "young" => Duration::from_secs(599),
        "grown" => Duration::from_secs(3600),
        "past-bound" => POLICY.hard_bound,
        other => panic!("unknown age band {other}"),
    }
}

fn verdict(name: &str) -> Verdict {
    match name {
        "busy" => Verdict::Busy,
        "idle" => Verdict::Idle { confirmed: true },
        "idle-once" => Verdict::Idle { confirmed: false },
        "absent" => Verdict::Absent { confirmed: true },
        "absent-once" => Verdict::Absent { confirmed: false },
        "unknown-short" => Verdict::Unknown {
            held_for: Duration::from_secs(599),
        },
        "unknown-long" => Verdict::Unknown {
            held_for: Duration::from_secs(600),
        },
        "not-asked" => Verdict::NotAsked,
        other => panic!("unknown verdict {other}"),
    }
}

fn cell(decision: &Decision) -> String {
    let mut out = decision.outcome.as_str().to_string();
    if let Some(tear_down) = decision.tear_down {
        if tear_down.deregister_first {
            out.push_str("+dereg");
        }
        if tear_down.force {
            out.push('!');
        }
    }
    out
}

/// mode alloc verdict | young | grown | past-bound
const SURPLUS: &str = "
app      none  busy          | held | reaped         | reaped
app      none  idle          | held | reaped         | reaped
app      none  idle-once     | held | reaped         | reaped
app      none  absent        | held | reaped         | reaped
app      none  absent-once   | held | reaped         | reaped
app      none  unknown-short | held | reaped         | reaped
app      none  unknown-long  | held | reaped         | reaped
app      none  not-asked     | held | reaped         | reaped
app      live  busy          | held | vetoed         | escaped+dereg!
app      live  idle          | held | reaped+dereg   | reaped+dereg
app      live  idle-once     | held | held           | held
app      live  absent        | held | reaped         | reaped
app      live  absent-once   | held | held           | held
app      live  unknown-short | held | held           | escaped!
app      live  unknown-long  | held | escaped!       | escaped!
app      live  not-asked     | held | held           | held
vault    none  busy          | held | reaped         | reaped
vault    none  idle          | held | reaped         | reaped
vault    none  idle-once     | held | reaped         | reaped
vault    none  absent        | held | reaped         | reaped
vault    none  absent-once   | held | reaped         | reaped
vault    none  unknown-short | held | reaped         | reaped
vault    none  unknown-long  | held | reaped         | reaped
vault    none  not-asked     | held | reaped         | reaped
vault    live  busy          | held | kept           | kept
vault    live  idle          | held | kept           | kept
vault    live  idle-once     | held | kept           | kept
vault    live  absent        | held | kept           | kept
vault    live  absent-once   | held | kept           | kept
vault    live  unknown-short | held | kept           | kept
vault    live  unknown-long  | held | kept           | kept
vault    live  not-asked     | held | kept           | kept
forgejo  none  busy          | held | reaped         | reaped
forgejo  none  idle          | held | reaped         | reaped
forgejo  none  idle-once     | held | reaped         | reaped
forgejo  none  absent        | held | reaped         | reaped
forgejo  none  absent-once   | held | reaped         | reaped
forgejo  none  unknown-short | held | reaped         | reaped
forgejo  none  unknown-long  | held | reaped         | reaped
forgejo  none  not-asked     | held | reaped         | reaped
forgejo  live  busy          | held | kept           | kept
forgejo  live  idle          | held | kept           | kept
forgejo  live  idle-once     | held | kept           | kept
forgejo  live  absent        | held | kept           | kept
forgejo  live  absent-once   | held | kept           | kept
forgejo  live  unknown-short | held | kept           | kept
forgejo  live  unknown-long  | held | kept           | kept
forgejo  live  not-asked     | held | kept           | kept
";

/// nomination mode alloc verdict age | outcome: where the other nominations differ.
const OTHER_NOMINATIONS: &str = "
placement_timeout app     none busy         young      | replaced
placement_timeout vault   none not-asked    grown      | replaced
placement_timeout forgejo none not-asked    past-bound | replaced
placement_timeout app     live idle         grown      | vetoed
placement_timeout vault   live not-asked    grown      | vetoed
unregistered      app     live idle         grown      | kept
deregistered      app     live not-asked    young      | reaped
deregistered      app     live not-asked    grown      | reaped
deregistered      app     live absent-once  grown      | reaped
deregistered      app     live unknown-short grown     | reaped
deregistered      app     live busy         young      | vetoed
deregistered      app     live busy         grown      | vetoed
deregistered      app     live idle         grown      | held
deregistered      app     none not-asked    grown      | reaped
unregistered      app     live absent       grown      | reaped
unregistered      app     live absent-once  grown      | held
unregistered      app     live busy         grown      | vetoed
unregistered      app     live unknown-long grown      | held
unregistered      app     live unknown-long young      | held
wedged            app     live busy         grown      | escaped+dereg!
wedged            app     live unknown-short grown     | escaped!
wedged            app     live idle         grown      | reaped+dereg
wedged            app     live idle-once    grown      | held
wedged            vault   live not-asked    past-bound | kept
wedged            forgejo none not-asked    past-bound | reaped
";

fn input(nomination: &str, mode: &str, alloc: &str, verdict_name: &str, band: &str) -> ReapInput {
    ReapInput {
        nomination: match nomination {
            "surplus" => Nomination::Surplus,
            "placement_timeout" => Nomination::PlacementTimeout,
            "unregistered" => Nomination::Unregistered,
            "deregistered" => Nomination::Deregistered,
            "wedged" => Nomination::Wedged,
            other => panic!("unknown nomination {other}"),
        },
        api: match mode {
            "app" => RunnerApi::Registrations,
            "vault" | "forgejo" => RunnerApi::None,
            other => panic!("unknown mode {other}"),
        },
        allocation: match alloc {
            "none" => Allocation::None,
            "live" => Allocation::Live,
            other => panic!("unknown allocation {other}"),
        },
        verdict: verdict(verdict_name),
        age: age(band),
        running_for: age(band),
        policy: POLICY,
    }
}

#[test]
fn every_cell_of_the_surplus_table_decides_as_written() {
    let mut cells = 0;
    for line in SURPLUS.lines().filter(|l| !l.trim().is_empty()) {
        let (key, expected) = line.split_once('|').expect("a row has cells");
        let key: Vec<&str> = key.split_whitespace().collect();
        let expected: Vec<&str> = expected.split('|').map(str::trim).collect();
        for (band, want) in ["young", "grown", "past-bound"].iter().zip(&expected) {
            let got = cell(&decide(&input("surplus", key[0], key[1], key[2], band)));
            assert_eq!(
                &got, want,
                "surplus {} {} {} {band}",
                key[0], key[1], key[2]
            );
            cells += 1;
        }
    }
    // 3 modes × 2 allocations × 8 verdicts × 3 age bands.
    assert_eq!(cells, 144);
}

#[test]
fn the_other_nominations_decide_as_written() {
    for line in OTHER_NOMINATIONS.lines().filter(|l| !l.trim().is_empty()) {
        let (key, want) = line.split_once('|').expect("a row has a cell");
        let k: Vec<&str> = key.split_whitespace().collect();
        let got = cell(&decide(&input(k[0], k[1], k[2], k[3], k[4])));
        assert_eq!(got, want.trim(), "{}", key.trim());
    }
}

#[test]
fn no_decision_tears_down_a_busy_runner_before_the_hard_bound() {
    let nominations = [
        Nomination::Surplus,
        Nomination::Unregistered,
        Nomination::Deregistered,
        Nomination::PlacementTimeout,
    ];
    for nomination in nominations {
        for api in [RunnerApi::Registrations, RunnerApi::None] {
            for seconds in [0, 599, 600, 3600, POLICY.hard_bound.as_secs() - 1] {
                let decision = decide(&ReapInput {
                    nomination,
                    api,
                    allocation: Allocation::Live,
                    verdict: Verdict::Busy,
                    age: Duration::from_secs(seconds),
                    running_for: Duration::from_secs(seconds),
                    policy: POLICY,
                });
                assert!(
                    decision.tear_down.is_none(),
                    "{nomination:?} {api:?} at {seconds}s: {decision:?}"
                );
            }
        }
    }
}

#[test]
fn a_decision_tears_down_exactly_when_its_outcome_says_so() {
    let verdicts = [
        "busy",
        "idle",
        "idle-once",
        "absent",
        "absent-once",
        "unknown-short",
        "unknown-long",
        "not-asked",
    ];
    for nomination in [
        "surplus",
        "placement_timeout",
        "unregistered",
        "deregistered",
        "wedged",
    ] {
        for mode in ["app", "vault"] {
            for alloc in ["none", "live"] {
                for v in verdicts {
                    for band in ["young", "grown", "past-bound"] {
                        let d = decide(&input(nomination, mode, alloc, v, band));
                        assert_eq!(d.tear_down.is_some(), d.outcome.tears_down(), "{d:?}");
                        assert!(!d.reason.is_empty());
                    }
                }
            }
        }
    }
}
