//! Fuzz tables as properties: arbitrary bytes and structure-aware mutations of valid
//! inputs for every parser that reads peer or operator input — the JSON-RPC envelope
//! (`jsonrpc::parse`, and the strict JSON under it), the SSE decoder, the
//! `requestState` decoder, `file:` URI normalization and the config loader. None may
//! panic; each answers with a typed error, and what it accepts behaves (round trips,
//! normalizes idempotently, decodes the same however the bytes are split).
//!
//! Seeded like the session machine's properties (`tests/seeded/mod.rs`): the seed is
//! printed, `DUALERA_PROPTEST_SEED` replays, `DUALERA_PROPTEST_CASES` overrides the
//! case count of each property.

#[path = "seeded/mod.rs"]
mod seeded;

use dualera::config::Config;
use dualera::gateway::GatewayConfig;
use dualera::request_state::{Binding, StateCodec};
use dualera::server::scope::Scope;
use dualera::sse;
use dualera_adapters::jsonrpc::{self, EnvelopeError, Incoming, Message};
use dualera_adapters::{json, ErrorCode};
use proptest::prelude::*;
use seeded::{run_seeded, Check};

const CASES: u32 = 4_000;

/// One edit of a valid input.
#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    /// Repeats a slice in place (duplicate members, doubled separators).
    Repeat(usize, usize),
}

fn apply(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let n = bytes.len().max(1);
        match e {
            Edit::Flip(i, x) => {
                if !bytes.is_empty() {
                    let i = i % bytes.len();
                    bytes[i] ^= x | 1;
                }
            }
            Edit::Truncate(i) => bytes.truncate(i % n),
            Edit::Insert(i, v) => {
                let i = i % n;
                let i = i.min(bytes.len());
                bytes.splice(i..i, v.iter().copied());
            }
            Edit::Delete(i, len) => {
                let i = (i % n).min(bytes.len());
                let end = (i + len % 16).min(bytes.len());
                bytes.drain(i..end);
            }
            Edit::Repeat(i, len) => {
                let i = (i % n).min(bytes.len());
                let end = (i + len % 32).min(bytes.len());
                let copy = bytes[i..end].to_vec();
                bytes.splice(end..end, copy);
            }
        }
    }
    bytes
}

/// Edits of a corpus entry, with tokens that matter to the format.
fn mutated(
    corpus: &'static [&'static str],
    tokens: &'static [&'static str],
) -> BoxedStrategy<Vec<u8>> {
    let token = prop::sample::select(tokens).prop_map(|t| t.as_bytes().to_vec());
    let edit = prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, x)| Edit::Flip(i, x)),
        any::<usize>().prop_map(Edit::Truncate),
        (any::<usize>(), token).prop_map(|(i, t)| Edit::Insert(i, t)),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, v)| Edit::Insert(i, v)),
        (any::<usize>(), any::<usize>()).prop_map(|(i, l)| Edit::Delete(i, l)),
        (any::<usize>(), any::<usize>()).prop_map(|(i, l)| Edit::Repeat(i, l)),
    ];
    (
        prop::sample::select(corpus),
        prop::collection::vec(edit, 0..6),
    )
        .prop_map(|(base, edits)| apply(base.as_bytes().to_vec(), &edits))
        .boxed()
}

/// Arbitrary bytes or a mutated valid input, about half each.
fn inputs(
    corpus: &'static [&'static str],
    tokens: &'static [&'static str],
) -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        mutated(corpus, tokens),
        mutated(corpus, tokens),
    ]
    .boxed()
}

const JSONRPC: &[&str] = &[
    r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"notes_delete","arguments":{"workspaceUri":"file:///w","title":"t"}}}"#,
    r#"{"jsonrpc":"2.0","id":"dualera-l3","result":{"action":"accept","content":{"note_id":"note-1","confirm":true}}}"#,
    r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"bad","data":{"x":[1,2.5,null]}}}"#,
    r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3,"reason":"stop"}}"#,
    r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/initialized"}]"#,
    r#"{"jsonrpc":"2.0","id":-9223372036854775808,"result":{"s":"\u00e9\ud83d\ude00\n"}}"#,
];
const JSON_TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ",",
    ":",
    "null",
    "1e999",
    "-0",
    "\"\\ud800\"",
    "\\u0000",
    "\"id\":1,",
    "\"jsonrpc\":\"2.0\",",
    "\"action\":\"accept\",",
    "[[[[[[[[[[[[[[[[",
    "18446744073709551616",
    "\u{feff}",
    "\u{0}",
    "\u{ff}",
];

#[test]
fn jsonrpc_parse_never_panics_and_errors_are_typed() {
    run_seeded(
        "jsonrpc::parse",
        CASES,
        inputs(JSONRPC, JSON_TOKENS),
        |bytes| {
            let check_error = |e: &EnvelopeError| -> Check {
                let response = e.to_response();
                let error = response.outcome.as_ref().err().ok_or("an error response")?;
                let expected = match e {
                    EnvelopeError::Parse { .. } => ErrorCode::PARSE_ERROR,
                    EnvelopeError::Invalid { .. } => ErrorCode::INVALID_REQUEST,
                };
                if error.code != expected {
                    return Err(format!("{e:?} answered with {:?}", error.code));
                }
                if error.message.len() > 1024 {
                    return Err(format!("an error message of {} bytes", error.message.len()));
                }
                let again = jsonrpc::parse(&Message::Response(response).to_vec())
                    .map_err(|e| format!("the error response does not parse: {e}"))?;
                if !matches!(again, Message::Response(_)) {
                    return Err("the error response is not a response".into());
                }
                Ok(())
            };
            match jsonrpc::parse(bytes) {
                Ok(m) => {
                    let again = jsonrpc::parse(&m.to_vec())
                        .map_err(|e| format!("{m:?} serializes to something unparsable: {e}"))?;
                    let same_kind = matches!(
                        (&m, &again),
                        (Message::Request(a), Message::Request(b)) if a.id == b.id && a.method == b.method
                    ) || matches!(
                        (&m, &again),
                        (Message::Notification(a), Message::Notification(b)) if a.method == b.method
                    ) || matches!(
                        (&m, &again),
                        (Message::Response(a), Message::Response(b)) if a.id == b.id
                    );
                    if !same_kind {
                        return Err(format!("{m:?} came back as {again:?}"));
                    }
                }
                Err(e) => check_error(&e)?,
            }
            match jsonrpc::parse_incoming(bytes) {
                Ok(Incoming::Batch(items)) => {
                    for item in items.iter().filter_map(|i| i.as_ref().err()) {
                        check_error(item)?;
                    }
                }
                Ok(Incoming::Single(_)) => {}
                Err(e) => check_error(&e)?,
            }
            // The strict JSON layer agrees with serde_json except on duplicate names.
            let ours = json::parse(bytes);
            let theirs = serde_json::from_slice::<serde_json::Value>(bytes);
            match (&ours, &theirs) {
                (Ok(a), Ok(b)) if a == b => Ok(()),
                (Err(json::JsonError::Syntax { .. }), Err(_)) => Ok(()),
                (Err(json::JsonError::DuplicateMember { .. }), Ok(_)) => Ok(()),
                _ => Err(format!("strict JSON {ours:?} vs serde_json {theirs:?}")),
            }
        },
    );
}

const SSE: &[&str] = &[
    "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n",
    "id: 3.1\r\ndata: a\r\ndata: b\r\n\r\n: keepalive\n\n",
    "data:x\n\nevent: endpoint\ndata: /messages?sessionId=1\n\n",
    "retry: 10\nid\ndata\n\n",
];
const SSE_TOKENS: &[&str] = &[
    "\n",
    "\r\n",
    "\r",
    "\n\n",
    "data: ",
    "id: ",
    ":",
    "event: message\n",
    "\u{0}",
    "\u{ff}",
];

#[test]
fn sse_decoder_never_panics_and_ignores_chunking() {
    let case = (
        inputs(SSE, SSE_TOKENS),
        prop::collection::vec(any::<usize>(), 0..8),
    );
    run_seeded("sse::Decoder", CASES, case, |(bytes, cuts)| {
        const LIMIT: usize = 64;
        let whole = sse::Decoder::new(LIMIT).feed(bytes);
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        points.sort_unstable();
        let mut d = sse::Decoder::new(LIMIT);
        let mut events = Vec::new();
        let mut error = None;
        let mut start = 0;
        for end in points.into_iter().chain([bytes.len()]) {
            match d.feed(&bytes[start..end]) {
                Ok(e) => events.extend(e),
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
            start = end;
        }
        for e in &events {
            if e.data.len() > LIMIT {
                return Err(format!(
                    "an event of {} bytes passed a {LIMIT}-byte limit",
                    e.data.len()
                ));
            }
        }
        match (whole, error) {
            (Ok(all), None) if all == events => Ok(()),
            // A stream that breaks the limit may do so at a different chunk.
            (Err(_), Some(_)) => Ok(()),
            (Err(_), None) | (Ok(_), Some(_)) => Ok(()),
            (Ok(all), None) => Err(format!("whole: {all:?}\nchunked: {events:?}")),
        }
    });
}

fn binding() -> Binding {
    Binding {
        principal: "local".into(),
        method: "tools/call".into(),
        target: "notes_delete".into(),
        arguments: "d1g3st".into(),
    }
}

#[test]
fn request_state_decoder_refuses_every_alteration() {
    let codec = StateCodec::new(
        vec![("k1".into(), b"0123456789abcdef0123456789abcdef".to_vec())],
        60_000,
        16 * 1024,
    );
    let token = codec
        .seal(
            &binding(),
            "confirm",
            1,
            serde_json::json!({"ids": ["note-1", "note-2"]}),
            1_000,
        )
        .expect("seal");
    assert!(codec.open(&token, &binding(), 2_000).is_ok());
    let corpus: &'static [&'static str] =
        Box::leak(vec![&*Box::leak(token.clone().into_boxed_str())].into_boxed_slice());
    let tokens: &'static [&'static str] = &[".", "=", "-", "_", "A", "/", "+", "..", "%2e"];
    run_seeded("requestState", CASES, inputs(corpus, tokens), |bytes| {
        let Ok(candidate) = std::str::from_utf8(bytes) else {
            return Ok(());
        };
        let opened = codec.open(candidate, &binding(), 2_000);
        if candidate == token {
            return opened
                .map(|_| ())
                .map_err(|e| format!("the genuine state refused: {e}"));
        }
        match opened {
            Err(_) => Ok(()),
            Ok(o) => Err(format!("an altered state {candidate:?} opened: {o:?}")),
        }
    });
}

const URIS: &[&str] = &[
    "file:///work/notes",
    "file://localhost/work/notes/sub/",
    "file:///work/notes/%2e%2e/private.md",
    "file:///work/notes-evil/x",
    "file:///a/./b/../c//d",
    "file:///caf%C3%A9/%20space",
];
const URI_TOKENS: &[&str] = &[
    "/",
    "..",
    ".",
    "%2e",
    "%2F",
    "%00",
    "%",
    "?",
    "#",
    "file://",
    "localhost",
    "%C3",
    "\\",
];

#[test]
fn uri_normalization_never_panics_and_is_idempotent() {
    run_seeded(
        "Scope::from_file_uri",
        CASES,
        inputs(URIS, URI_TOKENS),
        |bytes| {
            let Ok(uri) = std::str::from_utf8(bytes) else {
                return Ok(());
            };
            match Scope::from_file_uri(uri) {
                Err(_) => Ok(()),
                Ok(scope) => {
                    let again = scope.to_uri();
                    if again.split('/').any(|seg| seg == ".." || seg == ".") {
                        return Err(format!("{uri:?} normalized to {again:?} with dot segments"));
                    }
                    match Scope::from_file_uri(&again) {
                        Ok(s) if s == scope => {}
                        other => return Err(format!("{uri:?} -> {again:?} -> {other:?}")),
                    }
                    if !scope.contains(&scope) {
                        return Err(format!("{again:?} does not contain itself"));
                    }
                    Ok(())
                }
            }
        },
    );
}

const CONFIGS: &[&str] = &[
    include_str!("../examples/dualera.toml"),
    "[server]\nlisten = \"127.0.0.1:0\"\n[gateway]\nmax_sessions = 3\n",
    "[[principals]]\ntoken = \"t\"\nprincipal = \"alice\"\n[[grants]]\nprincipal = \"alice\"\nworkspaces = [\"file:///w\"]\n",
];
const TOML_TOKENS: &[&str] = &[
    "[",
    "]",
    "[[",
    "]]",
    "=",
    "\"",
    "'''",
    "\n",
    "#",
    "-1",
    "1e400",
    "true",
    "{ }",
    "x = 1\n",
    "[gateway]\n",
];

#[test]
fn config_loader_never_panics() {
    assert!(
        Config::parse(CONFIGS[0]).is_ok(),
        "the example config parses"
    );
    run_seeded(
        "config loader",
        CASES / 2,
        inputs(CONFIGS, TOML_TOKENS),
        |bytes| {
            let Ok(text) = std::str::from_utf8(bytes) else {
                return Ok(());
            };
            if let Ok(config) = Config::parse(text) {
                let _ = GatewayConfig::from_section(&config.gateway);
            }
            Ok(())
        },
    );
}
