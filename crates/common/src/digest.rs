//! Digests both programs use on secrets and attacker-chosen strings: a comparison in
//! constant time (tokens, credential digests, signature tags), and the short tag under
//! which a session id appears in logs (never the id itself, which is a bearer secret).

use sha2::{Digest, Sha256};

/// Compares two byte strings in time independent of where they differ (`subtle`).
/// Strings of different lengths are compared through their SHA-256 digests, so that
/// the time taken says nothing of a common prefix either; the common case (a digest
/// or a tag against one of the same length) costs no hashing.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    if a.len() == b.len() {
        return a.ct_eq(b).into();
    }
    let (da, db) = (Sha256::digest(a), Sha256::digest(b));
    da.as_slice().ct_eq(db.as_slice()).into()
}

/// Lower-case hex of `bytes` (digests, random ids, log tags): the one encoder both
/// programs use.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // Bytes first, one check at the end: a `char` pushed at a time costs its UTF-8
    // encoding (a session's binding key is written for every request it makes).
    let mut out = Vec::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.extend_from_slice(&[DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0x0f)]]);
    }
    String::from_utf8(out).unwrap_or_default()
}

/// The short tag a secret or attacker-chosen string is logged under: the first
/// `bytes` bytes of its SHA-256, as hex. Enough to tell values apart in a log; nothing
/// to replay.
pub fn short_digest(value: &[u8], bytes: usize) -> String {
    let d = Sha256::digest(value);
    hex(&d[..bytes.min(d.len())])
}

/// The tag a secret identifier (a session id) is logged under: the first 8 hex digits
/// of its SHA-256.
pub fn log_tag(secret: &str) -> String {
    short_digest(secret.as_bytes(), 4)
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
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(short_digest(b"abc", 3), "ba7816");
    }
}
