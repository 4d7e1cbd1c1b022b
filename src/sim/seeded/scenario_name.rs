//! The scenarios by name: the [`Scenario`] enum `simulate --scenario` parses, the lists a
//! sweep and the benchmark run, and how each is spelled. Kept apart from [`super::scenarios`]
//! (what each scenario draws) so that the arrow points one way: [`super::options`], which
//! records the scenario a run was drawn from, imports this name; the scenarios import the
//! options; nothing imports back.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scenario {
    /// Work arrives at a moderate pace; rare faults.
    Steady,
    /// Many runs at once, then little.
    Burst,
    /// Many jobs with the same labels in one repo at once (the seed incident): runners are
    /// fungible, any of them may take any of the jobs.
    SameLabelRace,
    /// Mostly superset label sets, so a bucket's runner is often taken by another bucket's job,
    /// leaving its own job queued.
    SupersetLabels,
    /// Jobs cancelled while queued, runs re-run.
    Cancellations,
    /// A small cluster, full of foreign work for a window that may exceed an hour: children
    /// stay pending without an allocation.
    ClusterFull,
    /// Runners that crash at boot, often.
    CrashLoop,
    /// Whole outages of GitHub, Forgejo, Nomad or Vault, some longer than ten minutes.
    Outages,
    /// Rate limits: budgets exhausted until a reset minutes away.
    RateLimited,
    /// Runners taken back while work keeps arriving: jobs cancelled while their runner boots
    /// leave it idle, it is taken back, and the next job of its bucket arrives while it is
    /// still leaving.
    TakeBacks,
    /// Each seed picks one of the others and randomises within it.
    Mixed,
    /// 50 `app` repos of one installation and no job for three hours: what polling costs
    /// when nothing happens.
    Idle,
    /// 500 `app` repos of one installation at a 15 s poll, most idle, a few busy, with
    /// `workflow_job` webhooks delivered as hints for most jobs and lost for some.
    Fleet500,
}

impl Scenario {
    pub const NAMED: [Scenario; 9] = [
        Scenario::Steady,
        Scenario::Burst,
        Scenario::SameLabelRace,
        Scenario::SupersetLabels,
        Scenario::Cancellations,
        Scenario::ClusterFull,
        Scenario::CrashLoop,
        Scenario::Outages,
        Scenario::RateLimited,
    ];

    /// The scale scenarios: not drawn by `mixed` (they would change every mixed seed's world)
    /// and run by the benchmark beside the named ones.
    pub const SCALE: [Scenario; 2] = [Scenario::Idle, Scenario::Fleet500];

    /// Scenarios that press on one hazard harder than `mixed` does, run by a sweep and the
    /// mutant hunt beside the named ones. Not drawn by `mixed` (yet): a new draw there would
    /// change the world of every mixed seed recorded so far.
    pub const HAZARDS: [Scenario; 1] = [Scenario::TakeBacks];

    pub fn as_str(self) -> &'static str {
        match self {
            Scenario::Steady => "steady",
            Scenario::Burst => "burst",
            Scenario::SameLabelRace => "same-label-race",
            Scenario::SupersetLabels => "superset-labels",
            Scenario::Cancellations => "cancellations",
            Scenario::ClusterFull => "cluster-full",
            Scenario::CrashLoop => "crash-loop",
            Scenario::Outages => "outages",
            Scenario::RateLimited => "rate-limited",
            Scenario::TakeBacks => "take-backs",
            Scenario::Mixed => "mixed",
            Scenario::Idle => "idle",
            Scenario::Fleet500 => "fleet-500",
        }
    }

    pub fn parse(name: &str) -> Option<Scenario> {
        Scenario::NAMED
            .into_iter()
            .chain([Scenario::Mixed])
            .chain(Scenario::SCALE)
            .chain(Scenario::HAZARDS)
            .find(|s| s.as_str() == name)
    }

    /// Every name `parse` accepts, for error messages.
    pub fn known_names() -> Vec<&'static str> {
        Scenario::NAMED
            .iter()
            .chain([Scenario::Mixed].iter())
            .chain(Scenario::SCALE.iter())
            .chain(Scenario::HAZARDS.iter())
            .map(|s| s.as_str())
            .collect()
    }
}

impl serde::Serialize for Scenario {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_names_round_trip() {
        for scenario in Scenario::NAMED
            .into_iter()
            .chain([Scenario::Mixed])
            .chain(Scenario::HAZARDS)
        {
            assert_eq!(Scenario::parse(scenario.as_str()), Some(scenario));
        }
        assert_eq!(Scenario::parse("demo"), None);
    }
}
