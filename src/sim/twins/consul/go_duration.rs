//! Go's duration syntax, as Consul reads it in `?wait=`, a session's `TTL` and `LockDelay`
//! (`time.ParseDuration`), and prints it in its messages (`time.Duration.String()`).

use std::time::Duration;

/// Parses a Go duration string (`time.ParseDuration`): `300ms`, `5s`, `1m30s`, `1.5h`.
pub fn parse_go_duration(raw: &str) -> Option<Duration> {
    if raw == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = raw;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * seconds_per_unit;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Go's `time.Duration.String()` for the durations a twin prints: `10s`, `24h0m0s`, `500ms`.
pub fn go_duration_string(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let total = d.as_secs();
    let (h, m, s) = (total / 3600, total / 60 % 60, total % 60);
    let millis = d.subsec_millis();
    let seconds = if millis == 0 {
        format!("{s}s")
    } else {
        format!("{s}.{}s", format!("{millis:03}").trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_like_go() {
        let cases = [
            ("5s", Some(Duration::from_secs(5))),
            ("5m", Some(Duration::from_secs(300))),
            ("1m30s", Some(Duration::from_secs(90))),
            ("250ms", Some(Duration::from_millis(250))),
            ("1.5h", Some(Duration::from_secs(5400))),
            ("0", Some(Duration::ZERO)),
            ("", None),
            ("5", None),
            ("5x", None),
            ("s", None),
        ];
        for (raw, want) in cases {
            assert_eq!(parse_go_duration(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn durations_print_like_go() {
        let cases = [
            (Duration::from_secs(10), "10s"),
            (Duration::from_secs(24 * 3600), "24h0m0s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(500), "500ms"),
        ];
        for (d, want) in cases {
            assert_eq!(go_duration_string(d), want);
        }
    }
}
