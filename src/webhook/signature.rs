//! HMAC-SHA256 of the raw body under the webhook's secret, checked in constant time.

use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;

/// Whether `hex_tag` is the HMAC-SHA256 of `body` under `secret`. The comparison
/// (`verify_slice`) takes the same time wherever the tags differ; a tag that is not hex, or
/// not 32 bytes, is simply wrong.
pub fn verify(secret: &SecretString, body: &[u8], hex_tag: &str) -> bool {
    let Ok(tag) = hex::decode(hex_tag.trim()) else {
        return false;
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret.expose_secret().as_bytes()) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&tag).is_ok()
}

/// The hex tag a forge sends for `body` under `secret`: for tests and twins.
pub fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GitHub's own test vector (validating-webhook-deliveries).
    #[test]
    fn githubs_test_vector_verifies() {
        let secret = SecretString::from("It's a Secret to Everybody");
        let tag = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(sign("It's a Secret to Everybody", b"Hello, World!"), tag);
        assert!(verify(&secret, b"Hello, World!", tag));
        assert!(verify(&secret, b"Hello, World!", &tag.to_uppercase()));
        assert!(!verify(&secret, b"Hello, World?", tag));
        assert!(!verify(&SecretString::from("other"), b"Hello, World!", tag));
        assert!(!verify(&secret, b"Hello, World!", &tag[..62]));
        assert!(!verify(&secret, b"Hello, World!", "not hex"));
        assert!(!verify(&secret, b"Hello, World!", ""));
    }
}
