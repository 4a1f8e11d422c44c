//! The round state: what the bridge hands a modern host as `requestState` when a
//! legacy server asked for input, and checks when the host retries.
//!
//! The machine never seals anything (no crypto in this crate): it emits a
//! [`RoundState`] with the `input_required` result, the driver serializes it with serde,
//! seals it (HMAC with the state keys) and sends the sealed string as `requestState`;
//! on the retry the driver verifies and opens the string and hands the machine the
//! [`OpenedState`]. 2026-07-28 `basic/patterns/mrtr` ("Server Requirements"): state is
//! attacker-controlled input, so the payload binds the principal, a short expiry and
//! the originating request (method and a digest of its arguments), and the machine
//! checks each of them ([`RoundState::check`]).
//!
//! The arguments digest: the machine builds canonical bytes of the request
//! ([`canonical_arguments`]: the method, a newline, the params as JSON with sorted
//! keys, without `_meta`, `inputResponses` and `requestState`) and hashes them with the
//! [`Digest`](super::Digest) function the driver supplies in the config (SHA-256 in
//! dualera's gateway), so this crate needs no hash crate of its own.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The payload of one `requestState`: everything a retry must match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RoundState {
    /// The bridge's name for the legacy session ([`Partition::session`](super::Partition::session)).
    pub session: String,
    /// How many times that session was (re-)initialized when the round was asked: a
    /// round of an earlier legacy session cannot be answered on a later one.
    pub epoch: u32,
    /// The machine's number for the host call the round belongs to.
    pub call: u64,
    /// The round within the call, from 1.
    pub round: u32,
    /// The parked legacy server requests this round asks the host to answer: the
    /// `inputRequests` key → the server's JSON-RPC id.
    pub parked: BTreeMap<String, Value>,
    /// The host request's method.
    pub method: String,
    /// The digest of the host request's arguments ([`canonical_arguments`]).
    pub arguments: String,
    /// The principal the partition serves.
    pub principal: String,
    /// When the round lapses, in Unix milliseconds: the driver's [`crate::Timestamp`]
    /// plus [`super::Config::unix_at_zero_ms`].
    pub expires_at_ms: u64,
}

/// What the driver makes of a retry's `requestState`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenedState {
    /// The request carries no `requestState`.
    Absent,
    /// The state verified and opened.
    Opened(RoundState),
    /// The state did not verify (bad tag, unknown key, not ours, not decodable): the
    /// machine answers it with the one error for an unusable state.
    Invalid,
}

/// Why a retry's round state is refused; every one is `-32602` to the host
/// (2026-07-28 `basic/patterns/mrtr`: state that fails verification MUST be
/// rejected; DESIGN.md: any mismatch, bad tag or expiry is `-32602`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateMismatch {
    /// Not verifiable (tampered, or sealed with a key the driver does not hold).
    Invalid,
    /// Issued by another legacy session.
    OtherSession,
    /// Issued before this partition's legacy session expired and was opened again:
    /// the server requests it names are gone with the old session.
    SessionRenewed,
    /// Issued to another principal.
    OtherPrincipal,
    /// Presented after its expiry.
    Expired,
    /// Presented with another method or other arguments than the request it was
    /// issued for.
    OtherRequest,
    /// Names a call or parked requests that are not waiting for this round (already
    /// answered: a replay; or never parked).
    NotWaiting,
    /// Its round waits in another gateway replica that is gone (no longer registered,
    /// or refusing connections): the legacy session and the server requests it parked
    /// went with it. A fresh request (without `requestState`) starts over.
    SessionLost,
}

impl StateMismatch {
    /// The error message the host sees.
    pub fn message(self) -> &'static str {
        match self {
            Self::Invalid => "Invalid requestState",
            Self::OtherSession => "requestState belongs to another session",
            Self::SessionRenewed => {
                "The upstream session was renewed since this requestState was issued; send the request again without requestState"
            }
            Self::OtherPrincipal => "requestState was issued to another principal",
            Self::Expired => "requestState has expired",
            Self::OtherRequest => "requestState was issued for another request",
            Self::NotWaiting => {
                "requestState names input requests that are not waiting (already answered?)"
            }
            Self::SessionLost => {
                "The gateway replica holding this round is gone; send the request again without requestState"
            }
        }
    }

    /// A short machine-readable name, `data.reason` of the error.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Invalid => "invalidState",
            Self::OtherSession => "otherSession",
            Self::SessionRenewed => "sessionRenewed",
            Self::OtherPrincipal => "otherPrincipal",
            Self::Expired => "expiredState",
            Self::OtherRequest => "otherRequest",
            Self::NotWaiting => "notWaiting",
            Self::SessionLost => "sessionLost",
        }
    }
}

impl RoundState {
    /// Checks what the state alone can tell against the retry: session, principal,
    /// expiry, method and arguments. (Whether its call and parked requests are still
    /// waiting is the machine's to check.)
    pub fn check(
        &self,
        session: &str,
        epoch: u32,
        principal: &str,
        now_ms: u64,
        method: &str,
        arguments: &str,
    ) -> Result<(), StateMismatch> {
        if self.session != session {
            return Err(StateMismatch::OtherSession);
        }
        if self.epoch != epoch {
            return Err(StateMismatch::SessionRenewed);
        }
        if self.principal != principal {
            return Err(StateMismatch::OtherPrincipal);
        }
        if now_ms >= self.expires_at_ms {
            return Err(StateMismatch::Expired);
        }
        if self.method != method || self.arguments != arguments {
            return Err(StateMismatch::OtherRequest);
        }
        Ok(())
    }
}

/// The canonical bytes of a host request's arguments, input of the arguments digest:
/// `method`, `\n`, then `params` without `_meta`, `inputResponses` and `requestState`
/// as compact JSON with object keys sorted by their UTF-8 bytes at every depth (so the
/// bytes do not depend on the order a host wrote its keys in, nor on how the JSON
/// library orders maps).
pub fn canonical_arguments(method: &str, params: &Map<String, Value>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(method.as_bytes());
    out.push(b'\n');
    let kept = crate::json::canonical_filtered(params, |k| {
        !matches!(k, "_meta" | "inputResponses" | "requestState")
    });
    out.extend_from_slice(kept.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(v: Value) -> Map<String, Value> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn canonical_bytes_ignore_key_order_and_the_round() {
        let a = canonical_arguments(
            "tools/call",
            &params(json!({"name": "t", "arguments": {"b": 1, "a": [{"y": 2, "x": "\u{e9}"}]}})),
        );
        let b = canonical_arguments(
            "tools/call",
            &params(
                json!({"arguments": {"a": [{"x": "\u{e9}", "y": 2}], "b": 1}, "name": "t",
                "_meta": {"progressToken": 1}, "inputResponses": {"k": {}}, "requestState": "s"}),
            ),
        );
        assert_eq!(a, b);
        assert_eq!(
            String::from_utf8(a).unwrap(),
            "tools/call\n{\"arguments\":{\"a\":[{\"x\":\"\u{e9}\",\"y\":2}],\"b\":1},\"name\":\"t\"}"
        );
        let c = canonical_arguments("tools/call", &params(json!({"name": "u"})));
        assert_ne!(
            c,
            canonical_arguments("prompts/get", &params(json!({"name": "u"})))
        );
    }

    #[test]
    fn checks_each_binding() {
        let state = RoundState {
            session: "s".into(),
            epoch: 1,
            call: 3,
            round: 1,
            parked: BTreeMap::from([("in1".to_owned(), json!("srv-1"))]),
            method: "tools/call".into(),
            arguments: "d".into(),
            principal: "alice".into(),
            expires_at_ms: 100,
        };
        assert_eq!(state.check("s", 1, "alice", 99, "tools/call", "d"), Ok(()));
        assert_eq!(
            state.check("t", 1, "alice", 99, "tools/call", "d"),
            Err(StateMismatch::OtherSession)
        );
        assert_eq!(
            state.check("s", 2, "alice", 99, "tools/call", "d"),
            Err(StateMismatch::SessionRenewed)
        );
        assert_eq!(
            state.check("s", 1, "bob", 99, "tools/call", "d"),
            Err(StateMismatch::OtherPrincipal)
        );
        assert_eq!(
            state.check("s", 1, "alice", 100, "tools/call", "d"),
            Err(StateMismatch::Expired)
        );
        assert_eq!(
            state.check("s", 1, "alice", 99, "tools/call", "e"),
            Err(StateMismatch::OtherRequest)
        );
        let text = serde_json::to_string(&state).unwrap();
        assert_eq!(serde_json::from_str::<RoundState>(&text).unwrap(), state);
        assert!(serde_json::from_str::<RoundState>(&text.replace("\"call\"", "\"cal\"")).is_err());
    }

    #[test]
    fn a_round_lost_with_its_replica_is_invalid_params_named_session_lost() {
        use crate::jsonrpc::ErrorCode;
        use crate::reverse::{host_error, HostFailure};
        let e = host_error(&HostFailure::State(StateMismatch::SessionLost));
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
        assert_eq!(e.data, Some(json!({"reason": "sessionLost"})));
        assert!(e.message.contains("without requestState"), "{}", e.message);
    }
}
