//! What a legacy session used: the observations the machine emits as
//! [`Event::Observed`](crate::Event::Observed), for a driver's metrics and migration
//! report.
//!
//! The vocabulary is closed and small on purpose: every enum here can be a metric label
//! or an index into a fixed table, so nothing a peer sends can grow what a driver keeps.
//! Methods the table does not name fold into [`Method::Other`]. The machine is the one
//! place that sees every message a session exchanges, so it is the one that tells which
//! legacy-era feature a host relied on; [`Feature::needs`] says, in words, what that
//! host still needs before it can talk 2026-07-28 to a server directly.

use crate::error::Failure;
use crate::jsonrpc::RequestId;

/// An MCP request method, folded into a bounded set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    /// `initialize` (legacy).
    Initialize,
    /// `ping` (legacy).
    Ping,
    /// `server/discover` (2026-07-28).
    ServerDiscover,
    /// `tools/list`.
    ToolsList,
    /// `tools/call`.
    ToolsCall,
    /// `prompts/list`.
    PromptsList,
    /// `prompts/get`.
    PromptsGet,
    /// `resources/list`.
    ResourcesList,
    /// `resources/templates/list`.
    ResourcesTemplatesList,
    /// `resources/read`.
    ResourcesRead,
    /// `resources/subscribe` (legacy).
    ResourcesSubscribe,
    /// `resources/unsubscribe` (legacy).
    ResourcesUnsubscribe,
    /// `subscriptions/listen` (2026-07-28).
    SubscriptionsListen,
    /// `logging/setLevel` (legacy).
    LoggingSetLevel,
    /// `completion/complete`.
    CompletionComplete,
    /// Any method this table does not name.
    Other,
}

impl Method {
    /// Every value, in a fixed order ([`Method::index`] is the position here).
    pub const ALL: [Method; 16] = [
        Method::Initialize,
        Method::Ping,
        Method::ServerDiscover,
        Method::ToolsList,
        Method::ToolsCall,
        Method::PromptsList,
        Method::PromptsGet,
        Method::ResourcesList,
        Method::ResourcesTemplatesList,
        Method::ResourcesRead,
        Method::ResourcesSubscribe,
        Method::ResourcesUnsubscribe,
        Method::SubscriptionsListen,
        Method::LoggingSetLevel,
        Method::CompletionComplete,
        Method::Other,
    ];

    /// The method named `name`, or [`Method::Other`].
    pub fn from_name(name: &str) -> Self {
        Self::ALL[..Self::ALL.len() - 1]
            .iter()
            .copied()
            .find(|m| m.as_str() == name)
            .unwrap_or(Method::Other)
    }

    /// The method name; `_OTHER` for [`Method::Other`] (the OpenTelemetry fallback for
    /// a value the instrumentation does not know).
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Initialize => "initialize",
            Method::Ping => "ping",
            Method::ServerDiscover => "server/discover",
            Method::ToolsList => "tools/list",
            Method::ToolsCall => "tools/call",
            Method::PromptsList => "prompts/list",
            Method::PromptsGet => "prompts/get",
            Method::ResourcesList => "resources/list",
            Method::ResourcesTemplatesList => "resources/templates/list",
            Method::ResourcesRead => "resources/read",
            Method::ResourcesSubscribe => "resources/subscribe",
            Method::ResourcesUnsubscribe => "resources/unsubscribe",
            Method::SubscriptionsListen => "subscriptions/listen",
            Method::LoggingSetLevel => "logging/setLevel",
            Method::CompletionComplete => "completion/complete",
            Method::Other => "_OTHER",
        }
    }

    /// The position in [`Method::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A legacy-era feature a host used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Feature {
    /// It answered a live form-mode `elicitation/create`.
    ElicitationForm,
    /// It answered a live URL-mode `elicitation/create` (2025-11-25).
    ElicitationUrl,
    /// It answered a live `sampling/createMessage`.
    Sampling,
    /// It answered a live `roots/list`.
    Roots,
    /// It sent `logging/setLevel`.
    LoggingSetLevel,
    /// It sent `resources/subscribe`.
    ResourcesSubscribe,
    /// It opened the standalone GET stream (Streamable HTTP).
    GetStream,
    /// It resumed a stream with `Last-Event-ID` (Streamable HTTP).
    Resumption,
    /// It sent a JSON-RPC batch (2025-03-26).
    Batch,
    /// It sent `notifications/cancelled`.
    Cancellation,
    /// It asked for or reported progress (`progressToken`, `notifications/progress`).
    Progress,
}

impl Feature {
    /// Every value, in a fixed order ([`Feature::index`] is the position here).
    pub const ALL: [Feature; 11] = [
        Feature::ElicitationForm,
        Feature::ElicitationUrl,
        Feature::Sampling,
        Feature::Roots,
        Feature::LoggingSetLevel,
        Feature::ResourcesSubscribe,
        Feature::GetStream,
        Feature::Resumption,
        Feature::Batch,
        Feature::Cancellation,
        Feature::Progress,
    ];

    /// A stable machine name (JSON keys, metric labels, DOM attributes).
    pub fn as_str(self) -> &'static str {
        match self {
            Feature::ElicitationForm => "elicitation_form",
            Feature::ElicitationUrl => "elicitation_url",
            Feature::Sampling => "sampling",
            Feature::Roots => "roots",
            Feature::LoggingSetLevel => "logging_set_level",
            Feature::ResourcesSubscribe => "resources_subscribe",
            Feature::GetStream => "get_stream",
            Feature::Resumption => "resumption",
            Feature::Batch => "batch",
            Feature::Cancellation => "cancellation",
            Feature::Progress => "progress",
        }
    }

    /// The value named `name` by [`Feature::as_str`].
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|f| f.as_str() == name)
    }

    /// A short human name.
    pub fn title(self) -> &'static str {
        match self {
            Feature::ElicitationForm => "live elicitation (form)",
            Feature::ElicitationUrl => "live elicitation (URL)",
            Feature::Sampling => "live sampling",
            Feature::Roots => "live roots/list",
            Feature::LoggingSetLevel => "logging/setLevel",
            Feature::ResourcesSubscribe => "resources/subscribe",
            Feature::GetStream => "GET stream",
            Feature::Resumption => "Last-Event-ID resumption",
            Feature::Batch => "JSON-RPC batches",
            Feature::Cancellation => "cancellation",
            Feature::Progress => "progress",
        }
    }

    /// What a host that used this feature still needs to talk to a 2026-07-28 server
    /// directly, or `None` when the feature works there unchanged (2026-07-28
    /// `changelog.mdx`, "Major changes").
    pub fn needs(self) -> Option<&'static str> {
        Some(match self {
            // Major change 7 (MRTR, SEP-2322): no server-initiated requests.
            Feature::ElicitationForm => {
                "answers form elicitation live: needs an MRTR-capable client"
            }
            Feature::ElicitationUrl => "answers URL elicitation live: needs an MRTR-capable client",
            Feature::Sampling => "answers sampling live: needs an MRTR-capable client",
            Feature::Roots => "answers roots/list live: needs an MRTR-capable client",
            // Major change 5: logging/setLevel removed, the level rides in each `_meta`.
            Feature::LoggingSetLevel => {
                "sets the log level per session: needs to send logLevel in each request's _meta"
            }
            // Major change 4: resources/subscribe and the GET stream replaced.
            Feature::ResourcesSubscribe => {
                "subscribes with resources/subscribe: needs subscriptions/listen"
            }
            Feature::GetStream => "listens on the GET stream: needs subscriptions/listen",
            // Major change 9: no resumption; a broken stream's request is re-issued.
            Feature::Resumption => {
                "resumes streams with Last-Event-ID: needs to re-issue interrupted requests"
            }
            // Removed in 2025-06-18 already.
            Feature::Batch => "sends JSON-RPC batches: needs one request per message",
            // basic/patterns/cancellation.mdx: over Streamable HTTP, closing the stream.
            Feature::Cancellation => {
                "cancels with notifications/cancelled: over HTTP needs to close the request's stream"
            }
            // Progress tokens work the same in 2026-07-28.
            Feature::Progress => return None,
        })
    }

    /// The position in [`Feature::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The verdict for a host that used no feature with a [`Feature::needs`].
pub const VERDICT_DIRECT: &str = "can move to 2026-07-28 directly";
/// The verdict for a host that already speaks 2026-07-28.
pub const VERDICT_MODERN: &str = "already modern";

/// What a legacy host that used `used` still needs to talk 2026-07-28 directly, one
/// sentence per need (the live-request features share one: they all need MRTR); empty
/// when it needs nothing ([`VERDICT_DIRECT`]).
pub fn needs(used: impl IntoIterator<Item = Feature>) -> Vec<String> {
    let mut used: Vec<Feature> = used.into_iter().collect();
    used.sort_unstable();
    used.dedup();
    let live: Vec<&str> = used
        .iter()
        .filter_map(|f| match f {
            Feature::ElicitationForm => Some("form elicitation"),
            Feature::ElicitationUrl => Some("URL elicitation"),
            Feature::Sampling => Some("sampling"),
            Feature::Roots => Some("roots/list"),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    if !live.is_empty() {
        let list = match live.split_last() {
            Some((last, [])) => (*last).to_owned(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
            None => String::new(),
        };
        out.push(format!("answers {list} live: needs an MRTR-capable client"));
    }
    for f in used {
        if LiveKind::ALL.iter().any(|k| k.feature() == f) {
            continue;
        }
        if let Some(need) = f.needs() {
            out.push(need.to_owned());
        }
    }
    out
}

/// The kind of a live request the gateway sent a host.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum LiveKind {
    /// `elicitation/create`, form mode.
    ElicitationForm,
    /// `elicitation/create`, URL mode.
    ElicitationUrl,
    /// `sampling/createMessage`.
    Sampling,
    /// `roots/list`.
    Roots,
}

impl LiveKind {
    /// Every value, in a fixed order ([`LiveKind::index`] is the position here).
    pub const ALL: [LiveKind; 4] = [
        LiveKind::ElicitationForm,
        LiveKind::ElicitationUrl,
        LiveKind::Sampling,
        LiveKind::Roots,
    ];

    /// The kind of a live request with this method and params (`None` for a method
    /// that is not an input request).
    pub fn of(method: &str, params: &serde_json::Map<String, serde_json::Value>) -> Option<Self> {
        match method {
            "elicitation/create" => Some(
                if params.get("mode").and_then(serde_json::Value::as_str) == Some("url") {
                    LiveKind::ElicitationUrl
                } else {
                    LiveKind::ElicitationForm
                },
            ),
            "sampling/createMessage" => Some(LiveKind::Sampling),
            "roots/list" => Some(LiveKind::Roots),
            _ => None,
        }
    }

    /// A stable machine name.
    pub fn as_str(self) -> &'static str {
        self.feature().as_str()
    }

    /// The feature a host uses by answering this kind.
    pub fn feature(self) -> Feature {
        match self {
            LiveKind::ElicitationForm => Feature::ElicitationForm,
            LiveKind::ElicitationUrl => Feature::ElicitationUrl,
            LiveKind::Sampling => Feature::Sampling,
            LiveKind::Roots => Feature::Roots,
        }
    }

    /// The position in [`LiveKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// How a live request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LiveOutcome {
    /// A result: an elicitation accepted, a sampling result, a roots list.
    Accept,
    /// An elicitation declined.
    Decline,
    /// An elicitation cancelled by the user, or the live request withdrawn by the
    /// gateway (its legacy request was cancelled or failed).
    Cancel,
    /// The host answered with a JSON-RPC error.
    Error,
    /// The host did not answer in time.
    Timeout,
}

impl LiveOutcome {
    /// Every value, in a fixed order ([`LiveOutcome::index`] is the position here).
    pub const ALL: [LiveOutcome; 5] = [
        LiveOutcome::Accept,
        LiveOutcome::Decline,
        LiveOutcome::Cancel,
        LiveOutcome::Error,
        LiveOutcome::Timeout,
    ];

    /// A stable machine name.
    pub fn as_str(self) -> &'static str {
        match self {
            LiveOutcome::Accept => "accept",
            LiveOutcome::Decline => "decline",
            LiveOutcome::Cancel => "cancel",
            LiveOutcome::Error => "error",
            LiveOutcome::Timeout => "timeout",
        }
    }

    /// The outcome a host's result to a live request of `kind` stands for.
    pub fn of_result(kind: LiveKind, result: &serde_json::Value) -> Self {
        let elicitation = matches!(kind, LiveKind::ElicitationForm | LiveKind::ElicitationUrl);
        match result.get("action").and_then(serde_json::Value::as_str) {
            Some("decline") if elicitation => LiveOutcome::Decline,
            Some("cancel") if elicitation => LiveOutcome::Cancel,
            _ => LiveOutcome::Accept,
        }
    }

    /// The position in [`LiveOutcome::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Why a legacy request failed inside the gateway, folded into a bounded set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailureReason {
    /// The server needed a capability the host did not declare.
    MissingCapability,
    /// The host did not answer a live request in time.
    Timeout,
    /// The host answered a live request with an error.
    HostError,
    /// The server asked for input more often than allowed.
    RoundLimit,
    /// The upstream failed or broke the protocol.
    Upstream,
    /// A bound of the session was reached (requests in flight, live requests
    /// outstanding).
    Overload,
}

impl FailureReason {
    /// Every value, in a fixed order ([`FailureReason::index`] is the position here).
    pub const ALL: [FailureReason; 6] = [
        FailureReason::MissingCapability,
        FailureReason::Timeout,
        FailureReason::HostError,
        FailureReason::RoundLimit,
        FailureReason::Upstream,
        FailureReason::Overload,
    ];

    /// A stable machine name.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::MissingCapability => "missing_capability",
            FailureReason::Timeout => "timeout",
            FailureReason::HostError => "host_error",
            FailureReason::RoundLimit => "round_limit",
            FailureReason::Upstream => "upstream",
            FailureReason::Overload => "overload",
        }
    }

    /// The value named `name` by [`FailureReason::as_str`].
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|f| f.as_str() == name)
    }

    /// The position in [`FailureReason::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl From<&Failure> for FailureReason {
    fn from(failure: &Failure) -> Self {
        match failure {
            Failure::MissingCapabilities { .. } => FailureReason::MissingCapability,
            Failure::LiveTimeout { .. } | Failure::TaskWaitTimeout => FailureReason::Timeout,
            Failure::PeerError { .. } => FailureReason::HostError,
            Failure::RoundLimit { .. } => FailureReason::RoundLimit,
            Failure::TooManyLive { .. } | Failure::TooManyTasks { .. } => FailureReason::Overload,
            Failure::UnsupportedInputRequest { .. }
            | Failure::AnswersTooLarge { .. }
            | Failure::TooManyInputRequests { .. }
            | Failure::MalformedInputRequired { .. }
            | Failure::InputRequiredNotAllowed { .. }
            | Failure::UnknownResultType { .. }
            | Failure::UpstreamLost
            | Failure::MalformedTask
            | Failure::UpstreamRefused { .. } => FailureReason::Upstream,
        }
    }
}

/// How a peer's request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestOutcome {
    /// Answered with a result.
    Ok,
    /// Answered with a JSON-RPC error (the upstream's, or the session's own refusal).
    Error,
    /// Failed for a reason the report tracks: inside the gateway (the peer got a
    /// response saying why), or refused by the upstream for a capability the peer did
    /// not declare (`-32021`).
    Failed(FailureReason),
    /// Cancelled by the peer (no response).
    Cancelled,
}

impl RequestOutcome {
    /// A stable machine name (without the failure reason).
    pub fn as_str(self) -> &'static str {
        match self {
            RequestOutcome::Ok => "ok",
            RequestOutcome::Error => "error",
            RequestOutcome::Failed(_) => "failed",
            RequestOutcome::Cancelled => "cancelled",
        }
    }
}

/// One fact about what a session did, for the driver's metrics and report.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Observation {
    /// `initialize` was answered: the session's identity ([`Session::client_info`],
    /// [`Session::revision`]) is now known.
    ///
    /// [`Session::client_info`]: crate::Session::client_info
    /// [`Session::revision`]: crate::Session::revision
    SessionReady,
    /// A request of the peer ended (emitted just before its response, if any).
    RequestEnded {
        /// The peer's request id.
        id: RequestId,
        /// Its method.
        method: Method,
        /// How it ended.
        outcome: RequestOutcome,
        /// MRTR rounds it took (`input_required` answers received).
        rounds: u32,
    },
    /// The peer used a legacy-era feature once (one live request sent, one batch, …).
    Used(Feature),
    /// A live request to the peer ended.
    LiveEnded {
        /// What it asked.
        kind: LiveKind,
        /// How it ended.
        outcome: LiveOutcome,
    },
    /// The peer replied to a live request the session had already given up on
    /// (cancelled, abandoned, timed out) or already had the answer to; the reply was
    /// accepted and dropped (2025-11-25 cancellation: responses arriving after a
    /// cancellation are ignored).
    ReplyDropped {
        /// `true` for a second reply to an answered request, `false` for a late one.
        duplicate: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_in_index_order() {
        for (i, m) in Method::ALL.iter().enumerate() {
            assert_eq!(m.index(), i);
            if *m != Method::Other {
                assert_eq!(Method::from_name(m.as_str()), *m);
            }
        }
        assert_eq!(Method::from_name("tools/cal"), Method::Other);
        assert_eq!(Method::from_name("_OTHER"), Method::Other);
        for (i, f) in Feature::ALL.iter().enumerate() {
            assert_eq!(f.index(), i);
            assert_eq!(Feature::from_name(f.as_str()), Some(*f));
        }
        for (i, k) in LiveKind::ALL.iter().enumerate() {
            assert_eq!(k.index(), i);
        }
        for (i, o) in LiveOutcome::ALL.iter().enumerate() {
            assert_eq!(o.index(), i);
        }
        for (i, r) in FailureReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
            assert_eq!(FailureReason::from_name(r.as_str()), Some(*r));
        }
    }

    #[test]
    fn needs_group_the_live_features() {
        assert!(needs([]).is_empty());
        assert!(needs([Feature::Progress]).is_empty());
        assert_eq!(
            needs([Feature::Sampling]),
            ["answers sampling live: needs an MRTR-capable client"]
        );
        assert_eq!(
            needs([
                Feature::GetStream,
                Feature::Sampling,
                Feature::ElicitationForm,
                Feature::Sampling,
                Feature::Roots
            ]),
            [
                "answers form elicitation, sampling and roots/list live: needs an MRTR-capable client",
                "listens on the GET stream: needs subscriptions/listen"
            ]
        );
    }

    #[test]
    fn live_outcomes() {
        let form = LiveKind::ElicitationForm;
        let v = |s: &str| serde_json::json!({ "action": s });
        assert_eq!(
            LiveOutcome::of_result(form, &v("accept")),
            LiveOutcome::Accept
        );
        assert_eq!(
            LiveOutcome::of_result(form, &v("decline")),
            LiveOutcome::Decline
        );
        assert_eq!(
            LiveOutcome::of_result(form, &v("cancel")),
            LiveOutcome::Cancel
        );
        assert_eq!(
            LiveOutcome::of_result(LiveKind::Sampling, &v("decline")),
            LiveOutcome::Accept
        );
    }
}
