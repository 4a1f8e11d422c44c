//! What identifies a cached response: the route, the method, the protocol revision and
//! the request's params without `_meta`, in canonical JSON (2026-07-28
//! `server/utilities/caching.mdx`, "Cache Key": a cached response MUST NOT be served for
//! a request whose method or parameters differ), plus who may see it (the audience).
//!
//! Request bodies are attacker-controlled, so the parser here is strict where a lax one
//! would let a request be keyed differently from how the upstream reads it: a duplicate
//! member anywhere (`{"uri":"a","uri":"b"}`) makes the request uncacheable rather than
//! picking one of the values, and so do requests carrying `inputResponses` or
//! `requestState` (caching.mdx: results of MRTR retries MUST NOT be cached), and
//! numbers the parser cannot hold exactly (a fraction, an exponent, an integer beyond
//! 64 bits: two such literals may read as one value the upstream tells apart).

use dualera_adapters::json::write as json_write;
use dualera_adapters::json::Str;
use http::header::HeaderValue;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The operations whose `complete` results carry caching hints (caching.mdx,
/// "Cacheable Results").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cacheable {
    /// `server/discover`.
    Discover,
    /// `tools/list`.
    ToolsList,
    /// `prompts/list`.
    PromptsList,
    /// `resources/list`.
    ResourcesList,
    /// `resources/templates/list`.
    ResourceTemplatesList,
    /// `resources/read`.
    ResourcesRead,
}

impl Cacheable {
    /// The cacheable operation named `method`, if it is one.
    pub fn from_method(method: &str) -> Option<Self> {
        Some(match method {
            "server/discover" => Self::Discover,
            "tools/list" => Self::ToolsList,
            "prompts/list" => Self::PromptsList,
            "resources/list" => Self::ResourcesList,
            "resources/templates/list" => Self::ResourceTemplatesList,
            "resources/read" => Self::ResourcesRead,
            _ => return None,
        })
    }

    /// The JSON-RPC method name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Discover => "server/discover",
            Self::ToolsList => "tools/list",
            Self::PromptsList => "prompts/list",
            Self::ResourcesList => "resources/list",
            Self::ResourceTemplatesList => "resources/templates/list",
            Self::ResourcesRead => "resources/read",
        }
    }
}

/// An authorization context: a cached `private` result is served only within the one
/// that fetched it (caching.mdx, "Cache Scope Field": caches MUST NOT be shared across
/// authorization contexts). Opaque on purpose: today it is a digest of the caller's
/// `Authorization` value; once sessions are bound to a principal it can be built from
/// that principal instead ([`AuthContext::principal`]) without touching the cache.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AuthContext([u8; 32]);

impl fmt::Debug for AuthContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the digest itself: it is derived from a credential.
        f.write_str("AuthContext(..)")
    }
}

impl AuthContext {
    fn digest(domain: &[u8], parts: &[&[u8]]) -> Self {
        let mut h = Sha256::new();
        h.update(domain);
        for p in parts {
            h.update((p.len() as u64).to_be_bytes());
            h.update(p);
        }
        Self(h.finalize().into())
    }

    /// The context of a caller presenting this `Authorization` header value.
    pub fn from_authorization(value: &HeaderValue) -> Self {
        Self::digest(
            b"dualera-cache-authorization\0",
            &[&crate::bearer::canonical(value)],
        )
    }

    /// The context of an authenticated principal (e.g. a JWT's `iss` and `sub`), for
    /// callers whose session is bound to one.
    pub fn principal(issuer: &str, subject: &str) -> Self {
        Self::digest(
            b"dualera-cache-principal\0",
            &[issuer.as_bytes(), subject.as_bytes()],
        )
    }

    /// The one context shared by callers that present no credentials.
    pub fn anonymous() -> Self {
        static ANONYMOUS: std::sync::OnceLock<AuthContext> = std::sync::OnceLock::new();
        *ANONYMOUS.get_or_init(|| Self::digest(b"dualera-cache-anonymous\0", &[]))
    }
}

/// Who asks: anonymous, or within an authorization context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Caller {
    context: Option<AuthContext>,
}

impl Caller {
    /// A caller presenting `authorization` (or nothing).
    pub fn from_authorization(authorization: Option<&HeaderValue>) -> Self {
        Self {
            context: authorization.map(AuthContext::from_authorization),
        }
    }

    /// A caller known by its authorization context.
    pub fn within(context: AuthContext) -> Self {
        Self {
            context: Some(context),
        }
    }

    /// A caller without credentials.
    pub fn anonymous() -> Self {
        Self { context: None }
    }

    /// Whether the caller presented credentials.
    pub fn is_authenticated(&self) -> bool {
        self.context.is_some()
    }

    /// The audience a result of this scope, fetched by this caller, is stored under.
    pub(super) fn audience_for(&self, scope: Scope) -> Audience {
        match (scope, self.context) {
            (Scope::Public, None) => Audience::PublicAnonymous,
            (Scope::Public, Some(_)) => Audience::PublicAuthenticated,
            (Scope::Private, c) => Audience::Private(c.unwrap_or_else(AuthContext::anonymous)),
        }
    }

    /// The audiences whose entries this caller may be served, most likely first.
    ///
    /// A `public` result fetched with credentials is served to any caller that presents
    /// credentials, but not to one that presents none: the upstream never showed it
    /// would answer an anonymous caller, and such a caller must get the upstream's own
    /// answer (a 401 that starts its authorization flow, where the upstream wants one).
    pub(super) fn audiences(&self) -> impl Iterator<Item = Audience> {
        let (a, b, c) = match self.context {
            None => (
                Audience::PublicAnonymous,
                Some(Audience::Private(AuthContext::anonymous())),
                None,
            ),
            Some(ctx) => (
                Audience::PublicAuthenticated,
                Some(Audience::PublicAnonymous),
                Some(Audience::Private(ctx)),
            ),
        };
        std::iter::once(a).chain(b).chain(c)
    }
}

/// `cacheScope` of a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scope {
    Public,
    Private,
}

/// Who an entry may be served to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Audience {
    /// A `public` result an anonymous request obtained: anyone.
    PublicAnonymous,
    /// A `public` result a request with credentials obtained: any caller with credentials.
    PublicAuthenticated,
    /// A `private` result: that authorization context only.
    Private(AuthContext),
}

/// Route, method, revision and canonical params: one request as far as caching goes.
#[derive(Debug)]
pub struct RequestKey {
    hash: u64,
    pub(super) route: Arc<str>,
    pub(super) method: Cacheable,
    version: Box<str>,
    /// Canonical JSON of the params without `_meta`.
    params: Box<str>,
    /// `params.uri` of a `resources/read` (for `notifications/resources/updated`).
    pub(super) uri: Option<Box<str>>,
}

impl PartialEq for RequestKey {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
            && self.method == other.method
            && self.route == other.route
            && self.version == other.version
            && self.params == other.params
    }
}

impl Eq for RequestKey {}

impl Hash for RequestKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl RequestKey {
    fn new(
        route: &Arc<str>,
        method: Cacheable,
        version: &str,
        params: &Canonical<'_>,
    ) -> Arc<Self> {
        let mut text = String::with_capacity(64);
        let uri = match params {
            Canonical::Object(m) => {
                let mut first = true;
                text.push('{');
                for (k, v) in m {
                    if k == "_meta" {
                        continue;
                    }
                    if !first {
                        text.push(',');
                    }
                    first = false;
                    json_write::string(&mut text, k);
                    text.push(':');
                    v.write(&mut text);
                }
                text.push('}');
                match params.get("uri") {
                    Some(Canonical::String(u)) if method == Cacheable::ResourcesRead => {
                        Some(u.as_ref().into())
                    }
                    _ => None,
                }
            }
            _ => {
                text.push_str("{}");
                None
            }
        };
        let mut h = std::collections::hash_map::DefaultHasher::new();
        route.hash(&mut h);
        method.hash(&mut h);
        version.hash(&mut h);
        text.hash(&mut h);
        Arc::new(Self {
            hash: h.finish(),
            route: route.clone(),
            method,
            version: version.into(),
            params: text.into_boxed_str(),
            uri,
        })
    }

    /// The key of a request the gateway itself builds (a legacy session's upstream
    /// call); `None` if the params make it uncacheable.
    pub fn from_params(
        route: &Arc<str>,
        method: Cacheable,
        version: &str,
        params: Option<&Value>,
    ) -> Option<Arc<Self>> {
        let canonical = match params {
            None => Canonical::Object(Vec::new()),
            Some(v) => Canonical::from_value(v)?,
        };
        if uncacheable_params(&canonical) {
            return None;
        }
        Some(Self::new(route, method, version, &canonical))
    }

    /// The params part of the key, as canonical JSON (for tests and logs).
    pub fn params(&self) -> &str {
        &self.params
    }
}

/// Params that must never be cached or served from the cache: MRTR retries
/// (caching.mdx, "Cache Key") and anything that is not an object.
fn uncacheable_params(params: &Canonical<'_>) -> bool {
    match params {
        Canonical::Object(_) => {
            params.get("inputResponses").is_some() || params.get("requestState").is_some()
        }
        _ => true,
    }
}

/// A pass-through request body the cache can answer, as read by [`parse_request`].
#[derive(Debug)]
pub(super) struct ParsedRequest {
    /// Byte range of the `id` value in the body, copied verbatim into a cached answer.
    pub(super) id: std::ops::Range<usize>,
    /// The cache key.
    pub(super) key: Arc<RequestKey>,
}

/// Reads a 2026-07-28 request body for `method` (announced by its `Mcp-Method` header,
/// `version` by `MCP-Protocol-Version`). `None` when the body is anything the cache
/// must leave alone: not one well-formed request for that method, a duplicate member,
/// `inputResponses`/`requestState`, or `_meta` the upstream would refuse (missing, or
/// a protocol version other than the header's, or no `clientCapabilities` object:
/// 2026-07-28 `basic/index.mdx`, "Per-request protocol fields"). Such a request goes
/// upstream untouched, so its error (or answer) is the upstream's own.
pub(super) fn parse_request(
    body: &[u8],
    route: &Arc<str>,
    method: Cacheable,
    version: &str,
) -> Option<ParsedRequest> {
    let envelope: Envelope<'_> = serde_json::from_slice(body).ok()?;
    if envelope.jsonrpc.as_ref().map(|s| &*s.0) != Some("2.0")
        || envelope.method.as_ref().map(|s| &*s.0) != Some(method.as_str())
    {
        return None;
    }
    let id = envelope.id?;
    let id_text = id.get();
    if !(id_text.starts_with('"')
        || id_text.starts_with('-')
        || id_text.as_bytes()[0].is_ascii_digit())
    {
        return None;
    }
    let params = envelope.params?;
    if uncacheable_params(&params) {
        return None;
    }
    let meta = params.get("_meta")?;
    if !matches!(meta, Canonical::Object(_)) {
        return None;
    }
    match meta.get("io.modelcontextprotocol/protocolVersion") {
        Some(Canonical::String(v)) if v == version => {}
        _ => return None,
    }
    if !matches!(
        meta.get("io.modelcontextprotocol/clientCapabilities"),
        Some(Canonical::Object(_))
    ) {
        return None;
    }
    let start = (id_text.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start + id_text.len();
    if body.get(start..end) != Some(id_text.as_bytes()) {
        return None;
    }
    Some(ParsedRequest {
        id: start..end,
        key: RequestKey::new(route, method, version, &params),
    })
}

/// The request envelope, strict about duplicates.
struct Envelope<'a> {
    jsonrpc: Option<Str<'a>>,
    method: Option<Str<'a>>,
    id: Option<&'a RawValue>,
    params: Option<Canonical<'a>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Envelope<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Envelope<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON-RPC request object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut e = Envelope {
                    jsonrpc: None,
                    method: None,
                    id: None,
                    params: None,
                };
                // The four members the cache reads are tracked by presence; any other
                // member only needs to be unique.
                let mut others: BTreeSet<Cow<'de, str>> = BTreeSet::new();
                let duplicate = || de::Error::custom("duplicate member");
                while let Some(Str(k)) = map.next_key::<Str<'de>>()? {
                    match &*k {
                        "jsonrpc" if e.jsonrpc.is_none() => e.jsonrpc = Some(map.next_value()?),
                        "method" if e.method.is_none() => e.method = Some(map.next_value()?),
                        "id" if e.id.is_none() => e.id = Some(map.next_value()?),
                        "params" if e.params.is_none() => e.params = Some(map.next_value()?),
                        "jsonrpc" | "method" | "id" | "params" => return Err(duplicate()),
                        _ => {
                            if !others.insert(k) {
                                return Err(duplicate());
                            }
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(e)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// A JSON value whose objects refused duplicate members while parsing, written back
/// with sorted members and serde_json's string escaping. Strings borrow from the
/// request body where they can: a key is built for every cacheable request, hit or not.
#[derive(Debug, Clone, PartialEq)]
enum Canonical<'a> {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(Cow<'a, str>),
    Array(Vec<Canonical<'a>>),
    /// Members sorted by name, each name once.
    Object(Vec<(Cow<'a, str>, Canonical<'a>)>),
}

/// Why a number makes a request uncacheable: serde_json reads a fraction, an exponent
/// or an integer beyond 64 bits as an `f64`, which does not keep every literal apart
/// (two integers of 25 digits can read as one double, and an upstream with exact
/// numbers tells them apart), and the key must tell apart every two requests the
/// upstream may (caching.mdx, "Cache Key"). Such params are rare in the cacheable
/// methods (cursors and URIs are strings); they go upstream every time.
const INEXACT: &str = "a number the key cannot hold exactly";

impl<'a> Canonical<'a> {
    /// `None` for params holding a number the key cannot hold exactly ([`INEXACT`]).
    fn from_value(v: &'a Value) -> Option<Self> {
        Some(match v {
            Value::Null => Self::Null,
            Value::Bool(b) => Self::Bool(*b),
            Value::Number(n) if n.is_f64() => return None,
            Value::Number(n) => Self::Number(n.clone()),
            Value::String(s) => Self::String(Cow::Borrowed(s)),
            Value::Array(a) => Self::Array(a.iter().map(Self::from_value).collect::<Option<_>>()?),
            Value::Object(m) => {
                let mut members = m
                    .iter()
                    .filter(|(k, _)| k.as_str() != "_meta")
                    .map(|(k, v)| Some((Cow::Borrowed(k.as_str()), Self::from_value(v)?)))
                    .collect::<Option<Vec<_>>>()?;
                members.sort_by(|a, b| a.0.cmp(&b.0));
                Self::Object(members)
            }
        })
    }

    /// The member `name` of an object.
    fn get(&self, name: &str) -> Option<&Canonical<'a>> {
        let Self::Object(m) = self else {
            return None;
        };
        m.binary_search_by(|(k, _)| (**k).cmp(name))
            .ok()
            .map(|i| &m[i].1)
    }

    fn write(&self, out: &mut String) {
        match self {
            Self::Null => out.push_str("null"),
            Self::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Self::Number(n) => {
                use std::fmt::Write as _;
                let _ = write!(out, "{n}");
            }
            Self::String(s) => json_write::string(out, s),
            Self::Array(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write(out);
                }
                out.push(']');
            }
            Self::Object(m) => {
                out.push('{');
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    json_write::string(out, k);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
}

impl<'de> Deserialize<'de> for Canonical<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Canonical<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<Canonical<'de>, E> {
                Ok(Canonical::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Canonical<'de>, E> {
                Ok(Canonical::Bool(b))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Canonical<'de>, E> {
                Ok(Canonical::Number(n.into()))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Canonical<'de>, E> {
                Ok(Canonical::Number(n.into()))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Canonical<'de>, E> {
                Err(E::custom(INEXACT))
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Canonical<'de>, E> {
                Ok(Canonical::String(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Canonical<'de>, E> {
                Ok(Canonical::String(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Canonical<'de>, E> {
                Ok(Canonical::String(Cow::Owned(s)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Canonical<'de>, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = seq.next_element()? {
                    v.push(x);
                }
                Ok(Canonical::Array(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Canonical<'de>, A::Error> {
                let mut m = Vec::new();
                while let Some(Str(k)) = map.next_key::<Str<'de>>()? {
                    m.push((k, map.next_value()?));
                }
                m.sort_by(|a: &(Cow<'de, str>, _), b| a.0.cmp(&b.0));
                if m.windows(2).any(|w| w[0].0 == w[1].0) {
                    return Err(de::Error::custom("duplicate member"));
                }
                Ok(Canonical::Object(m))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> Arc<str> {
        Arc::from("/mcp")
    }

    fn body(params: &str) -> Vec<u8> {
        format!(r#"{{"jsonrpc":"2.0","id":7,"method":"resources/read","params":{params}}}"#)
            .into_bytes()
    }

    const META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;

    #[test]
    fn key_ignores_meta_and_member_order() {
        let a = body(&format!(
            r#"{{{META},"uri":"file:///a","b":{{"y":1,"x":2}}}}"#
        ));
        let b = body(&format!(
            r#"{{"b":{{"x":2,"y":1}},"uri":"file:///a",{META}}}"#
        ));
        let ka = parse_request(&a, &route(), Cacheable::ResourcesRead, "2026-07-28").unwrap();
        let kb = parse_request(&b, &route(), Cacheable::ResourcesRead, "2026-07-28").unwrap();
        assert_eq!(ka.key, kb.key);
        assert_eq!(ka.key.params(), r#"{"b":{"x":2,"y":1},"uri":"file:///a"}"#);
        assert_eq!(ka.key.uri.as_deref(), Some("file:///a"));
        assert_eq!(&a[ka.id.clone()], b"7");
        let other = body(&format!(r#"{{{META},"uri":"file:///b"}}"#));
        let ko = parse_request(&other, &route(), Cacheable::ResourcesRead, "2026-07-28").unwrap();
        assert_ne!(ka.key, ko.key);
    }

    #[test]
    fn uncacheable_requests_are_left_alone() {
        let r = route();
        let m = Cacheable::ResourcesRead;
        for params in [
            format!(r#"{{{META},"uri":"a","uri":"b"}}"#),
            format!(r#"{{{META},"uri":"a","requestState":"x"}}"#),
            format!(r#"{{{META},"uri":"a","inputResponses":{{}}}}"#),
            r#"{"uri":"a"}"#.to_owned(),
            r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2025-11-25","io.modelcontextprotocol/clientCapabilities":{}},"uri":"a"}"#.to_owned(),
            r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"},"uri":"a"}"#.to_owned(),
            "[]".to_owned(),
        ] {
            assert!(parse_request(&body(&params), &r, m, "2026-07-28").is_none(), "{params}");
        }
        let dup_envelope = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{{{META},"uri":"a"}},"params":{{{META},"uri":"b"}}}}"#
        );
        assert!(parse_request(dup_envelope.as_bytes(), &r, m, "2026-07-28").is_none());
        let wrong_method =
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{{META}}}}}"#);
        assert!(parse_request(wrong_method.as_bytes(), &r, m, "2026-07-28").is_none());
        let no_id = format!(r#"{{"jsonrpc":"2.0","method":"resources/read","params":{{{META}}}}}"#);
        assert!(parse_request(no_id.as_bytes(), &r, m, "2026-07-28").is_none());
    }

    #[test]
    fn gateway_built_params_key_like_pass_through() {
        let v: Value = serde_json::from_str(&format!(r#"{{{META},"cursor":"c1"}}"#)).unwrap();
        let a = RequestKey::from_params(&route(), Cacheable::ToolsList, "2026-07-28", Some(&v))
            .unwrap();
        let b = format!(
            r#"{{"jsonrpc":"2.0","id":"x","method":"tools/list","params":{{"cursor":"c1",{META}}}}}"#
        );
        let kb = parse_request(b.as_bytes(), &route(), Cacheable::ToolsList, "2026-07-28").unwrap();
        assert_eq!(a, kb.key);
        let retry: Value = serde_json::json!({"requestState": "s"});
        assert!(RequestKey::from_params(
            &route(),
            Cacheable::ToolsList,
            "2026-07-28",
            Some(&retry)
        )
        .is_none());
    }

    /// Any JSON value, with names and strings that need escaping (quotes, backslashes,
    /// control characters) and that do not (ASCII, non-ASCII), never `_meta`.
    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let text = "[a-z\"\\\\\u{0}-\u{1f}\u{7f}é😀 ]{0,6}";
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            text.prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::btree_map(text, inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn has_float(v: &Value) -> bool {
        match v {
            Value::Number(n) => n.is_f64(),
            Value::Array(a) => a.iter().any(has_float),
            Value::Object(m) => m.values().any(has_float),
            _ => false,
        }
    }

    #[test]
    fn numbers_the_key_cannot_hold_exactly_are_uncacheable() {
        let r = route();
        let m = Cacheable::ToolsList;
        for n in ["1.5", "1e2", "12345678901234567890123", "-0.0"] {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{{META},"n":{n}}}}}"#
            );
            assert!(
                parse_request(body.as_bytes(), &r, m, "2026-07-28").is_none(),
                "{n}"
            );
        }
        for n in ["0", "-9223372036854775808", "18446744073709551615"] {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{{META},"n":{n}}}}}"#
            );
            let p = parse_request(body.as_bytes(), &r, m, "2026-07-28").expect(n);
            assert_eq!(p.key.params(), format!(r#"{{"n":{n}}}"#));
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

        /// The key's params are serde_json's own canonical form of the params without
        /// `_meta` (sorted members, its escaping), whatever the member order of the
        /// body, and a legacy session's params (a `Value`) key the same way.
        #[test]
        fn key_is_the_canonical_json_of_the_params(
            members in proptest::collection::btree_map("[a-z\"\\\\é]{0,4}", json_value(), 0..5),
            reverse in proptest::prelude::any::<bool>(),
        ) {
            let params: serde_json::Map<String, Value> = members.into_iter().collect();
            let expected = serde_json::to_string(&Value::Object(params.clone())).unwrap();
            let mut written: Vec<String> = params
                .iter()
                .map(|(k, v)| format!("{}:{}", serde_json::to_string(k).unwrap(), v))
                .collect();
            written.push(META.to_owned());
            if reverse {
                written.reverse();
            }
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{{}}}}}"#,
                written.join(",")
            );
            let parsed = parse_request(body.as_bytes(), &route(), Cacheable::ToolsList, "2026-07-28");
            let mut with_meta = params.clone();
            with_meta.insert("_meta".into(), serde_json::json!({}));
            let built = RequestKey::from_params(
                &route(),
                Cacheable::ToolsList,
                "2026-07-28",
                Some(&Value::Object(with_meta)),
            );
            if has_float(&Value::Object(params)) {
                proptest::prop_assert!(parsed.is_none(), "a float in the params: uncacheable");
                proptest::prop_assert!(built.is_none());
            } else {
                let parsed = parsed.expect("a well-formed request is cacheable");
                proptest::prop_assert_eq!(parsed.key.params(), expected.as_str());
                proptest::prop_assert_eq!(built.as_deref(), Some(&*parsed.key));
            }
        }
    }

    #[test]
    fn duplicate_members_anywhere_are_uncacheable() {
        let r = route();
        let m = Cacheable::ToolsList;
        for params in [
            format!(r#"{{{META},"a":1,"a":1}}"#),
            format!(r#"{{{META},"a":{{"b":1,"c":2,"b":1}}}}"#),
            format!(r#"{{{META},"a":[{{"x":1,"x":2}}]}}"#),
            format!(r#"{{{META},"a\u0062":1,"ab":1}}"#),
            format!(r#"{{{META},{META}}}"#),
        ] {
            let body =
                format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{params}}}"#);
            assert!(
                parse_request(body.as_bytes(), &r, m, "2026-07-28").is_none(),
                "{params}"
            );
        }
        for envelope in [
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list","params":{{{META}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","x":1,"x":1,"id":1,"method":"tools/list","params":{{{META}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","jsonrpc":"2.0","id":1,"method":"tools/list","params":{{{META}}}}}"#
            ),
        ] {
            assert!(
                parse_request(envelope.as_bytes(), &r, m, "2026-07-28").is_none(),
                "{envelope}"
            );
        }
        let other_members = format!(
            r#"{{"jsonrpc":"2.0","x":1,"y":1,"id":1,"method":"tools/list","params":{{{META}}}}}"#
        );
        assert!(parse_request(other_members.as_bytes(), &r, m, "2026-07-28").is_some());
    }

    #[test]
    fn audiences_keep_private_results_private() {
        let alice = Caller::from_authorization(Some(&HeaderValue::from_static("Bearer a")));
        let bob = Caller::from_authorization(Some(&HeaderValue::from_static("Bearer b")));
        let anon = Caller::anonymous();
        let stored = alice.audience_for(Scope::Private);
        assert!(alice.audiences().any(|a| a == stored));
        assert!(!bob.audiences().any(|a| a == stored));
        assert!(!anon.audiences().any(|a| a == stored));
        let public_auth = alice.audience_for(Scope::Public);
        assert!(bob.audiences().any(|a| a == public_auth));
        assert!(!anon.audiences().any(|a| a == public_auth));
        let public_anon = anon.audience_for(Scope::Public);
        assert!(bob.audiences().any(|a| a == public_anon));
    }
}
