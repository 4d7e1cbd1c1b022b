//! The live status the daemon serves on `GET /status`: what the running daemon knows (its
//! last tick, with its backoffs, holds and readings) and who acts. `runner-scaler status`
//! shows it; a fresh dry-run tick in another process cannot know these.

use serde::Serialize;

use super::TickView;

/// Who this daemon is in the leader election.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Holds the lock and acts.
    Leader,
    /// Waits for the lock; `leader` names the holder when the lock key says.
    Standby { leader: Option<String> },
    /// `run --dry-run`: plans and reports, writes nothing, needs no lock.
    Shadow,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct LiveStatus {
    pub role: Role,
    /// The last tick this daemon ran; `None` before the first, and on a standby.
    pub tick: Option<TickView>,
}

impl LiveStatus {
    /// The table `runner-scaler status` prints, headed by who acts.
    pub fn render_text(&self) -> String {
        let mut out = match &self.role {
            Role::Leader => "leader: this daemon acts\n".to_string(),
            Role::Shadow => "shadow mode (run --dry-run): this daemon writes nothing\n".to_string(),
            Role::Standby {
                leader: Some(holder),
            } => {
                format!("standby: the leader is {holder}; ask it for the status\n")
            }
            Role::Standby { leader: None } => "standby: no daemon holds the lock\n".to_string(),
        };
        match &self.tick {
            Some(tick) => {
                if let Some(at) = tick.at {
                    out.push_str(&format!("last tick at {}\n", at.to_rfc3339()));
                }
                out.push_str(&tick.render_text());
            }
            // A standby runs no ticks: the leader has the status.
            None if matches!(self.role, Role::Standby { .. }) => {}
            None => out.push_str("no tick has run yet\n"),
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_names_the_leader_and_shows_no_tick() {
        let status = LiveStatus {
            role: Role::Standby {
                leader: Some("node-2 (alloc 5f1c)".into()),
            },
            tick: None,
        };
        assert_eq!(
            status.render_text(),
            "standby: the leader is node-2 (alloc 5f1c); ask it for the status\n"
        );
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["role"]["standby"]["leader"], "node-2 (alloc 5f1c)");
    }

    #[test]
    fn a_leader_shows_its_last_tick() {
        let tick = TickView {
            queued: 3,
            paused: Some("runners/paused is set".into()),
            ..TickView::default()
        };
        let text = LiveStatus {
            role: Role::Leader,
            tick: Some(tick),
        }
        .render_text();
        assert!(text.starts_with("leader: this daemon acts\n"), "{text}");
        assert!(text.contains("queued=3"), "{text}");
        assert!(text.contains("paused: runners/paused is set"), "{text}");
    }
}
