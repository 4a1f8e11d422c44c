//! Sealing the reverse machine's round states into `requestState` and opening them
//! again on the host's retry, with the neutral codec ([`crate::request_state`]).
//!
//! 2026-07-28 `basic/patterns/mrtr` ("Server Requirements"): `requestState` is
//! attacker-controlled, so it MUST be integrity-protected and bound to the request it
//! was issued for. The codec binds the principal, the method, the target (tool name,
//! prompt name or resource URI) and a digest of the arguments; the machine checks its
//! own copy of the same facts ([`RoundState::check`]) and that the round still waits.

use crate::request_state::{digest_arguments, Binding, StateCodec, StateError};
use dualera_adapters::reverse::{RoundState, StateMismatch};
use serde_json::{Map, Value};
use std::time::Duration;

/// Longest `requestState` accepted from a host, in bytes.
pub(super) const MAX_STATE_BYTES: usize = 16 * 1024;

/// The `[state]` keys the bridge seals with: `(key id, secret)`, newest first. Its
/// `Debug` names the key ids only.
#[derive(Clone, Default)]
pub struct StateKeys(pub Vec<(String, Vec<u8>)>);

impl std::fmt::Debug for StateKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|k| &k.0)).finish()
    }
}

impl StateKeys {
    /// The keys of a config's `[state]` section whose secret resolves (inline or from
    /// its environment variable) and is at least 16 bytes long; the others are named
    /// in a warning and left out.
    pub fn from_section(section: &crate::config::StateSection) -> Self {
        let mut keys = Vec::new();
        for k in &section.keys {
            let secret = k
                .secret
                .clone()
                .or_else(|| k.secret_env.as_ref().and_then(|v| std::env::var(v).ok()));
            match secret {
                Some(s) if s.len() >= 16 => keys.push((k.id.clone(), s.into_bytes())),
                _ => tracing::warn!(
                    key = %k.id,
                    "reverse bridge: state key without a usable secret (16 bytes or more) left out"
                ),
            }
        }
        Self(keys)
    }
}

/// The codec of the bridge: the configured keys, else one random key for this
/// process (said once, at start).
pub(super) fn codec(keys: &StateKeys, ttl: Duration) -> StateCodec {
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    if !keys.0.is_empty() {
        return StateCodec::new(keys.0.clone(), ttl_ms, MAX_STATE_BYTES);
    }
    tracing::info!("reverse bridge: random state keys, retries must reach this process");
    StateCodec::random(ttl_ms, MAX_STATE_BYTES).unwrap_or_else(|e| {
        // No randomness: a key nobody can guess is impossible, so no state this
        // process seals will ever verify elsewhere; a fixed key would be worse.
        tracing::error!(error = %e, "reverse bridge: no random state key; rounds will fail");
        StateCodec::new(vec![("unusable".into(), Vec::new())], 0, 0)
    })
}

/// What a host request's state is bound to: its principal, method, target and the
/// digest of its params without `_meta`, `inputResponses` and `requestState` (what a
/// retry adds).
pub(super) fn binding(principal: &str, method: &str, params: &Map<String, Value>) -> Binding {
    let target = params
        .get("name")
        .or_else(|| params.get("uri"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let mut arguments = params.clone();
    for k in ["_meta", "inputResponses", "requestState"] {
        arguments.remove(k);
    }
    Binding {
        principal: principal.to_owned(),
        method: method.to_owned(),
        target,
        arguments: digest_arguments(&Value::Object(arguments)),
    }
}

/// A retry's opened `requestState`: the round, and the replica whose partition task
/// holds it (sealed beside it, so a host can no more redirect a retry than alter the
/// round; `None` when the gateway keeps no shared store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Opened {
    pub(super) state: RoundState,
    pub(super) owner: Option<String>,
}

/// The sealed payload: the round and its owner.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Sealed {
    round: RoundState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
}

/// Seals `state`, held by replica `owner`, for the host request bound by `binding`.
pub(super) fn seal(
    codec: &StateCodec,
    binding: &Binding,
    state: &RoundState,
    owner: Option<&str>,
    now_ms: u64,
) -> Option<String> {
    let data = serde_json::to_value(Sealed {
        round: state.clone(),
        owner: owner.map(str::to_owned),
    })
    .ok()?;
    codec
        .seal(binding, "reverse", state.round, data, now_ms)
        .ok()
}

/// Opens a retry's `requestState`; a refusal is the machine's mismatch for it, so the
/// host sees the same `-32602` whichever side noticed.
pub(super) fn open(
    codec: &StateCodec,
    token: &str,
    binding: &Binding,
    now_ms: u64,
) -> Result<Opened, StateMismatch> {
    let opened = codec.open(token, binding, now_ms).map_err(|e| match e {
        StateError::Expired => StateMismatch::Expired,
        StateError::WrongPrincipal => StateMismatch::OtherPrincipal,
        StateError::WrongRequest | StateError::WrongArguments => StateMismatch::OtherRequest,
        _ => StateMismatch::Invalid,
    })?;
    if opened.phase != "reverse" {
        return Err(StateMismatch::Invalid);
    }
    let sealed: Sealed = serde_json::from_value(opened.data).map_err(|_| StateMismatch::Invalid)?;
    Ok(Opened {
        state: sealed.round,
        owner: sealed.owner,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn state() -> RoundState {
        RoundState {
            session: "s1".into(),
            epoch: 1,
            call: 0,
            round: 1,
            parked: BTreeMap::from([("e1".to_owned(), json!("dualera-3"))]),
            method: "tools/call".into(),
            arguments: "d".into(),
            principal: "p".into(),
            expires_at_ms: 10_000,
        }
    }

    fn params(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn a_sealed_state_opens_for_its_request_only() {
        let codec = StateCodec::new(vec![("k".into(), b"0123456789abcdef".to_vec())], 1000, 4096);
        let p = params(json!({"name": "ask", "arguments": {"q": 1}}));
        let b = binding("p", "tools/call", &p);
        let token = seal(&codec, &b, &state(), Some("replica-a"), 0).expect("sealed");
        let retry = params(
            json!({"name": "ask", "arguments": {"q": 1}, "requestState": token, "inputResponses": {}}),
        );
        assert_eq!(
            open(&codec, &token, &binding("p", "tools/call", &retry), 1),
            Ok(Opened {
                state: state(),
                owner: Some("replica-a".into())
            })
        );
        let alone = seal(&codec, &b, &state(), None, 0).expect("sealed");
        assert_eq!(open(&codec, &alone, &b, 1).map(|o| o.owner), Ok(None));
        let other = params(json!({"name": "ask", "arguments": {"q": 2}}));
        assert_eq!(
            open(&codec, &token, &binding("p", "tools/call", &other), 1),
            Err(StateMismatch::OtherRequest)
        );
        assert_eq!(
            open(&codec, &token, &binding("q", "tools/call", &p), 1),
            Err(StateMismatch::OtherPrincipal)
        );
        assert_eq!(open(&codec, &token, &b, 5000), Err(StateMismatch::Expired));
        let mut tampered = token.clone();
        tampered.insert(3, 'x');
        assert_eq!(open(&codec, &tampered, &b, 1), Err(StateMismatch::Invalid));
    }
}
