//! A hand-written MCP client over stdio lines and streamable HTTP, with exact control of JSON-RPC
//! ids and of every `_meta` key.
