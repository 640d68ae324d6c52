//! `--diagnose-meta FILE`: the probe's shape record of each tool call, opt-in, never a value.
//!
//! [`Diagnostics`] appends one [`crate::probe::Record`] per `tools/call` (transport `router`),
//! built by the probe's own [`crate::probe::record::record_for_tool_call`], so `callid classify` reads the
//! router's file exactly like a probe log: key paths, JSON types, lengths and short digests of
//! `_meta`, the shape of the JSON-RPC id and the identity verdict, never a raw value or argument.
//!
//! # Guarantee
//! Recording never changes whether a call is allowed: it runs before the call is answered, and a
//! failure to open or write the file is logged on stderr and the call goes on.

use crate::probe::record::{RecordContext, ShapeLog, Transport};
use crate::shape::Digester;
use serde_json::{Map, Value, json};
use std::path::Path;

/// What the transport knows about one call besides its params.
#[derive(Debug, Clone, Default)]
pub struct CallInfo {
    /// The JSON-RPC id.
    pub request_id: Option<Value>,
    /// The `params` of the connection's `initialize` (client name, protocol version).
    pub initialize: Option<Value>,
}

/// An open `--diagnose-meta` file.
pub struct Diagnostics {
    log: ShapeLog,
    context: RecordContext,
    digester: Digester,
}

impl std::fmt::Debug for Diagnostics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Diagnostics")
            .field("digest", &self.digester.scheme())
            .finish()
    }
}

impl Diagnostics {
    /// Opens (creating, mode 0600) the file for appending; verdicts are given by `sources`.
    pub fn open(
        path: &Path,
        sources: std::sync::Arc<crate::identity::IdentitySources>,
    ) -> Result<Diagnostics, crate::probe::record::LogError> {
        Ok(Diagnostics {
            log: ShapeLog::open(path)?,
            context: RecordContext {
                sources,
                ..RecordContext::new(Transport::Router)
            },
            digester: Digester::Plain,
        })
    }

    /// Records one `tools/call`; `call` carries its JSON-RPC id and the connection's `initialize`
    /// params (for the client name and protocol version).
    pub fn record(
        &self,
        call: &CallInfo,
        tool: &str,
        arguments: Option<&Map<String, Value>>,
        meta: &Map<String, Value>,
    ) {
        let mut context = self.context.clone();
        if let Some(peer) = &call.initialize {
            let init = crate::probe::record_for_request(
                "initialize",
                Some(&json!(0)),
                Some(peer),
                0,
                &context,
                &self.digester,
            );
            context.client = init.client;
            context.protocol_version = init.protocol_version;
        }
        let arguments = Value::Object(arguments.cloned().unwrap_or_default());
        // rmcp hands the router `_meta` as a map; an absent `_meta` arrives empty.
        let meta = (!meta.is_empty()).then(|| Value::Object(meta.clone()));
        let record = crate::probe::record::record_for_tool_call(
            tool,
            &arguments,
            meta.as_ref(),
            call.request_id.as_ref(),
            &context,
            &self.digester,
        );
        if let Err(e) = self.log.write(&record) {
            tracing::warn!("--diagnose-meta: {e}");
        }
    }
}
