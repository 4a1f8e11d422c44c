//! Routes: several upstreams behind one listener, by path (DESIGN.md, "Operating").
//!
//! A route is an MCP endpoint path (`/mcp`, `/notes/mcp`) and everything that serves
//! it: its upstream pool, its legacy sessions, its response cache (whose keys carry the
//! route), its metrics label. The listener looks a request's path up once in a table
//! built at start; every path a route answers maps to the route and to which of its
//! endpoints was asked for:
//!
//! | path | endpoint |
//! |---|---|
//! | `<route>` | Streamable HTTP: modern pass-through and legacy sessions |
//! | `<route>/sse`, `<route>/messages` | the 2024-11-05 HTTP+SSE transport |
//! | `<route>/ws` | WebSocket |
//! | `/.well-known/oauth-protected-resource<route>` | the upstream's Protected Resource Metadata (RFC 9728 §3.1: the well-known string goes between host and path) |
//!
//! The `/mcp` route also keeps the paths it had before routes existed: `/sse`,
//! `/messages`, `/ws`, and the root `/.well-known/oauth-protected-resource`.
//! Any other path is a 404 naming the routes.
//!
//! [`from_config`] builds the routes a configuration describes: `--upstream` (given
//! once per instance), `--upstream-cmd` or `[[gateway.upstreams]]` is the route `/mcp`;
//! each `[[gateway.routes]]` entry is one more, with its own instances, TLS options and
//! limits.

use super::public_resource::PublicResource;
use super::upstream::{HttpUpstream, StdioUpstream, Upstream, UpstreamClient, UpstreamOptions};
use super::{GatewayConfig, RouteSpec, UpstreamPool};
use crate::config::{Config, RouteSection};
use std::collections::HashMap;
use std::path::PathBuf;

/// The route the `--upstream` flag (and `[[gateway.upstreams]]`) configures.
pub const DEFAULT_ROUTE: &str = crate::endpoint::ENDPOINT;
/// The Protected Resource Metadata well-known path (RFC 9728 §3).
pub(crate) const METADATA_PREFIX: &str = super::auth::METADATA_PATH;
/// Suffixes of a route's legacy single-channel endpoints.
pub(crate) const SSE_SUFFIX: &str = "/sse";
pub(crate) const MESSAGES_SUFFIX: &str = "/messages";
pub(crate) const WEBSOCKET_SUFFIX: &str = "/ws";
/// Longest route path.
const MAX_PATH: usize = 256;

/// Which of a route's endpoints a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// Streamable HTTP (modern pass-through and legacy sessions).
    Mcp,
    /// `GET` opens a 2024-11-05 HTTP+SSE session.
    Sse,
    /// `POST` one message into an HTTP+SSE session.
    Messages,
    /// A WebSocket upgrade.
    WebSocket,
    /// The upstream's Protected Resource Metadata, relayed.
    Metadata,
}

/// Why a set of routes cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// A path breaks the rules.
    #[error("route path {path:?}: {reason}")]
    BadPath {
        /// The path.
        path: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// Two routes (or a route and another's endpoint) claim one path.
    #[error("route paths collide: {path:?} is claimed by {first:?} and {second:?}")]
    Collision {
        /// The path claimed twice.
        path: String,
        /// One route.
        first: String,
        /// The other.
        second: String,
    },
    /// No route at all.
    #[error(
        "no route: give --upstream, --upstream-cmd, [[gateway.upstreams]] or [[gateway.routes]]"
    )]
    Empty,
    /// A route's upstream cannot be built.
    #[error("route {route}: {reason}")]
    Upstream {
        /// The route.
        route: String,
        /// What is wrong with its upstream.
        reason: String,
    },
}

/// What the command line says about the `/mcp` route's upstream.
#[derive(Debug, Clone, Default)]
pub struct UpstreamFlags {
    /// `--upstream URL`, once per instance.
    pub urls: Vec<String>,
    /// `--upstream-cmd CMD`.
    pub cmd: Option<String>,
    /// `--upstream-ca PEM`: the CA bundle of every route that names none itself.
    pub ca: Option<PathBuf>,
}

/// The routes `config` and `flags` describe, in order (`/mcp` first when it is one),
/// each with its upstream pool built (one HTTP client per route, shared by its
/// instances) and its settings: `base` with the route's own limits.
pub fn from_config(
    config: &Config,
    flags: &UpstreamFlags,
    base: &GatewayConfig,
) -> Result<Vec<RouteSpec>, RouteError> {
    let g = &config.gateway;
    let configured_mcp = g.routes.iter().position(|r| r.path == DEFAULT_ROUTE);
    let bad = |route: &str, reason: String| RouteError::Upstream {
        route: route.to_owned(),
        reason,
    };
    if !g.upstreams.is_empty() && configured_mcp.is_some() {
        return Err(bad(
            DEFAULT_ROUTE,
            "given by both [[gateway.upstreams]] and a [[gateway.routes]] entry".into(),
        ));
    }
    let default_ca = flags.ca.clone().or_else(|| g.upstream_ca.clone());
    let mut specs = Vec::new();
    // The /mcp route from the flags or [[gateway.upstreams]]; a [[gateway.routes]]
    // entry for /mcp still gives its limits and TLS options (the flags replace only its
    // instances).
    let entry = configured_mcp.map(|i| &g.routes[i]);
    let source = if !flags.urls.is_empty() {
        Some(Source::Urls(flags.urls.clone()))
    } else if let Some(cmd) = &flags.cmd {
        Some(Source::Command(cmd.clone()))
    } else if !g.upstreams.is_empty() {
        Some(Source::Urls(
            g.upstreams.iter().map(|u| u.url.clone()).collect(),
        ))
    } else {
        None
    };
    if let Some(source) = source {
        let options = options_for(entry, default_ca.clone(), g.upstream_http2);
        let config = match entry {
            Some(e) => with_public_resource(base.for_route(e), e)?,
            None => base.clone(),
        };
        specs.push(spec(DEFAULT_ROUTE, source, &options, config)?);
    }
    for r in &g.routes {
        if r.path == DEFAULT_ROUTE && !specs.is_empty() {
            continue;
        }
        let source = match (&r.upstream, &r.upstream_cmd) {
            (Some(u), None) => Source::Urls(u.urls()),
            (None, Some(cmd)) => Source::Command(cmd.clone()),
            _ => {
                return Err(bad(
                    &r.path,
                    "give exactly one of upstream and upstream_cmd".into(),
                ))
            }
        };
        let options = options_for(Some(r), default_ca.clone(), g.upstream_http2);
        let config = with_public_resource(base.for_route(r), r)?;
        specs.push(spec(&r.path, source, &options, config)?);
    }
    if specs.is_empty() {
        return Err(RouteError::Empty);
    }
    Ok(specs)
}

/// A route's settings with its public identity (`public_url`, `resource_metadata`,
/// `token_exchange`), when it has one.
fn with_public_resource(
    mut config: GatewayConfig,
    r: &RouteSection,
) -> Result<GatewayConfig, RouteError> {
    config.public_resource = PublicResource::from_route(r)
        .map_err(|e| RouteError::Upstream {
            route: r.path.clone(),
            reason: e.to_string(),
        })?
        .map(std::sync::Arc::new);
    Ok(config)
}

/// Where a route's instances come from.
enum Source {
    Urls(Vec<String>),
    Command(String),
}

fn options_for(
    entry: Option<&RouteSection>,
    default_ca: Option<PathBuf>,
    default_http2: Option<crate::config::UpstreamHttp2>,
) -> UpstreamOptions {
    UpstreamOptions {
        extra_ca: entry.and_then(|e| e.upstream_ca.clone()).or(default_ca),
        http2: entry
            .and_then(|e| e.upstream_http2)
            .or(default_http2)
            .unwrap_or_default(),
    }
}

fn spec(
    path: &str,
    source: Source,
    options: &UpstreamOptions,
    config: GatewayConfig,
) -> Result<RouteSpec, RouteError> {
    check_path(path)?;
    let bad = |reason: String| RouteError::Upstream {
        route: path.to_owned(),
        reason,
    };
    let instances = match source {
        Source::Command(cmd) => {
            let mut words = cmd.split_whitespace().map(str::to_owned);
            let program = words
                .next()
                .ok_or_else(|| bad("upstream_cmd is empty".into()))?;
            vec![Upstream::Stdio(StdioUpstream::spawn(
                program,
                words.collect(),
            ))]
        }
        Source::Urls(urls) => {
            let client = UpstreamClient::new(options).map_err(|e| bad(e.to_string()))?;
            let mut seen = std::collections::HashSet::new();
            let mut out = Vec::with_capacity(urls.len());
            for url in urls {
                let uri: http::Uri = url
                    .parse()
                    .map_err(|e| bad(format!("upstream {url:?}: {e}")))?;
                if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
                    return Err(bad(format!(
                        "upstream {url:?} must be an http:// or https:// URL"
                    )));
                }
                if !seen.insert(uri.to_string()) {
                    return Err(bad(format!("upstream {url:?} is listed twice")));
                }
                out.push(Upstream::Http(Box::new(HttpUpstream::with_client(
                    uri,
                    client.clone(),
                    config.max_body_bytes,
                ))));
            }
            out
        }
    };
    let upstream = UpstreamPool::new(instances).map_err(|e| bad(e.to_string()))?;
    Ok(RouteSpec {
        path: path.to_owned(),
        upstream,
        config,
    })
}

/// Checks a route path: absolute, no trailing slash, segments of unreserved URI
/// characters (so it needs no percent-decoding to compare), no dot segments, not under
/// `/.well-known/`, and not a path the `/mcp` route keeps for itself.
pub fn check_path(path: &str) -> Result<(), RouteError> {
    let bad = |reason| {
        Err(RouteError::BadPath {
            path: path.to_owned(),
            reason,
        })
    };
    if !path.starts_with('/') {
        return bad("must start with /");
    }
    if path.len() < 2 || path.len() > MAX_PATH {
        return bad("must be 2 to 256 characters");
    }
    if path.ends_with('/') {
        return bad("must not end with /");
    }
    for segment in path[1..].split('/') {
        if segment.is_empty() {
            return bad("must not contain an empty segment (//)");
        }
        if segment == "." || segment == ".." {
            return bad("must not contain . or .. segments");
        }
        if !segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
        {
            return bad("may only hold letters, digits, - . _ ~ and /");
        }
    }
    if path == "/.well-known" || path.starts_with("/.well-known/") {
        return bad("must not be under /.well-known/");
    }
    if matches!(path, SSE_SUFFIX | MESSAGES_SUFFIX | WEBSOCKET_SUFFIX) {
        return bad("is an endpoint of the /mcp route");
    }
    Ok(())
}

/// Every path the listener answers, mapped to (route index, endpoint).
#[derive(Debug, Clone)]
pub struct Paths {
    by_path: HashMap<Box<str>, (usize, Endpoint)>,
    /// "`/a/mcp`, `/b/mcp`" for the 404.
    listing: String,
}

impl Paths {
    /// The table for these route paths (in configuration order: index `i` is the
    /// `i`-th route).
    pub fn build<'a>(routes: impl IntoIterator<Item = &'a str>) -> Result<Self, RouteError> {
        let mut by_path: HashMap<Box<str>, (usize, Endpoint)> = HashMap::new();
        let mut names: Vec<&str> = Vec::new();
        for (i, route) in routes.into_iter().enumerate() {
            check_path(route)?;
            names.push(route);
            let mut claims = vec![
                (route.to_owned(), Endpoint::Mcp),
                (format!("{route}{SSE_SUFFIX}"), Endpoint::Sse),
                (format!("{route}{MESSAGES_SUFFIX}"), Endpoint::Messages),
                (format!("{route}{WEBSOCKET_SUFFIX}"), Endpoint::WebSocket),
                (format!("{METADATA_PREFIX}{route}"), Endpoint::Metadata),
            ];
            if route == DEFAULT_ROUTE {
                claims.extend([
                    (SSE_SUFFIX.to_owned(), Endpoint::Sse),
                    (MESSAGES_SUFFIX.to_owned(), Endpoint::Messages),
                    (WEBSOCKET_SUFFIX.to_owned(), Endpoint::WebSocket),
                    (METADATA_PREFIX.to_owned(), Endpoint::Metadata),
                ]);
            }
            for (path, endpoint) in claims {
                if let Some((other, _)) = by_path.get(path.as_str()) {
                    return Err(RouteError::Collision {
                        path,
                        first: names[*other].to_owned(),
                        second: route.to_owned(),
                    });
                }
                by_path.insert(path.into_boxed_str(), (i, endpoint));
            }
        }
        if names.is_empty() {
            return Err(RouteError::Empty);
        }
        Ok(Self {
            listing: names.join(", "),
            by_path,
        })
    }

    /// The table of the one route `/mcp` (cannot fail).
    pub fn default_route() -> Self {
        let mut by_path = HashMap::new();
        for (path, endpoint) in [
            (DEFAULT_ROUTE, Endpoint::Mcp),
            ("/mcp/sse", Endpoint::Sse),
            ("/mcp/messages", Endpoint::Messages),
            ("/mcp/ws", Endpoint::WebSocket),
            (
                "/.well-known/oauth-protected-resource/mcp",
                Endpoint::Metadata,
            ),
            (SSE_SUFFIX, Endpoint::Sse),
            (MESSAGES_SUFFIX, Endpoint::Messages),
            (WEBSOCKET_SUFFIX, Endpoint::WebSocket),
            (METADATA_PREFIX, Endpoint::Metadata),
        ] {
            by_path.insert(Box::from(path), (0, endpoint));
        }
        Self {
            by_path,
            listing: DEFAULT_ROUTE.to_owned(),
        }
    }

    /// The route and endpoint a request path names.
    pub fn find(&self, path: &str) -> Option<(usize, Endpoint)> {
        self.by_path.get(path).copied()
    }

    /// The routes, comma-separated (for the 404).
    pub fn listing(&self) -> &str {
        &self.listing
    }
}

/// The path of the messages endpoint that goes with an HTTP+SSE stream opened at
/// `sse_path` (the `endpoint` event names it; 2024-11-05 clients resolve it against
/// the stream's URL).
pub fn messages_path(sse_path: &str) -> String {
    let base = sse_path.strip_suffix(SSE_SUFFIX).unwrap_or("");
    format!("{base}{MESSAGES_SUFFIX}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_paths_are_checked() {
        for good in ["/mcp", "/notes/mcp", "/a", "/team-1/v2.0/mcp", "/~x/_y"] {
            assert_eq!(check_path(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "mcp",
            "/",
            "/mcp/",
            "//mcp",
            "/a//b",
            "/a/../b",
            "/./a",
            "/a b",
            "/a%2fb",
            "/a?x=1",
            "/.well-known/x",
            "/.well-known",
            "/sse",
            "/messages",
            "/ws",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?} accepted");
        }
        assert!(check_path(&format!("/{}", "a".repeat(300))).is_err());
    }

    #[test]
    fn every_endpoint_of_every_route_is_found() {
        let p = Paths::build(["/mcp", "/notes/mcp"]).unwrap();
        let cases = [
            ("/mcp", Some((0, Endpoint::Mcp))),
            ("/sse", Some((0, Endpoint::Sse))),
            ("/messages", Some((0, Endpoint::Messages))),
            ("/ws", Some((0, Endpoint::WebSocket))),
            ("/mcp/sse", Some((0, Endpoint::Sse))),
            ("/mcp/ws", Some((0, Endpoint::WebSocket))),
            (
                "/.well-known/oauth-protected-resource",
                Some((0, Endpoint::Metadata)),
            ),
            (
                "/.well-known/oauth-protected-resource/mcp",
                Some((0, Endpoint::Metadata)),
            ),
            ("/notes/mcp", Some((1, Endpoint::Mcp))),
            ("/notes/mcp/sse", Some((1, Endpoint::Sse))),
            ("/notes/mcp/messages", Some((1, Endpoint::Messages))),
            ("/notes/mcp/ws", Some((1, Endpoint::WebSocket))),
            (
                "/.well-known/oauth-protected-resource/notes/mcp",
                Some((1, Endpoint::Metadata)),
            ),
            ("/notes", None),
            ("/notes/mcp/", None),
            ("/other/mcp", None),
            ("/.well-known/oauth-protected-resource/other", None),
        ];
        for (path, want) in cases {
            assert_eq!(p.find(path), want, "{path}");
        }
        assert_eq!(p.listing(), "/mcp, /notes/mcp");
    }

    #[test]
    fn the_default_table_is_the_built_one() {
        let built = Paths::build([DEFAULT_ROUTE]).unwrap();
        let fixed = Paths::default_route();
        assert_eq!(built.by_path, fixed.by_path);
        assert_eq!(built.listing, fixed.listing);
    }

    #[test]
    fn without_an_mcp_route_the_bare_paths_are_unknown() {
        let p = Paths::build(["/a/mcp", "/b/mcp"]).unwrap();
        for path in ["/mcp", "/sse", "/ws", "/messages", METADATA_PREFIX] {
            assert_eq!(p.find(path), None, "{path}");
        }
        assert_eq!(p.find("/b/mcp/ws"), Some((1, Endpoint::WebSocket)));
    }

    #[test]
    fn colliding_routes_are_refused() {
        assert!(matches!(
            Paths::build(["/a/mcp", "/a/mcp"]),
            Err(RouteError::Collision { .. })
        ));
        // One route's endpoint is another's path.
        let e = Paths::build(["/a", "/a/ws"]).unwrap_err();
        assert_eq!(
            e,
            RouteError::Collision {
                path: "/a/ws".into(),
                first: "/a".into(),
                second: "/a/ws".into(),
            }
        );
        assert!(matches!(
            Paths::build(["/mcp/sse", "/mcp"]),
            Err(RouteError::Collision { .. })
        ));
        assert_eq!(Paths::build([]).unwrap_err(), RouteError::Empty);
    }

    #[test]
    fn the_messages_endpoint_follows_the_stream_path() {
        assert_eq!(messages_path("/sse"), "/messages");
        assert_eq!(messages_path("/mcp/sse"), "/mcp/messages");
        assert_eq!(messages_path("/notes/mcp/sse"), "/notes/mcp/messages");
    }
}
