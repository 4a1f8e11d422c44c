//! The path of the MCP endpoint: the modern server serves it, and the gateway serves
//! both eras on it.

/// The MCP endpoint path.
pub const ENDPOINT: &str = "/mcp";
