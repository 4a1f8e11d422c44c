//! The TOML configuration shared by `serve` (and later the gateway): who may call, what
//! each caller may touch, how MRTR state is signed, and every limit.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Errors loading or checking a configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("invalid config file {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the TOML parser said.
        source: Box<toml::de::Error>,
    },
    /// A value is well-formed but unusable.
    #[error("invalid config: {reason}")]
    Invalid {
        /// What is wrong.
        reason: String,
    },
}

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Listener settings.
    #[serde(default)]
    pub server: ServerSection,
    /// Where notes and single-use nonces live.
    #[serde(default)]
    pub store: StoreSection,
    /// How `requestState` is signed.
    #[serde(default)]
    pub state: StateSection,
    /// Size and round limits.
    #[serde(default)]
    pub limits: Limits,
    /// Bearer token → principal. Empty: every request on a loopback listener is `local`.
    #[serde(default)]
    pub principals: Vec<Principal>,
    /// What each principal may touch.
    #[serde(default)]
    pub grants: Vec<Grant>,
    /// Gateway bounds and timers.
    #[serde(default)]
    pub gateway: GatewaySection,
    /// The modern server as an OAuth 2.1 resource server (JWT access tokens).
    #[serde(default)]
    pub auth: Option<AuthSection>,
    /// The gateway's response cache.
    #[serde(default)]
    pub cache: CacheSection,
    /// The gateway's admin listener (health, readiness, metrics, migration report).
    #[serde(default)]
    pub admin: AdminSection,
    /// The gateway's migration report.
    #[serde(default)]
    pub report: ReportSection,
    /// Tasks on the modern server (the `io.modelcontextprotocol/tasks` extension).
    #[serde(default)]
    pub tasks: TasksSection,
}

/// `[tasks]`: bounds and hints for tasks on the modern server.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TasksSection {
    /// How long a task stays readable after it was created (`ttlMs`), in ms.
    #[serde(default = "default_task_ttl_ms")]
    pub ttl_ms: u64,
    /// The polling interval suggested to clients (`pollIntervalMs`), in ms.
    #[serde(default = "default_task_poll_ms")]
    pub poll_interval_ms: u64,
    /// Most unexpired tasks (finished or not) one principal may hold in the store.
    #[serde(default = "default_tasks_per_principal")]
    pub max_per_principal: usize,
    /// Most task rounds one server instance runs at once.
    #[serde(default = "default_tasks_running")]
    pub max_running: usize,
}

impl Default for TasksSection {
    fn default() -> Self {
        Self {
            ttl_ms: default_task_ttl_ms(),
            poll_interval_ms: default_task_poll_ms(),
            max_per_principal: default_tasks_per_principal(),
            max_running: default_tasks_running(),
        }
    }
}

fn default_task_ttl_ms() -> u64 {
    60 * 60 * 1000
}
fn default_task_poll_ms() -> u64 {
    1000
}
fn default_tasks_per_principal() -> usize {
    256
}
fn default_tasks_running() -> usize {
    32
}

/// The admin listener (`dualera gateway`, `dualera up`): off unless `listen` (or
/// `--admin`) is set.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    /// Address of the admin listener (the `--admin` flag wins); loopback is the norm.
    pub listen: Option<SocketAddr>,
    /// Bearer token required on `/metrics` and `/report*` (prefer `token_env`).
    pub token: Option<String>,
    /// Name of an environment variable holding that token.
    pub token_env: Option<String>,
    /// How often each route's upstream is probed with `server/discover`, in ms
    /// (default 5000).
    pub probe_interval_ms: Option<u64>,
}

/// The migration report; every field has a default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportSection {
    /// A SQLite file that keeps the report across restarts (relative paths are
    /// resolved against the config file's folder). Unset: memory only.
    pub path: Option<PathBuf>,
    /// Most host identities kept (default 1000); sessions of further ones are counted
    /// in one overflow row.
    pub max_hosts: Option<usize>,
}

/// `[auth]`: JWT access tokens from an authorization server, checked by the modern
/// server (`crates/server/src/oauth.rs`). Static `[[principals]]` tokens keep working beside it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    /// The identity provider whose token shape fills the defaults of `token_types`,
    /// `scope_claims`, `principal_claim` and `required_claims` (every one can still be
    /// set here); none: the strict RFC 9068 profile.
    #[serde(default)]
    pub provider: Option<IdentityProvider>,
    /// The authorization server's issuer identifier (the `iss` every token must carry).
    /// May be left out when `[[auth.issuers]]` names every issuer.
    #[serde(default)]
    pub issuer: String,
    /// This resource's canonical URI (RFC 8707): the `aud` tokens must name. Behind the
    /// gateway: the gateway's public URL, e.g. `https://gateway.example/mcp`. It stays
    /// first among the accepted audiences and is the metadata's `resource`.
    pub audience: String,
    /// Further accepted audiences, for providers that cannot issue the canonical URI
    /// (Entra ID: the application's GUID, `api://…`).
    #[serde(default)]
    pub audiences: Vec<String>,
    /// A JWK Set file (relative paths: against the config file's folder).
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// A JWK Set URL, fetched over HTTPS (plain HTTP only to a loopback address), cached,
    /// fetched again when a token names an unknown `kid`.
    #[serde(default)]
    pub jwks_uri: Option<String>,
    /// The claim that names the principal in `[[grants]]` (default `sub`).
    #[serde(default)]
    pub principal_claim: Option<String>,
    /// Accepted JOSE `typ` values (default `["at+jwt", "application/at+jwt"]`, RFC 9068
    /// §4); `""` accepts a token without `typ`.
    #[serde(default)]
    pub token_types: Option<Vec<String>>,
    /// Claims scopes are read from, each a space-separated string or an array of strings
    /// (default `["scope"]`).
    #[serde(default)]
    pub scope_claims: Option<Vec<String>>,
    /// Claim -> allowed values: a token must carry each claim with one of them (a
    /// string, or an array holding one), e.g. `azp = ["my-client"]`.
    #[serde(default)]
    pub required_claims: Option<std::collections::BTreeMap<String, Vec<String>>>,
    /// Further issuers, each with its own keys and, optionally, its own token shape.
    #[serde(default)]
    pub issuers: Vec<IssuerSection>,
    /// Accepted signature algorithms (default RS256, ES256, EdDSA).
    #[serde(default = "default_algorithms")]
    pub algorithms: Vec<String>,
    /// Clock skew allowed on `exp`/`nbf`, in seconds (default 30).
    #[serde(default = "default_clock_skew")]
    pub clock_skew_secs: u64,
    /// Authorization servers listed in the Protected Resource Metadata (default: the
    /// issuers).
    #[serde(default)]
    pub authorization_servers: Vec<String>,
    /// Least seconds between two `jwks_uri` fetches prompted by an unknown `kid`
    /// (default 10): forged tokens cannot turn into a flood of fetches.
    #[serde(default = "default_jwks_refresh")]
    pub jwks_refresh_secs: u64,
    /// Tool name -> scopes a `tools/call` of it needs (tools not listed need none).
    #[serde(default)]
    pub scopes: std::collections::BTreeMap<String, Vec<String>>,
}

/// One more issuer of `[auth]` (`[[auth.issuers]]`): its keys, and the token shape
/// fields, each falling back to this issuer's `provider`, then to `[auth]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerSection {
    /// The `iss` its tokens carry.
    pub issuer: String,
    /// As `[auth] provider`, for this issuer.
    #[serde(default)]
    pub provider: Option<IdentityProvider>,
    /// As `[auth] jwks_file`.
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// As `[auth] jwks_uri`.
    #[serde(default)]
    pub jwks_uri: Option<String>,
    /// As `[auth] audiences` (the canonical `[auth] audience` is always accepted).
    #[serde(default)]
    pub audiences: Option<Vec<String>>,
    /// As `[auth] principal_claim`.
    #[serde(default)]
    pub principal_claim: Option<String>,
    /// As `[auth] token_types`.
    #[serde(default)]
    pub token_types: Option<Vec<String>>,
    /// As `[auth] scope_claims`.
    #[serde(default)]
    pub scope_claims: Option<Vec<String>>,
    /// As `[auth] required_claims`.
    #[serde(default)]
    pub required_claims: Option<std::collections::BTreeMap<String, Vec<String>>>,
}

/// The identity providers whose access token shape `[auth] provider` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdentityProvider {
    /// Keycloak.
    Keycloak,
    /// Microsoft Entra ID.
    Entra,
    /// Auth0.
    Auth0,
    /// Okta.
    Okta,
}

fn default_algorithms() -> Vec<String> {
    ["RS256", "ES256", "EdDSA"].map(str::to_owned).to_vec()
}
fn default_clock_skew() -> u64 {
    30
}
fn default_jwks_refresh() -> u64 {
    10
}

/// What binds a legacy session to its caller (`[gateway] session_binding`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionBinding {
    /// The principal: `iss`+`sub` of a JWT bearer token, else the token's digest.
    #[default]
    Subject,
    /// The exact token (its digest): a refreshed token needs a new session.
    Token,
}

/// The gateway's response cache (2026-07-28 `server/utilities/caching.mdx`); every
/// field has a default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSection {
    /// Whether cacheable results are kept and served (default true).
    pub enabled: Option<bool>,
    /// Most entries (default 10000).
    pub max_entries: Option<usize>,
    /// Most bytes held (default 64 MiB).
    pub max_bytes: Option<u64>,
    /// Cap on a result's `ttlMs`, in ms (default 3600000).
    pub max_ttl_ms: Option<u64>,
    /// Serve an entry up to this long past its TTL when the re-fetch fails, in ms
    /// (default 0: never).
    pub stale_if_error_ms: Option<u64>,
}

/// Gateway settings (`dualera gateway`, `dualera up`); every field has a default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewaySection {
    /// Address of the gateway listener (the `--listen` flag wins).
    pub listen: Option<SocketAddr>,
    /// Extra `Origin` values accepted besides loopback ones.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Most live legacy sessions (default 10000).
    pub max_sessions: Option<usize>,
    /// Idle legacy sessions are evicted after this many seconds (default 1800).
    pub session_idle_ttl_secs: Option<u64>,
    /// SSE keepalive comment interval in seconds (default 15).
    pub keepalive_secs: Option<u64>,
    /// Seconds a live elicitation/sampling/roots request may go unanswered (default 600).
    pub live_request_timeout_secs: Option<u64>,
    /// Seconds a live request may run at most, progress or not (default 3600).
    pub live_request_timeout_max_secs: Option<u64>,
    /// Legacy revisions offered to hosts, newest first (default: all four).
    #[serde(default, deserialize_with = "legacy_versions")]
    pub legacy_versions: Option<Vec<String>>,
    /// Pause before retrying a state-only MRTR round, in ms (default 250).
    pub retry_pause_ms: Option<u64>,
    /// Most MRTR rounds per legacy request (default 8).
    pub max_rounds: Option<u32>,
    /// SSE events kept per stream for Last-Event-ID resumption (default 64).
    pub replay_buffer: Option<usize>,
    /// Requests in flight per legacy session (default 64).
    pub max_in_flight: Option<usize>,
    /// Largest body accepted, in bytes (default 4 MiB).
    pub max_body_bytes: Option<usize>,
    /// Live (elicitation/sampling/roots) requests outstanding per legacy session
    /// (default 128).
    pub max_live_requests: Option<usize>,
    /// Largest request the upstream accepts, in bytes (default 1 MiB, the modern
    /// server's `limits.max_body_bytes` default; `dualera up` uses its server's value).
    /// What would exceed it is refused by the gateway, naming the limit.
    pub upstream_max_body_bytes: Option<usize>,
    /// Bytes queued toward one host SSE connection that is not reading before the
    /// gateway closes it (default 4 MiB); the session and its replay ring survive.
    pub max_buffered_bytes: Option<usize>,
    /// Seconds the gateway waits for a host that is slow to read its SSE stream before
    /// it closes that connection (default 30). Meanwhile the upstream is read no faster
    /// than the host reads: nothing is dropped.
    pub stalled_reader_timeout_secs: Option<u64>,
    /// Bytes of events kept per stream for Last-Event-ID resumption (default 1 MiB;
    /// the newest event is always kept).
    pub replay_buffer_bytes: Option<usize>,
    /// Legacy sessions one caller (one credential) may hold (default 1000).
    pub max_sessions_per_caller: Option<usize>,
    /// Seconds a connection may take to send a request head (default 10).
    pub header_read_timeout_secs: Option<u64>,
    /// Seconds an idle keep-alive connection stays open (default 60).
    pub idle_timeout_secs: Option<u64>,
    /// Most connections open at once (default 8192).
    pub max_connections: Option<usize>,
    /// Seconds allowed between two pieces of a request body (default 10).
    pub body_idle_timeout_secs: Option<u64>,
    /// Seconds a whole request body may take (default 30).
    pub body_read_timeout_secs: Option<u64>,
    /// Request bodies one peer address may have in progress for over a second
    /// (default 64).
    pub max_slow_bodies_per_peer: Option<usize>,
    /// Response bytes the process may hold unwritten (hosts not reading their answers)
    /// before new requests get 503 + Retry-After (default 256 MiB).
    pub max_pending_write_bytes: Option<usize>,
    /// Serve TLS on the listener (the `--tls-cert`/`--tls-key` flags win).
    pub tls: Option<TlsSection>,
    /// An extra CA bundle (PEM) trusted for HTTPS upstreams, besides the system and
    /// webpki roots (the `--upstream-ca` flag wins).
    pub upstream_ca: Option<PathBuf>,
    /// HTTP/2 to an HTTPS upstream that offers it by ALPN (default `auto`).
    pub upstream_http2: Option<UpstreamHttp2>,
    /// Which headers tell the upstream who called (default `x-forwarded`).
    pub forwarded: Option<ForwardedHeaders>,
    /// The era of the `/mcp` route's upstream, and the default of every route's:
    /// `auto` (default: probed as `basic/versioning.mdx` says, cached per upstream),
    /// `modern` (2026-07-28) or `legacy` (2025-11-25 and earlier; the
    /// `--upstream-era` flag wins).
    pub era: Option<UpstreamEra>,
    /// Most legacy sessions the gateway holds open to legacy upstreams, all routes
    /// together (default 1024).
    pub max_upstream_sessions: Option<usize>,
    /// Most legacy upstream sessions of one key (one authorization context, one set
    /// of declared client capabilities, one upstream; default 8).
    pub max_upstream_sessions_per_key: Option<usize>,
    /// A legacy upstream session unused this long is closed (`DELETE`), in ms
    /// (default 300000).
    pub upstream_session_idle_ms: Option<u64>,
    /// `ttlMs` of the lists, `resources/read` and `server/discover` results the
    /// reverse bridge translates from a legacy upstream, in ms (default 0: a legacy
    /// server promises nothing about how long they hold).
    pub bridge_list_ttl_ms: Option<u64>,
    /// Whether those results are `cacheScope: "public"` (default false: `private`, as
    /// a legacy server may shape them per user).
    pub bridge_cache_public: Option<bool>,
    /// What a legacy session is bound to: `"subject"` (default) or `"token"`.
    pub session_binding: Option<SessionBinding>,
    /// Where legacy Streamable HTTP sessions live: `"memory"` (the default; one
    /// process) or `"redis://HOST:PORT/DB"` (shared by every replica behind a load
    /// balancer; `"redis+unix:///PATH?db=DB"` for a Redis on the same machine, over
    /// its Unix socket). The `--session-store` flag wins.
    pub session_store: Option<String>,
    /// This replica's name in the shared session store (default: random at start).
    pub replica_id: Option<String>,
    /// Prefix of every key and channel the gateway uses in the shared session store
    /// (default `"dualera:"`), so several deployments can share one Redis.
    pub session_key_prefix: Option<String>,
    /// How long a replica's lease on a running upstream exchange (an MRTR retry) lasts
    /// without renewal, in ms (default 10000); after it, another replica redoes it.
    pub upstream_lease_ms: Option<u64>,
    /// How long one shared-store command may take before the request fails with
    /// `sessionStoreUnavailable`, in ms (default 2000).
    pub session_store_timeout_ms: Option<u64>,
    /// How this replica writes session and lease records to the shared session
    /// store: `"msgpack"` (default) or `"json"`, the only form builds before
    /// MessagePack records read. Set `"json"` on the new replicas while older ones
    /// still serve (a rolling upgrade), then drop it once none is left. Both forms
    /// are always read.
    pub session_record_format: Option<String>,
    /// The URL (`http://HOST:PORT`) other replicas reach this one at, registered in
    /// the shared session store: a reverse-bridge retry that lands on another replica
    /// is forwarded there (only with a Redis session store). The
    /// `--advertise-url` flag wins.
    pub advertise_url: Option<String>,
    /// The instances of the `/mcp` route's upstream (`--upstream`, given once or more,
    /// wins): requests are spread round-robin over the healthy ones.
    #[serde(default)]
    pub upstreams: Vec<UpstreamEntry>,
    /// More routes: each path its own upstream, sessions and cache.
    #[serde(default)]
    pub routes: Vec<RouteSection>,
}

/// One `[[gateway.upstreams]]` instance.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamEntry {
    /// The instance's MCP endpoint, e.g. `http://10.0.0.1:8787/mcp`.
    pub url: String,
}

/// One URL or several (`upstream = "…"` or `upstream = ["…", "…"]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One instance.
    One(String),
    /// Several instances of one upstream.
    Many(Vec<String>),
}

impl OneOrMany {
    /// The URLs, in order.
    pub fn urls(&self) -> Vec<String> {
        match self {
            Self::One(u) => vec![u.clone()],
            Self::Many(v) => v.clone(),
        }
    }
}

/// One `[[gateway.routes]]` entry: an MCP endpoint path and the upstream behind it,
/// with what a single upstream carries (its instances, and limits that override the
/// `[gateway]` ones for this route).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSection {
    /// The endpoint path, e.g. `/notes/mcp`.
    pub path: String,
    /// The upstream's MCP endpoint URL, or a list of its instances' URLs.
    #[serde(default)]
    pub upstream: Option<OneOrMany>,
    /// Or a command to spawn and speak to over stdio (split on whitespace).
    #[serde(default)]
    pub upstream_cmd: Option<String>,
    /// An extra CA bundle (PEM) trusted for this route's HTTPS instances (default:
    /// `[gateway] upstream_ca`; relative to the config file).
    pub upstream_ca: Option<PathBuf>,
    /// HTTP/2 to this route's HTTPS instances (default: `[gateway] upstream_http2`).
    pub upstream_http2: Option<UpstreamHttp2>,
    /// The era of this route's upstream: `auto`, `modern` or `legacy` (default:
    /// `[gateway] era`).
    pub era: Option<UpstreamEra>,
    /// Largest request body on this route, in bytes.
    pub max_body_bytes: Option<usize>,
    /// Most live legacy sessions on this route.
    pub max_sessions: Option<usize>,
    /// Requests in flight per legacy session.
    pub max_in_flight: Option<usize>,
    /// Most MRTR rounds per legacy request.
    pub max_rounds: Option<u32>,
    /// Seconds a live elicitation/sampling/roots request may go unanswered.
    pub live_request_timeout_secs: Option<u64>,
    /// Pause before retrying a state-only MRTR round, in ms.
    pub retry_pause_ms: Option<u64>,
    /// Idle legacy sessions are evicted after this many seconds.
    pub session_idle_ttl_secs: Option<u64>,
    /// This route's URL as hosts reach it, e.g. `https://gateway.example/notes/mcp`:
    /// the `resource` of a rewritten metadata document and the base of the gateway's
    /// own challenges. Needed by `resource_metadata = "rewrite"` and `token_exchange`.
    pub public_url: Option<String>,
    /// `relay` (default): the upstream's Protected Resource Metadata verbatim;
    /// `rewrite`: its `resource` set to `public_url`, for an upstream that names its
    /// own URL and cannot be told otherwise.
    pub resource_metadata: Option<ResourceMetadata>,
    /// Exchange the host's token for one whose audience is the upstream (RFC 8693).
    pub token_exchange: Option<TokenExchangeSection>,
}

/// `[[gateway.routes]] resource_metadata`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceMetadata {
    /// The upstream's document, byte for byte.
    #[default]
    Relay,
    /// The upstream's document with `resource` set to the route's `public_url`.
    Rewrite,
}

/// `[gateway.routes.token_exchange]`: RFC 8693 at the authorization server, the
/// gateway authenticating as a confidential client (`client_secret_basic`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenExchangeSection {
    /// The authorization server's token endpoint (https; http only to loopback).
    pub token_endpoint: String,
    /// The gateway's client id at the authorization server.
    pub client_id: String,
    /// Its secret, inline…
    #[serde(default)]
    pub client_secret: Option<String>,
    /// …or from this environment variable.
    #[serde(default)]
    pub client_secret_env: Option<String>,
    /// The upstream's canonical URI: the `resource` (RFC 8707) the new token is for.
    pub resource: String,
    /// An RFC 8693 `audience` as well, for authorization servers that want one.
    #[serde(default)]
    pub audience: Option<String>,
    /// The `scope` to ask for (default: none, the authorization server decides).
    #[serde(default)]
    pub scope: Option<String>,
    /// Most exchanged tokens cached (default 1024).
    #[serde(default)]
    pub max_cached: Option<usize>,
}

/// A non-empty list of known legacy revisions.
fn legacy_versions<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<String>>, D::Error> {
    use serde::de::Error as _;
    let list = Vec::<String>::deserialize(d)?;
    if list.is_empty() {
        return Err(D::Error::custom(
            "legacy_versions must name at least one revision",
        ));
    }
    for v in &list {
        if !dualera_adapters::ProtocolVersion::LEGACY.contains(&v.as_str()) {
            return Err(D::Error::custom(format!(
                "legacy_versions: {v:?} is not a legacy revision ({})",
                dualera_adapters::ProtocolVersion::LEGACY.join(", ")
            )));
        }
    }
    Ok(Some(list))
}

/// A listener's certificate and key, PEM files.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// `[gateway] upstream_http2`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpstreamHttp2 {
    /// HTTP/2 when the upstream offers `h2` by ALPN, else HTTP/1.1.
    #[default]
    Auto,
    /// Always HTTP/1.1.
    Never,
}

/// `[gateway] era` / `[[gateway.routes]] era` / `--upstream-era`: which revisions an
/// upstream speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamEra {
    /// Probed (`basic/versioning.mdx`, "Backward Compatibility"), cached per upstream.
    #[default]
    Auto,
    /// 2026-07-28: per-request `_meta`, no session.
    Modern,
    /// 2025-11-25 and earlier: an `initialize` handshake and a session.
    Legacy,
}

impl UpstreamEra {
    /// The spelling of the configuration and the flag.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Modern => "modern",
            Self::Legacy => "legacy",
        }
    }
}

impl std::str::FromStr for UpstreamEra {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "modern" => Ok(Self::Modern),
            "legacy" => Ok(Self::Legacy),
            other => Err(format!(
                "{other:?} is not an upstream era (auto, modern or legacy)"
            )),
        }
    }
}

/// `[gateway] forwarded`: how an upstream learns the caller's address, scheme and host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ForwardedHeaders {
    /// `X-Forwarded-For`, `X-Forwarded-Proto`, `X-Forwarded-Host`.
    #[default]
    XForwarded,
    /// RFC 7239 `Forwarded: for=…;proto=…;host=…`.
    Forwarded,
    /// Neither.
    None,
}

/// Listener settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// Address of the HTTP listener (the `--listen` flag wins).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Extra `Origin` values accepted besides loopback origins.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Name reported in `serverInfo`.
    #[serde(default = "default_name")]
    pub name: String,
    /// Seconds a connection may take to send a request head (default 10).
    #[serde(default)]
    pub header_read_timeout_secs: Option<u64>,
    /// Seconds an idle keep-alive connection stays open (default 60).
    #[serde(default)]
    pub idle_timeout_secs: Option<u64>,
    /// Most connections open at once (default 8192).
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// Seconds allowed between two pieces of a request body (default 10).
    #[serde(default)]
    pub body_idle_timeout_secs: Option<u64>,
    /// Seconds a whole request body may take (default 30).
    #[serde(default)]
    pub body_read_timeout_secs: Option<u64>,
    /// Request bodies one peer address may have in progress for over a second
    /// (default 64).
    #[serde(default)]
    pub max_slow_bodies_per_peer: Option<usize>,
    /// Response bytes the process may hold unwritten (hosts not reading their answers)
    /// before new requests get 503 + Retry-After (default 256 MiB).
    #[serde(default)]
    pub max_pending_write_bytes: Option<usize>,
    /// Serve TLS on the listener (the `--tls-cert`/`--tls-key` flags win).
    #[serde(default)]
    pub tls: Option<TlsSection>,
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            allowed_origins: Vec::new(),
            name: default_name(),
            header_read_timeout_secs: None,
            idle_timeout_secs: None,
            max_connections: None,
            body_idle_timeout_secs: None,
            body_read_timeout_secs: None,
            max_slow_bodies_per_peer: None,
            max_pending_write_bytes: None,
            tls: None,
        }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8787))
}

fn default_name() -> String {
    "dualera-notes".to_owned()
}

/// Where notes and nonces are stored: SQLite (`path`, the embedded default) or
/// PostgreSQL (`url`, or the `DUALERA_STORE_URL` environment variable, which wins).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// SQLite file path, or `:memory:`. Unused when a URL is given.
    #[serde(default = "default_store_path")]
    pub path: String,
    /// `postgres://USER[:PASSWORD]@HOST:PORT/DB`: several instances share one database.
    #[serde(default)]
    pub url: Option<String>,
    /// Most pooled PostgreSQL connections per instance (default 16).
    #[serde(default)]
    pub max_connections: Option<u32>,
    /// PEM file of the CA(s) that sign the PostgreSQL server's certificate (default:
    /// the system's roots). A relative path is resolved against the config file.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

impl Default for StoreSection {
    fn default() -> Self {
        Self {
            path: default_store_path(),
            url: None,
            max_connections: None,
            ca_file: None,
        }
    }
}

fn default_store_path() -> String {
    ":memory:".to_owned()
}

/// `requestState` signing.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateSection {
    /// How long a signed state stays valid, in milliseconds.
    #[serde(default = "default_ttl_ms")]
    pub ttl_ms: u64,
    /// Signing keys, newest first: the first signs, all verify (rotation).
    #[serde(default)]
    pub keys: Vec<StateKey>,
}

impl Default for StateSection {
    fn default() -> Self {
        Self {
            ttl_ms: default_ttl_ms(),
            keys: Vec::new(),
        }
    }
}

fn default_ttl_ms() -> u64 {
    5 * 60 * 1000
}

/// One HMAC key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateKey {
    /// Key id carried in each state payload.
    pub id: String,
    /// The secret itself (prefer `secret_env`).
    #[serde(default)]
    pub secret: Option<String>,
    /// Name of an environment variable holding the secret.
    #[serde(default)]
    pub secret_env: Option<String>,
}

/// Limits; every one has a default.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest request body accepted, in bytes (HTTP 413 / stdio line limit).
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// Most MRTR rounds one request may take.
    #[serde(default = "default_max_rounds")]
    pub max_rounds: u32,
    /// Bytes of repository content sent to the client's model in one sampling round.
    #[serde(default = "default_sampling_bytes")]
    pub sampling_bytes_per_round: usize,
    /// `maxTokens` asked of the client's model in one sampling round.
    #[serde(default = "default_sampling_tokens")]
    pub sampling_max_tokens: u32,
    /// Largest file read by `summarize_repo`.
    #[serde(default = "default_file_bytes")]
    pub max_file_bytes: u64,
    /// Most files listed by `summarize_repo`.
    #[serde(default = "default_max_files")]
    pub max_files: usize,
    /// Longest `requestState` accepted, in bytes.
    #[serde(default = "default_max_state")]
    pub max_state_bytes: usize,
    /// Most notes returned by one `notes_list` page (and the largest `limit`).
    #[serde(default = "default_max_list")]
    pub max_list: usize,
    /// Most notes offered in one `notes_delete` confirmation form.
    #[serde(default = "default_max_delete_candidates")]
    pub max_delete_candidates: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: default_max_body(),
            max_rounds: default_max_rounds(),
            sampling_bytes_per_round: default_sampling_bytes(),
            sampling_max_tokens: default_sampling_tokens(),
            max_file_bytes: default_file_bytes(),
            max_files: default_max_files(),
            max_state_bytes: default_max_state(),
            max_list: default_max_list(),
            max_delete_candidates: default_max_delete_candidates(),
        }
    }
}

fn default_max_body() -> usize {
    1024 * 1024
}
fn default_max_rounds() -> u32 {
    3
}
fn default_sampling_bytes() -> usize {
    48 * 1024
}
fn default_sampling_tokens() -> u32 {
    800
}
fn default_file_bytes() -> u64 {
    64 * 1024
}
fn default_max_files() -> usize {
    200
}
fn default_max_state() -> usize {
    16 * 1024
}
fn default_max_list() -> usize {
    500
}
fn default_max_delete_candidates() -> usize {
    25
}

/// A caller identified by a bearer token.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Principal {
    /// The principal's name (what grants refer to).
    pub name: String,
    /// The bearer token (prefer `token_env`).
    #[serde(default)]
    pub token: Option<String>,
    /// Name of an environment variable holding the token.
    #[serde(default)]
    pub token_env: Option<String>,
}

/// What one principal may touch.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// The principal (`local` when authentication is off).
    pub principal: String,
    /// Workspace URIs (`file:///…`) whose notes it may read and change.
    #[serde(default)]
    pub workspaces: Vec<String>,
    /// Repository directories (paths or `file:` URIs) it may summarize.
    #[serde(default)]
    pub repositories: Vec<String>,
}

impl Config {
    /// Reads and parses a configuration file; relative store paths are resolved
    /// against the file's folder.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut config = Self::parse(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        if let Some(dir) = path.parent() {
            if config.store.path != ":memory:" && Path::new(&config.store.path).is_relative() {
                config.store.path = dir.join(&config.store.path).to_string_lossy().into_owned();
            }
            let absolute = |f: &mut PathBuf| {
                if f.is_relative() {
                    *f = dir.join(&*f);
                }
            };
            for tls in [config.server.tls.as_mut(), config.gateway.tls.as_mut()]
                .into_iter()
                .flatten()
            {
                absolute(&mut tls.cert);
                absolute(&mut tls.key);
            }
            if let Some(ca) = config.gateway.upstream_ca.as_mut() {
                absolute(ca);
            }
            for route in &mut config.gateway.routes {
                if let Some(ca) = route.upstream_ca.as_mut() {
                    absolute(ca);
                }
            }
        }
        if let (Some(report), Some(dir)) = (&config.report.path, path.parent()) {
            if report.is_relative() {
                config.report.path = Some(dir.join(report));
            }
        }
        if let (Some(ca), Some(dir)) = (&config.store.ca_file, path.parent()) {
            if ca.is_relative() {
                config.store.ca_file = Some(dir.join(ca));
            }
        }
        if let (Some(auth), Some(dir)) = (config.auth.as_mut(), path.parent()) {
            let files = std::iter::once(&mut auth.jwks_file)
                .chain(auth.issuers.iter_mut().map(|i| &mut i.jwks_file));
            for file in files.flatten().filter(|f| f.is_relative()) {
                *file = dir.join(&*file);
            }
        }
        Ok(config)
    }

    /// Parses configuration text.
    pub fn parse(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }
}

/// Resolves a secret given inline or through an environment variable.
pub fn resolve_secret(
    what: &str,
    inline: &Option<String>,
    env: &Option<String>,
) -> Result<String, ConfigError> {
    match (inline, env) {
        (Some(s), None) if !s.is_empty() => Ok(s.clone()),
        (None, Some(var)) => match std::env::var(var) {
            Ok(s) if !s.is_empty() => Ok(s),
            _ => Err(ConfigError::Invalid {
                reason: format!("{what}: environment variable {var} is unset or empty"),
            }),
        },
        _ => Err(ConfigError::Invalid {
            reason: format!("{what}: give exactly one of the inline value or the _env variable"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_parses() {
        let text = include_str!("../../../examples/dualera.toml");
        let config = Config::parse(text).expect("examples/dualera.toml parses");
        assert!(!config.grants.is_empty());
        assert!(!config.state.keys.is_empty());
        assert_eq!(config.admin.probe_interval_ms, Some(5000));
        assert_eq!(config.report.max_hosts, Some(1000));
    }

    /// The commented `[[gateway.upstreams]]` and `[[gateway.routes]]` examples, once
    /// uncommented, are a valid configuration.
    #[test]
    fn example_instances_and_routes_parse() {
        let text = include_str!("../../../examples/dualera.toml");
        let mut out = String::new();
        let mut inside = false;
        for line in text.lines() {
            let rest = line.strip_prefix("# ").unwrap_or("");
            if rest.starts_with("[[gateway.upstreams]]")
                || rest.starts_with("[[gateway.routes]]")
                || rest.starts_with("[gateway.routes.token_exchange]")
            {
                inside = true;
            } else if !(inside
                && rest.split_once(" = ").is_some_and(|(k, _)| {
                    k.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                }))
            {
                inside = false;
                continue;
            }
            out.push_str(rest);
            out.push('\n');
        }
        let c = Config::parse(&out).unwrap_or_else(|e| panic!("{e}:\n{out}"));
        assert_eq!(c.gateway.upstreams.len(), 2, "{out}");
        assert_eq!(c.gateway.routes.len(), 3, "{out}");
        let vendor = &c.gateway.routes[2];
        assert_eq!(vendor.resource_metadata, Some(ResourceMetadata::Rewrite));
        assert!(vendor.public_url.is_some());
        assert_eq!(
            vendor.token_exchange.as_ref().map(|t| t.max_cached),
            Some(Some(1024))
        );
        assert_eq!(
            c.gateway.routes[0].upstream_http2,
            Some(UpstreamHttp2::Never)
        );
        assert!(c.gateway.routes[0].upstream_ca.is_some());
        assert_eq!(c.gateway.routes[0].max_rounds, Some(8));
        assert!(c.gateway.routes[1].upstream_cmd.is_some());
    }

    /// The commented `[auth]` example, once uncommented, is a valid configuration.
    #[test]
    fn example_auth_parses() {
        let text = include_str!("../../../examples/dualera.toml");
        let start = text.find("# [auth]\n").expect("an [auth] example");
        let out: String = text[start..]
            .lines()
            .map_while(|l| l.strip_prefix("# "))
            .filter(|l| !l.starts_with(' '))
            .map(|l| format!("{l}\n"))
            .collect();
        let c = Config::parse(&out).unwrap_or_else(|e| panic!("{e}:\n{out}"));
        let auth = c.auth.expect("[auth]");
        assert_eq!(auth.provider, Some(IdentityProvider::Keycloak));
        assert_eq!(auth.audiences, ["api://notes-gateway"]);
        assert!(auth.required_claims.is_some_and(|r| r.contains_key("azp")));
        assert_eq!(auth.issuers.len(), 1);
        assert_eq!(auth.issuers[0].provider, Some(IdentityProvider::Entra));
        assert_eq!(auth.scopes.len(), 4);
    }

    #[test]
    fn upstreams_and_routes() {
        let c = Config::parse(
            "[[gateway.upstreams]]\nurl = \"http://127.0.0.1:1/mcp\"\n\
             [[gateway.upstreams]]\nurl = \"http://127.0.0.1:2/mcp\"\n\
             [[gateway.routes]]\npath = \"/a/mcp\"\nupstream = \"http://127.0.0.1:3/mcp\"\n\
             max_sessions = 5\nupstream_ca = \"a-ca.pem\"\nupstream_http2 = \"never\"\n\
             [[gateway.routes]]\npath = \"/b/mcp\"\n\
             upstream = [\"http://127.0.0.1:4/mcp\", \"http://127.0.0.1:5/mcp\"]\n\
             [[gateway.routes]]\npath = \"/c/mcp\"\nupstream_cmd = \"dualera serve --stdio\"\n",
        )
        .expect("parses");
        let g = &c.gateway;
        assert_eq!(g.upstreams.len(), 2);
        assert_eq!(g.upstreams[1].url, "http://127.0.0.1:2/mcp");
        assert_eq!(g.routes.len(), 3);
        assert_eq!(
            g.routes[0].upstream.as_ref().map(OneOrMany::urls),
            Some(vec!["http://127.0.0.1:3/mcp".to_owned()])
        );
        assert_eq!(g.routes[0].max_sessions, Some(5));
        assert_eq!(g.routes[0].upstream_http2, Some(UpstreamHttp2::Never));
        assert_eq!(
            g.routes[0].upstream_ca.as_deref(),
            Some(Path::new("a-ca.pem"))
        );
        assert_eq!(
            g.routes[1].upstream.as_ref().map(|u| u.urls().len()),
            Some(2)
        );
        assert!(g.routes[2].upstream.is_none());
        assert!(Config::parse("[[gateway.routes]]\npath = \"/a\"\nbogus = 1\n").is_err());
        assert!(Config::parse("[[gateway.upstreams]]\nurl = 3\n").is_err());
    }

    #[test]
    fn upstream_era_and_legacy_session_keys() {
        let c = Config::parse(
            "[gateway]\nera = \"legacy\"\nmax_upstream_sessions = 9\n\
             max_upstream_sessions_per_key = 2\nupstream_session_idle_ms = 1500\n\
             [[gateway.routes]]\npath = \"/a/mcp\"\nupstream = \"http://127.0.0.1:3/mcp\"\n\
             era = \"modern\"\n[[gateway.routes]]\npath = \"/b/mcp\"\n\
             upstream = \"http://127.0.0.1:4/mcp\"\n",
        )
        .expect("parses");
        let g = &c.gateway;
        assert_eq!(g.era, Some(UpstreamEra::Legacy));
        assert_eq!(g.max_upstream_sessions, Some(9));
        assert_eq!(g.max_upstream_sessions_per_key, Some(2));
        assert_eq!(g.upstream_session_idle_ms, Some(1500));
        assert_eq!(g.routes[0].era, Some(UpstreamEra::Modern));
        assert_eq!(g.routes[1].era, None);
        assert_eq!(Config::parse("").unwrap().gateway.era, None);
        assert!(Config::parse("[gateway]\nera = \"2025\"\n").is_err());
        assert_eq!("auto".parse(), Ok(UpstreamEra::Auto));
        assert!("Legacy".parse::<UpstreamEra>().is_err());
    }

    #[test]
    fn listener_and_upstream_keys() {
        let c = Config::parse(
            "[server]\nmax_connections = 5\n[server.tls]\ncert = \"a.pem\"\nkey = \"b.pem\"\n\
             [gateway]\nupstream_http2 = \"never\"\nforwarded = \"forwarded\"\nupstream_ca = \"ca.pem\"\n\
             idle_timeout_secs = 3\n[gateway.tls]\ncert = \"c.pem\"\nkey = \"d.pem\"\n",
        )
        .expect("parses");
        assert_eq!(c.server.max_connections, Some(5));
        assert_eq!(c.gateway.upstream_http2, Some(UpstreamHttp2::Never));
        assert_eq!(c.gateway.forwarded, Some(ForwardedHeaders::Forwarded));
        assert!(c.gateway.tls.is_some() && c.server.tls.is_some());
        assert!(Config::parse("[gateway]\nupstream_http2 = \"maybe\"\n").is_err());
        assert!(Config::parse("[gateway.tls]\ncert = \"c.pem\"\n").is_err());
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(Config::parse("[server]\nlisten = \"127.0.0.1:1\"\nbogus = 1\n").is_err());
        assert!(Config::parse("nonsense = true\n").is_err());
    }

    #[test]
    fn legacy_versions_are_checked() {
        let ok = Config::parse("[gateway]\nlegacy_versions = [\"2025-06-18\"]\n").unwrap();
        assert_eq!(
            ok.gateway.legacy_versions,
            Some(vec!["2025-06-18".to_owned()])
        );
        assert!(Config::parse("[gateway]\nlegacy_versions = []\n").is_err());
        assert!(Config::parse("[gateway]\nlegacy_versions = [\"2026-07-28\"]\n").is_err());
    }
}
