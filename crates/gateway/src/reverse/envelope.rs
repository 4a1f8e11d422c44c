//! The 2026-07-28 request checks the reverse bridge makes itself. Toward a modern host
//! the gateway is the modern server: the legacy server behind it knows neither `_meta`
//! nor the mirrored `MCP-Protocol-Version` header, and has methods the modern revision
//! removed, so a malformed modern request would otherwise be served as if it were
//! well formed.
//!
//! The order is the modern server's (2026-07-28 `basic/index.mdx` and
//! `basic/transports/streamable-http.mdx`): a removed method (`-32601`) → `_meta` with
//! the protocol version and the client capabilities (`-32602`) → the header equals the
//! `_meta` version (`-32020`) → a version this gateway speaks (`-32022`, listing them) →
//! `Mcp-Method` present and equal to the body's method, `Mcp-Name` on a call, a prompt
//! or a read, equal to the body's name (`-32020`).
//! The HTTP status follows from the code ([`super::answer`]).

use dualera_adapters::echo::{bounded, echo_quoted};
use dualera_adapters::jsonrpc::{ErrorCode, ErrorObject};
use dualera_adapters::session::{META_CLIENT_CAPABILITIES, META_PROTOCOL_VERSION};
use dualera_adapters::ProtocolVersion;
use dualera_common::mirrored::decode_header_value;
use serde_json::{json, Value};

/// Methods of the session-based revisions that 2026-07-28 removed; a modern request
/// naming one is `-32601` (404), whatever the legacy server would make of it.
const REMOVED: &[&str] = ProtocolVersion::REMOVED_IN_MODERN;

/// The routing headers a request arrived with (SEP-2243), when the host sent them.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Routing<'a> {
    /// `Mcp-Method`.
    pub(super) method: Option<&'a str>,
    /// `Mcp-Name`, raw (plain, or `=?base64?…?=`).
    pub(super) name: Option<&'a str>,
}

/// `Err` with the error the modern server owes a request of `method` with `params`
/// that arrived with `header` as its `MCP-Protocol-Version` and `routing`.
pub(super) fn check(
    method: &str,
    params: Option<&Value>,
    header: Option<&str>,
    routing: Routing<'_>,
) -> Result<(), ErrorObject> {
    if REMOVED.contains(&method) {
        return Err(ErrorObject::new(
            ErrorCode::METHOD_NOT_FOUND,
            format!("Method not found: {method} was removed in 2026-07-28"),
        ));
    }
    // basic/index.mdx, "Request metadata": every request MUST carry the protocol
    // version and the client capabilities in `_meta`; without them it is malformed.
    let invalid = |what: &str| ErrorObject::new(ErrorCode::INVALID_PARAMS, what.to_owned());
    let meta = params
        .and_then(|p| p.get("_meta"))
        .ok_or_else(|| invalid("params._meta is required"))?
        .as_object()
        .ok_or_else(|| invalid("params._meta must be an object"))?;
    let version = match meta.get(META_PROTOCOL_VERSION) {
        Some(Value::String(v)) => v.as_str(),
        Some(_) => return Err(invalid("_meta protocolVersion must be a string")),
        None => return Err(invalid("_meta protocolVersion is required")),
    };
    match meta.get(META_CLIENT_CAPABILITIES) {
        Some(Value::Object(_)) => {}
        Some(_) => return Err(invalid("_meta clientCapabilities must be an object")),
        None => return Err(invalid("_meta clientCapabilities is required")),
    }
    // streamable-http.mdx, "Protocol Version Header": a header that disagrees with the
    // body MUST be rejected with 400 and -32020.
    if header != Some(version) {
        return Err(ErrorObject::new(
            ErrorCode::HEADER_MISMATCH,
            format!(
                "MCP-Protocol-Version header {} does not match _meta protocolVersion {}",
                echo_quoted(header.unwrap_or_default()),
                echo_quoted(version)
            ),
        ));
    }
    // basic/versioning.mdx: an unsupported version is -32022 naming the supported ones.
    if !ProtocolVersion::MODERN.contains(&version) {
        return Err(ErrorObject::new(
            ErrorCode::UNSUPPORTED_PROTOCOL_VERSION,
            format!(
                "Unsupported protocol version {}; this server supports {}",
                echo_quoted(version),
                ProtocolVersion::MODERN.join(", ")
            ),
        )
        .with_data(json!({
            "supported": ProtocolVersion::MODERN,
            "requested": bounded(version),
        })));
    }
    check_routing(method, params, routing)
}

/// streamable-http.mdx, "Standard Request Headers" and "Server Validation": `Mcp-Method`
/// is REQUIRED on every request and a server MUST reject with 400 and -32020 one that
/// is missing or differs from the body's method (values compare case-sensitively) and,
/// on a request naming a tool, prompt or resource, a `Mcp-Name` that is missing, not
/// validly encoded, or different from the body: as the modern server does, though the
/// legacy server behind needs none of it.
fn check_routing(
    method: &str,
    params: Option<&Value>,
    routing: Routing<'_>,
) -> Result<(), ErrorObject> {
    let mismatch = |reason: String| ErrorObject::new(ErrorCode::HEADER_MISMATCH, reason);
    let Some(header) = routing.method else {
        return Err(mismatch("the Mcp-Method header is required".into()));
    };
    if header != method {
        return Err(mismatch(format!(
            "Mcp-Method header {} does not match body method {}",
            echo_quoted(header),
            echo_quoted(method)
        )));
    }
    let field = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" => "uri",
        _ => return Ok(()),
    };
    let body = params
        .and_then(|p| p.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let raw = routing
        .name
        .ok_or_else(|| mismatch("the Mcp-Name header is required".into()))?;
    let name = decode_header_value(raw)
        .ok_or_else(|| mismatch("the Mcp-Name header is not validly encoded".into()))?;
    if name != body {
        return Err(mismatch(format!(
            "Mcp-Name header {} does not match body {field} {}",
            echo_quoted(&name),
            echo_quoted(body)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(version: &str) -> Value {
        json!({ "_meta": {
            (META_PROTOCOL_VERSION): version,
            (META_CLIENT_CAPABILITIES): {},
        } })
    }

    fn code(r: Result<(), ErrorObject>) -> i64 {
        r.err().map(|e| e.code.0).unwrap_or(0)
    }

    #[test]
    fn the_ladder_in_order() {
        let ok = meta("2026-07-28");
        let listing = Routing {
            method: Some("tools/list"),
            name: None,
        };
        assert!(check("tools/list", Some(&ok), Some("2026-07-28"), listing).is_ok());
        // Everything else right, no Mcp-Method: -32020, as the modern server answers.
        assert_eq!(
            code(check(
                "tools/list",
                Some(&ok),
                Some("2026-07-28"),
                Routing::default()
            )),
            -32020
        );
        assert_eq!(
            code(check(
                "ping",
                Some(&ok),
                Some("2026-07-28"),
                Routing::default()
            )),
            -32601
        );
        assert_eq!(
            code(check(
                "tools/list",
                None,
                Some("2026-07-28"),
                Routing::default()
            )),
            -32602
        );
        let no_caps = json!({ "_meta": { (META_PROTOCOL_VERSION): "2026-07-28" } });
        assert_eq!(
            code(check(
                "tools/list",
                Some(&no_caps),
                Some("2026-07-28"),
                Routing::default()
            )),
            -32602
        );
        assert_eq!(
            code(check(
                "tools/list",
                Some(&ok),
                Some("2099-01-01"),
                Routing::default()
            )),
            -32020
        );
        let old = meta("2099-01-01");
        let e = check(
            "tools/list",
            Some(&old),
            Some("2099-01-01"),
            Routing::default(),
        )
        .expect_err("unsupported");
        assert_eq!(e.code.0, -32022);
        assert_eq!(e.data.expect("data")["supported"][0], "2026-07-28");
    }

    #[test]
    fn routing_headers_are_required_and_match_the_body() {
        let mut call = meta("2026-07-28");
        call["name"] = json!("add");
        let at = |method, name| Routing {
            method: Some(method),
            name,
        };
        let run = |r| check("tools/call", Some(&call), Some("2026-07-28"), r);
        assert_eq!(code(run(Routing::default())), -32020);
        assert!(run(at("tools/call", Some("add"))).is_ok());
        assert!(run(at("tools/call", Some("=?base64?YWRk?="))).is_ok());
        assert_eq!(code(run(at("TOOLS/CALL", Some("add")))), -32020);
        assert_eq!(code(run(at("tools/call", None))), -32020);
        assert_eq!(code(run(at("tools/call", Some("  add  ")))), -32020);
        assert_eq!(code(run(at("tools/call", Some("other")))), -32020);
        assert_eq!(code(run(at("tools/call", Some("=?base64?!!?=")))), -32020);
    }
}
