//! The global pause: a Consul key (`runners/paused` unless `--pause-key` says otherwise) an
//! operator writes to stop every dispatch at once, without editing the document or stopping
//! the daemon: `consul kv put runners/paused "incident 123"` pauses, `consul kv delete
//! runners/paused` (or the value `false`) resumes. Runners in flight are left alone, dead
//! children are still purged and surplus is still taken back: a pause only stops adding.

use crate::model::clip_chars;

/// Values that mean "not paused", compared without case: a key left behind as `false` must
/// not stop CI.
const RESUMED: &[&str] = &["false", "0", "no", "off"];

/// How much of the operator's value is shown in `status` and the log.
const SHOWN_CHARS_MAX: usize = 200;

/// Why dispatching is paused, from the key's value, or `None` when it is not. Any other value
/// pauses, an empty one too (`consul kv put runners/paused` with no value); it is shown as the
/// reason, on one line.
pub fn pause_reason(key: &str, value: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(value);
    let text = text.trim();
    if RESUMED.iter().any(|r| text.eq_ignore_ascii_case(r)) {
        return None;
    }
    let shown: String = clip_chars(text, SHOWN_CHARS_MAX)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    Some(if shown.is_empty() {
        format!("{key} is set")
    } else {
        format!("{key} is set: {shown}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_pauses_unless_it_says_false() {
        let cases: &[(&[u8], Option<&str>)] = &[
            (b"incident 123", Some("runners/paused is set: incident 123")),
            (b"", Some("runners/paused is set")),
            (b"  true \n", Some("runners/paused is set: true")),
            (
                b"line one\nline two",
                Some("runners/paused is set: line one line two"),
            ),
            (b"false", None),
            (b" FALSE\n", None),
            (b"0", None),
            (b"off", None),
            (b"no", None),
        ];
        for (value, want) in cases {
            assert_eq!(
                pause_reason("runners/paused", value).as_deref(),
                *want,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }

    #[test]
    fn a_long_value_is_clipped() {
        let long = "x".repeat(1000);
        let why = pause_reason("runners/paused", long.as_bytes()).unwrap();
        assert!(why.len() < 300, "{why}");
    }
}
