//! W3C Trace Context (`traceparent`, `tracestate`) carried from a host's request to
//! every upstream exchange it causes.
//!
//! Pass-through keeps the host's headers as they are. A legacy request's upstream
//! attempts are the gateway's own requests, so the driver keeps the trace context of
//! the HTTP request that carried the legacy request and sets it on each attempt,
//! MRTR retries included (those are caused by that request even though the host's
//! answers arrived on other POSTs). Without one in the headers, the request's own
//! `_meta.traceparent` (2026-07-28 `basic/index.mdx`, "OpenTelemetry trace context":
//! the one unprefixed `_meta` key pair, already forwarded in `_meta`) is also sent as
//! the header, so HTTP-level tracing upstream sees the same trace on every wire.
//!
//! The values come from the host: only well-formed ones are forwarded
//! (<https://www.w3.org/TR/trace-context/>), `tracestate` at most 512 bytes. The
//! gateway does not create spans of its own in the trace (it exports none), so it
//! forwards the parent id unchanged; its `tracing` spans carry the trace id as a field.

use crate::header_names::{TRACEPARENT, TRACESTATE};
use http::header::{HeaderMap, HeaderValue};
use serde_json::Value;

/// The longest `tracestate` forwarded (the W3C recommendation for what a vendor
/// should propagate at least).
const MAX_TRACESTATE: usize = 512;

/// A validated trace context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: HeaderValue,
    tracestate: Option<HeaderValue>,
}

/// Whether `s` is a `traceparent` this gateway forwards: version `00` exactly as
/// specified, or a later version (not `ff`) whose first four fields have the `00`
/// layout; lowercase hex; trace id and parent id not all zeros.
fn valid_traceparent(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 55 {
        return false;
    }
    let hex = |r: std::ops::Range<usize>| {
        b[r].iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    };
    let zeros = |r: std::ops::Range<usize>| b[r].iter().all(|c| *c == b'0');
    let shape = hex(0..2)
        && b[2] == b'-'
        && hex(3..35)
        && b[35] == b'-'
        && hex(36..52)
        && b[52] == b'-'
        && hex(53..55);
    if !shape || &b[0..2] == b"ff" || zeros(3..35) || zeros(36..52) {
        return false;
    }
    match &b[0..2] {
        b"00" => b.len() == 55,
        _ => b.len() == 55 || (b[55] == b'-' && b.len() <= 256 && s.is_ascii()),
    }
}

fn valid_tracestate(s: &str) -> bool {
    s.len() <= MAX_TRACESTATE && s.bytes().all(|c| (0x20..=0x7e).contains(&c))
}

impl TraceContext {
    /// From a request's headers (`None` without a valid `traceparent`; exactly one is
    /// allowed). Several `tracestate` lines are joined; an invalid one is dropped.
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        let mut parents = headers.get_all(&TRACEPARENT).iter();
        let parent = parents.next()?;
        if parents.next().is_some() || !parent.to_str().is_ok_and(valid_traceparent) {
            return None;
        }
        let states: Vec<&str> = headers
            .get_all(&TRACESTATE)
            .iter()
            .map(|v| v.to_str().unwrap_or("\u{0}"))
            .collect();
        let tracestate = (!states.is_empty())
            .then(|| states.join(","))
            .filter(|s| valid_tracestate(s))
            .and_then(|s| HeaderValue::from_str(&s).ok());
        Some(Self {
            traceparent: parent.clone(),
            tracestate,
        })
    }

    /// From a request's `params._meta` (`traceparent`, `tracestate`).
    pub fn from_meta(params: Option<&Value>) -> Option<Self> {
        let meta = params?.get("_meta")?;
        let parent = meta.get("traceparent")?.as_str()?;
        if !valid_traceparent(parent) {
            return None;
        }
        let tracestate = meta
            .get("tracestate")
            .and_then(Value::as_str)
            .filter(|s| valid_tracestate(s))
            .and_then(|s| HeaderValue::from_str(s).ok());
        Some(Self {
            traceparent: HeaderValue::from_str(parent).ok()?,
            tracestate,
        })
    }

    /// The trace id (32 hex digits), for span fields.
    pub fn trace_id(&self) -> &str {
        self.traceparent.to_str().map_or("", |s| &s[3..35])
    }

    /// The parent span id (16 hex digits), for span fields.
    pub fn parent_id(&self) -> &str {
        self.traceparent.to_str().map_or("", |s| &s[36..52])
    }

    /// The `traceparent` header value.
    pub fn traceparent(&self) -> &HeaderValue {
        &self.traceparent
    }

    /// The `tracestate` header value, if any.
    pub fn tracestate(&self) -> Option<&HeaderValue> {
        self.tracestate.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_shapes() {
        assert!(valid_traceparent(GOOD));
        assert!(!valid_traceparent(&GOOD.to_uppercase()));
        assert!(!valid_traceparent(&format!("{GOOD}-x")));
        assert!(valid_traceparent(&format!("01{}-extra", &GOOD[2..])));
        assert!(!valid_traceparent(&format!("ff{}", &GOOD[2..])));
        assert!(!valid_traceparent(
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
        ));
        assert!(!valid_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"
        ));
        assert!(!valid_traceparent("00-4bf9-00f0-01"));
    }

    #[test]
    fn from_headers_and_meta() {
        let mut h = HeaderMap::new();
        assert!(TraceContext::from_headers(&h).is_none());
        h.insert("traceparent", HeaderValue::from_static(GOOD));
        h.append("tracestate", HeaderValue::from_static("a=1"));
        h.append("tracestate", HeaderValue::from_static("b=2"));
        let t = TraceContext::from_headers(&h).unwrap();
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id(), "00f067aa0ba902b7");
        assert_eq!(t.tracestate().unwrap(), "a=1,b=2");
        h.append("traceparent", HeaderValue::from_static(GOOD));
        assert!(TraceContext::from_headers(&h).is_none(), "two traceparents");

        let p = json!({"_meta": {"traceparent": GOOD, "tracestate": "x".repeat(600)}});
        let t = TraceContext::from_meta(Some(&p)).unwrap();
        assert!(t.tracestate().is_none(), "over-long tracestate dropped");
        assert!(
            TraceContext::from_meta(Some(&json!({"_meta": {"traceparent": "nope"}}))).is_none()
        );
    }
}
