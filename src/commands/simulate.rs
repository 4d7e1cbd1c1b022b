//! `simulate`: the embedded worlds. `--scenario NAME --seeds N` sweeps the seeded world,
//! `--seed S` replays one seed, `--bench` compares strategies on the same seeds,
//! `--bench-process` measures the daemon as its own process, and the `demo` scenario runs the
//! real daemon against HTTP twins of every service. Only here does the product reach into
//! [`crate::sim`], and only with the `sim` feature.

use std::process::ExitCode;

use super::runtime;
use crate::cli::{EXIT_BAD_SETTINGS, EXIT_INVALID, SimulateArgs};

/// `simulate`: the seeded world (`--scenario NAME --seeds N` sweeps, `--seed S` replays one)
/// or, for the `demo` scenario, the HTTP demo world. The seeded world runs on its own
/// current-thread runtimes, so it is driven from plain threads, outside any runtime.
pub fn simulate(args: SimulateArgs) -> ExitCode {
    use crate::sim::seeded::Scenario;
    if args.bench_process {
        return simulate_process_bench(args);
    }
    if args.bench {
        return simulate_bench(&args);
    }
    if args.mutants {
        return simulate_mutants(&args);
    }
    if args.scenario == "demo" {
        if args.seeds.is_some() {
            eprintln!(
                "runner-scaler simulate: the demo world runs one seed; --seeds needs a --scenario ({})",
                Scenario::known_names().join(", ")
            );
            return ExitCode::from(EXIT_BAD_SETTINGS as u8);
        }
        return runtime().block_on(simulate_demo(args));
    }
    let Some(scenario) = Scenario::parse(&args.scenario) else {
        eprintln!(
            "runner-scaler simulate: unknown scenario {:?}; known: demo, {}",
            args.scenario,
            Scenario::known_names().join(", ")
        );
        return ExitCode::from(EXIT_BAD_SETTINGS as u8);
    };
    let Some(strategy) = crate::sim::seeded::Strategy::parse(&args.strategy) else {
        eprintln!(
            "runner-scaler simulate: unknown strategy {:?}; known: {}",
            args.strategy,
            crate::sim::seeded::Strategy::ALL
                .map(|s| s.as_str())
                .join(", ")
        );
        return ExitCode::from(EXIT_BAD_SETTINGS as u8);
    };
    let settings = crate::sim::seeded::RunSettings {
        strategy,
        keep_trace: args.seed.is_some() && !args.json,
        ..Default::default()
    };
    match (args.seeds, args.seed) {
        (Some(n), _) => simulate_sweep(scenario, n, args.json, settings),
        (None, Some(seed)) => simulate_replay(scenario, seed, args.json, settings),
        (None, None) => {
            eprintln!(
                "runner-scaler simulate: --scenario {scenario} needs --seeds N (a sweep of seeds 1..=N) or --seed S (a replay)"
            );
            ExitCode::from(EXIT_BAD_SETTINGS as u8)
        }
    }
}

fn simulate_sweep(
    scenario: crate::sim::seeded::Scenario,
    seeds: u64,
    json: bool,
    settings: crate::sim::seeded::RunSettings,
) -> ExitCode {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    if !json {
        println!("sweeping scenario {scenario}: seeds 1..={seeds} on {threads} threads");
    }
    let report = crate::sim::seeded::sweep_with(scenario, 1..=seeds, threads, settings);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("a sweep report serialises")
        );
    } else {
        print!("{}", report.render_text());
    }
    if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_INVALID as u8)
    }
}

/// Seeds each mutant is hunted through when `--seeds` is not given.
const MUTANT_SEEDS_DEFAULT: u64 = 300;

fn simulate_mutants(args: &SimulateArgs) -> ExitCode {
    use crate::sim::seeded::mutants::{Mutant, hunt, render};
    let seeds = args.seeds.unwrap_or(MUTANT_SEEDS_DEFAULT);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    if !args.json {
        println!(
            "hunting {} mutants through up to {seeds} seeds each, on {threads} threads",
            Mutant::ALL.len()
        );
    }
    let hunts: Vec<_> = Mutant::ALL
        .into_iter()
        .map(|mutant| hunt(mutant, seeds, threads))
        .collect();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&hunts).expect("hunts serialise")
        );
    } else {
        print!("{}", render(&hunts));
    }
    if hunts.iter().all(|h| h.caught.is_some()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_INVALID as u8)
    }
}

/// Seeds each (strategy, scenario) of the benchmark runs when `--seeds` is not given.
const BENCH_SEEDS_DEFAULT: u64 = 100;

fn simulate_bench(args: &SimulateArgs) -> ExitCode {
    use crate::sim::seeded::{Scenario, bench};
    if args.seed.is_some() {
        eprintln!("runner-scaler simulate: --bench runs seeds 1..=N (--seeds N), not one --seed");
        return ExitCode::from(EXIT_BAD_SETTINGS as u8);
    }
    // `idle` and the hazards (`take-backs`, where kills inside the delete window are
    // measured) run with the named scenarios; `fleet-500` (500 repos, minutes of wall time
    // per seed) only when asked for by name.
    let scenarios = if args.scenario == "demo" {
        Scenario::NAMED
            .into_iter()
            .chain([Scenario::Idle])
            .chain(Scenario::HAZARDS)
            .collect()
    } else {
        match Scenario::parse(&args.scenario) {
            Some(scenario) => vec![scenario],
            None => {
                eprintln!(
                    "runner-scaler simulate: unknown scenario {:?}; known: {}",
                    args.scenario,
                    Scenario::known_names().join(", ")
                );
                return ExitCode::from(EXIT_BAD_SETTINGS as u8);
            }
        }
    };
    let seeds = args.seeds.unwrap_or(BENCH_SEEDS_DEFAULT);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    if !args.json {
        println!(
            "benchmark: strategies {} over seeds 1..={seeds} of {} scenario(s), on {threads} threads",
            bench::Strategy::ALL.map(|s| s.as_str()).join(", "),
            scenarios.len()
        );
    }
    let started = std::time::Instant::now();
    let rows = bench::run(&scenarios, seeds, threads);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("benchmark rows serialise")
        );
    } else {
        print!("{}", bench::render_text(&rows));
        println!("wall time {:.1} s", started.elapsed().as_secs_f64());
    }
    ExitCode::SUCCESS
}

fn simulate_replay(
    scenario: crate::sim::seeded::Scenario,
    seed: u64,
    json: bool,
    settings: crate::sim::seeded::RunSettings,
) -> ExitCode {
    if !json {
        println!("replaying scenario {scenario}, seed {seed}");
    }
    let outcome = crate::sim::seeded::run_seed_with(scenario, seed, settings);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&outcome).expect("a seed outcome serialises")
        );
    } else {
        print!("{}", crate::sim::seeded::render_replay(&outcome));
    }
    if outcome.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_INVALID as u8)
    }
}

async fn simulate_demo(args: SimulateArgs) -> ExitCode {
    let options = crate::sim::world::WorldOptions {
        seed: args.seed.unwrap_or(1),
        ..Default::default()
    };
    println!(
        "simulating seed {}: twins of GitHub, Forgejo, Nomad, Consul and Vault on loopback; the real daemon against them",
        options.seed
    );
    match crate::sim::world::run_world(options).await {
        Ok(summary) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&summary).expect("a summary serialises")
                );
            } else {
                print!("{}", summary.render_text());
            }
            if summary.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_INVALID as u8)
            }
        }
        Err(e) => {
            eprintln!("simulate: {e}");
            ExitCode::from(EXIT_INVALID as u8)
        }
    }
}

/// `simulate --bench-process`: this binary's `run` as a child process against the twins of
/// the `demo` world or the `fleet-500` one, for `--window` of real time; reports its CPU
/// time, peak RSS and tick wall times.
#[cfg(unix)]
fn simulate_process_bench(args: SimulateArgs) -> ExitCode {
    use crate::sim::process_bench::{ProcessBenchOptions, ProcessScenario, run_process_bench};
    let Some(scenario) = ProcessScenario::parse(&args.scenario) else {
        eprintln!(
            "runner-scaler simulate: --bench-process runs the worlds {}; --scenario {} is not supported with it",
            ProcessScenario::ALL.map(ProcessScenario::as_str).join(", "),
            args.scenario
        );
        return ExitCode::from(EXIT_BAD_SETTINGS as u8);
    };
    let options = ProcessBenchOptions {
        scenario,
        window: args.window.unwrap_or(scenario.default_window()),
        seed: args.seed.unwrap_or(1),
        github_latency: args.github_latency.unwrap_or_default(),
    };
    if options.window.is_zero() {
        eprintln!("runner-scaler simulate: --window must be longer than zero");
        return ExitCode::from(EXIT_BAD_SETTINGS as u8);
    }
    let daemon_exe = match std::env::current_exe() {
        Ok(path) => path,
        Err(e) => {
            eprintln!("simulate: find this program's own path to run the daemon: {e}");
            return ExitCode::from(EXIT_INVALID as u8);
        }
    };
    if !args.json {
        println!(
            "running `runner-scaler run` as its own process against twins on loopback ({} world) for {}, polling every {}",
            scenario.as_str(),
            humantime::format_duration(options.window),
            humantime::format_duration(scenario.poll_interval(options.window))
        );
    }
    match runtime().block_on(run_process_bench(&daemon_exe, &options)) {
        Ok(report) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("a bench report serialises")
                );
            } else {
                print!("{}", report.render_text());
            }
            if report.ok() {
                ExitCode::SUCCESS
            } else {
                if args.json {
                    for problem in report.problems() {
                        eprintln!("simulate --bench-process: {problem}");
                    }
                    for line in &report.daemon_log_tail {
                        eprintln!("  daemon: {line}");
                    }
                }
                ExitCode::from(EXIT_INVALID as u8)
            }
        }
        Err(e) => {
            eprintln!("simulate --bench-process: {e}");
            ExitCode::from(EXIT_INVALID as u8)
        }
    }
}

#[cfg(not(unix))]
fn simulate_process_bench(_args: SimulateArgs) -> ExitCode {
    eprintln!(
        "runner-scaler simulate: --bench-process reads the daemon's usage with wait4, which needs a Unix system"
    );
    ExitCode::from(EXIT_BAD_SETTINGS as u8)
}
