//! [`Guard`]: the gateway's protection embedded in a Rust MCP server, without a second process.
//!
//! A paid tool handler asks the guard first ([`Guard::begin`]) with the call's tool name,
//! arguments and `_meta`, and gets a [`Decision`]: a new operation to run (a [`Ticket`] with
//! the public handle and the derived idempotency key to pass to whatever charges), the recorded
//! result of the same call delivered again, or the refusal the router would give. The handler
//! then runs the operation and hands its result to [`Ticket::finish`], which records it and
//! answers the reply to send. It is the same pipeline as `callid router` and `callid gateway`
//! ([`crate::spend::pipeline`]): identity in the arguments refused, trusted identity from
//! `_meta` (fail closed), request hash, the registry row committed before [`Decision::Run`] is
//! returned, redelivery replayed, the same call id with other arguments refused. Built with trust
//! keys ([`GuardBuilder::trust_keys`]), it verifies signed envelopes as `--trust-keys` does.
//! Behind a vouching gateway ([`super::vouch`]), a call whose `_meta["callid/vouched-for"]` is
//! not the identity its envelope's `task_id` binds is refused first (`vouched_for_mismatch`,
//! [`super::vouch::check_vouched_for`]), before anything is recorded.
//!
//! A ticket dropped without [`Ticket::finish`] (the handler failed or was cancelled) leaves the
//! operation's outcome unknown: a tool the policy declares `idempotent` runs again under the
//! same idempotency key on redelivery; any other tool is marked in doubt and never handed out
//! again until a person resolves it (`callid router resolve`).

use super::policy::GatewayPolicy;
use crate::identity::trust::TrustKeys;
use crate::keys::PublicHandle;
use crate::spend::pipeline::{
    Core, CoreOptions, Outcome, Quote, Reply, Spender, ToolCode, ToolError,
};
use crate::spend::registry::{Operation, Status};
use serde_json::{Map, Value, json};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Guards the paid tools of an MCP server with a durable registry.
///
/// # Example
/// ```
/// use callid::gateway::guard::{Decision, Guard};
/// use serde_json::{json, Map, Value};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let dir = tempfile::tempdir().unwrap();
/// let guard = Guard::open(dir.path().join("registry.sqlite3"));
/// let args: Map<String, Value> = json!({"prompt": "fox"}).as_object().unwrap().clone();
/// let meta: Map<String, Value> = json!({"callId": "call_1"}).as_object().unwrap().clone();
///
/// // First delivery: run it, passing the derived key to whatever charges.
/// let reply = match guard.begin("generate_image", &args, &meta).await {
///     Decision::Run(ticket) => {
///         let key = ticket.idempotency_key().to_string();
///         let result = json!({"content": [{"type": "text", "text": format!("charged under {key}")}]});
///         ticket.finish(result).await
///     }
///     other => panic!("a new call runs: {other:?}"),
/// };
/// assert_eq!(reply["_meta"]["callid/replayed"], false);
///
/// // The same call delivered again: the recorded result, nothing runs.
/// match guard.begin("generate_image", &args, &meta).await {
///     Decision::Answer(again) => {
///         assert_eq!(again["content"], reply["content"]);
///         assert_eq!(again["_meta"]["callid/replayed"], true);
///     }
///     other => panic!("a redelivery is answered: {other:?}"),
/// }
///
/// // No trusted identity: refused, as the router would.
/// match guard.begin("generate_image", &args, &Map::new()).await {
///     Decision::Answer(err) => assert_eq!(err["structuredContent"]["error"], "missing_identity"),
///     other => panic!("refused: {other:?}"),
/// }
/// # });
/// ```
pub struct Guard {
    core: Arc<Core>,
    policy: GatewayPolicy,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").field("core", &self.core).finish()
    }
}

/// What to do with a call.
#[derive(Debug)]
pub enum Decision {
    /// A new operation (or an open one continued): run it, then [`Ticket::finish`].
    Run(Ticket),
    /// Send this `CallToolResult` JSON as it is: the recorded result of a redelivery (with
    /// `_meta["callid/replayed"] = true`) or a refusal (`isError: true`, with the router's code
    /// in `structuredContent.error`).
    Answer(Value),
}

/// An operation the caller must run once, under its idempotency key.
pub struct Ticket {
    handle: PublicHandle,
    idempotency_key: String,
    outcome: Option<oneshot::Sender<Outcome>>,
    reply: oneshot::Receiver<Value>,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("handle", &self.handle)
            .finish()
    }
}

impl Ticket {
    /// The operation's public handle (safe to show).
    pub fn handle(&self) -> &PublicHandle {
        &self.handle
    }

    /// The key to pass to whatever charges: derived from the private key, the same on every
    /// continuation of this operation.
    pub fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }

    /// Records `result` (a `CallToolResult` JSON; `isError: true` included) as the operation's
    /// outcome and answers the reply to send (scrubbed, with `_meta["callid/replayed"]` and
    /// `_meta["callid/handle"]`), as rmcp writes a `CallToolResult`. A `result` that is not a
    /// `CallToolResult` is answered as the `structuredContent` of one with empty `content`.
    pub async fn finish(mut self, result: Value) -> Value {
        let is_error = result["isError"] == json!(true);
        let outcome = Outcome::Done {
            result: json!({
                "handle": self.handle.as_str(),
                "status": Status::Completed.name(),
                "result": result,
            }),
            charged_cents: 0,
            answer: if is_error {
                "the tool answered with an error".into()
            } else {
                "the tool answered".into()
            },
        };
        if let Some(tx) = self.outcome.take() {
            let _ = tx.send(outcome);
        }
        (&mut self.reply)
            .await
            .unwrap_or_else(|_| answer(Reply::Err(lost()).into_result()))
    }
}

/// The guard's answer as the JSON its caller sends: the `CallToolResult` the core built, as
/// rmcp puts it on the wire.
fn answer(result: rmcp::model::CallToolResult) -> Value {
    serde_json::to_value(result).unwrap_or(Value::Null)
}

fn lost() -> ToolError {
    ToolError::new(
        ToolCode::OutcomeUnknown,
        "the guard stopped before the outcome was recorded; redeliver this same call",
    )
}

/// The spender of one [`Guard::begin`]: hands the operation out as a [`Ticket`] and waits for
/// its outcome.
struct Handoff<'a> {
    policy: &'a GatewayPolicy,
    ticket: Mutex<Option<oneshot::Sender<Ticket>>>,
    reply: Mutex<Option<oneshot::Sender<Value>>>,
    reply_rx: Mutex<Option<oneshot::Receiver<Value>>>,
}

impl Spender for Handoff<'_> {
    /// The price in cents (the caller runs the operation with its own arguments).
    type Request = u64;

    const ERROR_CODES: &'static [ToolCode] = super::spend::ERROR_CODES;
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
        let (otx, orx) = oneshot::channel();
        let sender = self.ticket.lock().unwrap_or_else(|p| p.into_inner()).take();
        let reply = self
            .reply_rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        // Until the ticket is in the caller's hands nothing has run: the operation stays open and
        // a redelivery hands it out again, whether or not its tool is idempotent.
        let (Some(sender), Some(reply)) = (sender, reply) else {
            return Outcome::NotSent(lost());
        };
        let ticket = Ticket {
            handle: op.handle.clone(),
            idempotency_key: op.key.idempotency_key(),
            outcome: Some(otx),
            reply,
        };
        if sender.send(ticket).is_err() {
            // The caller of `begin` went away before it got the ticket.
            return Outcome::NotSent(lost());
        }
        orx.await.unwrap_or_else(|_| {
            Outcome::Open(ToolError::new(
                ToolCode::OutcomeUnknown,
                format!(
                    "operation `{}` was handed out to run and its outcome never came back; it \
                     stays open: redeliver this same call to run it again under the same \
                     idempotency key",
                    op.handle
                ),
            ))
        })
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

/// Builds a [`Guard`] ([`Guard::builder`]).
#[derive(Debug)]
pub struct GuardBuilder {
    registry: PathBuf,
    policy: GatewayPolicy,
    trust: Option<Arc<TrustKeys>>,
}

impl GuardBuilder {
    /// Prices, approvals and a budget (see [`super::policy`]).
    pub fn policy(mut self, policy: GatewayPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Envelopes must be signed by these keys ([`crate::identity::trust`]); a call whose
    /// signature is refused is answered with its code and records nothing.
    pub fn trust_keys(mut self, trust: TrustKeys) -> Self {
        self.trust = Some(Arc::new(trust));
        self
    }

    /// The guard (its registry opened now if it can be).
    pub fn build(self) -> Guard {
        Guard {
            core: Arc::new(Core::new(CoreOptions {
                registry: crate::spend::registry::RegistryLocation::File(self.registry),
                preallocated_keys: None,
                key_prefix: crate::keys::DEFAULT_KEY_PREFIX.into(),
                handle_prefix: crate::keys::DEFAULT_HANDLE_PREFIX.into(),
                identity_sources: crate::identity::IdentitySources::built_in_shared(),
                lease_ttl: crate::spend::pipeline::LEASE_TTL,
                trust: self.trust,
            })),
            policy: self.policy,
        }
    }
}

impl Guard {
    /// A guard on the registry at `registry` (created if missing; a registry that cannot be
    /// opened makes every call fail closed with `registry_unavailable`).
    pub fn open(registry: impl Into<PathBuf>) -> Guard {
        Guard::with_policy(registry, GatewayPolicy::default())
    }

    /// A guard with prices, approvals and a budget (see [`super::policy`]).
    pub fn with_policy(registry: impl Into<PathBuf>, policy: GatewayPolicy) -> Guard {
        Guard::builder(registry).policy(policy).build()
    }

    /// A guard with more options than [`Guard::open`]: a policy, trust keys.
    pub fn builder(registry: impl Into<PathBuf>) -> GuardBuilder {
        GuardBuilder {
            registry: registry.into(),
            policy: GatewayPolicy::default(),
            trust: None,
        }
    }

    /// Decides what to do with one call of the paid tool `tool`.
    pub async fn begin(
        &self,
        tool: &str,
        arguments: &Map<String, Value>,
        meta: &Map<String, Value>,
    ) -> Decision {
        if let Err(e) = super::vouch::check_vouched_for(meta) {
            let refusal = ToolError::new(
                ToolCode::VouchedForMismatch,
                format!("{e}; nothing was recorded"),
            );
            return Decision::Answer(answer(self.core.finish(tool, Reply::Err(refusal), &[])));
        }
        let (ticket_tx, ticket_rx) = oneshot::channel();
        let (reply_tx, reply_rx) = oneshot::channel();
        let core = self.core.clone();
        let policy = self.policy.clone();
        let (tool, args, meta) = (
            tool.to_string(),
            Value::Object(arguments.clone()),
            meta.clone(),
        );
        let (answer_tx, answer_rx) = oneshot::channel();
        tokio::spawn(async move {
            let handoff = Handoff {
                policy: &policy,
                ticket: Mutex::new(Some(ticket_tx)),
                reply: Mutex::new(Some(reply_tx)),
                reply_rx: Mutex::new(Some(reply_rx)),
            };
            let (reply, keys) = core.spend(&handoff, &tool, args, &meta).await;
            let value = answer(core.finish(&tool, reply, &keys));
            let ticket_taken = handoff
                .ticket
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_none();
            let reply_tx = handoff
                .reply
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            match reply_tx {
                // The ticket's holder waits in `Ticket::finish`.
                Some(tx) if ticket_taken => {
                    let _ = tx.send(value);
                }
                _ => {
                    let _ = answer_tx.send(value);
                }
            }
        });
        tokio::select! {
            biased;
            Ok(ticket) = ticket_rx => Decision::Run(ticket),
            answer = answer_rx => Decision::Answer(
                answer.unwrap_or_else(|_| self::answer(Reply::Err(lost()).into_result())),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str) -> (Map<String, Value>, Map<String, Value>) {
        let args = json!({"prompt": "fox"}).as_object().unwrap().clone();
        let meta = json!({"callId": id}).as_object().unwrap().clone();
        (args, meta)
    }

    /// A guard with trust keys runs a validly signed call and answers a forged one with its
    /// code, recording nothing for it.
    #[tokio::test]
    async fn a_guard_with_trust_keys_verifies_envelopes() {
        use crate::identity::signature::{Alg, SIGNATURE_KEY, sign, write_new_key};
        use crate::identity::trust::{HarnessIds, TrustKeys, now_secs};
        let dir = tempfile::tempdir().unwrap();
        let key = write_new_key(&dir.path().join("k"), Alg::Ed25519).unwrap();
        let intruder = write_new_key(&dir.path().join("x"), Alg::Ed25519).unwrap();
        let trust = dir.path().join("trust.yaml");
        std::fs::write(
            &trust,
            format!(
                "keys:\n  - {{kid: k, alg: ed25519, public_key: {}, platforms: [acme]}}\n",
                key.public_key().unwrap()
            ),
        )
        .unwrap();
        let guard = Guard::builder(dir.path().join("registry.sqlite3"))
            .trust_keys(TrustKeys::load(&trust, HarnessIds::Refuse).unwrap())
            .build();
        let args = json!({"prompt": "fox"}).as_object().unwrap().clone();
        let meta = |by: &crate::identity::signature::SigningKey, id: &str| {
            let envelope = json!({"platform": "acme", "invocation_id": id});
            let jws = sign(&envelope, by, "k", now_secs(), now_secs() + 60).unwrap();
            json!({crate::identity::ENVELOPE_KEY: envelope, SIGNATURE_KEY: jws})
                .as_object()
                .unwrap()
                .clone()
        };
        match guard.begin("pay", &args, &meta(&intruder, "forged")).await {
            Decision::Answer(err) => {
                assert_eq!(
                    err["structuredContent"]["error"], "invalid_signature",
                    "{err}"
                )
            }
            Decision::Run(t) => panic!("a forged envelope must not run: {t:?}"),
        }
        let (_, codex) = call("unsigned");
        match guard.begin("pay", &args, &codex).await {
            Decision::Answer(err) => {
                assert_eq!(
                    err["structuredContent"]["error"], "unsigned_identity",
                    "{err}"
                )
            }
            Decision::Run(t) => panic!("an unsigned harness id must not run: {t:?}"),
        }
        match guard.begin("pay", &args, &meta(&key, "signed")).await {
            Decision::Run(ticket) => {
                let reply = ticket.finish(json!({"content": []})).await;
                assert_eq!(reply["_meta"]["callid/replayed"], false, "{reply}");
            }
            Decision::Answer(a) => panic!("a signed envelope runs: {a}"),
        }
        let rows: i64 = rusqlite::Connection::open(dir.path().join("registry.sqlite3"))
            .unwrap()
            .query_row("SELECT count(*) FROM operations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 1, "only the signed call is recorded");
    }

    /// A guard behind a vouching gateway runs what the gateway wrote, and refuses the same
    /// signed envelope with another `callid/vouched-for` identity (or none beside a foreign
    /// one), recording nothing for it.
    #[tokio::test]
    async fn a_guard_refuses_a_vouched_for_identity_its_envelope_does_not_bind() {
        use crate::gateway::vouch::{VOUCHED_FOR_META, vouched_for_digest};
        use crate::identity::signature::{Alg, SIGNATURE_KEY, sign, write_new_key};
        use crate::identity::trust::{HarnessIds, TrustKeys, now_secs};
        let dir = tempfile::tempdir().unwrap();
        let key = write_new_key(&dir.path().join("gw.key"), Alg::Ed25519).unwrap();
        let trust = dir.path().join("trust.yaml");
        std::fs::write(
            &trust,
            format!(
                "keys:\n  - {{kid: gw-1, alg: ed25519, public_key: {}, platforms: [my-gateway]}}\n",
                key.public_key().unwrap()
            ),
        )
        .unwrap();
        let registry = dir.path().join("registry.sqlite3");
        let guard = Guard::builder(&registry)
            .trust_keys(TrustKeys::load(&trust, HarnessIds::Refuse).unwrap())
            .build();
        let args = json!({"prompt": "fox"}).as_object().unwrap().clone();
        let vouched = |call_id: &str, invocation: &str| {
            let vouched_for = json!({"platform": "codex", "call_id": call_id});
            let envelope = json!({
                "platform": "my-gateway",
                "invocation_id": invocation,
                "task_id": vouched_for_digest(&vouched_for).unwrap(),
            });
            let jws = sign(&envelope, &key, "gw-1", now_secs(), now_secs() + 60).unwrap();
            json!({crate::identity::ENVELOPE_KEY: envelope, SIGNATURE_KEY: jws,
                   VOUCHED_FOR_META: vouched_for})
            .as_object()
            .unwrap()
            .clone()
        };
        let mut altered = vouched("call_1", "op-1");
        altered.insert(
            VOUCHED_FOR_META.into(),
            json!({"platform": "codex", "call_id": "call_2"}),
        );
        let mut foreign = json!({"callId": "call_3"}).as_object().unwrap().clone();
        foreign.insert(
            VOUCHED_FOR_META.into(),
            json!({"platform": "codex", "call_id": "call_3"}),
        );
        for meta in [altered, foreign] {
            match guard.begin("pay", &args, &meta).await {
                Decision::Answer(err) => {
                    assert_eq!(
                        err["structuredContent"]["error"], "vouched_for_mismatch",
                        "{err}"
                    );
                    assert!(err["structuredContent"]["handle"].is_null(), "{err}");
                }
                Decision::Run(t) => panic!("a mismatched vouch must not run: {t:?}"),
            }
        }
        match guard.begin("pay", &args, &vouched("call_1", "op-1")).await {
            Decision::Run(ticket) => {
                let reply = ticket.finish(json!({"content": []})).await;
                assert_eq!(reply["_meta"]["callid/replayed"], false, "{reply}");
            }
            Decision::Answer(a) => panic!("what the gateway vouched for runs: {a}"),
        }
        let rows: i64 = rusqlite::Connection::open(&registry)
            .unwrap()
            .query_row("SELECT count(*) FROM operations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 1, "only the call the gateway vouched for is recorded");
    }

    /// A `begin` abandoned before its ticket was handed out ran nothing: the operation stays
    /// open (not in doubt, though the tool is not idempotent) and the next delivery runs it.
    #[tokio::test]
    async fn a_ticket_never_handed_out_leaves_the_operation_open() {
        let dir = tempfile::tempdir().unwrap();
        let guard = Guard::open(dir.path().join("registry.sqlite3"));
        let (args, meta) = call("abandoned");
        let abandoned =
            tokio::time::timeout(std::time::Duration::ZERO, guard.begin("pay", &args, &meta)).await;
        assert!(abandoned.is_err(), "begin answered at once: {abandoned:?}");
        let again = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            guard.begin("pay", &args, &meta),
        )
        .await
        .expect("the second delivery is answered");
        let ticket = match again {
            Decision::Run(ticket) => ticket,
            Decision::Answer(reply) => panic!("the operation must stay open: {reply}"),
        };
        let reply = ticket
            .finish(json!({"content": [{"type": "text", "text": "ran once"}]}))
            .await;
        assert_eq!(reply["_meta"]["callid/replayed"], false, "{reply}");
    }
}
