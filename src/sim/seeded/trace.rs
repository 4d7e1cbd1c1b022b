//! The event trace of one run and its hash: the same seed must give the same hash in any
//! process, on any machine, so the hash is FNV-1a 64 written out here (std's `DefaultHasher`
//! makes no such promise).

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64 bits, continued from `hash`.
pub fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// Events folded into a running hash; kept as text only when asked (a replay prints them).
#[derive(Debug)]
pub struct Trace {
    hash: u64,
    events: u64,
    kept: Option<Vec<String>>,
}

impl Trace {
    pub fn new(keep: bool) -> Trace {
        Trace {
            hash: FNV_OFFSET,
            events: 0,
            kept: keep.then(Vec::new),
        }
    }

    /// Records one event at simulated second `t`.
    pub fn record(&mut self, t: u64, event: impl AsRef<str>) {
        let event = event.as_ref();
        self.hash = fnv1a(self.hash, &t.to_le_bytes());
        self.hash = fnv1a(self.hash, event.as_bytes());
        self.hash = fnv1a(self.hash, b"\n");
        self.events += 1;
        if let Some(kept) = &mut self.kept {
            kept.push(format!("t={t}s {event}"));
        }
    }

    pub fn hash(&self) -> u64 {
        self.hash
    }

    pub fn events(&self) -> u64 {
        self.events
    }

    pub fn take_kept(&mut self) -> Vec<String> {
        self.kept.take().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        assert_eq!(fnv1a(FNV_OFFSET, b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a(FNV_OFFSET, b"foobar"), 0x85944171f73967e8);
    }
}
