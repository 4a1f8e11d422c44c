//! A route in front of an upstream that cannot be reconfigured: the route's own
//! public URL stands in for the upstream's canonical URI toward the host
//! (`[[gateway.routes]] public_url`, `resource_metadata`, `token_exchange`).
//!
//! Why: by default the gateway relays the upstream's Protected Resource Metadata and
//! challenges verbatim (DESIGN.md, "Remote upstreams"), which is right when the
//! upstream was configured with the gateway's URL as its resource. A third-party
//! upstream names its own URL instead, and SDK clients refuse metadata whose
//! `resource` is not the server they connected to (2025-11-25
//! `basic/authorization.mdx`, RFC 9728 §3.3: the client MUST check that `resource`
//! matches the URL it used). With `resource_metadata = "rewrite"` the route serves
//! the upstream's document with `resource` set to `public_url` (everything else
//! kept) and points the `resource_metadata` of the upstream's challenges at its own
//! copy; with `token_exchange` the host's token (audience: the gateway) is traded for
//! one whose audience is the upstream before anything goes upstream
//! ([`TokenExchanger`]).
//!
//! This happens once, where the listener hands a request to the route, so every
//! upstream path (pass-through, legacy sessions, HTTP+SSE, WebSocket, the gateway's
//! probes on a request's behalf) sees only the exchanged token. Without either
//! setting the route is exactly the transparent relay.

use super::token_exchange::{Refusal, TokenExchanger};
use crate::body::{full, GatewayBody};
use crate::config::{ConfigError, ResourceMetadata, RouteSection};
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use serde_json::Value;

/// Largest metadata document rewritten.
const MAX_METADATA_BYTES: usize = 64 * 1024;

/// A route's public identity toward hosts.
#[derive(Debug)]
pub struct PublicResource {
    public_url: String,
    metadata_url: String,
    rewrite: bool,
    exchange: Option<TokenExchanger>,
}

impl PublicResource {
    /// What a `[[gateway.routes]]` entry asks for; `None` for the transparent relay.
    pub fn from_route(r: &RouteSection) -> Result<Option<Self>, ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid { reason };
        let rewrite = r.resource_metadata == Some(ResourceMetadata::Rewrite);
        if !rewrite && r.token_exchange.is_none() {
            if r.public_url.is_some() {
                return Err(invalid(
                    "public_url is used only with resource_metadata = \"rewrite\" or token_exchange"
                        .into(),
                ));
            }
            return Ok(None);
        }
        let Some(public_url) = &r.public_url else {
            return Err(invalid(
                "resource_metadata = \"rewrite\" and token_exchange need public_url (this route's URL as hosts reach it)"
                    .into(),
            ));
        };
        let uri: Uri = public_url
            .parse()
            .map_err(|e| invalid(format!("public_url {public_url:?}: {e}")))?;
        let (Some(scheme @ ("http" | "https")), Some(authority)) =
            (uri.scheme_str(), uri.authority())
        else {
            return Err(invalid(format!(
                "public_url {public_url:?} must be an absolute http(s) URL"
            )));
        };
        let metadata_url = format!(
            "{scheme}://{authority}{}{}",
            super::auth::METADATA_PATH,
            uri.path().trim_end_matches('/')
        );
        let exchange = r
            .token_exchange
            .as_ref()
            .map(TokenExchanger::from_config)
            .transpose()?;
        Ok(Some(Self {
            public_url: public_url.clone(),
            metadata_url,
            rewrite,
            exchange,
        }))
    }

    /// Whether the upstream's metadata and challenges are rewritten.
    pub fn rewrites(&self) -> bool {
        self.rewrite
    }

    /// The request as it goes on to the route: with token exchange, its
    /// `Authorization` replaced by the exchanged one; or the host's answer when there
    /// is none to send.
    pub async fn prepare<B>(
        &self,
        mut req: Request<B>,
    ) -> Result<Request<B>, Response<GatewayBody>> {
        let Some(exchange) = &self.exchange else {
            return Ok(req);
        };
        match exchange
            .authorization_for(req.headers().get(header::AUTHORIZATION))
            .await
        {
            Ok(Some(authorization)) => {
                req.headers_mut()
                    .insert(header::AUTHORIZATION, authorization);
                Ok(req)
            }
            Ok(None) => Ok(req),
            Err(e) => Err(self.refusal(&Refusal::from(&e))),
        }
    }

    /// The route's answer as the host gets it: with `rewrite`, the `resource_metadata`
    /// of a 401/403 challenge names this route's metadata, not the upstream's.
    pub fn finish(&self, mut resp: Response<GatewayBody>) -> Response<GatewayBody> {
        let denied = matches!(
            resp.status(),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        );
        if !self.rewrite || !denied {
            return resp;
        }
        let challenges: Vec<HeaderValue> = resp
            .headers()
            .get_all(header::WWW_AUTHENTICATE)
            .iter()
            .map(|v| {
                v.to_str()
                    .ok()
                    .and_then(|s| point_at(s, &self.metadata_url))
                    .and_then(|s| HeaderValue::from_str(&s).ok())
                    .unwrap_or_else(|| v.clone())
            })
            .collect();
        resp.headers_mut().remove(header::WWW_AUTHENTICATE);
        for c in challenges {
            resp.headers_mut().append(header::WWW_AUTHENTICATE, c);
        }
        resp
    }

    /// The upstream's metadata document as this route serves it: with `rewrite` and
    /// a JSON object body, `resource` set to `public_url` and everything else kept;
    /// anything else (an error status, not JSON) as it came.
    pub async fn metadata(&self, resp: Response<GatewayBody>) -> Response<GatewayBody> {
        if !self.rewrite || resp.status() != StatusCode::OK {
            return resp;
        }
        let (mut parts, body) = resp.into_parts();
        let Some(bytes) = read_bounded(body).await else {
            return super::text(
                StatusCode::BAD_GATEWAY,
                "the upstream's metadata is unreadable or too large\n",
            );
        };
        let rewritten = match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(mut doc)) => {
                doc.insert("resource".into(), Value::String(self.public_url.clone()));
                serde_json::to_vec(&doc).ok()
            }
            _ => None,
        };
        let body = match rewritten {
            Some(b) => {
                parts.headers.remove(header::CONTENT_LENGTH);
                parts.headers.remove(header::ETAG);
                b.into()
            }
            None => bytes,
        };
        Response::from_parts(parts, full(body))
    }

    /// A refused exchange as the host's answer: the status, and on 401/403 a challenge
    /// naming this route's metadata (RFC 6750 §3, RFC 9728 §5.1).
    fn refusal(&self, r: &Refusal) -> Response<GatewayBody> {
        let mut resp = Response::new(full(format!("{}\n", r.description)));
        *resp.status_mut() = r.status;
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        if let Some(error) = r.error {
            let challenge = format!(
                "Bearer resource_metadata=\"{}\", error=\"{error}\", error_description=\"{}\"",
                self.metadata_url,
                r.description.replace(['"', '\\'], "'")
            );
            if let Ok(v) = HeaderValue::from_str(&challenge) {
                resp.headers_mut().insert(header::WWW_AUTHENTICATE, v);
            }
        }
        resp
    }
}

/// A body of at most [`MAX_METADATA_BYTES`]; `None` when longer or broken.
async fn read_bounded(mut body: GatewayBody) -> Option<bytes::Bytes> {
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|e| e.to_string()) else {
            tracing::warn!("upstream metadata body failed");
            return None;
        };
        if let Ok(data) = data.into_data() {
            if buf.len() + data.len() > MAX_METADATA_BYTES {
                tracing::warn!(limit = MAX_METADATA_BYTES, "upstream metadata too large");
                return None;
            }
            buf.extend_from_slice(&data);
        }
    }
    Some(buf.into())
}

/// A challenge with its `resource_metadata` parameter (quoted or a token) set to
/// `url`; `None` when it has none.
fn point_at(challenge: &str, url: &str) -> Option<String> {
    const KEY: &str = "resource_metadata=";
    let lower = challenge.to_ascii_lowercase();
    let start = lower
        .match_indices(KEY)
        .map(|(i, _)| i)
        .find(|&i| i == 0 || matches!(challenge.as_bytes()[i - 1], b' ' | b',' | b'\t'))?;
    let value = start + KEY.len();
    let rest = &challenge[value..];
    let len = if let Some(quoted) = rest.strip_prefix('"') {
        let mut escaped = false;
        let end = quoted.char_indices().find_map(|(i, c)| {
            let close = c == '"' && !escaped;
            escaped = c == '\\' && !escaped;
            close.then_some(i)
        })?;
        end + 2
    } else {
        rest.find([',', ' ', '\t']).unwrap_or(rest.len())
    };
    Some(format!(
        "{}\"{url}\"{}",
        &challenge[..value],
        &challenge[value + len..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn route(extra: &str) -> Result<Option<PublicResource>, ConfigError> {
        let c = Config::parse(&format!(
            "[[gateway.routes]]\npath = \"/notes/mcp\"\nupstream = \"https://up.example/mcp\"\n{extra}"
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        PublicResource::from_route(&c.gateway.routes[0])
    }

    #[test]
    fn settings_are_checked() {
        assert!(route("").unwrap().is_none(), "the transparent relay");
        assert!(route("resource_metadata = \"relay\"").unwrap().is_none());
        assert!(
            route("public_url = \"https://gw.example/notes/mcp\"").is_err(),
            "unused"
        );
        assert!(
            route("resource_metadata = \"rewrite\"").is_err(),
            "no public_url"
        );
        assert!(route("resource_metadata = \"rewrite\"\npublic_url = \"/notes/mcp\"").is_err());
        assert!(Config::parse(
            "[[gateway.routes]]\npath = \"/a\"\nupstream = \"https://u/mcp\"\nresource_metadata = \"copy\"\n"
        )
        .is_err());
        let p =
            route("resource_metadata = \"rewrite\"\npublic_url = \"https://gw.example/notes/mcp\"")
                .unwrap()
                .unwrap();
        assert_eq!(
            p.metadata_url,
            "https://gw.example/.well-known/oauth-protected-resource/notes/mcp"
        );
        assert!(p.rewrites() && p.exchange.is_none());
        let x = route(
            "public_url = \"https://gw.example/notes/mcp\"\n[gateway.routes.token_exchange]\n\
             token_endpoint = \"https://as.example/token\"\nclient_id = \"gw\"\n\
             client_secret = \"s\"\nresource = \"https://up.example/mcp\"\n",
        )
        .unwrap()
        .unwrap();
        assert!(!x.rewrites() && x.exchange.is_some());
        assert!(Config::parse(
            "[[gateway.routes]]\npath = \"/a\"\nupstream = \"https://u/mcp\"\n\
             [gateway.routes.token_exchange]\ntoken_endpoint = \"https://as.example/token\"\n\
             client_id = \"gw\"\nclient_secret = \"s\"\nresource = \"https://u/mcp\"\nbogus = 1\n"
        )
        .is_err());
    }

    #[test]
    fn challenges_point_at_the_routes_metadata() {
        let url = "https://gw.example/.well-known/oauth-protected-resource/mcp";
        assert_eq!(
            point_at(
                "Bearer resource_metadata=\"https://up.example/.well-known/oauth-protected-resource/mcp\", error=\"invalid_token\"",
                url
            )
            .unwrap(),
            format!("Bearer resource_metadata=\"{url}\", error=\"invalid_token\"")
        );
        assert_eq!(
            point_at("Bearer error=\"x\", Resource_Metadata=https://up/x", url).unwrap(),
            format!("Bearer error=\"x\", Resource_Metadata=\"{url}\"")
        );
        assert_eq!(
            point_at("Bearer realm=\"a\\\"b\", resource_metadata=\"q\\\"x\"", url).unwrap(),
            format!("Bearer realm=\"a\\\"b\", resource_metadata=\"{url}\"")
        );
        assert_eq!(point_at("Bearer error=\"invalid_token\"", url), None);
        assert_eq!(point_at("Bearer x_resource_metadata=\"a\"", url), None);
    }

    #[tokio::test]
    async fn metadata_keeps_everything_but_resource() {
        let p =
            route("resource_metadata = \"rewrite\"\npublic_url = \"https://gw.example/notes/mcp\"")
                .unwrap()
                .unwrap();
        let upstream = br#"{"resource":"https://up.example/mcp","authorization_servers":["https://as.example"],"scopes_supported":["a"]}"#;
        let mut resp = Response::new(full(&upstream[..]));
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(upstream.len()));
        let out = p.metadata(resp).await;
        assert!(out.headers().get(header::CONTENT_LENGTH).is_none());
        let body = out.into_body().collect().await.unwrap().to_bytes();
        let doc: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(doc["resource"], "https://gw.example/notes/mcp");
        assert_eq!(doc["authorization_servers"][0], "https://as.example");
        assert_eq!(doc["scopes_supported"][0], "a");
        let mut not_found = Response::new(full("nope"));
        *not_found.status_mut() = StatusCode::NOT_FOUND;
        let out = p.metadata(not_found).await;
        assert_eq!(out.status(), StatusCode::NOT_FOUND);
    }
}
