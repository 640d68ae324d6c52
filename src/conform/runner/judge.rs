//! Judging a check on what the target can show: which expectations of a step could be checked,
//! which of them are the rule's core, and whether a run whose checked expectations all held may
//! pass.
//!
//! # Guarantees
//! - An expectation that reads a field the profile declares absent (`pointers.handle: null`,
//!   `pointers.status: null`: a transparent proxy's results carry neither) is not checked; it
//!   neither passes nor fails the check. What remains is judged: charges counted at the provider
//!   or upstream, the result returned, refusals.
//! - The core of a rule is derived here and nowhere else ([`Kind::is_core`]): the charge count and
//!   the other ledger facts, the refusal or success of a call, the replayed result, the router
//!   dying without a reply, one operation for concurrent deliveries, the tool schemas. A scenario
//!   whose written expectations include none of those has all of them as its core.
//! - [`Judge::not_run`] turns a run in which every checked expectation held but no core
//!   expectation could be checked into `not run`, with the reason: never a pass on nothing.
//! - A broken expectation that is not core ([`Kind::is_core`] false: a status word, a handle)
//!   does not end the scenario: the interpreter runs the remaining steps, so a broken core
//!   expectation later on (the upstream's second charge at a redelivery) leads the reason.

use crate::conform::scenario::{Expect, Scenario};
use crate::conform::target::Pointers;

/// One kind of written expectation (a key of a step's `expect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Ok,
    Error,
    ErrorNamed,
    Status,
    HasHandle,
    SameHandleAs,
    DifferentHandleFrom,
    ResultEquals,
    Replayed,
    Charges,
    ChargeInLedger,
    ProviderKeysNotPrivate,
    ProviderOneKey,
    NoReply,
    OneOperation,
    NoIdentityFields,
    Dispatches,
}

impl Kind {
    /// The kinds `expect` names, in the order the checks run.
    pub(super) fn of(expect: &Expect) -> Vec<Kind> {
        let e = expect;
        [
            (e.charges.is_some(), Kind::Charges),
            (e.dispatches.is_some(), Kind::Dispatches),
            (e.charge_in_ledger.is_some(), Kind::ChargeInLedger),
            (
                e.provider_keys_not_private.is_some(),
                Kind::ProviderKeysNotPrivate,
            ),
            (e.provider_one_key.is_some(), Kind::ProviderOneKey),
            (e.no_reply.is_some(), Kind::NoReply),
            (e.one_operation.is_some(), Kind::OneOperation),
            (e.no_identity_fields.is_some(), Kind::NoIdentityFields),
            (e.ok.is_some(), Kind::Ok),
            (e.error.is_some(), Kind::Error),
            (e.result_equals.is_some(), Kind::ResultEquals),
            (e.status.is_some(), Kind::Status),
            (e.has_handle.is_some(), Kind::HasHandle),
            (e.same_handle_as.is_some(), Kind::SameHandleAs),
            (
                !e.different_handle_from.is_empty(),
                Kind::DifferentHandleFrom,
            ),
            (e.error_named.is_some(), Kind::ErrorNamed),
            (e.replayed.is_some(), Kind::Replayed),
        ]
        .into_iter()
        .filter_map(|(named, kind)| named.then_some(kind))
        .collect()
    }

    /// Whether this kind is what a rule is about (money, refusals, the result) rather than how a
    /// router presents it (a status word, a handle, a convention's name or marker).
    pub(super) fn is_core(self) -> bool {
        !matches!(
            self,
            Kind::Status
                | Kind::HasHandle
                | Kind::SameHandleAs
                | Kind::DifferentHandleFrom
                | Kind::ErrorNamed
                | Kind::Replayed
        )
    }

    /// Why this expectation cannot be checked against a router with these pointers, if it
    /// cannot.
    pub(super) fn unchecked(self, pointers: &Pointers) -> Option<&'static str> {
        match self {
            Kind::Status if pointers.status.is_none() => {
                Some("its status (the profile declares `pointers.status: null`)")
            }
            Kind::HasHandle | Kind::SameHandleAs | Kind::DifferentHandleFrom
                if pointers.handle.is_none() =>
            {
                Some("its handles (the profile declares `pointers.handle: null`)")
            }
            _ => None,
        }
    }
}

/// What a scenario run could check so far.
#[derive(Debug)]
pub(super) struct Judge {
    /// Whether the scenario's written expectations include a core kind (otherwise every written
    /// expectation is its core).
    has_core: bool,
    /// Whether the scenario writes any expectation at all (none: only the checks every step
    /// makes, the key scan and no JSON-RPC error, which are always checked).
    written: bool,
    /// A core expectation was checked and held.
    core_checked: bool,
    /// What could not be checked, each once.
    unchecked: Vec<&'static str>,
}

impl Judge {
    /// A judge for one run of `scenario`.
    pub(super) fn new(scenario: &Scenario) -> Self {
        let kinds: Vec<Kind> = scenario
            .steps
            .iter()
            .filter_map(|s| s.expect())
            .flat_map(Kind::of)
            .collect();
        Judge {
            has_core: kinds.iter().any(|k| k.is_core()),
            written: !kinds.is_empty(),
            core_checked: false,
            unchecked: Vec::new(),
        }
    }

    /// Records a step whose checkable expectations all held.
    pub(super) fn held(&mut self, expect: &Expect, pointers: &Pointers) {
        for kind in Kind::of(expect) {
            match kind.unchecked(pointers) {
                Some(why) => {
                    if !self.unchecked.contains(&why) {
                        self.unchecked.push(why);
                    }
                }
                None => {
                    if kind.is_core() || !self.has_core {
                        self.core_checked = true;
                    }
                }
            }
        }
    }

    /// The reason a run in which every checked expectation held is `not run`, if it is.
    pub(super) fn not_run(&self) -> Option<String> {
        if !self.written || self.core_checked {
            return None;
        }
        Some(format!(
            "nothing this rule is about could be checked: the router's results show neither {}",
            self.unchecked.join(" nor ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conform::scenario::parse;
    use std::path::Path;

    fn scenario(steps: &str) -> Scenario {
        parse(
            &format!("id: a.b\ntitle: t\nrule: r\narticle: q\nsteps:\n{steps}"),
            Path::new("x.yaml"),
        )
        .unwrap()
    }

    fn proxy() -> Pointers {
        Pointers {
            handle: None,
            status: None,
            ..Pointers::default()
        }
    }

    #[test]
    fn a_run_passes_only_when_a_core_expectation_was_checked() {
        let full = Pointers::default();
        let proxy = proxy();
        let cases: Vec<(&str, &Pointers, Option<&str>)> = vec![
            (
                "  - {do: call, expect: {status: completed, charges: 1}}\n",
                &full,
                None,
            ),
            (
                "  - {do: call, expect: {status: completed, charges: 1}}\n",
                &proxy,
                None,
            ),
            ("  - {do: call, expect: {has_handle: true}}\n", &full, None),
            (
                "  - {do: call, name: a, expect: {status: completed}}\n  - {do: call, expect: {different_handle_from: [a]}}\n",
                &proxy,
                Some(
                    "nothing this rule is about could be checked: the router's results show neither its status (the profile declares `pointers.status: null`) nor its handles (the profile declares `pointers.handle: null`)",
                ),
            ),
            ("  - do: list_tools\n", &proxy, None),
        ];
        for (steps, pointers, want) in cases {
            let scenario = scenario(steps);
            let mut judge = Judge::new(&scenario);
            for step in &scenario.steps {
                if let Some(expect) = step.expect() {
                    judge.held(expect, pointers);
                }
            }
            assert_eq!(judge.not_run().as_deref(), want, "{steps}");
        }
    }

    #[test]
    fn presentation_is_not_core() {
        let core: Vec<Kind> = Kind::of(&Expect {
            ok: Some(true),
            error: Some("x".into()),
            status: Some("completed".into()),
            has_handle: Some(true),
            same_handle_as: Some("a".into()),
            different_handle_from: vec!["b".into()],
            result_equals: Some("a".into()),
            replayed: Some(true),
            error_named: Some("x".into()),
            charges: Some(1),
            ..Expect::default()
        })
        .into_iter()
        .filter(|k| k.is_core())
        .collect();
        assert_eq!(
            core,
            [Kind::Charges, Kind::Ok, Kind::Error, Kind::ResultEquals]
        );
    }
}
