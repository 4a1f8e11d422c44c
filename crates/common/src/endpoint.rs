//! The path of the MCP endpoint: the modern server serves it, and the gateway serves
//! both eras on it (its route for `--upstream`; `[[gateway.routes]]` add others).

/// The MCP endpoint path.
pub const ENDPOINT: &str = "/mcp";
