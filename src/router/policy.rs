//! The router's spend policy: when a person must approve an image, and the account's budget.
//!
//! [`Policy`] comes from flags (`--approval-above-cents`, `--approval-model`, `--budget-cents`)
//! and/or a YAML file (`--policy FILE`); a flag overrides the file's field. The policy only ever
//! adds a person or a limit in front of a spend: [`Policy::needs_approval`] is a pure function of
//! the quoted price and the model, decided once when the operation is recorded and stored with
//! it, so a redelivery can never skip an approval that the original call needed.
//!
//! The file is read as every policy file is ([`crate::spend::policy`]: the same errors as the
//! gateway's); what it may say is the router's own, checked against the provider's price table
//! ([`Policy::check`]).
//!
//! ```yaml
//! approval_above_cents: 10      # spends above 10 cents need a person
//! approval_models: [flux-pro]   # every spend with these models needs a person
//! budget_cents: 500             # the account's budget (enforced by the authorization layer)
//! reservation_expiry_seconds: 3600  # a reservation whose provider call never started frees its
//!                                   # budget after this long (default 3600)
//! ```
//!
//! # Budget
//! A spend reserves its quoted price when it is authorized. The reservation is released when the
//! provider refuses the spend, replaced by the receipt's amount when the provider charges (even
//! above the quote: the budget never undercounts a real charge), and expires after
//! `reservation_expiry_seconds` when the provider was never called for it (a crash before the
//! call, or a provider that could not be reached). A reservation whose provider call may have
//! charged (no answer) is kept until a redelivery of the operation settles it.

use crate::spend::policy::PolicyError;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The spend policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Spends strictly above this many cents need a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_above_cents: Option<u64>,
    /// Spends with any of these models need a person.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approval_models: Vec<String>,
    /// The account's budget in cents (`None`: unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_cents: Option<u64>,
    /// Seconds after which a reservation whose provider call never started stops holding budget
    /// (`None`: [`DEFAULT_RESERVATION_EXPIRY`](crate::backend::authorization::DEFAULT_RESERVATION_EXPIRY)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_expiry_seconds: Option<u64>,
}

/// An approval model the price table does not sell: no spend could match it, so the approval
/// it asks for would silently never happen.
#[derive(Debug, thiserror::Error)]
#[error(
    "approval model `{model}` is not in the price table, so no spend would ever match it and \
     approval would never be asked; pass `--approval-model` (or `approval_models` in the policy \
     file) with one of {known}"
)]
pub struct UnknownModel {
    /// The model named.
    pub model: String,
    /// The models of the price table, quoted.
    pub known: String,
}

impl Policy {
    /// Reads a YAML policy file ([`crate::spend::policy::load`]).
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        crate::spend::policy::load(path)
    }

    /// This policy with the fields that `flags` sets replacing its own.
    pub fn overridden_by(mut self, flags: Policy) -> Policy {
        if flags.approval_above_cents.is_some() {
            self.approval_above_cents = flags.approval_above_cents;
        }
        if !flags.approval_models.is_empty() {
            self.approval_models = flags.approval_models;
        }
        if flags.budget_cents.is_some() {
            self.budget_cents = flags.budget_cents;
        }
        if flags.reservation_expiry_seconds.is_some() {
            self.reservation_expiry_seconds = flags.reservation_expiry_seconds;
        }
        self
    }

    /// How long a reservation whose provider call never started holds budget.
    pub fn reservation_expiry(&self) -> std::time::Duration {
        self.reservation_expiry_seconds
            .map(std::time::Duration::from_secs)
            .unwrap_or(crate::backend::authorization::DEFAULT_RESERVATION_EXPIRY)
    }

    /// Refuses a policy that names a model the price table does not know (checked at start-up).
    pub fn check(&self) -> Result<(), UnknownModel> {
        let known = |m: &str| crate::provider::prices::price_cents(m).is_some();
        match self.approval_models.iter().find(|m| !known(m)) {
            None => Ok(()),
            Some(model) => Err(UnknownModel {
                model: model.clone(),
                known: crate::provider::prices::models()
                    .map(|m| format!("`{m}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// Whether a spend of `amount_cents` with `model` needs a person's approval.
    pub fn needs_approval(&self, amount_cents: u64, model: &str) -> bool {
        self.approval_above_cents
            .is_some_and(|limit| amount_cents > limit)
            || self.approval_models.iter().any(|m| m == model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spend::policy::parse;

    #[test]
    fn approval_table() {
        let p = Policy {
            approval_above_cents: Some(5),
            approval_models: vec!["flux-pro".into()],
            budget_cents: None,
            reservation_expiry_seconds: None,
        };
        let cases = [
            (3, "flux-schnell", false),
            (5, "flux-schnell", false),
            (6, "flux-schnell", true),
            (1, "flux-pro", true),
        ];
        for (amount, model, want) in cases {
            assert_eq!(p.needs_approval(amount, model), want, "{amount} {model}");
        }
        assert!(!Policy::default().needs_approval(u64::MAX, "any"));
    }

    #[test]
    fn approval_models_must_be_in_the_price_table() {
        let policy = |models: &[&str]| Policy {
            approval_models: models.iter().map(|m| m.to_string()).collect(),
            ..Policy::default()
        };
        assert!(policy(&[]).check().is_ok());
        assert!(policy(&["flux-pro", "flux-dev"]).check().is_ok());
        let err = policy(&["flux-pro", "FLUX-PRO"]).check().unwrap_err();
        assert_eq!(
            err.to_string(),
            "approval model `FLUX-PRO` is not in the price table, so no spend would ever match it \
             and approval would never be asked; pass `--approval-model` (or `approval_models` in \
             the policy file) with one of `flux-schnell`, `flux-dev`, `flux-pro`"
        );
    }

    #[test]
    fn yaml_and_flags() {
        let file = parse::<Policy>(
            "approval_above_cents: 10\napproval_models: [flux-pro]\nbudget_cents: 50\n\
             reservation_expiry_seconds: 2\n",
            "p.yaml",
        )
        .unwrap();
        let merged = file.clone().overridden_by(Policy {
            approval_above_cents: Some(2),
            ..Policy::default()
        });
        assert_eq!(merged.approval_above_cents, Some(2));
        assert_eq!(merged.approval_models, vec!["flux-pro".to_string()]);
        assert_eq!(merged.budget_cents, Some(50));
        assert_eq!(
            merged.reservation_expiry(),
            std::time::Duration::from_secs(2)
        );
        assert_eq!(
            Policy::default().reservation_expiry(),
            crate::backend::authorization::DEFAULT_RESERVATION_EXPIRY
        );
        let err = parse::<Policy>("approval_above: 3\n", "p.yaml").unwrap_err();
        let text = err.to_string();
        assert_eq!(
            text,
            "policy file `p.yaml` is invalid at `approval_above`: unknown field `approval_above`, \
             expected one of `approval_above_cents`, `approval_models`, `budget_cents`, \
             `reservation_expiry_seconds`"
        );
        let err = parse::<Policy>("approval_above_cents: lots\n", "p.yaml").unwrap_err();
        assert!(
            err.to_string().contains("at `approval_above_cents`"),
            "{err}"
        );
    }
}
