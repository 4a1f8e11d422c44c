//! What a modern server offers: its tools, and optionally resources, prompts and
//! completions, plus the hints it puts on discovery and list results. The notes server
//! is one catalog; the conformance fixture is another, on the same framework.

use super::error::ServerError;
use super::tools::{CallContext, Outcome, ToolRegistry};
use serde_json::{json, Map, Value};

/// Resources: listing, templates, reading.
pub trait ResourceProvider: Send + Sync + std::fmt::Debug {
    /// `resources/list` entries (each with `uri` and `name`).
    fn list(&self) -> Vec<Value>;
    /// `resources/templates/list` entries.
    fn templates(&self) -> Vec<Value> {
        Vec::new()
    }
    /// `resources/read`; an unknown URI is `-32602` with `data.uri`
    /// ([`ServerError::ResourceNotFound`]).
    fn read(&self, cx: &CallContext<'_>, uri: &str) -> Result<Outcome, ServerError>;
    /// Whether `notifications/resources/updated` can be delivered for this URI.
    fn subscribable(&self, _uri: &str) -> bool {
        false
    }
}

/// Prompts: listing and getting.
pub trait PromptProvider: Send + Sync + std::fmt::Debug {
    /// `prompts/list` entries.
    fn list(&self) -> Vec<Value>;
    /// `prompts/get`; `cx.arguments` holds the prompt's arguments.
    fn get(&self, cx: &CallContext<'_>, name: &str) -> Result<Outcome, ServerError>;
}

/// Argument completion.
pub trait CompletionProvider: Send + Sync + std::fmt::Debug {
    /// `completion/complete` → the `completion` object.
    fn complete(&self, params: &Map<String, Value>) -> Result<Value, ServerError>;
}

/// Caching hints (2026-07-28 `server/utilities/caching.mdx`).
#[derive(Debug, Clone)]
pub struct CacheHints {
    /// `ttlMs` on `server/discover`.
    pub discover_ttl_ms: u64,
    /// `cacheScope` on `server/discover`.
    pub discover_scope: &'static str,
    /// `ttlMs` on list results.
    pub list_ttl_ms: u64,
    /// `cacheScope` on list results.
    pub list_scope: &'static str,
    /// `ttlMs` on `resources/read`.
    pub read_ttl_ms: u64,
    /// `cacheScope` on `resources/read`.
    pub read_scope: &'static str,
}

impl Default for CacheHints {
    fn default() -> Self {
        Self {
            discover_ttl_ms: 3_600_000,
            discover_scope: "public",
            list_ttl_ms: 3_600_000,
            list_scope: "public",
            read_ttl_ms: 60_000,
            read_scope: "private",
        }
    }
}

/// Everything a server offers.
#[derive(Debug)]
pub struct Catalog {
    /// `serverInfo.name`.
    pub name: String,
    /// `serverInfo.version`.
    pub version: String,
    /// `instructions` on discovery.
    pub instructions: Option<String>,
    /// The tools.
    pub tools: ToolRegistry,
    /// Resources, if any.
    pub resources: Option<Box<dyn ResourceProvider>>,
    /// Prompts, if any.
    pub prompts: Option<Box<dyn PromptProvider>>,
    /// Completions, if any.
    pub completions: Option<Box<dyn CompletionProvider>>,
    /// Whether list-changed notifications are offered (via `subscriptions/listen`).
    pub list_changed: bool,
    /// Whether the server emits `notifications/message` (when a request asks).
    pub logging: bool,
    /// Caching hints.
    pub cache: CacheHints,
}

impl Catalog {
    /// A catalog with only tools.
    pub fn with_tools(name: impl Into<String>, tools: ToolRegistry) -> Self {
        Self {
            name: name.into(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            instructions: None,
            tools,
            resources: None,
            prompts: None,
            completions: None,
            list_changed: false,
            logging: false,
            cache: CacheHints::default(),
        }
    }

    /// The notes + repository-summary server.
    pub fn notes(name: impl Into<String>, limits: &crate::config::Limits) -> Self {
        let mut c = Self::with_tools(name, ToolRegistry::notes_server(limits));
        c.instructions = Some(
            "Notes live in workspaces named by file: URIs that the server's configuration \
             grants you; pass workspaceUri explicitly. notes_list returns pages (follow \
             nextCursor; total counts every match). notes_delete asks the user to pick and \
             confirm through a form (pass noteId to target one note); summarize_repo asks your model twice (pick files, then \
             summarize)."
                .to_owned(),
        );
        c
    }

    /// The `capabilities` object advertised by `server/discover`.
    pub fn capabilities(&self) -> Value {
        let mut caps = Map::new();
        caps.insert("tools".into(), json!({ "listChanged": self.list_changed }));
        if let Some(r) = &self.resources {
            let subscribe = r.list().iter().any(|res| {
                res.get("uri")
                    .and_then(Value::as_str)
                    .is_some_and(|u| r.subscribable(u))
            });
            caps.insert(
                "resources".into(),
                json!({ "listChanged": self.list_changed, "subscribe": subscribe }),
            );
        }
        if self.prompts.is_some() {
            caps.insert(
                "prompts".into(),
                json!({ "listChanged": self.list_changed }),
            );
        }
        if self.completions.is_some() {
            caps.insert("completions".into(), json!({}));
        }
        if self.logging {
            caps.insert("logging".into(), json!({}));
        }
        if self.tools.offers_tasks() {
            // extensions/tasks/overview.mdx, "Advertise support".
            caps.insert("extensions".into(), json!({ super::tasks::EXTENSION: {} }));
        }
        Value::Object(caps)
    }
}
