//! [`Gateway`]: the router's [`pipeline`](crate::spend::pipeline) in front of an upstream MCP
//! server, with the upstream as its [`Spender`].
//!
//! A spend tool's call is recorded before the upstream sees it, then sent upstream with the
//! operation's arguments as recorded and `_meta` holding only
//! `callid/idempotency-key` ([`crate::keys::OperationKey::idempotency_key`]), the same on every
//! continuation of the operation. The upstream's `CallToolResult`, `isError: true` included, is
//! the operation's recorded result, replayed on redelivery with `_meta["callid/replayed"]` and
//! `_meta["callid/handle"]` added. Every answer about an operation (results, refusals naming
//! one, `operation_status`) names its handle and status in `_meta["callid/handle"]` and
//! `_meta["callid/status"]`; `callid/*` keys of the upstream's own `_meta` are dropped, since
//! those names are the gateway's. When a spend's outcome is unknown after it may have reached
//! the upstream (it died, timed out, dropped the connection, or answered something unreadable)
//! the operation is in doubt (`outcome_in_doubt`) and never sent again, unless the tool is
//! declared idempotent, in which case it stays open (`outcome_unknown`) and a redelivery
//! re-sends it under the same idempotency key. An upstream that could not be reached at all
//! leaves the operation open either way (nothing was sent). A vouching gateway also sends a
//! signed envelope of the call it checked ([`super::vouch`]).

use super::policy::GatewayPolicy;
use super::upstream::{Upstream, UpstreamError};
use crate::canonical::push_pointer_token;
use crate::identity;
use crate::keys::IDEMPOTENCY_META;
use crate::spend::pipeline::{Core, Outcome, Quote, Reply, Spender, ToolCode, ToolError};
use crate::spend::registry::{Operation, Status};
use crate::spend::reply::Catalogue;
use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, MetaObject, Tool};
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;

/// `_meta` key of a gateway answer that names its operation's status (the handle is in
/// [`crate::spend::pipeline::HANDLE_META`]).
pub const STATUS_META: &str = "callid/status";
pub use crate::spend::tools::{OPERATION_STATUS, RESUME_OPERATION};

/// Every error code a gateway tool call can answer, and a [`Guard`](super::guard::Guard)'s (which
/// alone answers `vouched_for_mismatch`, [`super::vouch::check_vouched_for`]): the codes the
/// table of [`ToolCode`] gives to [`Catalogue::Gateway`], in its order.
pub const ERROR_CODES: &[ToolCode] = &Catalogue::Gateway.codes::<{ Catalogue::Gateway.size() }>();

/// Why the gateway refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The upstream could not be reached or listed its tools wrongly.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The upstream already has a tool the gateway adds.
    #[error(
        "the upstream already has a tool named `{tool}`, which the gateway adds itself; rename \
         that tool in the upstream server"
    )]
    NameClash {
        /// The tool.
        tool: String,
    },
    /// A `--spend` tool the upstream does not have.
    #[error("`--spend {tool}`: the upstream has no tool `{tool}`; it has: {available}")]
    UnknownSpendTool {
        /// The tool.
        tool: String,
        /// The upstream's tools.
        available: String,
    },
    /// A spend tool's input schema lets the model write an identity.
    #[error(
        "spend tool `{tool}` exposes the identity-like field `{field}` (at `{pointer}`) in its \
         input schema; a spend's identity must come from the harness's `_meta`, never from \
         model-written arguments: remove that field from the upstream tool"
    )]
    IdentityInSchema {
        /// The tool.
        tool: String,
        /// The field name.
        field: String,
        /// Where in the schema.
        pointer: String,
    },
}

impl StartError {
    /// Stable code of this refusal (what the unit tests check).
    #[cfg(test)]
    pub fn code(&self) -> &'static str {
        match self {
            StartError::Upstream(_) => "upstream_unavailable",
            StartError::NameClash { .. } => "tool_name_clash",
            StartError::UnknownSpendTool { .. } => "unknown_spend_tool",
            StartError::IdentityInSchema { .. } => "identity_in_schema",
        }
    }
}

/// Checks the upstream's tools against the gateway's: no clash with the added tools, every spend
/// tool present, no identity-like field in a spend tool's input schema (by the rule the calls
/// are checked with: `sources`' table, `--identity-sources` included).
pub fn check_tools(
    tools: &[Tool],
    spend: &BTreeSet<String>,
    sources: &identity::IdentitySources,
) -> Result<(), StartError> {
    if let Some(t) = tools
        .iter()
        .find(|t| t.name == OPERATION_STATUS || t.name == RESUME_OPERATION)
    {
        return Err(StartError::NameClash {
            tool: t.name.to_string(),
        });
    }
    for name in spend {
        let Some(tool) = tools.iter().find(|t| t.name == name.as_str()) else {
            return Err(StartError::UnknownSpendTool {
                tool: name.clone(),
                available: tools
                    .iter()
                    .map(|t| format!("`{}`", t.name))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        if let Some((field, pointer)) =
            identity_field(&Value::Object((*tool.input_schema).clone()), "", sources)
        {
            return Err(StartError::IdentityInSchema {
                tool: name.clone(),
                field,
                pointer,
            });
        }
    }
    Ok(())
}

/// The first identity-like property name anywhere in a JSON schema, with its JSON pointer.
fn identity_field(
    schema: &Value,
    at: &str,
    sources: &identity::IdentitySources,
) -> Option<(String, String)> {
    match schema {
        Value::Object(map) => {
            for (key, value) in map {
                let mut here = format!("{at}/");
                push_pointer_token(&mut here, key);
                if matches!(key.as_str(), "properties" | "patternProperties")
                    && let Value::Object(props) = value
                {
                    for name in props.keys() {
                        if sources.is_identity_like(name) {
                            let mut pointer = format!("{here}/");
                            push_pointer_token(&mut pointer, name);
                            return Some((name.clone(), pointer));
                        }
                    }
                }
                if let Some(found) = identity_field(value, &here, sources) {
                    return Some(found);
                }
            }
            None
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, v)| identity_field(v, &format!("{at}/{i}"), sources)),
        _ => None,
    }
}

/// The upstream's tools, checked ([`check_tools`]), plus `operation_status` and
/// `resume_operation`.
async fn merged_tools(
    upstream: &Upstream,
    spend: &BTreeSet<String>,
    sources: &identity::IdentitySources,
) -> Result<Vec<Tool>, StartError> {
    let mut tools = upstream.list_tools().await?;
    check_tools(&tools, spend, sources)?;
    tools.extend(crate::spend::tools::operation_tools());
    Ok(tools)
}

/// The gateway: the pipeline core, the upstream, which tools spend, and the merged tool list.
pub struct Gateway {
    core: Core,
    upstream: Upstream,
    spend: BTreeSet<String>,
    policy: GatewayPolicy,
    tools: Vec<Tool>,
    sources: std::sync::Arc<identity::IdentitySources>,
    vouch: Option<std::sync::Arc<super::vouch::Vouch>>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("upstream", &self.upstream)
            .field("spend", &self.spend)
            .finish()
    }
}

impl Gateway {
    /// A gateway over a connected upstream; lists and checks the upstream's tools. The spend
    /// tools are `spend` and every tool the policy prices. `core` is made (the registry opened,
    /// its file created) only once every check has passed: a refusal creates nothing.
    pub async fn start(
        core: impl FnOnce() -> Core,
        upstream: Upstream,
        mut spend: BTreeSet<String>,
        policy: GatewayPolicy,
        sources: &std::sync::Arc<identity::IdentitySources>,
        vouch: Option<std::sync::Arc<super::vouch::Vouch>>,
    ) -> Result<Gateway, StartError> {
        spend.extend(policy.tools.keys().cloned());
        let tools = merged_tools(&upstream, &spend, sources).await?;
        Ok(Gateway {
            core: core(),
            upstream,
            spend,
            policy,
            tools,
            sources: sources.clone(),
            vouch,
        })
    }

    /// The upstream's tools plus `operation_status` and `resume_operation`, as listed at start.
    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    /// Lists the upstream's tools again and checks them as at start (after the upstream said
    /// its tools changed).
    pub async fn relist_tools(&self) -> Result<Vec<Tool>, StartError> {
        merged_tools(&self.upstream, &self.spend, &self.sources).await
    }

    /// The upstream connection (for requests passed through unchanged).
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// The spend tools, each with whether it is declared idempotent (start-up line).
    pub fn describe_spend_tools(&self) -> String {
        self.spend
            .iter()
            .map(|t| match self.policy.idempotent(t) {
                true => format!("{t} (idempotent)"),
                false => format!("{t} (at most once)"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Whether `tool` goes through the spend pipeline.
    pub fn is_spend(&self, tool: &str) -> bool {
        self.spend.contains(tool)
    }

    /// Which of the gateway's own tools `name` is: a spend tool, `operation_status` or
    /// `resume_operation`; `None` for any other tool (passed through to the upstream).
    pub fn own_tool(&self, name: &str) -> Option<OwnTool> {
        if self.is_spend(name) {
            Some(OwnTool::Spend)
        } else if name == OPERATION_STATUS {
            Some(OwnTool::OperationStatus)
        } else if name == RESUME_OPERATION {
            Some(OwnTool::ResumeOperation)
        } else {
            None
        }
    }

    /// Answers a call of one of the gateway's own tools (`tool`, named `name`): the scrubbed
    /// `CallToolResult`.
    pub async fn call_tool(
        &self,
        tool: OwnTool,
        name: &str,
        arguments: Option<Map<String, Value>>,
        meta: &Map<String, Value>,
    ) -> CallToolResult {
        let args = Value::Object(arguments.unwrap_or_default());
        let (reply, keys) = match tool {
            OwnTool::Spend => self.core.spend(self, name, args, meta).await,
            OwnTool::OperationStatus => (self.core.operation_status(args).await, vec![]),
            OwnTool::ResumeOperation => self.core.resume_operation(self, args).await,
        };
        let mut result = self.core.finish(name, reply, &keys);
        name_operation(&mut result);
        result
    }
}

/// A tool the gateway answers itself ([`Gateway::own_tool`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnTool {
    /// A spend tool, through the spend pipeline.
    Spend,
    /// `operation_status`.
    OperationStatus,
    /// `resume_operation`.
    ResumeOperation,
}

/// Puts the operation's handle and status in `_meta` of every answer about one, so a client
/// reads them in one place whatever the answer: an upstream result (whose `structuredContent`
/// is the upstream's own, so they cannot go there; a recorded result is `completed`), a refusal
/// or `operation_status` (which also carry them in `structuredContent`).
fn name_operation(result: &mut CallToolResult) {
    use crate::spend::pipeline::HANDLE_META;
    let raw = result
        .meta
        .as_ref()
        .and_then(|m| m.get(HANDLE_META))
        .is_some_and(Value::is_string);
    let (handle, status) = if raw {
        (None, Some(Status::Completed.name().to_string()))
    } else {
        let structured = result.structured_content.as_ref();
        let field = |name: &str| structured.and_then(|s| s.get(name)).and_then(Value::as_str);
        match field("handle") {
            Some(h) => (Some(json!(h)), field("status").map(str::to_string)),
            None => return,
        }
    };
    let meta = &mut result.meta.get_or_insert_with(MetaObject::new).0;
    if let Some(h) = handle {
        meta.insert(HANDLE_META.into(), h);
    }
    if let Some(s) = status
        && meta.get(STATUS_META).is_none_or(Value::is_null)
    {
        meta.insert(STATUS_META.into(), json!(s));
    }
}

/// An unknown outcome: the request may have reached the upstream. Its message is the answer
/// for a tool declared idempotent; its cause is what the in-doubt answer of any other tool
/// quotes ([`crate::spend::pipeline::Outcome::Open`]).
fn unknown_outcome(op: &Operation, e: &UpstreamError) -> ToolError {
    let mut err = ToolError::new(
        ToolCode::OutcomeUnknown,
        format!(
            "{e}; operation `{}` was sent upstream and may have run: the gateway keeps it open. \
             Redeliver this same call (same call id, same arguments): it re-sends the request \
             with the same idempotency key, which this tool's upstream is declared to answer \
             without a second charge; do not make a new call for it",
            op.handle
        ),
    );
    err.cause = Some(e.to_string());
    err
}

/// The upstream's result as the gateway records it: `callid/*` keys of its own `_meta` are
/// dropped (the gateway's answers name the operation's handle and status under those names,
/// and an upstream's `callid/status` must not contradict them).
fn without_gateway_keys(mut result: CallToolResult) -> CallToolResult {
    if let Some(meta) = &mut result.meta {
        let before = meta.len();
        meta.retain(|k, _| !k.starts_with("callid/"));
        if meta.len() != before {
            tracing::warn!(
                dropped = before - meta.len(),
                "dropped `callid/*` keys from an upstream result's `_meta`"
            );
        }
        if meta.is_empty() {
            result.meta = None;
        }
    }
    result
}

impl Spender for Gateway {
    /// The price in cents: the arguments themselves are forwarded as the registry recorded
    /// them ([`Operation::arguments`]).
    type Request = u64;

    const ERROR_CODES: &'static [ToolCode] = ERROR_CODES;
    const OPERATOR: &'static str = "callid router";

    fn check(&self, tool: &str, args: &Value) -> Result<u64, ToolError> {
        self.policy.price(tool, args)
    }

    fn recorded(&self, op: &Operation) -> Result<u64, ToolError> {
        Ok(op.amount_cents)
    }

    fn idempotent(&self, tool: &str) -> bool {
        self.policy.idempotent(tool)
    }

    async fn quote(&self, tool: &str, amount_cents: &u64) -> Result<Quote, ToolError> {
        Ok(self.policy.quote(tool, *amount_cents))
    }

    async fn execute(&self, op: &Operation, _amount_cents: &u64) -> Outcome {
        // The one copy of the arguments a dispatch makes: rmcp sends only parameters it owns,
        // and the operation stays the pipeline's, which records the outcome with it.
        let arguments = match &op.arguments {
            Value::Object(map) => map.clone(),
            _ => Map::new(),
        };
        let mut meta = rmcp::model::RequestMetaObject::default();
        meta.0
            .0
            .insert(IDEMPOTENCY_META.into(), json!(op.key.idempotency_key()));
        if let Some(vouch) = &self.vouch {
            vouch.add(op, &mut meta.0.0, identity::trust::now_secs());
        }
        let mut params = CallToolRequestParams::new(op.tool.clone()).with_arguments(arguments);
        params.meta = Some(meta);
        match self.upstream.call_tool(params).await {
            Ok(CallToolResponse::Complete(result)) => {
                let is_error = result.is_error == Some(true);
                let result =
                    serde_json::to_value(without_gateway_keys(result)).unwrap_or(Value::Null);
                Outcome::Done {
                    result: json!({
                        "handle": op.handle.as_str(),
                        "status": Status::Completed.name(),
                        "result": result,
                    }),
                    charged_cents: if is_error { 0 } else { op.amount_cents },
                    answer: if is_error {
                        "the upstream answered with a tool error".into()
                    } else {
                        "the upstream answered with a result".into()
                    },
                }
            }
            Ok(_) => {
                let mut err = ToolError::new(
                    ToolCode::UpstreamError,
                    format!(
                        "the upstream answered `{}` with something other than a tool result \
                         (input request or task), which the gateway does not relay for spend \
                         tools; the operation stays open: redeliver this same call to re-send it \
                         with the same idempotency key",
                        op.tool
                    ),
                );
                err.cause = Some(
                    "the upstream answered with something other than a tool result (an input \
                     request or a task), which the gateway does not relay for spend tools"
                        .into(),
                );
                Outcome::Open(err)
            }
            Err(UpstreamError::Refused(e)) => Outcome::Refused {
                code: ToolCode::UpstreamError,
                message: format!(
                    "the upstream refused `{}` with JSON-RPC error {}: {}",
                    op.tool, e.code.0, e.message
                ),
            },
            Err(e @ (UpstreamError::Connect { .. } | UpstreamError::NotSent { .. })) => {
                Outcome::NotSent(ToolError::new(
                    ToolCode::UpstreamUnavailable,
                    format!(
                        "{e}; nothing was sent upstream for this delivery: redeliver this same call \
                     once the upstream is back"
                    ),
                ))
            }
            Err(e) => Outcome::Open(unknown_outcome(op, &e)),
        }
    }

    fn completed(&self, op: &Operation, replayed: bool) -> Reply {
        Reply::Raw {
            result: op
                .result
                .as_ref()
                .and_then(|r| r.get("result"))
                .cloned()
                .unwrap_or(Value::Null),
            replayed,
            handle: Some(op.handle.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn tool(name: &'static str, schema: Value) -> Tool {
        Tool::new(name, "t", Arc::new(schema.as_object().unwrap().clone()))
    }

    #[test]
    fn start_up_checks_name_the_tool_and_field() {
        let spend: BTreeSet<String> = ["pay".to_string()].into();
        let built_in = identity::IdentitySources::built_in_shared();
        let ok = tool(
            "pay",
            json!({"type": "object", "properties": {"amount": {"type": "integer"}}}),
        );
        assert!(check_tools(std::slice::from_ref(&ok), &spend, &built_in).is_ok());
        let nested = tool(
            "pay",
            json!({"type": "object", "properties": {"order": {"type": "object", "properties": {"call_id": {"type": "string"}}}}}),
        );
        let e = check_tools(&[nested], &spend, &built_in).unwrap_err();
        assert_eq!(e.code(), "identity_in_schema");
        assert!(
            e.to_string().contains("`pay`") && e.to_string().contains("`call_id`"),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("/properties/order/properties/call_id"),
            "{e}"
        );
        let escaped = tool(
            "pay",
            json!({"type": "object", "properties": {"a/b~c": {"type": "object", "properties": {"call_id": {"type": "string"}}}}}),
        );
        let e = check_tools(&[escaped], &spend, &built_in).unwrap_err();
        assert!(
            e.to_string()
                .contains("(at `/properties/a~1b~0c/properties/call_id`)"),
            "{e}"
        );
        let clash = tool(OPERATION_STATUS, json!({"type": "object"}));
        assert_eq!(
            check_tools(&[ok.clone(), clash], &spend, &built_in)
                .unwrap_err()
                .code(),
            "tool_name_clash"
        );
        let e = check_tools(&[], &spend, &built_in).unwrap_err();
        assert_eq!(e.code(), "unknown_spend_tool");
        // A read-only tool may have any schema: only spend tools are checked.
        let free = tool(
            "lookup",
            json!({"type": "object", "properties": {"request_id": {}}}),
        );
        assert!(check_tools(&[ok, free], &spend, &built_in).is_ok());
    }

    #[test]
    fn every_start_up_refusal_reads_well() {
        let all = [
            StartError::Upstream(UpstreamError::Connect {
                spec: "`paid-server --stdio`".into(),
                detail: "No such file or directory (os error 2)".into(),
            }),
            StartError::NameClash {
                tool: OPERATION_STATUS.into(),
            },
            StartError::UnknownSpendTool {
                tool: "buy_car".into(),
                available: "`generate_image`, `list_charges`".into(),
            },
            StartError::IdentityInSchema {
                tool: "pay".into(),
                field: "call_id".into(),
                pointer: "/properties/call_id".into(),
            },
        ];
        let text: Vec<String> = all.iter().map(|e| format!("{}: {e}", e.code())).collect();
        insta::assert_snapshot!("start_up_refusals", text.join("\n"));
    }
}
