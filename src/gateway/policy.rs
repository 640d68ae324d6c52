//! The gateway's spend policy (`--policy FILE`): which tools spend, what each costs, when a
//! person must approve, and the budget.
//!
//! ```yaml
//! approval_above_cents: 10     # spends above 10 cents need a person
//! budget_cents: 500            # the gateway's budget over all its operations
//! tools:
//!   generate_image:
//!     price_cents: 3           # a fixed price per call
//!   send_payment:
//!     price_pointer: /amount_cents   # the price is this integer in the arguments
//!     approval: true           # every call needs a person
//!   book_flight:
//!     idempotent: true         # the upstream honours `callid/idempotency-key`
//! ```
//!
//! Every tool listed is a spend tool (as with `--spend`); a `--spend` tool not listed costs 0.
//! A spend tool is dispatched **at most once** unless it is declared `idempotent: true` here (or
//! with `--idempotent TOOL`): most real paid servers ignore idempotency keys, so an operation
//! whose outcome is unknown is never sent again but marked in doubt for a person to resolve.
//! Only a tool whose upstream returns the first result for a repeated key may be declared
//! idempotent; its unknown outcomes are then continued under the same key.
//! The price and the approval are decided once, when the operation is recorded, and stored with
//! it, so a redelivery can never skip an approval the original call needed. The budget is
//! checked in the same registry transaction that records the operation (see
//! [`crate::spend::registry::Write::Insert`]): completed operations count by
//! what they charged (0 for an upstream tool error), open and waiting ones by their price.

use crate::canonical::whole_number;
use crate::spend::pipeline::{Quote, ToolCode, ToolError};
use crate::spend::policy::PolicyError;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// The gateway's policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayPolicy {
    /// Spends strictly above this many cents need a person.
    #[serde(default)]
    pub approval_above_cents: Option<u64>,
    /// The budget in cents over all operations of the registry (`None`: unlimited).
    #[serde(default)]
    pub budget_cents: Option<u64>,
    /// Spend tools and their prices.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolPolicy>,
}

/// One spend tool's price and approval.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolPolicy {
    /// A fixed price per call, in cents.
    #[serde(default)]
    pub price_cents: Option<u64>,
    /// A JSON pointer (RFC 6901) to a non-negative integer in the arguments: the price in cents.
    #[serde(default)]
    pub price_pointer: Option<String>,
    /// Every call needs a person.
    #[serde(default)]
    pub approval: bool,
    /// The upstream honours the idempotency key (`false`: at most once, in doubt when unknown).
    #[serde(default)]
    pub idempotent: bool,
}

impl GatewayPolicy {
    /// Reads and checks a YAML policy file ([`crate::spend::policy::load`]).
    pub fn load(path: &Path) -> Result<GatewayPolicy, PolicyError> {
        crate::spend::policy::load::<GatewayPolicy>(path)?.checked(&path.display().to_string())
    }

    /// Parses and checks a YAML policy document (`origin` names it in errors).
    pub fn parse(text: &str, origin: &str) -> Result<GatewayPolicy, PolicyError> {
        crate::spend::policy::parse::<GatewayPolicy>(text, origin)?.checked(origin)
    }

    /// This policy, when each tool has at most one price and its price pointer is a pointer.
    fn checked(self, origin: &str) -> Result<GatewayPolicy, PolicyError> {
        for (name, tool) in &self.tools {
            let at = format!("tools.{name}");
            if tool.price_cents.is_some() && tool.price_pointer.is_some() {
                return Err(PolicyError::Parse {
                    path: origin.to_string(),
                    at,
                    message: "give `price_cents` or `price_pointer`, not both".into(),
                });
            }
            if let Some(p) = &tool.price_pointer
                && !p.starts_with('/')
            {
                return Err(PolicyError::Parse {
                    path: origin.to_string(),
                    at: format!("{at}.price_pointer"),
                    message: format!(
                        "`{p}` is not a JSON pointer: it starts with `/`, e.g. `/amount_cents`"
                    ),
                });
            }
        }
        Ok(self)
    }

    /// The price of a call of `tool` with `args`, in cents.
    pub fn price(&self, tool: &str, args: &Value) -> Result<u64, ToolError> {
        let Some(t) = self.tools.get(tool) else {
            return Ok(0);
        };
        if let Some(p) = &t.price_pointer {
            return args.pointer(p).and_then(whole_number).ok_or_else(|| {
                ToolError::new(
                    ToolCode::InvalidArguments,
                    format!(
                        "`{tool}` is priced by the argument at `{p}`, which must be a \
                         non-negative integer number of cents; nothing was dispatched"
                    ),
                )
            });
        }
        Ok(t.price_cents.unwrap_or(0))
    }

    /// The quote of a call of `tool` whose [price](Self::price) is `amount_cents`: whether it
    /// [needs a person](Self::needs_approval), and the budget. Both of the gateway's spenders
    /// (the upstream and the guard's hand-off) quote with this one rule.
    pub fn quote(&self, tool: &str, amount_cents: u64) -> Quote {
        Quote {
            amount_cents,
            needs_approval: self.needs_approval(tool, amount_cents),
            budget_cents: self.budget_cents,
        }
    }

    /// Whether `tool`'s upstream is declared to honour the idempotency key (default: no).
    pub fn idempotent(&self, tool: &str) -> bool {
        self.tools.get(tool).is_some_and(|t| t.idempotent)
    }

    /// Whether a call of `tool` costing `amount_cents` needs a person.
    pub fn needs_approval(&self, tool: &str, amount_cents: u64) -> bool {
        self.tools.get(tool).is_some_and(|t| t.approval)
            || self
                .approval_above_cents
                .is_some_and(|limit| amount_cents > limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prices_approvals_and_errors() {
        let p = GatewayPolicy::parse(
            "approval_above_cents: 10\nbudget_cents: 50\ntools:\n  img:\n    price_cents: 3\n  \
             pay:\n    price_pointer: /amount/cents\n    approval: true\n",
            "p.yaml",
        )
        .unwrap();
        assert_eq!(p.price("img", &json!({})).unwrap(), 3);
        assert_eq!(
            p.price("pay", &json!({"amount": {"cents": 12}})).unwrap(),
            12
        );
        assert_eq!(
            p.price("pay", &json!({"amount": {"cents": 12.0}})).unwrap(),
            12
        );
        assert_eq!(p.price("other", &json!({})).unwrap(), 0);
        for bad in [
            json!({}),
            json!({"amount": {"cents": -1}}),
            json!({"amount": {"cents": "3"}}),
            json!({"amount": {"cents": 2.5}}),
        ] {
            assert_eq!(
                p.price("pay", &bad).unwrap_err().code,
                ToolCode::InvalidArguments,
                "{bad}"
            );
        }
        assert!(!p.needs_approval("img", 10));
        assert!(p.needs_approval("img", 11));
        assert!(p.needs_approval("pay", 0));
        let both = GatewayPolicy::parse(
            "tools:\n  x:\n    price_cents: 1\n    price_pointer: /a\n",
            "p.yaml",
        )
        .unwrap_err();
        assert!(both.to_string().contains("not both"), "{both}");
        assert_eq!(both.code(), "policy_invalid");
        let ptr =
            GatewayPolicy::parse("tools:\n  x:\n    price_pointer: a\n", "p.yaml").unwrap_err();
        assert!(ptr.to_string().contains("not a JSON pointer"), "{ptr}");
        let unknown = GatewayPolicy::parse("tools:\n  x:\n    price: 1\n", "p.yaml").unwrap_err();
        assert!(
            unknown.to_string().contains("at `tools.x.price`"),
            "{unknown}"
        );
    }
}
