//! Clients of the services the daemon talks to. Wire types never leave these files: each
//! client implements the ports of `observe`, `act` and `secrets` over its real API.

pub mod consul;
pub mod consul_lock;
pub mod forgejo;
pub mod github;
pub mod http;
pub mod nomad;
pub mod origin;
pub mod vault;
