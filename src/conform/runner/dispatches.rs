//! Dispatches apart from charges: the runner's provider (or upstream) logs every request for the
//! paid tool ([`Dispatch`]), and these checks judge the log beside the ledger.
//!
//! # Guarantees
//! - Every step that reads the ledger fails when two dispatches of one operation (one
//!   idempotency key; without a key, the same request) were in flight at once, whatever was
//!   charged: single flight is the router's job across all its processes, and a backend that
//!   honours the key is the last layer, not a licence to dispatch twice.
//! - A dispatch after the last one of its operation ended (a re-dispatch after a crash, a timeout
//!   or a 503) is not judged by that rule: against an idempotent backend it is legal. The
//!   `dispatches:` expectation counts it, which is how the `at-most-once.*` checks hold a router
//!   built for a backend that charges every request to one dispatch.
//! - Every count message names dispatches and charges separately ([`Tally`]): "the provider saw 2
//!   dispatches (2 at once), 1 charge in this scenario".

use super::{ScenarioRun, StepError, StepResult, fail};
use crate::conform::hooks::Dispatch;
use crate::conform::scenario::Expect;
use std::collections::BTreeMap;

/// What the backend saw in this scenario so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tally {
    /// Requests for the paid tool.
    pub dispatches: u64,
    /// The most dispatches of one operation that were in flight at the same moment.
    pub at_once: u64,
    /// Charges in the ledger.
    pub charges: u64,
}

impl Tally {
    /// `the provider saw 2 dispatches (2 at once), 1 charge in this scenario`.
    pub fn sentence(&self, role: &str) -> String {
        let at_once = if self.at_once > 1 {
            format!(" ({} at once)", self.at_once)
        } else {
            String::new()
        };
        format!(
            "the {role} saw {}{at_once}, {} in this scenario",
            counted(self.dispatches, "dispatch", "dispatches"),
            counted(self.charges, "charge", "charges"),
        )
    }
}

/// `1 charge`, `2 charges`.
fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The most dispatches of one operation in flight at the same moment (a dispatch still running
/// counts as in flight; one that ends as another starts does not overlap it).
pub(super) fn most_at_once(dispatches: &[Dispatch]) -> u64 {
    let mut by_operation: BTreeMap<&str, Vec<(std::time::Instant, i8)>> = BTreeMap::new();
    for d in dispatches {
        let events = by_operation.entry(d.operation.as_str()).or_default();
        events.push((d.start, 1));
        if let Some(end) = d.end {
            events.push((end, -1));
        }
    }
    let mut most = 0;
    for events in by_operation.values_mut() {
        // Ends sort before starts at the same instant.
        events.sort();
        let mut open: i64 = 0;
        for (_, delta) in events.iter() {
            open += i64::from(*delta);
            most = most.max(open);
        }
    }
    u64::try_from(most).unwrap_or(0)
}

impl ScenarioRun<'_> {
    /// What the backend saw in this scenario so far; `charges` is read from the ledger.
    pub(super) fn tally(&self, charges: u64) -> Tally {
        let provider = self.provider.expect("checked by not_runnable");
        let dispatches = provider.hooks().dispatches();
        Tally {
            dispatches: dispatches.len() as u64,
            at_once: most_at_once(&dispatches),
            charges,
        }
    }

    /// The dispatch rules of the module docs, after the charge count held: no two dispatches
    /// of one operation at once, and `expect.dispatches` if given.
    pub(super) fn check_dispatches(&self, expect: &Expect, tally: Tally) -> StepResult {
        let role = self
            .provider
            .expect("checked by not_runnable")
            .role()
            .name();
        if tally.at_once > 1 {
            let why = if self.profile.backend_idempotent() {
                format!(
                    "a router sends an operation to the {role} once at a time, across all its processes, even when the {role}'s idempotency key saves the charge"
                )
            } else {
                format!(
                    "a router sends an operation to the {role} at most once, across all its processes: this {role} charges every request"
                )
            };
            return fail(format!(
                "{}: {} dispatches of one operation were in flight at once; {why}",
                tally.sentence(role),
                tally.at_once
            ));
        }
        if let Some(want) = expect.dispatches
            && tally.dispatches != want
        {
            let hint = if self.profile.backend_idempotent() {
                ""
            } else {
                " (the profile declares `idempotent_backend: false`: an operation whose outcome is unknown is sent again only after `resolve`)"
            };
            return Err(StepError::Fail(format!(
                "{}; expected {}{hint}",
                tally.sentence(role),
                counted(want, "dispatch", "dispatches")
            )));
        }
        Ok(())
    }

    /// The charge count of `expect`, in words that count dispatches too.
    pub(super) fn check_charges(&self, expect: &Expect, tally: Tally) -> StepResult {
        let role = self
            .provider
            .expect("checked by not_runnable")
            .role()
            .name();
        match expect.charges {
            Some(want) if tally.charges != want => fail(format!(
                "{}; expected {}",
                tally.sentence(role),
                counted(want, "charge", "charges")
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn overlapping_dispatches_of_one_operation_are_counted() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let d = |op: &str, start: u64, end: Option<u64>| Dispatch {
            operation: op.into(),
            start: at(start),
            end: end.map(at),
        };
        let cases: Vec<(Vec<Dispatch>, u64)> = vec![
            (vec![], 0),
            (vec![d("k", 0, Some(10))], 1),
            // A re-dispatch after the first ended, and one that starts as it ends.
            (vec![d("k", 0, Some(10)), d("k", 20, Some(30))], 1),
            (vec![d("k", 0, Some(10)), d("k", 10, Some(30))], 1),
            // Two of one operation at once, and one still in flight.
            (vec![d("k", 0, Some(10)), d("k", 5, Some(30))], 2),
            (vec![d("k", 0, None), d("k", 50, Some(60))], 2),
            // Two operations at once are not one operation twice.
            (vec![d("a", 0, Some(10)), d("b", 5, Some(30))], 1),
            (
                vec![d("k", 0, None), d("k", 1, None), d("k", 2, Some(3))],
                3,
            ),
        ];
        for (dispatches, want) in cases {
            assert_eq!(most_at_once(&dispatches), want, "{dispatches:?}");
        }
    }

    #[test]
    fn the_tally_names_dispatches_and_charges_apart() {
        let t = |dispatches, at_once, charges| Tally {
            dispatches,
            at_once,
            charges,
        };
        assert_eq!(
            t(2, 2, 1).sentence("provider"),
            "the provider saw 2 dispatches (2 at once), 1 charge in this scenario"
        );
        assert_eq!(
            t(1, 1, 0).sentence("upstream"),
            "the upstream saw 1 dispatch, 0 charges in this scenario"
        );
    }
}
