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
use super::{Begin, Fetch, ResponseCache};
use crate::upstream::{Exchange, Item, OnBehalf, Outbound, UpstreamError, UpstreamPool};
use dualera_adapters::{ErrorCode, Message, ProtocolVersion, RequestId, Response, UpstreamRole};
use http::header::HeaderValue;
use serde_json::Value;
use std::sync::Arc;

/// The discover result a new legacy session may start from, if the cache may serve it
/// to this caller for an `initialize` (see the module docs).
pub(crate) fn discover_for_initialize(
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

/// One upstream exchange of a legacy session, through the cache where it may be: the
/// route's pool's [`Exchange`] (a cache hit is an exchange already answered, and
/// counts as accepted), with the cache's layer on it (store on complete, a stale entry
/// when the upstream fails).
pub(crate) async fn exchange(
    cache: &Arc<ResponseCache>,
    upstream: &UpstreamPool,
    role: &UpstreamRole,
    request: &Outbound,
    on_behalf: OnBehalf<'_>,
    params: &[(String, String)],
) -> Result<Exchange, UpstreamError> {
    let r = match request.message() {
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
        let exchange = upstream.exchange(request, on_behalf, params).await?;
        return Ok(match r.filter(|r| r.method == "tools/call") {
            Some(r) => watch_tool_call(cache, r, exchange),
            None => exchange,
        });
    };
    let caller = Caller::from_authorization(on_behalf.authorization);
    let fetch = match role {
        UpstreamRole::Discover if caller.is_authenticated() => cache.revalidate(key, caller),
        UpstreamRole::ToolsRefresh { .. } => cache.revalidate(key, caller),
        _ => match cache.begin(key, caller, false).await {
            Begin::Hit(entry) => {
                return Ok(Exchange::answered(Message::Response(Response::result(
                    r.id.clone(),
                    (*entry.value()).clone(),
                ))));
            }
            Begin::Fetch(f) => f,
        },
    };
    let mut layer = Fill {
        cache: cache.clone(),
        fetch,
        id: r.id.clone(),
        notified: false,
    };
    match upstream.exchange(request, on_behalf, params).await {
        Ok(exchange) => Ok(exchange.map(move |item| layer.pass(item))),
        Err(e) => match layer.stale(&e) {
            Some(stale) => Ok(Exchange::answered(stale)),
            None => Err(e),
        },
    }
}

/// The cache's layer on one fetched exchange: the response is stored when it may be
/// (and nothing streamed before it), and a failure is answered with the stale entry
/// when there is one.
struct Fill {
    cache: Arc<ResponseCache>,
    fetch: Fetch,
    id: RequestId,
    notified: bool,
}

impl Fill {
    fn pass(&mut self, item: Item) -> Item {
        match item {
            Ok(Message::Response(resp)) => {
                let failed = matches!(&resp.outcome, Err(e) if e.code == ErrorCode::INTERNAL_ERROR);
                if failed {
                    if let Some(stale) = self.stale_entry() {
                        return Ok(stale);
                    }
                }
                if let (Ok(result), false) = (&resp.outcome, self.notified) {
                    self.cache.store_result(&self.fetch, result);
                }
                Ok(Message::Response(resp))
            }
            Ok(other) => {
                self.notified = true;
                Ok(other)
            }
            Err(e) => match self.stale(&e) {
                Some(stale) => Ok(stale),
                None => Err(e),
            },
        }
    }

    /// The stale entry for a failed exchange. A refusal of the caller's credentials
    /// (401/403) is the upstream's verdict, never a failure to paper over.
    fn stale(&self, e: &UpstreamError) -> Option<Message> {
        if matches!(e, UpstreamError::Denied(_)) {
            return None;
        }
        self.stale_entry()
    }

    fn stale_entry(&self) -> Option<Message> {
        if self.notified {
            return None;
        }
        let stale = self.fetch.stale.as_ref()?;
        self.cache.served_stale();
        tracing::info!("upstream failed; stale cache entry served");
        Some(Message::Response(Response::result(
            self.id.clone(),
            (*stale.value()).clone(),
        )))
    }
}

/// A `tools/call`, watched for the error that invalidates a cached `tools/list`.
fn watch_tool_call(
    cache: &Arc<ResponseCache>,
    request: &dualera_adapters::Request,
    exchange: Exchange,
) -> Exchange {
    let Some(tool) = request
        .params
        .as_ref()
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        return exchange;
    };
    let cache = cache.clone();
    exchange.inspect(move |m| {
        if let Message::Response(Response {
            outcome: Err(e), ..
        }) = m
        {
            cache.tool_call_failed(&tool, e.code.0);
        }
    })
}
