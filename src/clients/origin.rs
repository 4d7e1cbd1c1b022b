//! Where a token may be sent: the origin (scheme, host, port) it was issued for.
//!
//! A token read from Vault goes only to the origin written beside it in the same secret, never
//! to one the Consul document names: whoever may edit the document must not be able to aim a
//! token at a host of their choosing (BRIEF lesson 15). The document's URL is only compared
//! with the secret's.

use std::fmt;

use url::{Host, Url};

/// The scheme, host and port of an `http` or `https` URL, compared the way a browser compares
/// origins: case-insensitively, with the default port written or not, and a fully qualified
/// name's trailing dot ignored (`forgejo.example.` is the host `forgejo.example`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Origin {
    scheme: String,
    host: String,
    port: u16,
}

impl Origin {
    /// The origin of `raw`; refused when it is not an absolute `http(s)` URL with a host, or
    /// when it carries a user name or password (which would be sent, and shown, with it).
    pub fn parse(raw: &str) -> Result<Origin, String> {
        let url = Url::parse(raw.trim()).map_err(|e| format!("is not a URL: {e}"))?;
        Origin::of(&url)
    }

    /// The origin of `url`, refused as [`Origin::parse`] says.
    pub fn of(url: &Url) -> Result<Origin, String> {
        let scheme = url.scheme();
        if !matches!(scheme, "http" | "https") {
            return Err("must be an http:// or https:// URL".to_string());
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("must not carry a user name or password".to_string());
        }
        // The url crate lower-cases and IDNA-maps domain names and writes IP addresses in
        // their one canonical form, so only the trailing dot is left to undo.
        let host = match url.host() {
            Some(Host::Domain(domain)) => domain.strip_suffix('.').unwrap_or(domain).to_string(),
            Some(Host::Ipv4(ip)) => ip.to_string(),
            Some(Host::Ipv6(ip)) => format!("[{ip}]"),
            None => return Err("must name a host".to_string()),
        };
        if host.is_empty() {
            return Err("must name a host".to_string());
        }
        let port = url
            .port_or_known_default()
            .ok_or_else(|| "has no port".to_string())?;
        Ok(Origin {
            scheme: scheme.to_string(),
            host,
            port,
        })
    }

    /// Whether requests to this origin travel in clear text.
    pub fn is_plain_http(&self) -> bool {
        self.scheme == "http"
    }
}

/// `https://forgejo.example`, `http://10.0.0.5:3000`: the port only when it is not the
/// scheme's default.
impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let default = if self.scheme == "https" { 443 } else { 80 };
        if self.port == default {
            write!(f, "{}://{}", self.scheme, self.host)
        } else {
            write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(a: &str, b: &str) -> bool {
        Origin::parse(a).unwrap() == Origin::parse(b).unwrap()
    }

    #[test]
    fn origins_compare_as_a_browser_compares_them() {
        for (a, b, equal) in [
            // Case of scheme and host does not matter; a path never does.
            ("https://Forgejo.Example", "https://forgejo.example/", true),
            (
                "HTTPS://forgejo.example/sub/",
                "https://forgejo.example",
                true,
            ),
            // The default port, written or not.
            (
                "https://forgejo.example:443",
                "https://forgejo.example",
                true,
            ),
            (
                "http://forgejo.example:80/x",
                "http://forgejo.example",
                true,
            ),
            // A fully qualified name's trailing dot is the same host.
            ("https://forgejo.example.", "https://forgejo.example", true),
            (
                "https://forgejo.example.:443/",
                "https://forgejo.example",
                true,
            ),
            // Another port, another scheme or another host is another origin.
            (
                "https://forgejo.example:8443",
                "https://forgejo.example",
                false,
            ),
            ("http://forgejo.example", "https://forgejo.example", false),
            (
                "http://forgejo.example:443",
                "https://forgejo.example",
                false,
            ),
            (
                "https://forgejo.example.evil.test",
                "https://forgejo.example",
                false,
            ),
            (
                "https://evil.test/forgejo.example",
                "https://forgejo.example",
                false,
            ),
            (
                "https://sub.forgejo.example",
                "https://forgejo.example",
                false,
            ),
            // Addresses in their canonical form.
            ("http://127.0.0.1:3000", "http://0x7f.0.0.1:3000", true),
            ("http://[::1]:3000", "http://[0:0:0:0:0:0:0:1]:3000", true),
            ("http://127.0.0.1:3000", "http://127.0.0.2:3000", false),
            // IDNA: the Unicode name and its punycode are one host.
            (
                "https://bücher.example",
                "https://xn--bcher-kva.example",
                true,
            ),
        ] {
            assert_eq!(same(a, b), equal, "{a} vs {b}");
        }
    }

    #[test]
    fn urls_that_would_carry_or_hide_something_are_refused() {
        for (raw, problem) in [
            (
                "https://ci:hunter2@forgejo.example",
                "user name or password",
            ),
            ("https://ci@forgejo.example", "user name or password"),
            ("ftp://forgejo.example", "http:// or https://"),
            ("file:///etc/passwd", "http:// or https://"),
            ("forgejo.example", "not a URL"),
            ("", "not a URL"),
        ] {
            let refused = Origin::parse(raw).unwrap_err();
            assert!(refused.contains(problem), "{raw:?}: {refused}");
            assert!(!refused.contains("hunter2"), "{refused}");
        }
    }

    #[test]
    fn an_origin_is_shown_with_its_port_only_when_not_the_default() {
        for (raw, shown) in [
            ("https://Forgejo.Example:443/sub", "https://forgejo.example"),
            (
                "http://forgejo.example.:3000",
                "http://forgejo.example:3000",
            ),
            ("http://[::1]:80", "http://[::1]"),
        ] {
            assert_eq!(Origin::parse(raw).unwrap().to_string(), shown, "{raw}");
        }
        assert!(Origin::parse("http://f:3000").unwrap().is_plain_http());
        assert!(!Origin::parse("https://f").unwrap().is_plain_http());
    }
}
