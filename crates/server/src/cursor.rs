//! Opaque listing cursors: where the next page of a listing starts, signed so that a
//! client can neither move it nor carry it to another listing.
//!
//! 2026-07-28 `server/utilities/pagination.mdx`: the cursor is an opaque string, and an
//! invalid cursor SHOULD be answered with `-32602`. Wire form, like `requestState`:
//! `base64url(payload JSON) "." base64url(HMAC-SHA256)`, under the same key set (so
//! every instance sharing `[[state.keys]]` honours every other's cursors) but with its
//! own domain label. The payload holds the key id, the principal, a digest of the
//! listing (its workspaces and query) and the keyset: the last note id shown.

use crate::digest::{constant_time_eq, hex};
use crate::request_state::{split_signed, SignedParts, StateCodec, StateError};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The domain label of cursor tags.
const PURPOSE: &str = "dualera-notes-list-cursor";
/// Longest cursor accepted (ours are about 250 bytes).
const MAX_LEN: usize = 1024;

/// Why a cursor was refused. Every variant is answered with `-32602`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CursorError {
    /// Not a cursor this server makes.
    #[error("cursor is malformed")]
    Malformed,
    /// Signed with a key this server does not hold.
    #[error("cursor was signed with an unknown key")]
    UnknownKey,
    /// The tag does not verify: the cursor was altered.
    #[error("cursor failed its integrity check")]
    BadTag,
    /// Issued to another principal.
    #[error("cursor was issued to another principal")]
    WrongPrincipal,
    /// Issued for another listing.
    #[error("cursor was issued for another listing (the workspaces or the query differ)")]
    WrongListing,
}

impl From<StateError> for CursorError {
    fn from(e: StateError) -> Self {
        match e {
            StateError::UnknownKey => Self::UnknownKey,
            StateError::BadTag => Self::BadTag,
            _ => Self::Malformed,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Payload {
    v: u8,
    kid: String,
    sub: String,
    listing: String,
    after: i64,
}

/// A digest naming one listing: the workspaces (in any order) and the query.
pub fn listing_digest(workspaces: &[String], query: Option<&str>) -> String {
    let mut sorted: Vec<&String> = workspaces.iter().collect();
    sorted.sort();
    let canonical = serde_json::json!({ "workspaces": sorted, "query": query });
    hex(&Sha256::digest(canonical.to_string().as_bytes()))
}

/// A cursor for `principal` continuing `listing` after note id `after`.
pub fn seal(codec: &StateCodec, principal: &str, listing: &str, after: i64) -> String {
    let payload = Payload {
        v: 1,
        kid: codec.signing_key_id().to_owned(),
        sub: principal.to_owned(),
        listing: listing.to_owned(),
        after,
    };
    let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&payload).unwrap_or_default());
    let (_, tag) = codec.sign_detached(PURPOSE, body.as_bytes());
    format!("{body}.{}", URL_SAFE_NO_PAD.encode(tag))
}

/// Verifies a cursor a client sent back and returns the note id the page starts after.
pub fn open(
    codec: &StateCodec,
    token: &str,
    principal: &str,
    listing: &str,
) -> Result<i64, CursorError> {
    if token.len() > MAX_LEN {
        return Err(CursorError::Malformed);
    }
    let SignedParts { body, raw, tag } = split_signed(token).ok_or(CursorError::Malformed)?;
    // The key id must be read before the tag can be checked; nothing else is trusted
    // until it is.
    // Duplicate member names are refused here too (I-JSON), like in every message.
    let payload: Payload = dualera_adapters::json::parse(&raw)
        .ok()
        .and_then(|v| serde_json::from_value(v).ok())
        .ok_or(CursorError::Malformed)?;
    codec.verify_detached(PURPOSE, &payload.kid, body.as_bytes(), &tag)?;
    if payload.v != 1 || payload.after < 0 {
        return Err(CursorError::Malformed);
    }
    if !constant_time_eq(payload.sub.as_bytes(), principal.as_bytes()) {
        return Err(CursorError::WrongPrincipal);
    }
    if !constant_time_eq(payload.listing.as_bytes(), listing.as_bytes()) {
        return Err(CursorError::WrongListing);
    }
    Ok(payload.after)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec(secret: &[u8]) -> StateCodec {
        StateCodec::new(vec![("k1".into(), secret.to_vec())], 1000, 16384)
    }

    #[test]
    fn roundtrip_and_bindings() {
        let c = codec(b"secret-one");
        let ws = vec!["file:///b".to_owned(), "file:///a".to_owned()];
        let listing = listing_digest(&ws, Some("tps"));
        let token = seal(&c, "alice", &listing, 42);
        assert_eq!(open(&c, &token, "alice", &listing), Ok(42));
        let reordered = listing_digest(&["file:///a".into(), "file:///b".into()], Some("tps"));
        assert_eq!(open(&c, &token, "alice", &reordered), Ok(42));
        let other = listing_digest(&ws, Some("standup"));
        assert_eq!(
            open(&c, &token, "alice", &other),
            Err(CursorError::WrongListing)
        );
        assert_eq!(
            open(&c, &token, "alice", &listing_digest(&ws, None)),
            Err(CursorError::WrongListing)
        );
        assert_eq!(
            open(&c, &token, "mallory", &listing),
            Err(CursorError::WrongPrincipal)
        );
        assert_eq!(
            open(&codec(b"another-secret"), &token, "alice", &listing),
            Err(CursorError::BadTag)
        );
        assert_eq!(open(&c, "", "alice", &listing), Err(CursorError::Malformed));
        for i in 0..token.len() {
            let mut bytes = token.clone().into_bytes();
            bytes[i] ^= 0x01;
            let Ok(t) = String::from_utf8(bytes) else {
                continue;
            };
            assert!(open(&c, &t, "alice", &listing).is_err(), "flip at {i}");
        }
    }
}
