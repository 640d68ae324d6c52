//! The metadata-shape probe: an MCP server (stdio or streamable HTTP) and a transparent stdio
//! proxy that record the shape of every request's `_meta`, never a value, never the arguments.
