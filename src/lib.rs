//! runner-scaler: keeps exactly enough ephemeral self-hosted CI runners in flight on Nomad
//! for GitHub Actions and Forgejo Actions.
//!
//! # Layout
//!
//! Data flows one way: config → observe → plan → act → report.
//!
//! - [`model`]: the words of the domain (repo, label set, bucket, child, runner name).
//! - [`config`]: the Consul document, raw JSON → validated [`config::Config`], every error at
//!   once; the watcher task that keeps the last good document.
//! - [`observe`]: the ports the loop reads through (queues, children) and the
//!   [`observe::Snapshot`] of one tick, where a failed source is a gap, not an abort.
//! - [`plan`]: pure: (config, snapshot, memory, now) → [`plan::Plan`]. No I/O, no clock.
//! - [`act`]: carries out a plan through the ports it defines (mint, dispatch, purge).
//! - [`report`]: the one place that logs decisions and counts them ([`report::record`]).
//! - [`metrics`]: the metrics registry and the facts `/livez` and `/healthz` judge by; the
//!   clients' request counters.
//! - [`serve`]: the `--listen` server: `/metrics`, `/livez`, `/healthz`.
//! - [`secrets`]: secret types and the port secrets are read through.
//! - [`clients`]: GitHub, Forgejo, Nomad, Consul, Vault; wire types stay inside.
//! - [`sim`]: twins of every service and the simulated world.
//! - [`control_loop`]: one tick after another; the only owner of state kept between ticks.
//! - [`leader`]: the Consul leader lock; only its holder writes, and it fences itself.
//! - [`webhook`]: the `--webhook-listen` receiver; verified deliveries become hints for the
//!   loop ("look at this repo now").
//! - [`check`]: `config check --live`, and the daemon's refusal of a readable admin token.

pub mod act;
pub mod cli;
pub mod clients;
pub mod clock;
pub mod commands;
pub mod config;
pub mod control_loop;
pub mod leader;
pub mod metrics;
pub mod model;
pub mod observe;
pub mod plan;
pub mod report;
pub mod secrets;
pub mod serve;
#[cfg(feature = "sim")]
pub mod sim;
pub mod webhook;
pub mod wiring;
