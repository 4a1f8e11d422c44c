//! Digests both programs use on secrets and attacker-chosen strings: a comparison in
//! constant time (tokens, credential digests, signature tags), and the short tag under
//! which a session id appears in logs (never the id itself, which is a bearer secret).

use sha2::{Digest, Sha256};

/// Compares two byte strings in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let (da, db) = (Sha256::digest(a), Sha256::digest(b));
    da.iter()
        .zip(db.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// The tag a secret identifier (a session id) is logged under: the first 8 hex digits
/// of its SHA-256. Enough to tell sessions apart in a log; nothing to replay.
pub fn log_tag(secret: &str) -> String {
    let d = Sha256::digest(secret.as_bytes());
    d[..4].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_and_tags() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        let tag = log_tag("0123456789abcdef");
        assert_eq!(tag.len(), 8);
        assert!(!"0123456789abcdef".contains(&tag));
        assert_eq!(tag, log_tag("0123456789abcdef"));
    }
}
