//! The simulated world: twins of every service the daemon uses, and the world that moves
//! them. Used by the tests and by `runner-scaler simulate`; first-class code, not test hacks.

pub mod daemon_clients;
pub mod memory;
#[cfg(unix)]
pub mod process_bench;
pub mod seeded;
pub mod twins;
pub mod world;
