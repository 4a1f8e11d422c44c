//! The cache on the legacy path: a session's upstream calls for cacheable methods are
//! answered from the same entries pass-through uses (the session machine then applies
//! its per-revision downgrade to the result as to any upstream answer), and what they
//! fetch is stored for everyone it may be served to.
//!
//! Authorization: `initialize` is where a legacy host gets a session, so a cached
//! `server/discover` must never stand in for the upstream's verdict on a caller's
//! credentials. An `initialize` with credentials always asks the upstream with them
//! ([`ResponseCache::revalidate`]); one without may use an entry that an anonymous
//! request obtained (the upstream answered such a caller itself). The same bypass
//! serves the machine's `tools/list` refresh after a `-32020`: its point is a fresh list.

use super::key::{Cacheable, Caller, RequestKey};
use super::{Begin, ResponseCache};
use crate::gateway::upstream::{OnBehalf, UpstreamError};
use crate::gateway::Gateway;
use bytes::Bytes;
use dualera_adapters::{ErrorCode, Message, ProtocolVersion, Response, UpstreamRole};
use http::header::HeaderValue;
use serde_json::Value;
use std::sync::Arc;

/// The discover result a new legacy session may start from, if the cache may serve it
/// to this caller for an `initialize` (see the module docs).
pub(in crate::gateway) fn discover_for_initialize(
    cache: &ResponseCache,
    authorization: Option<&HeaderValue>,
) -> Option<Arc<Value>> {
    if !cache.enabled() || authorization.is_some() {
        return None;
    }
    let key = RequestKey::from_params(
        cache.route(),
        Cacheable::Discover,
        ProtocolVersion::V2026_07_28,
        None,
    )?;
    cache.peek(&key, &Caller::anonymous()).map(|e| e.value())
}

/// One upstream exchange of a legacy session, through the cache where it may be.
/// Same contract as [`Upstream::exchange_observed`](crate::gateway::Upstream::exchange_observed)
/// (a cache hit counts as accepted).
pub(in crate::gateway) async fn exchange(
    gw: &Gateway,
    role: &UpstreamRole,
    request: &Message,
    on_behalf: OnBehalf<'_>,
    params: &[(String, String)],
    on_head: impl FnOnce(),
    mut on_message: impl FnMut(Message),
) -> Result<(), UpstreamError> {
    let cache = &gw.cache;
    let r = match request {
        Message::Request(r) if cache.enabled() && !matches!(role, UpstreamRole::Listen) => Some(r),
        _ => None,
    };
    let key = r.and_then(|r| {
        let m = Cacheable::from_method(&r.method)?;
        RequestKey::from_params(
            cache.route(),
            m,
            ProtocolVersion::V2026_07_28,
            r.params.as_ref(),
        )
    });
    let (Some(r), Some(key)) = (r, key) else {
        if r.is_some_and(|r| r.method == "tools/call") {
            return tool_call(gw, request, on_behalf, params, on_head, on_message).await;
        }
        return gw
            .upstream
            .exchange_observed(request, on_behalf, params, on_head, on_message)
            .await;
    };
    let caller = Caller::from_authorization(on_behalf.authorization);
    let fetch = match role {
        UpstreamRole::Discover if caller.is_authenticated() => cache.revalidate(key, caller),
        UpstreamRole::ToolsRefresh { .. } => cache.revalidate(key, caller),
        _ => match cache.begin(key, caller, false).await {
            Begin::Hit(entry) => {
                on_head();
                on_message(Message::Response(Response::result(
                    r.id.clone(),
                    (*entry.value()).clone(),
                )));
                return Ok(());
            }
            Begin::Fetch(f) => f,
        },
    };
    let mut notified = false;
    let mut last = None;
    let outcome = gw
        .upstream
        .exchange_observed(request, on_behalf, params, on_head, |m| match m {
            Message::Response(resp) => last = Some(resp),
            other => {
                notified = true;
                on_message(other);
            }
        })
        .await;
    // A refusal of the caller's credentials (401/403) is the upstream's verdict, never
    // a failure to paper over with a stale entry.
    let failed = outcome
        .as_ref()
        .is_err_and(|e| !matches!(e, UpstreamError::Denied(_)))
        || matches!(&last, Some(Response { outcome: Err(e), .. }) if e.code == ErrorCode::INTERNAL_ERROR);
    if failed && !notified {
        if let Some(stale) = &fetch.stale {
            cache.served_stale();
            tracing::info!("upstream failed; stale cache entry served");
            on_message(Message::Response(Response::result(
                r.id.clone(),
                (*stale.value()).clone(),
            )));
            return Ok(());
        }
    }
    if let Some(resp) = last {
        if let (Ok(result), false) = (&resp.outcome, notified) {
            cache.store(&fetch, frame(result), false);
        }
        on_message(Message::Response(resp));
    }
    outcome
}

/// A response around `result` in the shape [`ResponseCache::store`] reads.
fn frame(result: &Value) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(br#"{"id":0,"jsonrpc":"2.0","result":"#);
    if serde_json::to_writer(&mut out, result).is_err() {
        return Bytes::new();
    }
    out.push(b'}');
    Bytes::from(out)
}

/// A `tools/call`, watched for the error that invalidates a cached `tools/list`.
async fn tool_call(
    gw: &Gateway,
    request: &Message,
    on_behalf: OnBehalf<'_>,
    params: &[(String, String)],
    on_head: impl FnOnce(),
    mut on_message: impl FnMut(Message),
) -> Result<(), UpstreamError> {
    let tool = match request {
        Message::Request(r) => r
            .params
            .as_ref()
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    };
    let mut failed_code = None;
    let outcome = gw
        .upstream
        .exchange_observed(request, on_behalf, params, on_head, |m| {
            if let Message::Response(Response {
                outcome: Err(e), ..
            }) = &m
            {
                failed_code = Some(e.code.0);
            }
            on_message(m);
        })
        .await;
    if let (Some(tool), Some(code)) = (tool, failed_code) {
        gw.cache.tool_call_failed(&tool, code);
    }
    outcome
}
