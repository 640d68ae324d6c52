//! The tool reply and error catalogue: what every answer of a tool call looks like on the wire.
//!
//! The [`pipeline`](super::pipeline) decides *what* to answer; this module says *how*: a result
//! ([`Reply`]), a tool error with its stable code ([`ToolError`]), the one table of every code
//! with the spenders that answer it ([`ToolCode::ALL`], [`Catalogue`]) and how identity errors
//! map onto it. Each spender names its catalogue and keeps its result text
//! ([`crate::router::reply`], [`crate::gateway::spend::ERROR_CODES`]).
//!
//! # Guarantees
//! - A tool error's `structuredContent` is `{"error": code, "message", "handle"?, "status"?}`
//!   and its text content is the message; the code is one of the spender's catalogue.
//! - A spend result carries `_meta["callid/replayed"]`; a result relayed from an upstream keeps
//!   its own content and gets `callid/replayed` (and `callid/handle` when known) in `_meta`.
//! - A charge above its authorization is never hidden: the result gets an `overcharge` member
//!   and the text a warning.

use super::registry::{Operation, RegistryError, Status};
use super::replay::Cached;
use super::scrub::Scrubber;
use crate::identity;
use crate::keys::{OperationKey, PublicHandle};
use rmcp::model::{CallToolResult, ContentBlock, MetaObject};
use serde::Deserialize as _;
use serde_json::{Value, json};
use std::sync::Arc;

/// `_meta` key of a result that says whether it was replayed.
pub const REPLAYED_META: &str = "callid/replayed";

/// Which spender's catalogue a [`ToolCode`] belongs to: the codes a tool call of the built-in
/// router ([`crate::router::reply::ERROR_CODES`]) or of the gateway
/// ([`crate::gateway::spend::ERROR_CODES`]) can answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Catalogue {
    /// The built-in router in front of the image backend.
    Router,
    /// The gateway in front of an upstream MCP server.
    Gateway,
}

impl Catalogue {
    /// How many codes this catalogue has.
    pub const fn size(self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < ToolCode::ALL.len() {
            if ToolCode::ALL[i].in_catalogue(self) {
                n += 1;
            }
            i += 1;
        }
        n
    }

    /// This catalogue's codes, in [`ToolCode::ALL`] order; `N` is [`Catalogue::size`] (checked
    /// when the constant is compiled).
    pub const fn codes<const N: usize>(self) -> [ToolCode; N] {
        let mut codes = [ToolCode::ALL[0]; N];
        let mut n = 0;
        let mut i = 0;
        while i < ToolCode::ALL.len() {
            if ToolCode::ALL[i].in_catalogue(self) {
                codes[n] = ToolCode::ALL[i];
                n += 1;
            }
            i += 1;
        }
        assert!(n == N, "N is the catalogue's size");
        codes
    }
}

/// The table of every tool error code: its variant, its wire string and the catalogues that
/// answer it, one line each. [`ToolCode`], [`ToolCode::ALL`] (in table order),
/// [`ToolCode::code`] and each spender's catalogue ([`Catalogue::codes`]) all come from it, so
/// adding a code is one line here and no catalogue can hold a code that `ALL` lacks.
macro_rules! tool_codes {
    ($($variant:ident = $wire:literal: $($catalogue:ident)+;)+) => {
        /// A tool error's stable code: every code a tool call of the router or the gateway can
        /// answer. The wire string ([`ToolCode::code`]) never changes; which codes a spender
        /// answers is its [`Catalogue`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ToolCode {
            $(
                #[doc = concat!("`", $wire, "`.")]
                $variant,
            )+
        }

        impl ToolCode {
            /// Every code, in catalogue order.
            pub const ALL: [ToolCode; [$(ToolCode::$variant),+].len()] = [$(ToolCode::$variant),+];

            /// The stable wire string (`structuredContent.error`, the registry's recorded code).
            pub const fn code(self) -> &'static str {
                match self {
                    $(ToolCode::$variant => $wire,)+
                }
            }

            /// Whether `catalogue` holds this code.
            pub const fn in_catalogue(self, catalogue: Catalogue) -> bool {
                let holders: &[Catalogue] = match self {
                    $(ToolCode::$variant => &[$(Catalogue::$catalogue),+],)+
                };
                let mut i = 0;
                while i < holders.len() {
                    if holders[i] as u8 == catalogue as u8 {
                        return true;
                    }
                    i += 1;
                }
                false
            }
        }
    };
}

tool_codes! {
    MissingIdentity = "missing_identity": Router Gateway;
    AmbiguousIdentity = "ambiguous_identity": Router Gateway;
    InvalidIdentity = "invalid_identity": Router Gateway;
    IdentityInArguments = "identity_in_arguments": Router Gateway;
    MissingSignature = "missing_signature": Router Gateway;
    InvalidSignature = "invalid_signature": Router Gateway;
    UnknownSigningKey = "unknown_signing_key": Router Gateway;
    SigningKeyNotAllowed = "signing_key_not_allowed": Router Gateway;
    SignatureExpired = "signature_expired": Router Gateway;
    SignatureNotYetValid = "signature_not_yet_valid": Router Gateway;
    UnsignedIdentity = "unsigned_identity": Router Gateway;
    VouchedForMismatch = "vouched_for_mismatch": Gateway;
    NonCanonicalArguments = "non_canonical_arguments": Router Gateway;
    InvalidArguments = "invalid_arguments": Router Gateway;
    RequestMismatch = "request_mismatch": Router Gateway;
    OperationInProgress = "operation_in_progress": Router Gateway;
    AwaitingApproval = "awaiting_approval": Router Gateway;
    OperationDenied = "operation_denied": Router Gateway;
    UnknownOperation = "unknown_operation": Router Gateway;
    RegistryUnavailable = "registry_unavailable": Router Gateway;
    OutcomeUnknown = "outcome_unknown": Router Gateway;
    OutcomeInDoubt = "outcome_in_doubt": Gateway;
    BackendStateCorrupt = "backend_state_corrupt": Router;
    BudgetExceeded = "budget_exceeded": Router Gateway;
    CreateNewOperation = "create_new_operation": Router;
    UnknownModel = "unknown_model": Router;
    ProviderUnavailable = "provider_unavailable": Router;
    ProviderError = "provider_error": Router Gateway;
    UpstreamUnavailable = "upstream_unavailable": Gateway;
    UpstreamError = "upstream_error": Gateway;
}

impl ToolCode {
    /// The code whose wire string is `code`, if any.
    pub fn from_code(code: &str) -> Option<ToolCode> {
        ToolCode::ALL.into_iter().find(|c| c.code() == code)
    }

    /// The code of an identity refusal (the same wire string as [`identity::IdentityError::code`]).
    pub fn of_identity(e: &identity::IdentityError) -> ToolCode {
        use identity::IdentityError as E;
        match e {
            E::Missing | E::MissingExtended { .. } => ToolCode::MissingIdentity,
            E::Ambiguous { .. } => ToolCode::AmbiguousIdentity,
            E::Invalid { .. } => ToolCode::InvalidIdentity,
            E::InArguments { .. } => ToolCode::IdentityInArguments,
        }
    }

    /// The code of a signature refusal (the same wire string as
    /// [`identity::signature::SignatureError::code`]).
    pub fn of_signature(e: &identity::signature::SignatureError) -> ToolCode {
        use identity::signature::SignatureError as E;
        match e {
            E::Missing => ToolCode::MissingSignature,
            E::Malformed { .. } | E::Forged { .. } => ToolCode::InvalidSignature,
            E::UnknownKey { .. } => ToolCode::UnknownSigningKey,
            E::PlatformNotAllowed { .. } => ToolCode::SigningKeyNotAllowed,
            E::Expired { .. } => ToolCode::SignatureExpired,
            E::NotYetValid { .. } => ToolCode::SignatureNotYetValid,
            E::Unsigned { .. } => ToolCode::UnsignedIdentity,
        }
    }
}

impl std::fmt::Display for ToolCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code())
    }
}

/// A tool error: a stable code, a message that says what to do, and the operation if one exists.
#[derive(Debug, Clone)]
pub struct ToolError {
    /// Stable machine code (one of the spender's [`super::pipeline::Spender::ERROR_CODES`]).
    pub code: ToolCode,
    /// What happened and what to do.
    pub message: String,
    /// The operation's public handle, if one exists.
    pub handle: Option<PublicHandle>,
    /// The operation's state, if one exists.
    pub status: Option<Status>,
    /// The underlying failure alone, without the advice of `message` (when it differs).
    pub cause: Option<String>,
}

impl ToolError {
    /// An error with no operation.
    pub fn new(code: ToolCode, message: impl Into<String>) -> Self {
        ToolError {
            code,
            message: message.into(),
            handle: None,
            status: None,
            cause: None,
        }
    }

    /// This error, about operation `op`.
    pub fn of(mut self, op: &Operation) -> Self {
        self.handle = Some(op.handle.clone());
        self.status = Some(op.status);
        self
    }

    pub(crate) fn registry(err: RegistryError) -> Self {
        let mut e = ToolError::new(
            ToolCode::RegistryUnavailable,
            format!(
                "{err}; nothing was dispatched for this delivery, and retrying with the same call is safe once the registry is fixed"
            ),
        );
        e.cause = Some(err.to_string());
        e
    }

    /// The spender was called for `op` and answered (`answer`, saying whether money moved),
    /// but its answer could not be recorded.
    pub(crate) fn unrecorded(op: &Operation, answer: &str, cause: &ToolError) -> Self {
        ToolError::new(
            ToolCode::OutcomeUnknown,
            format!(
                "operation `{}` was dispatched and the backend answered ({answer}), but the answer \
                 could not be recorded: {}; redeliver this same call (same call id, same \
                 arguments) to get the recorded outcome without a second charge, and do not make \
                 a new call for it",
                op.handle,
                cause.cause.as_deref().unwrap_or(&cause.message)
            ),
        )
        .of(op)
    }

    /// The `structuredContent` of this error.
    pub fn structured(&self) -> Value {
        let mut v = json!({"error": self.code.code(), "message": self.message});
        if let Some(h) = &self.handle {
            v["handle"] = json!(h.as_str());
        }
        if let Some(s) = self.status {
            v["status"] = json!(s.name());
        }
        v
    }
}

/// A tool's answer before it is scrubbed ([`Reply::scrub`]) and put on the wire
/// ([`Reply::into_result`]), each once, at the edge ([`super::pipeline::Core::finish`]).
#[derive(Debug)]
pub enum Reply {
    /// A result.
    Ok {
        /// `structuredContent`.
        structured: Value,
        /// The human summary.
        text: String,
        /// `Some` for spend results (`_meta["callid/replayed"]`).
        replayed: Option<bool>,
    },
    /// A whole `CallToolResult` someone else wrote (an upstream's), sent as it is but for
    /// `_meta`, which gets `callid/replayed` and, when given, `callid/handle`.
    Raw {
        /// The `CallToolResult` JSON.
        result: Value,
        /// `_meta["callid/replayed"]`.
        replayed: bool,
        /// `_meta["callid/handle"]`.
        handle: Option<PublicHandle>,
    },
    /// A tool error.
    Err(ToolError),
    /// A reply already rendered and scrubbed (a completed operation's replay from the
    /// [`super::replay::ReplayCache`]): sent as it is.
    Ready(Arc<Cached>),
}

impl From<ToolError> for Reply {
    fn from(e: ToolError) -> Self {
        Reply::Err(e)
    }
}

/// `_meta` key of a gateway result that names its operation's public handle.
pub const HANDLE_META: &str = "callid/handle";

impl Reply {
    /// Scrubs this reply's text in place, before it is put on the wire: every string that
    /// holds one of `keys` or the scrubber's key prefix (see [`Scrubber`]); returns how many
    /// strings it rewrote. A [`Reply::Ready`] reply was scrubbed when it was cached.
    pub fn scrub(&mut self, scrubber: &Scrubber, keys: &[&OperationKey]) -> usize {
        match self {
            Reply::Ok {
                structured, text, ..
            } => scrubber.scrub(structured, keys) + usize::from(scrubber.scrub_string(text, keys)),
            Reply::Raw { result, .. } => scrubber.scrub(result, keys),
            Reply::Err(e) => {
                let mut n = usize::from(scrubber.scrub_string(&mut e.message, keys));
                if let Some(handle) = &e.handle {
                    let mut text = handle.as_str().to_string();
                    if scrubber.scrub_string(&mut text, keys) {
                        e.handle = Some(PublicHandle::from_stored(text));
                        n += 1;
                    }
                }
                n
            }
            Reply::Ready(_) => 0,
        }
    }

    /// The `CallToolResult` of this reply, built once from its parts (moved, not copied). A
    /// result someone else wrote ([`Reply::Raw`]) keeps every member of `CallToolResult` it has
    /// (a `_meta` that is not an object is replaced); one that is not a `CallToolResult` at
    /// all is carried as `structuredContent`, with empty `content`.
    pub fn into_result(self) -> CallToolResult {
        match self {
            Reply::Ok {
                structured,
                text,
                replayed,
            } => {
                let mut result = text_result(text, structured);
                result.meta = replayed.map(|r| meta([(REPLAYED_META, json!(r))]));
                result
            }
            Reply::Raw {
                result,
                replayed,
                handle,
            } => {
                let mut result = foreign_result(result);
                let meta = &mut result.meta.get_or_insert_with(MetaObject::new).0;
                meta.insert(REPLAYED_META.into(), json!(replayed));
                if let Some(h) = handle {
                    meta.insert(HANDLE_META.into(), json!(h.as_str()));
                }
                result
            }
            Reply::Ready(cached) => cached.reply.clone(),
            Reply::Err(e) => {
                let structured = e.structured();
                let mut result = text_result(e.message, structured);
                result.is_error = Some(true);
                result
            }
        }
    }
}

/// A result of one text block and its `structuredContent`, as the wire had it when it was
/// written as JSON (no `resultType`: rmcp's server sets what the peer's version needs).
fn text_result(text: String, structured: Value) -> CallToolResult {
    let mut result = CallToolResult::default();
    result.result_type = None;
    result.content = vec![ContentBlock::text(text)];
    result.structured_content = Some(structured);
    result
}

/// A `CallToolResult` someone else wrote, as recorded: read as one when it is one.
fn foreign_result(mut recorded: Value) -> CallToolResult {
    if let Value::Object(map) = &mut recorded
        && map.get("_meta").is_some_and(|m| !m.is_object())
    {
        map.remove("_meta");
    }
    if recorded.is_object()
        && let Ok(result) = CallToolResult::deserialize(&recorded)
    {
        return result;
    }
    let mut result = CallToolResult::default();
    result.result_type = None;
    result.structured_content = Some(recorded);
    result
}

/// A `_meta` object of these members.
fn meta<const N: usize>(members: [(&str, Value); N]) -> MetaObject {
    MetaObject(
        members
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

/// A signature refusal as a tool error (nothing was recorded or dispatched).
pub fn signature_error(e: identity::signature::SignatureError) -> ToolError {
    ToolError::new(
        ToolCode::of_signature(&e),
        format!("{e}; nothing was dispatched"),
    )
}

/// An identity refusal: nothing was dispatched.
pub fn identity_error(e: identity::IdentityError) -> ToolError {
    ToolError::new(
        ToolCode::of_identity(&e),
        format!("{e}; nothing was dispatched"),
    )
}

/// The `overcharge` member: what was authorized and what was charged.
pub fn overcharge_json(authorized: u64, charged: u64) -> Value {
    json!({"authorized_cents": authorized, "charged_cents": charged})
}

/// The warning appended to a reply whose charge exceeded its authorization.
pub fn overcharge_text(authorized: u64, charged: u64) -> String {
    format!(
        "; WARNING: the provider charged {charged} cents although {authorized} were authorized; \
         the budget was debited by the full charge"
    )
}

/// The error and its causes, as one line.
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_render_the_contract_shapes() {
        let handle = PublicHandle::from_stored(
            "hubu:public-operation:v1:00000000-0000-4000-8000-000000000000".into(),
        );
        let ok = Reply::Ok {
            structured: json!({"handle": handle.as_str(), "status": "completed", "result": {"charge_id": "ch_1", "amount_cents": 3}}),
            text: "Generated image".into(),
            replayed: Some(true),
        };
        let mut err = ToolError::new(ToolCode::AwaitingApproval, "needs a person");
        err.handle = Some(handle);
        err.status = Some(Status::AwaitingApproval);
        let bare = ToolError::new(ToolCode::MissingIdentity, "no identity");
        let wire = |reply: Reply| serde_json::to_value(reply.into_result()).unwrap();
        insta::assert_json_snapshot!(
            "reply_shapes",
            json!({
                "success": wire(ok),
                "error_with_operation": wire(Reply::Err(err)),
                "error_without_operation": wire(Reply::Err(bare)),
            })
        );
    }

    /// Each reply's typed result is the one rmcp read from the JSON the reply was written as
    /// before it was built typed (so the wire is unchanged), an upstream's result included.
    #[test]
    fn typed_results_equal_the_json_they_replace() {
        let handle = PublicHandle::from_stored("hubu:public-operation:v1:h".into());
        let mut err = ToolError::new(ToolCode::OutcomeUnknown, "lost");
        err.handle = Some(handle.clone());
        err.status = Some(Status::Pending);
        let cases = [
            (
                Reply::Ok {
                    structured: json!({"handle": "h", "result": {"n": 1}}),
                    text: "done".into(),
                    replayed: Some(false),
                },
                json!({"content": [{"type": "text", "text": "done"}],
                       "structuredContent": {"handle": "h", "result": {"n": 1}},
                       "_meta": {"callid/replayed": false}}),
            ),
            (
                Reply::Ok {
                    structured: json!({"status": "pending"}),
                    text: "status".into(),
                    replayed: None,
                },
                json!({"content": [{"type": "text", "text": "status"}],
                       "structuredContent": {"status": "pending"}}),
            ),
            (
                Reply::Err(err),
                json!({"isError": true, "content": [{"type": "text", "text": "lost"}],
                       "structuredContent": {"error": "outcome_unknown", "message": "lost",
                                             "handle": "hubu:public-operation:v1:h",
                                             "status": "pending"}}),
            ),
            (
                Reply::Raw {
                    result: json!({"content": [{"type": "image", "data": "AA==", "mimeType": "image/png"}],
                                   "isError": false, "_meta": {"vendor": 1}}),
                    replayed: true,
                    handle: Some(handle.clone()),
                },
                json!({"content": [{"type": "image", "data": "AA==", "mimeType": "image/png"}],
                       "isError": false,
                       "_meta": {"vendor": 1, "callid/replayed": true,
                                 "callid/handle": "hubu:public-operation:v1:h"}}),
            ),
            (
                Reply::Raw {
                    result: json!({"content": [], "_meta": "not an object"}),
                    replayed: false,
                    handle: None,
                },
                json!({"content": [], "_meta": {"callid/replayed": false}}),
            ),
            (
                Reply::Raw {
                    result: json!([1, 2]),
                    replayed: false,
                    handle: None,
                },
                json!({"content": [], "structuredContent": [1, 2],
                       "_meta": {"callid/replayed": false}}),
            ),
        ];
        for (reply, before) in cases {
            let want: CallToolResult = serde_json::from_value(before.clone()).unwrap();
            assert_eq!(reply.into_result(), want, "{before}");
        }
    }

    /// Scrubbing reaches every part of every reply that carries text, the handle of an error
    /// included (a key prefix that a handle shares is a configuration the scrubber still
    /// honours).
    #[test]
    fn scrubbing_reaches_every_part() {
        let scrubber = Scrubber::new("hubu:");
        let key = OperationKey::generate("hubu:", "codex");
        let k = key.expose().to_string();
        let mut err = ToolError::new(ToolCode::OutcomeUnknown, format!("sent {k}"));
        err.handle = Some(PublicHandle::from_stored(
            "hubu:public-operation:v1:h".into(),
        ));
        let replies = [
            Reply::Ok {
                structured: json!({"echo": k}),
                text: format!("charged {k}"),
                replayed: Some(false),
            },
            Reply::Raw {
                result: json!({"content": [{"type": "text", "text": k}], "_meta": {"k": k}}),
                replayed: false,
                handle: None,
            },
            Reply::Err(err),
        ];
        for mut reply in replies {
            assert!(reply.scrub(&scrubber, &[&key]) > 0);
            let wire = serde_json::to_string(&reply.into_result()).unwrap();
            assert!(!wire.contains(&k) && !wire.contains("hubu:"), "{wire}");
        }
    }

    /// The wire strings, written out by hand: a renamed variant or string fails here.
    #[test]
    fn every_code_keeps_its_wire_string() {
        let table = [
            (ToolCode::MissingIdentity, "missing_identity"),
            (ToolCode::AmbiguousIdentity, "ambiguous_identity"),
            (ToolCode::InvalidIdentity, "invalid_identity"),
            (ToolCode::IdentityInArguments, "identity_in_arguments"),
            (ToolCode::MissingSignature, "missing_signature"),
            (ToolCode::InvalidSignature, "invalid_signature"),
            (ToolCode::UnknownSigningKey, "unknown_signing_key"),
            (ToolCode::SigningKeyNotAllowed, "signing_key_not_allowed"),
            (ToolCode::SignatureExpired, "signature_expired"),
            (ToolCode::SignatureNotYetValid, "signature_not_yet_valid"),
            (ToolCode::UnsignedIdentity, "unsigned_identity"),
            (ToolCode::VouchedForMismatch, "vouched_for_mismatch"),
            (ToolCode::NonCanonicalArguments, "non_canonical_arguments"),
            (ToolCode::InvalidArguments, "invalid_arguments"),
            (ToolCode::RequestMismatch, "request_mismatch"),
            (ToolCode::OperationInProgress, "operation_in_progress"),
            (ToolCode::AwaitingApproval, "awaiting_approval"),
            (ToolCode::OperationDenied, "operation_denied"),
            (ToolCode::UnknownOperation, "unknown_operation"),
            (ToolCode::RegistryUnavailable, "registry_unavailable"),
            (ToolCode::OutcomeUnknown, "outcome_unknown"),
            (ToolCode::OutcomeInDoubt, "outcome_in_doubt"),
            (ToolCode::BackendStateCorrupt, "backend_state_corrupt"),
            (ToolCode::BudgetExceeded, "budget_exceeded"),
            (ToolCode::CreateNewOperation, "create_new_operation"),
            (ToolCode::UnknownModel, "unknown_model"),
            (ToolCode::ProviderUnavailable, "provider_unavailable"),
            (ToolCode::ProviderError, "provider_error"),
            (ToolCode::UpstreamUnavailable, "upstream_unavailable"),
            (ToolCode::UpstreamError, "upstream_error"),
        ];
        assert_eq!(table.len(), ToolCode::ALL.len());
        for (i, (code, wire)) in table.into_iter().enumerate() {
            assert_eq!(ToolCode::ALL[i], code, "catalogue order");
            assert_eq!(code.code(), wire);
            assert_eq!(code.to_string(), wire);
            assert_eq!(ToolCode::from_code(wire), Some(code));
        }
        assert_eq!(ToolCode::from_code("no_such_code"), None);
        for wire in identity::IdentityError::CODES {
            assert!(ToolCode::from_code(wire).is_some(), "{wire}");
        }
        for wire in identity::signature::SignatureError::CODES {
            assert!(ToolCode::from_code(wire).is_some(), "{wire}");
        }
    }

    /// Each spender's catalogue, written out by hand: moving a code into or out of one is a
    /// deliberate change of this list too.
    #[test]
    fn each_catalogue_holds_the_codes_its_spender_answers() {
        let only_router = [
            "backend_state_corrupt",
            "create_new_operation",
            "unknown_model",
            "provider_unavailable",
        ];
        let only_gateway = [
            "vouched_for_mismatch",
            "outcome_in_doubt",
            "upstream_unavailable",
            "upstream_error",
        ];
        let expected = |not: &[&str]| -> Vec<&'static str> {
            ToolCode::ALL
                .iter()
                .map(|c| c.code())
                .filter(|w| !not.contains(w))
                .collect()
        };
        let codes = |list: &[ToolCode]| list.iter().map(|c| c.code()).collect::<Vec<_>>();
        assert_eq!(
            codes(&Catalogue::Router.codes::<{ Catalogue::Router.size() }>()),
            expected(&only_gateway)
        );
        assert_eq!(
            codes(&Catalogue::Gateway.codes::<{ Catalogue::Gateway.size() }>()),
            expected(&only_router)
        );
        for code in ToolCode::ALL {
            assert!(
                code.in_catalogue(Catalogue::Router) || code.in_catalogue(Catalogue::Gateway),
                "{code} is answered by no spender"
            );
        }
    }
}
