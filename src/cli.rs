//! The command line: process settings from flags and the standard HashiCorp environment.
//!
//! Every non-secret setting is a flag named after its variable (`NOMAD_ADDR` ↔
//! `--nomad-addr`). Secrets never are: they are read from the environment, or from the file a
//! `*_FILE` variable names, by [`crate::secrets::read_secret`], so they cannot show in `--help`, in `ps` or in
//! shell history.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use url::Url;

/// Exit code for a missing or malformed process setting (sysexits' EX_USAGE).
pub const EXIT_BAD_SETTINGS: i32 = 64;
/// Exit code for invalid input or a failed check.
pub const EXIT_INVALID: i32 = 1;

const SECRETS_HELP: &str = "\
Secrets are read only from the environment, never from flags:
  NOMAD_TOKEN, CONSUL_HTTP_TOKEN, VAULT_TOKEN, and the GitHub App private key
  (GITHUB_APP_PRIVATE_KEY_FILE, or GITHUB_APP_VAULT_PATH for a key kept in Vault).
  NOMAD_TOKEN_FILE, CONSUL_HTTP_TOKEN_FILE and VAULT_TOKEN_FILE name files to read instead.
  With --webhook-listen: GITHUB_WEBHOOK_SECRET (or a webhook_secret field at
  GITHUB_APP_VAULT_PATH) and FORGEJO_WEBHOOK_SECRET, or their *_FILE variants.
  RUNNER_SCALER_LISTEN_TOKEN(_FILE): the bearer token /status and /metrics require
  (needed when --listen is not loopback), which `status` presents too.";

#[derive(Debug, Parser)]
#[command(
    name = "runner-scaler",
    version,
    about = "Autoscales ephemeral self-hosted CI runners on Nomad for GitHub Actions and Forgejo Actions",
    after_help = SECRETS_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// How log lines are written to stderr: `text` for people, `json` (one object per line)
    /// for a log shipper.
    #[arg(
        long,
        global = true,
        env = "RUNNER_SCALER_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: a tick at start, then one every --poll-interval.
    #[command(after_help = SECRETS_HELP)]
    Run {
        #[command(flatten)]
        daemon: Box<DaemonArgs>,
        /// Shadow mode: the whole loop runs and logs and exports its plans, but nothing is
        /// written (no mint, dispatch, stop, purge or registration deleted).
        #[arg(long)]
        dry_run: bool,
    },
    /// Run one tick and exit.
    #[command(after_help = SECRETS_HELP)]
    Once {
        #[command(flatten)]
        daemon: Box<DaemonArgs>,
        /// Print the plan and act on nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print the tick as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show, per bucket, what is queued and in flight and why nothing was dispatched.
    #[command(after_help = SECRETS_HELP)]
    Status {
        #[command(flatten)]
        daemon: Box<DaemonArgs>,
        #[arg(long)]
        json: bool,
        /// Where the running daemon serves `/status` (its `--listen` address). When no daemon
        /// answers there, a fresh dry-run tick is shown instead, and it says so.
        #[arg(
            long,
            env = "RUNNER_SCALER_STATUS_ADDR",
            default_value = "http://127.0.0.1:9464"
        )]
        addr: Url,
    },
    /// Work with the Consul document.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Run the real daemon against twins of every service in a small simulated world.
    Simulate(SimulateArgs),
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a document (a file, or `-` for stdin) before it is written to Consul.
    #[command(after_help = SECRETS_HELP)]
    Check {
        /// Path of the document, or `-` to read stdin.
        file: String,
        /// Also check it against the live services, with the settings `run` uses: each
        /// parent job's meta, the App's installation on each `app` repo, each `vaultPath`
        /// readable and each `registerVaultPath` not, each Forgejo instance's version.
        #[arg(long)]
        live: bool,
        #[command(flatten)]
        daemon: Box<DaemonArgs>,
    },
}

#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// The scenario to run.
    #[arg(long, default_value = "demo")]
    pub scenario: String,
    /// Run this many seeds.
    #[arg(long, conflicts_with = "seed")]
    pub seeds: Option<u64>,
    /// Replay one seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Compare strategies and print the benchmark table.
    #[arg(long)]
    pub bench: bool,
    /// Hunt every deliberately broken daemon through the seeds of its scenario (--seeds N,
    /// default 300) and print, per mutant, the invariant and the first seed that caught it.
    #[arg(long, conflicts_with_all = ["bench", "seed", "bench_process"])]
    pub mutants: bool,
    /// Who runs the runners in a sweep or a replay: `ours`, or a baseline of the benchmark
    /// (`seed`, `ephemerd-pre-veto`), whose invariant violations are reported, not failed.
    #[arg(long, default_value = "ours")]
    pub strategy: String,
    /// Measure the daemon's own CPU time, peak RSS and tick wall times: run `runner-scaler
    /// run` as its own process against the twins of the `demo` world (--scenario demo) or of
    /// 500 repos on one GitHub App installation (--scenario fleet-500) for --window of real
    /// time.
    #[arg(long, conflicts_with_all = ["bench", "seeds"])]
    pub bench_process: bool,
    /// How long --bench-process lets the daemon run (default 60s; 5m for fleet-500).
    #[arg(long, requires = "bench_process", value_parser = humantime::parse_duration)]
    pub window: Option<Duration>,
    /// Round-trip time --bench-process's GitHub twin adds to each answer (default 0s: at
    /// loopback speed), to see ticks as far from GitHub as a real host is.
    #[arg(long, requires = "bench_process", value_parser = humantime::parse_duration)]
    pub github_latency: Option<Duration>,
    #[arg(long)]
    pub json: bool,
}

/// Settings of the daemon, `once` and `status`.
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Settings")]
pub struct DaemonArgs {
    /// `http(s)://host:4646`, or `unix:///path/api.sock`: the task API socket Nomad 1.5 or
    /// later gives a task (`unix://${NOMAD_SECRETS_DIR}/api.sock`), used with the workload
    /// identity's token as NOMAD_TOKEN.
    #[arg(
        long,
        env = "NOMAD_ADDR",
        default_value = "http://127.0.0.1:4646",
        hide_env_values = true
    )]
    pub nomad_addr: Url,
    /// The Nomad namespace of the runner parent jobs of every repo whose document entry sets
    /// no `nomadNamespace`; dispatches go there. Not NOMAD_NAMESPACE: Nomad sets that in
    /// every task to the task's own namespace (the daemon's), not its runners'. Children
    /// are listed in every namespace the token may read, whatever this says.
    #[arg(
        long,
        env = "RUNNER_SCALER_RUNNER_NAMESPACE",
        default_value = "ci-runners",
        hide_env_values = true
    )]
    pub runner_namespace: String,
    #[arg(long, env = "NOMAD_REGION", hide_env_values = true)]
    pub nomad_region: Option<String>,
    #[arg(long, env = "NOMAD_CACERT", hide_env_values = true)]
    pub nomad_cacert: Option<PathBuf>,
    #[arg(long, env = "NOMAD_CLIENT_CERT", hide_env_values = true)]
    pub nomad_client_cert: Option<PathBuf>,
    #[arg(long, env = "NOMAD_CLIENT_KEY", hide_env_values = true)]
    pub nomad_client_key: Option<PathBuf>,

    #[arg(
        long,
        env = "CONSUL_HTTP_ADDR",
        default_value = "http://127.0.0.1:8500",
        hide_env_values = true
    )]
    pub consul_http_addr: String,
    #[arg(long, env = "CONSUL_CACERT", hide_env_values = true)]
    pub consul_cacert: Option<PathBuf>,
    #[arg(long, env = "CONSUL_CLIENT_CERT", hide_env_values = true)]
    pub consul_client_cert: Option<PathBuf>,
    #[arg(long, env = "CONSUL_CLIENT_KEY", hide_env_values = true)]
    pub consul_client_key: Option<PathBuf>,
    /// The Consul KV key of the document.
    #[arg(
        long,
        alias = "config-key",
        env = "RUNNER_SCALER_CONFIG_KEY",
        default_value = "runners/config",
        hide_env_values = true
    )]
    pub runner_scaler_config_key: String,
    /// A Consul key that pauses every dispatch while it holds a value other than `false`.
    #[arg(
        long,
        env = "RUNNER_SCALER_PAUSE_KEY",
        default_value = "runners/paused",
        hide_env_values = true
    )]
    pub pause_key: String,

    #[arg(
        long,
        env = "VAULT_ADDR",
        default_value = "http://127.0.0.1:8200",
        hide_env_values = true
    )]
    pub vault_addr: Url,
    #[arg(long, env = "VAULT_CACERT", hide_env_values = true)]
    pub vault_cacert: Option<PathBuf>,
    #[arg(long, env = "VAULT_NAMESPACE", hide_env_values = true)]
    pub vault_namespace: Option<String>,
    /// Mount of the KV v2 secrets engine the daemon reads.
    #[arg(
        long,
        env = "VAULT_MOUNT",
        default_value = "secret",
        hide_env_values = true
    )]
    pub vault_mount: String,
    /// CA bundle (PEM) trusted for every Forgejo instance the document names, beside the
    /// system roots.
    #[arg(long, env = "FORGEJO_CACERT", hide_env_values = true)]
    pub forgejo_cacert: Option<PathBuf>,

    /// GitHub's REST API: api.github.com, `https://<host>/api/v3` (GHES) or
    /// `https://api.<tenant>.ghe.com` (GHE.com).
    #[arg(
        long,
        env = "GITHUB_API_URL",
        default_value = "https://api.github.com",
        hide_env_values = true
    )]
    pub github_api_url: Url,
    /// The GitHub App's id or client id (the JWT issuer).
    #[arg(long, env = "GITHUB_APP_ID", hide_env_values = true)]
    pub github_app_id: Option<String>,
    /// File holding the App's PEM private key.
    #[arg(long, env = "GITHUB_APP_PRIVATE_KEY_FILE", hide_env_values = true)]
    pub github_app_private_key_file: Option<PathBuf>,
    /// Installation used when the per-owner lookup finds none.
    #[arg(long, env = "GITHUB_APP_INSTALLATION_ID", hide_env_values = true)]
    pub github_app_installation_id: Option<u64>,
    /// Vault KV v2 path holding `app_id`, `private_key` and optional `installation_id`.
    #[arg(long, env = "GITHUB_APP_VAULT_PATH", hide_env_values = true)]
    pub github_app_vault_path: Option<String>,

    /// Parent job for `app` repos' jobs that match no profile.
    #[arg(
        long,
        env = "RUNNER_SCALER_DEFAULT_JOB",
        default_value = "ci-runner",
        hide_env_values = true
    )]
    pub default_job: String,
    /// Cap of a repo that sets none and has no profiles.
    #[arg(
        long,
        env = "RUNNER_SCALER_DEFAULT_REPO_MAX",
        default_value_t = 2,
        hide_env_values = true
    )]
    pub default_repo_max: u32,
    /// Caps all in-flight runners, across repos.
    #[arg(long, env = "RUNNER_SCALER_MAX_IN_FLIGHT", hide_env_values = true)]
    pub max_in_flight: Option<u32>,
    /// Time between ticks, and between reads of a repo with work (a job queued or running,
    /// a runner in flight, or a webhook hint in the last five minutes).
    #[arg(long, env = "RUNNER_SCALER_POLL_INTERVAL", default_value = "15s", value_parser = humantime::parse_duration, hide_env_values = true)]
    pub poll_interval: Duration,
    /// Time between reads of an idle repo's queue [default: 60s; 5m when webhooks are
    /// received, since a lost webhook then costs at most that].
    #[arg(long, env = "RUNNER_SCALER_IDLE_POLL_INTERVAL", value_parser = humantime::parse_duration, hide_env_values = true)]
    pub idle_poll_interval: Option<Duration>,
    /// Queues and parent listings read at once.
    #[arg(long, env = "RUNNER_SCALER_MAX_CONCURRENT_POLLS", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..), hide_env_values = true)]
    pub max_concurrent_polls: u16,
    /// Timeout of one HTTP request to any service.
    #[arg(long, env = "RUNNER_SCALER_REQUEST_TIMEOUT", default_value = "15s", value_parser = humantime::parse_duration, hide_env_values = true)]
    pub request_timeout: Duration,
    /// A surplus runner younger than this is left alone; a runner whose state cannot be read
    /// is held this long before it is torn down anyway.
    #[arg(long, env = "RUNNER_SCALER_ORPHAN_GRACE", default_value = "10m", value_parser = humantime::parse_duration, hide_env_values = true)]
    pub orphan_grace: Duration,
    /// An idle reading of a runner counts only when it held on two readings this far apart.
    #[arg(long, env = "RUNNER_SCALER_IDLE_CONFIRM", default_value = "2m", value_parser = humantime::parse_duration, hide_env_values = true)]
    pub idle_confirm: Duration,
    /// How long after a runner took a job GitHub's job listings may still not show it: a
    /// runner whose registration the daemon deleted is stopped only on a queue reading taken
    /// this long after the delete that names it in no job.
    #[arg(long, env = "RUNNER_SCALER_JOB_LISTING_LAG", default_value = "30s", value_parser = humantime::parse_duration, hide_env_values = true)]
    pub job_listing_lag: Duration,
    /// A runner still busy this long after its child was placed is wedged and torn down
    /// (GitHub's limit for a self-hosted job is 5 days). A lower bound kills any job whose
    /// timeout-minutes is larger; a profile may set its own with hardBoundMinutes.
    #[arg(long, env = "RUNNER_SCALER_HARD_BOUND", default_value = "5d30m", value_parser = humantime::parse_duration, hide_env_values = true)]
    pub hard_bound: Duration,
    /// A runner the cluster has not placed after this long is stopped and replaced, before
    /// its one-hour registration token expires.
    #[arg(long, env = "RUNNER_SCALER_PLACEMENT_TIMEOUT", default_value = "50m", value_parser = humantime::parse_duration, hide_env_values = true)]
    pub placement_timeout: Duration,
    /// Stop unplaced surplus children of `vault` mode repos and purge their dead ones. Only
    /// where Nomad (>= 1.11.2) grants that without `submit-job`: the runner namespaces of
    /// vault mode need `purge-job` (Terraform's nomad_vault_children_cleanup). Off, they are
    /// left to Nomad's garbage collection and to their runners' idle timeout.
    #[arg(
        long,
        env = "RUNNER_SCALER_VAULT_CHILDREN_CLEANUP",
        hide_env_values = true
    )]
    pub vault_children_cleanup: bool,
    /// Where `run` serves /metrics, /livez and /healthz: an IP address and port, or `off`.
    #[arg(
        long,
        env = "RUNNER_SCALER_LISTEN",
        default_value = "127.0.0.1:9464",
        hide_env_values = true
    )]
    pub listen: String,
    /// Where `run` receives webhooks (`POST /webhook/github`, `POST /webhook/forgejo`), as
    /// hints to re-poll a repo at once: an IP address and port, or `off`. Apart from
    /// --listen, so that only the webhook port need be reachable from the forges.
    #[arg(
        long,
        env = "RUNNER_SCALER_WEBHOOK_LISTEN",
        default_value = "off",
        hide_env_values = true
    )]
    pub webhook_listen: String,
    /// /healthz fails when a bucket whose cap has room has had a job queued this long.
    #[arg(long, env = "RUNNER_SCALER_STUCK_AFTER", default_value = "15m", value_parser = humantime::parse_duration, hide_env_values = true)]
    pub stuck_after: Duration,
    /// TTL of the leader lock's Consul session (at least 1s here; Consul refuses less than
    /// its session_ttl_min, 10s by default). A standby takes over within
    /// 2 × TTL + TTL/3 (the lock delay) + 1s.
    #[arg(long, env = "RUNNER_SCALER_LOCK_TTL", default_value = "15s", value_parser = humantime::parse_duration, hide_env_values = true)]
    pub lock_ttl: Duration,
    /// The Consul KV key of the leader lock.
    #[arg(
        long,
        env = "RUNNER_SCALER_LEADER_KEY",
        default_value = "runners/leader",
        hide_env_values = true
    )]
    pub leader_key: String,
    /// The Consul KV key the lock holder keeps its state in (crash-loop backoff, deleted
    /// registrations), so that a restart or a new leader carries it on.
    #[arg(
        long,
        env = "RUNNER_SCALER_STATE_KEY",
        default_value = "runners/state",
        hide_env_values = true
    )]
    pub state_key: String,
}

/// The bearer token `/status` and `/metrics` on `--listen` require, and `status` presents
/// (or `RUNNER_SCALER_LISTEN_TOKEN_FILE`): required when `--listen` is not loopback.
pub const LISTEN_TOKEN_VAR: &str = "RUNNER_SCALER_LISTEN_TOKEN";

impl DaemonArgs {
    /// `--listen` as an address, `None` for `off`.
    pub fn listen_addr(&self) -> Result<Option<std::net::SocketAddr>, String> {
        let value = self.listen.trim();
        if value == "off" {
            return Ok(None);
        }
        value.parse().map(Some).map_err(|_| {
            format!(
                "--listen (RUNNER_SCALER_LISTEN) must be an IP address and a port, like \
                 127.0.0.1:9464 or [::]:9464, or `off`; got {value:?}"
            )
        })
    }

    /// `--webhook-listen` as an address, `None` for `off` (the default).
    pub fn webhook_listen_addr(&self) -> Result<Option<std::net::SocketAddr>, String> {
        let value = self.webhook_listen.trim();
        if value == "off" {
            return Ok(None);
        }
        value.parse().map(Some).map_err(|_| {
            format!(
                "--webhook-listen (RUNNER_SCALER_WEBHOOK_LISTEN) must be an IP address and a \
                 port, like 0.0.0.0:9465, or `off`; got {value:?}"
            )
        })
    }

    /// Refuses settings no daemon can run with, naming each (exit 64 before anything starts).
    pub fn validate(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        if self.poll_interval.is_zero() {
            problems.push(
                "--poll-interval (RUNNER_SCALER_POLL_INTERVAL) must be longer than 0s".to_string(),
            );
        }
        if self.request_timeout.is_zero() {
            problems.push(
                "--request-timeout (RUNNER_SCALER_REQUEST_TIMEOUT) must be longer than 0s: every \
                 request would time out at once"
                    .to_string(),
            );
        }
        // 0 would hold back every dispatch of every repo while looking like a cap.
        if self.max_in_flight == Some(0) {
            problems.push(
                "--max-in-flight (RUNNER_SCALER_MAX_IN_FLIGHT) must be at least 1; to pause a \
                 repo, set its maxConcurrent to 0 in the document, or leave this unset for no cap"
                    .to_string(),
            );
        }
        if self.runner_scaler_config_key.trim().is_empty() {
            problems.push(
                "--runner-scaler-config-key (RUNNER_SCALER_CONFIG_KEY) must name a Consul key"
                    .to_string(),
            );
        }
        if let Some(problem) = crate::config::parse::namespace_name_problem(&self.runner_namespace)
        {
            problems.push(format!(
                "--runner-namespace (RUNNER_SCALER_RUNNER_NAMESPACE) {:?} is not a Nomad \
                 namespace: it {problem}",
                self.runner_namespace
            ));
        }
        if self.pause_key.trim().is_empty() {
            problems
                .push("--pause-key (RUNNER_SCALER_PAUSE_KEY) must name a Consul key".to_string());
        }
        if self.lock_ttl < crate::leader::LOCK_TTL_MIN {
            problems.push(
                "--lock-ttl (RUNNER_SCALER_LOCK_TTL) must be at least 1s (Consul's own minimum, \
                 session_ttl_min, is 10s unless lowered)"
                    .to_string(),
            );
        }
        if self.leader_key.trim().is_empty() || self.leader_key == self.runner_scaler_config_key {
            problems.push(
                "--leader-key (RUNNER_SCALER_LEADER_KEY) must name a Consul key other than the \
                 document's"
                    .to_string(),
            );
        }
        if self.state_key.trim().is_empty()
            || [
                &self.runner_scaler_config_key,
                &self.leader_key,
                &self.pause_key,
            ]
            .contains(&&self.state_key)
        {
            problems.push(
                "--state-key (RUNNER_SCALER_STATE_KEY) must name a Consul key other than the \
                 document's, the leader lock's and the pause key"
                    .to_string(),
            );
        }
        if self.default_job.trim().is_empty() {
            problems.push(
                "--default-job (RUNNER_SCALER_DEFAULT_JOB) must name a Nomad job".to_string(),
            );
        }
        if let Err(problem) = self.listen_addr() {
            problems.push(problem);
        }
        if let Err(problem) = self.webhook_listen_addr() {
            problems.push(problem);
        }
        if self.stuck_after.is_zero() {
            problems.push(
                "--stuck-after (RUNNER_SCALER_STUCK_AFTER) must be longer than 0s: every queued \
                 job would count as stuck"
                    .to_string(),
            );
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn a_lock_ttl_below_one_second_is_a_bad_setting() {
        let parse = |ttl: &str| {
            let cli = Cli::try_parse_from(["runner-scaler", "run", "--lock-ttl", ttl]).unwrap();
            let Command::Run { daemon: args, .. } = cli.command else {
                unreachable!()
            };
            args.validate()
        };
        let refused = parse("500ms").unwrap_err();
        assert!(
            refused.contains("--lock-ttl (RUNNER_SCALER_LOCK_TTL)"),
            "{refused}"
        );
        assert!(parse("1s").is_ok());
        assert!(parse("15s").is_ok());
    }

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_flag_accepts_a_secret() {
        let cmd = Cli::command();
        let mut names = Vec::new();
        for sub in cmd.get_subcommands() {
            for arg in sub.get_arguments() {
                if let Some(long) = arg.get_long() {
                    names.push(long.to_string());
                }
            }
        }
        assert!(names.iter().any(|n| n == "nomad-addr"));
        for name in names {
            assert!(
                !name.contains("token") && !name.ends_with("private-key"),
                "--{name} would take a secret"
            );
        }
    }

    #[test]
    fn the_process_bench_window_is_humantime_and_needs_the_process_bench() {
        let cli = Cli::try_parse_from([
            "runner-scaler",
            "simulate",
            "--bench-process",
            "--window",
            "90s",
        ])
        .unwrap();
        let Command::Simulate(args) = cli.command else {
            panic!("not simulate")
        };
        assert!(args.bench_process);
        assert_eq!(args.window, Some(Duration::from_secs(90)));
        assert!(Cli::try_parse_from(["runner-scaler", "simulate", "--window", "5s"]).is_err());
        assert!(
            Cli::try_parse_from(["runner-scaler", "simulate", "--bench-process", "--bench"])
                .is_err()
        );
    }

    #[test]
    fn impossible_settings_are_refused_naming_the_setting() {
        let args = |extra: &[&str]| {
            let mut argv = vec!["runner-scaler", "run"];
            argv.extend_from_slice(extra);
            let Command::Run { daemon: args, .. } = Cli::try_parse_from(argv).unwrap().command
            else {
                panic!("not run")
            };
            args
        };
        assert_eq!(args(&[]).validate(), Ok(()));
        for (flags, named) in [
            (&["--poll-interval", "0s"][..], "--poll-interval"),
            (&["--request-timeout", "0s"], "--request-timeout"),
            (&["--max-in-flight", "0"], "--max-in-flight"),
            (&["--config-key", ""], "--runner-scaler-config-key"),
            (&["--config-key", " "], "--runner-scaler-config-key"),
            (&["--default-job", ""], "--default-job"),
            (&["--listen", "localhost"], "--listen"),
            (&["--listen", "9464"], "--listen"),
            (&["--listen", "example.com:9464"], "--listen"),
            (&["--webhook-listen", "9465"], "--webhook-listen"),
            (&["--stuck-after", "0s"], "--stuck-after"),
        ] {
            let problem = args(flags).validate().expect_err(named);
            assert!(problem.starts_with(named), "{flags:?}: {problem}");
        }
        let both = args(&["--poll-interval", "0s", "--max-in-flight", "0"])
            .validate()
            .unwrap_err();
        assert!(
            both.contains("--poll-interval") && both.contains("--max-in-flight"),
            "{both}"
        );
        assert!(args(&["--max-in-flight", "1"]).validate().is_ok());
    }

    #[test]
    fn listen_is_an_address_or_off() {
        let listen = |value: &str| {
            let cli = Cli::try_parse_from(["runner-scaler", "run", "--listen", value]).unwrap();
            let Command::Run { daemon: args, .. } = cli.command else {
                panic!("not run")
            };
            args.listen_addr()
        };
        assert_eq!(listen("off"), Ok(None));
        assert_eq!(
            listen("0.0.0.0:9464").unwrap(),
            Some("0.0.0.0:9464".parse().unwrap())
        );
        assert_eq!(
            listen("[::1]:80").unwrap(),
            Some("[::1]:80".parse().unwrap())
        );
        assert!(listen("on").is_err());
        let default = Cli::try_parse_from(["runner-scaler", "run"]).unwrap();
        let Command::Run { daemon: args, .. } = default.command else {
            panic!("not run")
        };
        assert_eq!(
            args.listen_addr().unwrap(),
            Some("127.0.0.1:9464".parse().unwrap())
        );
        assert_eq!(args.stuck_after, Duration::from_secs(15 * 60));
    }

    #[test]
    fn durations_are_humantime() {
        let cli = Cli::try_parse_from(["runner-scaler", "run", "--poll-interval", "10m"]).unwrap();
        let Command::Run { daemon: args, .. } = cli.command else {
            panic!("not run")
        };
        assert_eq!(args.poll_interval, Duration::from_secs(600));
    }
}
