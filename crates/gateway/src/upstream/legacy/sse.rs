//! A legacy session over the 2024-11-05 HTTP+SSE transport (`basic/transports.mdx` of
//! 2024-11-05): the client opens an SSE stream with `GET`; the server's first event,
//! `endpoint`, names the URI the client POSTs its messages to; everything the server
//! says (responses included) comes back as `message` events on that one stream.

use super::{pump_events, Core, LegacyError, SessionOptions, SseBody, OPEN_TIMEOUT};
use crate::body::full;
use crate::upstream::{OnBehalf, UpstreamClient, UpstreamError};
use bytes::Bytes;
use dualera_adapters::jsonrpc::Message;
use http::header::{self, HeaderValue};
use http::{Method, StatusCode, Uri};
use std::sync::Arc;
use tracing::debug;

/// Longest `endpoint` event accepted.
const MAX_ENDPOINT: usize = 2048;

#[derive(Debug)]
pub(super) struct Sse {
    client: UpstreamClient,
    endpoint: Uri,
    host: Option<HeaderValue>,
    options: SessionOptions,
}

impl Sse {
    /// `GET uri` and wait (bounded) for the `endpoint` event; the stream's body, to be
    /// pumped from there on.
    pub(super) async fn open(
        client: UpstreamClient,
        uri: Uri,
        options: SessionOptions,
    ) -> Result<(Self, SseBody), LegacyError> {
        let host = uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok());
        let mut b = http::Request::builder()
            .method(Method::GET)
            .uri(uri.clone())
            .header(header::ACCEPT, "text/event-stream");
        if let Some(h) = &host {
            b = b.header(header::HOST, h.clone());
        }
        if let Some(a) = &options.authorization {
            b = b.header(header::AUTHORIZATION, a.clone());
        }
        let req = b
            .body(crate::body::empty())
            .map_err(|e| LegacyError::protocol(e.to_string()))?;
        let opened = async {
            let resp = client
                .client()
                .request(req)
                .await
                .map_err(|e| LegacyError::Upstream(UpstreamError::from_client(&e)))?;
            let status = resp.status();
            let sse = resp
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            if !status.is_success() || !sse {
                return Err(LegacyError::Upstream(UpstreamError::Status {
                    status: status.as_u16(),
                }));
            }
            let mut body = SseBody::new(resp.into_body(), options.max_message);
            while let Some(ev) = body.next().await {
                let ev = ev?;
                if ev.event == "endpoint" {
                    let endpoint = resolve(&uri, ev.data.trim())?;
                    return Ok((endpoint, body));
                }
            }
            Err(LegacyError::closed(
                "the SSE stream ended before its endpoint event",
            ))
        };
        let (endpoint, body) = tokio::time::timeout(OPEN_TIMEOUT, opened)
            .await
            .map_err(|_| LegacyError::closed("no endpoint event in time"))??;
        Ok((
            Self {
                client,
                endpoint,
                host,
                options,
            },
            body,
        ))
    }

    pub(super) fn endpoint(&self) -> &Uri {
        &self.endpoint
    }

    /// POSTs one message to the endpoint; its answer comes on the stream.
    pub(super) async fn send(
        &self,
        core: &Core,
        message: &Message,
        on_behalf: OnBehalf<'_>,
    ) -> Result<(), LegacyError> {
        let mut b = http::Request::builder()
            .method(Method::POST)
            .uri(self.endpoint.clone())
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(h) = &self.host {
            b = b.header(header::HOST, h.clone());
        }
        if let Some(headers) = b.headers_mut() {
            if let Some(a) = &self.options.authorization {
                headers.insert(header::AUTHORIZATION, a.clone());
            }
            on_behalf.apply(headers);
        }
        let req = b
            .body(full(Bytes::from(message.to_vec())))
            .map_err(|e| LegacyError::protocol(e.to_string()))?;
        let resp = self
            .client
            .client()
            .request(req)
            .await
            .map_err(|e| LegacyError::Upstream(UpstreamError::from_client(&e)))?;
        match resp.status() {
            s if s.is_success() => Ok(()),
            StatusCode::NOT_FOUND => {
                core.fail(LegacyError::Expired).await;
                Err(LegacyError::Expired)
            }
            s => Err(LegacyError::Upstream(UpstreamError::Status {
                status: s.as_u16(),
            })),
        }
    }
}

/// Reads the stream after its `endpoint` event: every `message` event to the consumer;
/// the end of the stream ends the session.
pub(super) async fn pump(mut body: SseBody, core: Arc<Core>) {
    match pump_events(&mut body, &core, None, |_| false).await {
        Err(None) => {}
        Err(Some(e)) => {
            debug!(error = %e, "upstream HTTP+SSE stream broke");
            core.fail(e).await;
        }
        Ok(()) => {
            core.fail(LegacyError::closed("the upstream closed its SSE stream"))
                .await;
        }
    }
}

/// The `endpoint` event's URI resolved against the stream's URL. Only the stream's
/// own origin is accepted: the gateway sends the host's credentials there, and a
/// server must not be able to redirect them elsewhere.
fn resolve(base: &Uri, endpoint: &str) -> Result<Uri, LegacyError> {
    if endpoint.is_empty() || endpoint.len() > MAX_ENDPOINT {
        return Err(LegacyError::protocol(
            "the endpoint event is empty or too long",
        ));
    }
    let bad = |why: &str| LegacyError::protocol(format!("endpoint event {endpoint:?}: {why}"));
    let (Some(scheme), Some(authority)) = (base.scheme(), base.authority()) else {
        return Err(bad("the stream's URL has no origin"));
    };
    let absolute = if endpoint.starts_with("http://") || endpoint.starts_with("https://") {
        let u: Uri = endpoint.parse().map_err(|_| bad("not a URI"))?;
        if u.scheme() != Some(scheme) || u.authority() != Some(authority) {
            return Err(bad("names another origin"));
        }
        return Ok(u);
    } else if endpoint.starts_with("//") {
        return Err(bad("names another origin"));
    } else if endpoint.starts_with('/') {
        format!("{scheme}://{authority}{endpoint}")
    } else {
        let path = base.path();
        let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
        format!("{scheme}://{authority}{dir}/{endpoint}")
    };
    absolute.parse().map_err(|_| bad("not a URI"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_resolve_against_the_stream_and_stay_on_its_origin() {
        let base: Uri = "http://127.0.0.1:9/a/sse".parse().unwrap();
        assert_eq!(
            resolve(&base, "/messages/?session_id=1").unwrap(),
            "http://127.0.0.1:9/messages/?session_id=1"
        );
        assert_eq!(
            resolve(&base, "messages?x=2").unwrap(),
            "http://127.0.0.1:9/a/messages?x=2"
        );
        assert_eq!(
            resolve(&base, "http://127.0.0.1:9/m").unwrap(),
            "http://127.0.0.1:9/m"
        );
        for bad in [
            "http://evil.example/m",
            "https://127.0.0.1:9/m",
            "//evil.example/m",
            "",
        ] {
            assert!(resolve(&base, bad).is_err(), "{bad:?}");
        }
    }
}
