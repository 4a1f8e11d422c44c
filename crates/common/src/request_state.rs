//! The `requestState` codec: what a stateless server hands the client between MRTR
//! rounds, signed so that an attacker-controlled echo cannot change what it means.
//! Shared by both programs: the modern server seals its own rounds, and the gateway
//! seals the rounds it parks for a modern host in front of a legacy server (the
//! reverse bridge), so it lives beside them rather than inside either.
//!
//! Wire form: `base64url(payload JSON) "." base64url(HMAC-SHA256(key, first part))`.
//! The payload names its key id, so keys rotate: the newest signs, every listed key
//! verifies. The tag is checked (in constant time) before any field is trusted.

use crate::digest::{constant_time_eq, hex};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// Why a `requestState` was refused. Every variant is answered with `-32602`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// Longer than the configured limit.
    #[error("requestState is too long")]
    TooLong,
    /// Not of the `payload.tag` shape, or the payload is not ours.
    #[error("requestState is malformed")]
    Malformed,
    /// Signed with a key this server does not hold.
    #[error("requestState was signed with an unknown key")]
    UnknownKey,
    /// The tag does not verify: the state was altered.
    #[error("requestState failed its integrity check")]
    BadTag,
    /// Past its expiry.
    #[error("requestState has expired")]
    Expired,
    /// Issued to another principal.
    #[error("requestState was issued to another principal")]
    WrongPrincipal,
    /// Issued for another method or tool.
    #[error("requestState was issued for another request")]
    WrongRequest,
    /// Issued for other arguments.
    #[error("requestState was issued for different arguments")]
    WrongArguments,
}

/// What a state is bound to: the request it may be echoed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The authenticated principal (never `clientInfo`).
    pub principal: String,
    /// The JSON-RPC method (`tools/call`, …).
    pub method: String,
    /// The tool, prompt or resource the method targets.
    pub target: String,
    /// [`digest_arguments`] of the original arguments.
    pub arguments: String,
}

/// The signed payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Payload {
    v: u8,
    kid: String,
    sub: String,
    method: String,
    target: String,
    args: String,
    phase: String,
    round: u32,
    nonce: String,
    exp: u64,
    data: Value,
}

/// A verified state.
#[derive(Debug, Clone, PartialEq)]
pub struct Opened {
    /// The handler-defined phase name.
    pub phase: String,
    /// How many rounds have been taken so far.
    pub round: u32,
    /// The single-use nonce (hex).
    pub nonce: String,
    /// Expiry, in milliseconds since the Unix epoch.
    pub expires_ms: u64,
    /// Validated intermediate data the handler stored.
    pub data: Value,
}

impl Opened {
    /// The strings of an array the handler stored under `key` (empty if absent).
    pub fn strings(&self, key: &str) -> Vec<String> {
        self.data
            .get(key)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Signs and verifies states.
#[derive(Clone)]
pub struct StateCodec {
    keys: Vec<(String, Vec<u8>)>,
    ttl_ms: u64,
    max_len: usize,
}

impl std::fmt::Debug for StateCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print secrets.
        f.debug_struct("StateCodec")
            .field(
                "key_ids",
                &self.keys.iter().map(|k| &k.0).collect::<Vec<_>>(),
            )
            .field("ttl_ms", &self.ttl_ms)
            .finish()
    }
}

impl StateCodec {
    /// A codec over `(key id, secret)` pairs, newest first. Panics never; an empty
    /// list is the caller's error to prevent.
    pub fn new(keys: Vec<(String, Vec<u8>)>, ttl_ms: u64, max_len: usize) -> Self {
        Self {
            keys,
            ttl_ms,
            max_len,
        }
    }

    /// A codec with one fresh random key (used when the config names none).
    pub fn random(ttl_ms: u64, max_len: usize) -> Result<Self, getrandom::Error> {
        let mut secret = vec![0u8; 32];
        getrandom::fill(&mut secret)?;
        Ok(Self::new(
            vec![("ephemeral".into(), secret)],
            ttl_ms,
            max_len,
        ))
    }

    /// Signs a new state for `binding`, valid for the configured TTL from `now_ms`.
    pub fn seal(
        &self,
        binding: &Binding,
        phase: &str,
        round: u32,
        data: Value,
        now_ms: u64,
    ) -> Result<String, getrandom::Error> {
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce)?;
        let (kid, secret) = &self.keys[0];
        let payload = Payload {
            v: 1,
            kid: kid.clone(),
            sub: binding.principal.clone(),
            method: binding.method.clone(),
            target: binding.target.clone(),
            args: binding.arguments.clone(),
            phase: phase.to_owned(),
            round,
            nonce: hex(&nonce),
            exp: now_ms.saturating_add(self.ttl_ms),
            data,
        };
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&payload).unwrap_or_default());
        let tag = URL_SAFE_NO_PAD.encode(sign(secret, body.as_bytes()));
        Ok(format!("{body}.{tag}"))
    }

    /// Verifies a state echoed by a client and checks it belongs to `binding`.
    pub fn open(&self, token: &str, binding: &Binding, now_ms: u64) -> Result<Opened, StateError> {
        if token.len() > self.max_len {
            return Err(StateError::TooLong);
        }
        let SignedParts { body, raw, tag } = split_signed(token).ok_or(StateError::Malformed)?;
        // The key id must be read before the tag can be checked; nothing else is
        // trusted until it is.
        // Duplicate member names are refused here too (I-JSON), like in every message.
        let payload: Payload = dualera_adapters::json::parse(&raw)
            .ok()
            .and_then(|v| serde_json::from_value(v).ok())
            .ok_or(StateError::Malformed)?;
        let (_, secret) = self
            .keys
            .iter()
            .find(|(id, _)| *id == payload.kid)
            .ok_or(StateError::UnknownKey)?;
        let mut mac = HmacSha256::new_from_slice(secret).map_err(|_| StateError::Malformed)?;
        mac.update(body.as_bytes());
        mac.verify_slice(&tag).map_err(|_| StateError::BadTag)?;
        if payload.v != 1 {
            return Err(StateError::Malformed);
        }
        if now_ms >= payload.exp {
            return Err(StateError::Expired);
        }
        if !constant_time_eq(payload.sub.as_bytes(), binding.principal.as_bytes()) {
            return Err(StateError::WrongPrincipal);
        }
        if payload.method != binding.method || payload.target != binding.target {
            return Err(StateError::WrongRequest);
        }
        if !constant_time_eq(payload.args.as_bytes(), binding.arguments.as_bytes()) {
            return Err(StateError::WrongArguments);
        }
        Ok(Opened {
            phase: payload.phase,
            round: payload.round,
            nonce: payload.nonce,
            expires_ms: payload.exp,
            data: payload.data,
        })
    }
}

impl StateCodec {
    /// The id of the key that signs (the first configured).
    pub fn signing_key_id(&self) -> &str {
        &self.keys[0].0
    }

    /// Signs `body` for `purpose` (a domain label, so a tag made for one kind of token
    /// never verifies as another) with the newest key: its id and the tag.
    pub fn sign_detached(&self, purpose: &str, body: &[u8]) -> (String, Vec<u8>) {
        let (kid, secret) = &self.keys[0];
        (kid.clone(), sign(secret, &domain(purpose, body)))
    }

    /// Checks a tag made by [`StateCodec::sign_detached`] with key `kid`, in constant
    /// time.
    pub fn verify_detached(
        &self,
        purpose: &str,
        kid: &str,
        body: &[u8],
        tag: &[u8],
    ) -> Result<(), StateError> {
        let (_, secret) = self
            .keys
            .iter()
            .find(|(id, _)| id == kid)
            .ok_or(StateError::UnknownKey)?;
        let mut mac = HmacSha256::new_from_slice(secret).map_err(|_| StateError::Malformed)?;
        mac.update(&domain(purpose, body));
        mac.verify_slice(tag).map_err(|_| StateError::BadTag)
    }
}

/// A signed token (`base64url(payload) "." base64url(tag)`) taken apart.
#[derive(Debug)]
pub struct SignedParts<'a> {
    /// The first part as sent: what the tag covers.
    pub body: &'a str,
    /// The first part decoded (payload JSON, not yet trusted).
    pub raw: Vec<u8>,
    /// The tag, decoded.
    pub tag: Vec<u8>,
}

/// Splits and decodes a signed token; `None` when it is not of that shape.
pub fn split_signed(token: &str) -> Option<SignedParts<'_>> {
    let (body, tag) = token.split_once('.')?;
    Some(SignedParts {
        body,
        raw: URL_SAFE_NO_PAD.decode(body).ok()?,
        tag: URL_SAFE_NO_PAD.decode(tag).ok()?,
    })
}

fn domain(purpose: &str, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(purpose.len() + 1 + body.len());
    out.extend_from_slice(purpose.as_bytes());
    out.push(0);
    out.extend_from_slice(body);
    out
}

fn sign(secret: &[u8], body: &[u8]) -> Vec<u8> {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(body);
    mac.finalize().into_bytes().to_vec()
}

/// A digest of JSON arguments that does not depend on object key order.
pub fn digest_arguments(arguments: &Value) -> String {
    let canonical = dualera_adapters::json::canonical(arguments);
    hex(&Sha256::digest(canonical.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn binding() -> Binding {
        Binding {
            principal: "alice".into(),
            method: "tools/call".into(),
            target: "notes_delete".into(),
            arguments: digest_arguments(&json!({"title": "t", "workspaceUri": "file:///w"})),
        }
    }

    fn codec() -> StateCodec {
        StateCodec::new(vec![("k1".into(), b"secret-one".to_vec())], 1000, 16384)
    }

    #[test]
    fn roundtrip_and_bindings() {
        let c = codec();
        let s = c
            .seal(&binding(), "confirm", 1, json!({"ids": ["note-1"]}), 10)
            .unwrap();
        let o = c.open(&s, &binding(), 11).unwrap();
        assert_eq!(o.phase, "confirm");
        assert_eq!(o.data, json!({"ids": ["note-1"]}));
        assert_eq!(c.open(&s, &binding(), 1010), Err(StateError::Expired));
        let mut other = binding();
        other.principal = "mallory".into();
        assert_eq!(c.open(&s, &other, 11), Err(StateError::WrongPrincipal));
        let mut other = binding();
        other.target = "notes_create".into();
        assert_eq!(c.open(&s, &other, 11), Err(StateError::WrongRequest));
        let mut other = binding();
        other.arguments = digest_arguments(&json!({"title": "u", "workspaceUri": "file:///w"}));
        assert_eq!(c.open(&s, &other, 11), Err(StateError::WrongArguments));
    }

    #[test]
    fn tampering_is_caught() {
        let c = codec();
        let s = c.seal(&binding(), "confirm", 1, json!(null), 10).unwrap();
        for i in 0..s.len() {
            let mut bytes = s.clone().into_bytes();
            bytes[i] ^= 0x01;
            let Ok(t) = String::from_utf8(bytes) else {
                continue;
            };
            assert!(c.open(&t, &binding(), 11).is_err(), "flip at {i} accepted");
        }
    }

    #[test]
    fn rotation() {
        let old = StateCodec::new(vec![("k0".into(), b"old".to_vec())], 1000, 16384);
        let s = old.seal(&binding(), "p", 1, json!(null), 10).unwrap();
        let new = StateCodec::new(
            vec![
                ("k1".into(), b"new".to_vec()),
                ("k0".into(), b"old".to_vec()),
            ],
            1000,
            16384,
        );
        assert!(new.open(&s, &binding(), 11).is_ok());
        let gone = StateCodec::new(vec![("k1".into(), b"new".to_vec())], 1000, 16384);
        assert_eq!(gone.open(&s, &binding(), 11), Err(StateError::UnknownKey));
    }

    #[test]
    fn digest_ignores_key_order() {
        let a: Value = serde_json::from_str(r#"{"a":1,"b":{"c":2,"d":3}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"b":{"d":3,"c":2},"a":1}"#).unwrap();
        assert_eq!(digest_arguments(&a), digest_arguments(&b));
    }
}
