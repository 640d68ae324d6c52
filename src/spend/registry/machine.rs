//! The operation state machine of the registry, written once over the storage primitives that
//! each backend implements ([`RegistryStore`], [`StoreTx`]): what a new operation's write does
//! (the budget, insert-if-absent, its lease and its layers' stage), the fenced record of a
//! result, a group commit, a claim's answer, a person's approval, denial and resolution, and the
//! errors each of them answers.
//!
//! A backend owns only statements: each primitive is one statement on PostgreSQL (the takeover
//! rule of a claim included, on the server's clock) and one or a few on SQLite, and says
//! whether it matched its row. The machine decides what a matched or unmatched row means.
//!
//! Round trips (PostgreSQL): a write with nothing else to commit with it (no budget, no layer
//! step) runs as one statement in its own implicit transaction: no `BEGIN`, no `COMMIT`. A lone
//! write of a batch needs no savepoint: its failure rolls back the whole transaction, which holds
//! nothing else. A layer's step is sent with the row's insert or the result's record
//! ([`StoreTx::insert_then`], [`StoreTx::apply_then`]) before their answers are read, so it may
//! run for a row this write did not create or a result that was fenced: the machine then rolls
//! back what it wrote, with the transaction (a lone write) or its savepoint.

use super::{
    Approval, InTransaction, Insert, InsertDone, Lease, NewOperation, Operation, RegistryError,
    Status, Write,
};
use crate::keys::PublicHandle;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// One call identity of this installation: a row's key.
#[derive(Debug, Clone, Copy)]
pub(super) struct CallKey<'a> {
    pub(super) platform: &'a str,
    pub(super) source_installation: &'a str,
    pub(super) harness_call_id: &'a str,
}

impl<'a> CallKey<'a> {
    pub(super) fn of(new: &'a NewOperation) -> CallKey<'a> {
        CallKey {
            platform: &new.platform,
            source_installation: &new.source_installation,
            harness_call_id: &new.harness_call_id,
        }
    }
}

/// A conditional change of one row, by its handle: each backend runs it as one statement and
/// answers whether it matched the row.
#[derive(Debug)]
pub(super) enum Step<'a> {
    /// Extends the lease of `generation` to `now + ttl` (pending, still leased).
    Renew {
        handle: &'a str,
        generation: i64,
        ttl: Duration,
    },
    /// Drops the lease of `generation` and the dispatch mark (pending).
    Release { handle: &'a str, generation: i64 },
    /// A pending row under `generation` becomes `in_doubt` with `reason`.
    MarkInDoubt {
        handle: &'a str,
        generation: i64,
        reason: &'a str,
    },
    /// The result of the dispatch under `generation` (fenced: pending under it, or in doubt
    /// after a dispatch under it).
    RecordResult {
        handle: &'a str,
        generation: i64,
        result: &'a str,
        charged_cents: i64,
    },
    /// A final error of the dispatch under `generation` (fenced like `RecordResult`).
    RecordFailure {
        handle: &'a str,
        generation: i64,
        code: &'a str,
        message: &'a str,
    },
    /// A row waiting for approval becomes pending, approved.
    Approve { handle: &'a str },
    /// A row waiting for approval becomes denied with `message`.
    Deny { handle: &'a str, message: &'a str },
    /// An in-doubt row becomes completed with `result`, charged its amount.
    ResolveCharged {
        handle: &'a str,
        result: &'a str,
        by: &'a str,
    },
    /// An in-doubt row becomes pending again with its dispatch mark cleared.
    ResolveNotCharged { handle: &'a str, by: &'a str },
}

impl Step<'_> {
    /// What the step records, as a fragment of an error message.
    pub(super) fn doing(&self) -> &'static str {
        match self {
            Step::Renew { .. } => "renewing a dispatch lease",
            Step::Release { .. } => "releasing a dispatch lease",
            Step::MarkInDoubt { .. } => "marking an operation in doubt",
            Step::RecordResult { .. } => "recording a result",
            Step::RecordFailure { .. } => "recording a failure",
            Step::Approve { .. } => "recording an approval",
            Step::Deny { .. } => "recording a denial",
            Step::ResolveCharged { .. } | Step::ResolveNotCharged { .. } => {
                "recording a resolution"
            }
        }
    }
}

/// What a backend's claim statement found: the row's status after it, and the lease
/// generation it granted, or, when it took nothing from a holder whose liveness is gone on a
/// dispatched row, the milliseconds until that lease expires.
#[derive(Debug)]
pub(super) struct Claimed {
    pub(super) status: String,
    pub(super) granted: Option<i64>,
    pub(super) orphaned_ms: Option<i64>,
}

/// What an insert-if-absent did ([`StoreTx::insert`]).
#[derive(Debug)]
pub(super) enum Inserted {
    /// This statement created the row.
    Created,
    /// The call identity has a row already: the one the statement read beside its insert when
    /// it could see it (committed before the statement began), else `None`, and a fresh
    /// statement reads it.
    Recorded(Option<Box<Operation>>),
}

/// The statements a step of the machine runs inside one transaction of a backend (or, for a
/// write that needs none, each in its own implicit transaction: see
/// [`RegistryStore::transact`]).
pub(super) trait StoreTx {
    /// The registry as messages name it.
    fn location(&self) -> PathBuf;
    /// The row of a call identity, read by a fresh statement (it sees every row committed
    /// before it began, a concurrent writer's included).
    fn find(&mut self, key: CallKey<'_>) -> Result<Option<Operation>, RegistryError>;
    /// Serializes the budgeted writes of this installation until the commit (PostgreSQL: an
    /// advisory lock across replicas; SQLite: the `IMMEDIATE` transaction holds the file's
    /// write lock already).
    fn lock_budget(&mut self) -> Result<(), RegistryError>;
    /// The cents committed by this installation's operations: completed ones by what they
    /// charged, open ones by their amount.
    fn committed_cents(&mut self) -> Result<i64, RegistryError>;
    /// Inserts the row of `new` with `status` and `approval` unless its call identity has one
    /// (never check-then-insert); with `lease` (owner, time to live) it is leased to be
    /// dispatched next, its first lease generation and dispatch mark written with it. The
    /// insert is the look-up: it answers whether it created the row, and may answer the row it
    /// conflicted with.
    fn insert(
        &mut self,
        new: &NewOperation,
        status: Status,
        approval: Approval,
        lease: Option<(&str, Duration)>,
    ) -> Result<Inserted, RegistryError>;
    /// Runs `step`; `true` when it matched its row.
    fn apply(&mut self, step: &Step<'_>) -> Result<bool, RegistryError>;
    /// [`StoreTx::insert`], then `then` in the same transaction: `then`'s answer, when it ran.
    /// A backend that pipelines (PostgreSQL) sends the insert and runs `then` before its answer
    /// is back, so that `then`'s first statement travels with it: `then` runs whether or not
    /// the row was created, and the caller must roll back what it wrote when it was not. By
    /// default `then` runs only after a created row.
    fn insert_then<R>(
        &mut self,
        new: &NewOperation,
        status: Status,
        approval: Approval,
        lease: Option<(&str, Duration)>,
        then: impl FnOnce(&mut Self) -> Result<R, RegistryError>,
    ) -> Result<(Inserted, Option<R>), RegistryError>
    where
        Self: Sized,
    {
        match self.insert(new, status, approval, lease)? {
            Inserted::Created => Ok((Inserted::Created, Some(then(self)?))),
            recorded => Ok((recorded, None)),
        }
    }
    /// [`StoreTx::apply`], then `then` in the same transaction, as [`StoreTx::insert_then`]:
    /// `then` may run (and write) when `step` did not match its row.
    fn apply_then<R>(
        &mut self,
        step: &Step<'_>,
        then: impl FnOnce(&mut Self) -> Result<R, RegistryError>,
    ) -> Result<(bool, Option<R>), RegistryError>
    where
        Self: Sized,
    {
        if !self.apply(step)? {
            return Ok((false, None));
        }
        Ok((true, Some(then(self)?)))
    }
    /// Runs another layer's step in this transaction.
    fn layer<T>(
        &mut self,
        step: InTransaction<T, String>,
    ) -> Result<Result<T, String>, RegistryError>;
    /// `SAVEPOINT name`.
    fn savepoint(&mut self, name: &'static str) -> Result<(), RegistryError>;
    /// Keeps (`keep`) or rolls back what was written since `SAVEPOINT name`, and releases it.
    fn end_savepoint(&mut self, name: &'static str, keep: bool) -> Result<(), RegistryError>;
}

/// A registry backend: where the rows live, and its transactions.
pub(super) trait RegistryStore {
    /// An open transaction.
    type Tx<'t>: StoreTx
    where
        Self: 't;
    /// The registry as messages name it.
    fn location(&self) -> PathBuf;
    /// Runs `f` in one transaction, committed when it answers `Ok` (and only then answered),
    /// rolled back when it answers an error. Not `atomic`: `f`'s statements need not commit
    /// together (a backend may run each as its own implicit transaction, one round trip each).
    fn transact<R>(
        &mut self,
        doing: &'static str,
        atomic: bool,
        f: impl FnOnce(&mut Self::Tx<'_>) -> Result<R, RegistryError>,
    ) -> Result<R, RegistryError>;
    /// The operation with this public handle.
    fn find_by_handle(&mut self, handle: &str) -> Result<Option<Operation>, RegistryError>;
    /// Takes the dispatch lease of a pending row for `owner` until `now + ttl` by the takeover
    /// rule (`## Concurrency` of [`super`]): free, already `owner`'s, expired, or its holder
    /// gone (certainly, or on a row without a dispatch mark). The lease counts the generation
    /// up and writes the dispatch mark of an at-most-once row (PostgreSQL: of every row); an
    /// at-most-once row that carries a dispatch mark already becomes `in_doubt`
    /// ([`super::TAKEN_OVER_IN_DOUBT`]) instead. One statement on PostgreSQL.
    fn claim(&mut self, handle: &str, owner: &str, ttl: Duration)
    -> Result<Claimed, RegistryError>;
}

/// Runs one conditional row change in a transaction of its own; `true` when it matched.
pub(super) fn apply<S: RegistryStore>(
    store: &mut S,
    step: Step<'_>,
) -> Result<bool, RegistryError> {
    store.transact(step.doing(), false, |tx| tx.apply(&step))
}

/// Where a new row's stage runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Staging {
    /// In a savepoint: a failed stage is rolled back alone; the row and its lease stay.
    Savepoint,
    /// Bare in the transaction, which holds nothing else (a lone write), and sent with the row
    /// ([`StoreTx::insert_then`]): the caller rolls the whole transaction back when the stage
    /// failed (and writes the row again without it) or ran for a call recorded already (and
    /// answers that row) ([`insert_lone`]), which spares PostgreSQL the savepoint's two round trips and the
    /// stage's own on the path every new operation takes.
    Bare,
}

/// A new operation's write inside `tx` (see [`Write::Insert`]): the existing row when its call
/// identity has one, [`Insert::OverBudget`] when `budget_cents` would be exceeded, otherwise the
/// new row, leased for `lease` when it is pending, with `stage` run after it ([`Staging`]).
pub(super) fn insert_in<X: StoreTx, T>(
    tx: &mut X,
    new: &NewOperation,
    budget_cents: Option<u64>,
    lease: Option<(&str, Duration)>,
    stage: Option<(InTransaction<T, String>, Staging)>,
) -> Result<InsertDone<T>, RegistryError> {
    let existing = |op: Operation| Ok((Insert::Stored(Box::new(op), false), false, None));
    if let Some(budget) = budget_cents {
        tx.lock_budget()?;
        if let Some(op) = tx.find(CallKey::of(new))? {
            return existing(op);
        }
        let committed = tx.committed_cents()?.max(0) as u64;
        if committed.saturating_add(new.amount_cents) > budget {
            return Ok((
                Insert::OverBudget {
                    committed_cents: committed,
                },
                false,
                None,
            ));
        }
    }
    let (status, approval) = new.initial_state();
    // Only a pending row is dispatched; one waiting for a person gets no lease.
    let lease = lease.filter(|_| status == Status::Pending);
    let (stage, bare) = match stage.filter(|_| lease.is_some()) {
        Some((stage, Staging::Bare)) => (None, Some(stage)),
        stage => (stage, None),
    };
    let (inserted, mut staged) = match bare {
        Some(stage) => tx.insert_then(new, status, approval, lease, |tx| tx.layer(stage))?,
        None => (tx.insert(new, status, approval, lease)?, None),
    };
    if let Inserted::Recorded(seen) = inserted {
        // The call was recorded already (a redelivery, or another writer's row first): the
        // insert's answer, or a fresh statement when the insert could not see that row.
        let recorded = match seen {
            Some(op) => Some(*op),
            None => tx.find(CallKey::of(new))?,
        };
        return match recorded {
            // A stage that ran anyway wrote for a row that is not this write's: its error makes
            // the caller roll it back ([`Staging::Bare`]).
            Some(op) if staged.is_some() => Ok((
                Insert::Stored(Box::new(op), false),
                false,
                Some(Err("this call was recorded already".into())),
            )),
            Some(op) => existing(op),
            None => Err(RegistryError::Corrupt {
                path: tx.location(),
                detail: format!(
                    "the row of call `{}` conflicted on insert and then could not be found",
                    new.harness_call_id
                ),
            }),
        };
    }
    let leased = lease.is_some();
    if let Some((stage, _)) = stage {
        tx.savepoint("stage")?;
        let outcome = tx.layer(stage)?;
        tx.end_savepoint("stage", outcome.is_ok())?;
        staged = Some(outcome);
    }
    Ok((
        Insert::Stored(Box::new(new.operation(status, approval)), true),
        leased,
        staged,
    ))
}

/// A new operation's write as the only write of its transaction: one transaction with its stage
/// run bare ([`Staging::Bare`]). When the call was recorded already, that transaction is rolled
/// back and the recorded row is answered. When the stage failed, it is rolled back and the row
/// and its lease are written again alone, and the stage's error is answered beside them, as a
/// savepoint would have left it.
pub(super) fn insert_lone<S: RegistryStore, T>(
    store: &mut S,
    new: &NewOperation,
    budget_cents: Option<u64>,
    lease: Option<(&str, Duration)>,
    stage: Option<InTransaction<T, String>>,
) -> Result<InsertDone<T>, RegistryError> {
    let doing = "recording a new operation";
    let Some(stage) = stage else {
        return store.transact(doing, budget_cents.is_some(), |tx| {
            insert_in::<_, T>(tx, new, budget_cents, lease, None)
        });
    };
    let mut refused = None;
    let mut recorded = None;
    let done = store.transact(doing, true, |tx| {
        match insert_in(tx, new, budget_cents, lease, Some((stage, Staging::Bare)))? {
            (Insert::Stored(op, false), _, Some(Err(e))) => {
                // The call was recorded already (a redelivery, or another writer first): what
                // the stage wrote beside the conflicting insert is rolled back, and the row the
                // insert conflicted with is the answer, so nothing is written again.
                recorded = Some(op);
                Err(RegistryError::layer(tx.location(), &e))
            }
            (_, _, Some(Err(e))) => {
                let rollback = RegistryError::layer(tx.location(), &e);
                refused = Some(e);
                Err(rollback)
            }
            done => Ok(done),
        }
    });
    if let Some(op) = recorded {
        return Ok((Insert::Stored(op, false), false, None));
    }
    let Some(refused) = refused else {
        return done;
    };
    let (insert, leased, _) = store.transact(doing, budget_cents.is_some(), |tx| {
        insert_in::<_, T>(tx, new, budget_cents, lease, None)
    })?;
    // Another writer may have recorded the call in between: then this write leased nothing and
    // no stage of it counts.
    Ok((insert, leased, leased.then_some(Err(refused))))
}

/// Records a completed operation's result inside `tx`, fenced by the dispatcher's lease
/// `generation` (a stale one records nothing: [`RegistryError::Fenced`]), and `settle`, another
/// layer's record of it (its failure records nothing either: [`RegistryError::Layer`]).
pub(super) fn record_in<X: StoreTx>(
    tx: &mut X,
    handle: &PublicHandle,
    generation: i64,
    result: &Value,
    charged_cents: u64,
    settle: Option<InTransaction<(), String>>,
) -> Result<(), RegistryError> {
    let result = result.to_string();
    let step = Step::RecordResult {
        handle: handle.as_str(),
        generation,
        result: &result,
        charged_cents: charged_cents.min(i64::MAX as u64) as i64,
    };
    let Some(settle) = settle else {
        return fenced(tx.apply(&step)?, handle, "the result");
    };
    // Sent with the result ([`StoreTx::apply_then`]): a fenced result answers an error, so what
    // the settlement wrote is rolled back with it.
    let (matched, settled) = tx.apply_then(&step, |tx| tx.layer(settle))?;
    fenced(matched, handle, "the result")?;
    match settled {
        Some(settled) => settled.map_err(|e| RegistryError::layer(tx.location(), e)),
        None => Ok(()),
    }
}

/// `Ok` when a fenced write changed its row; [`RegistryError::Fenced`] when it matched none.
pub(super) fn fenced(
    matched: bool,
    handle: &PublicHandle,
    doing: &'static str,
) -> Result<(), RegistryError> {
    if matched {
        Ok(())
    } else {
        Err(RegistryError::Fenced {
            handle: handle.as_str().to_string(),
            doing,
        })
    }
}

/// A write of a batch without its answer channel.
enum Op<T> {
    Insert {
        new: Box<NewOperation>,
        budget_cents: Option<u64>,
        owner: String,
        ttl: Duration,
        stage: Option<InTransaction<T, String>>,
    },
    Result {
        handle: PublicHandle,
        result: Value,
        charged_cents: u64,
        generation: i64,
        settle: Option<InTransaction<(), String>>,
    },
}

/// Where a write's answer goes.
enum Reply<T> {
    Insert(tokio::sync::oneshot::Sender<Result<InsertDone<T>, RegistryError>>),
    Result(tokio::sync::oneshot::Sender<Result<(), RegistryError>>),
}

/// A write's answer.
enum Done<T> {
    Insert(InsertDone<T>),
    Result,
}

impl<T> Write<T> {
    fn split(self) -> (Op<T>, Reply<T>) {
        match self {
            Write::Insert {
                new,
                budget_cents,
                owner,
                ttl,
                stage,
                reply,
            } => (
                Op::Insert {
                    new,
                    budget_cents,
                    owner,
                    ttl,
                    stage,
                },
                Reply::Insert(reply),
            ),
            Write::Result {
                handle,
                result,
                charged_cents,
                generation,
                settle,
                reply,
            } => (
                Op::Result {
                    handle,
                    result,
                    charged_cents,
                    generation,
                    settle,
                },
                Reply::Result(reply),
            ),
        }
    }
}

impl<T> Op<T> {
    fn doing(&self) -> &'static str {
        match self {
            Op::Insert { .. } => "recording a new operation",
            Op::Result { .. } => "recording a result",
        }
    }

    /// Whether its statements must commit together: a budget check with its insert, a layer's
    /// step with the row it belongs to.
    fn atomic(&self) -> bool {
        match self {
            Op::Insert {
                budget_cents,
                stage,
                ..
            } => budget_cents.is_some() || stage.is_some(),
            Op::Result { settle, .. } => settle.is_some(),
        }
    }

    fn run<X: StoreTx>(self, tx: &mut X) -> Result<Done<T>, RegistryError> {
        match self {
            Op::Insert {
                new,
                budget_cents,
                owner,
                ttl,
                stage,
            } => {
                let stage = stage.map(|s| (s, Staging::Savepoint));
                insert_in(tx, &new, budget_cents, Some((&owner, ttl)), stage).map(Done::Insert)
            }
            Op::Result {
                handle,
                result,
                charged_cents,
                generation,
                settle,
            } => record_in(tx, &handle, generation, &result, charged_cents, settle)
                .map(|()| Done::Result),
        }
    }
}

impl<T> Reply<T> {
    fn send(self, done: Result<Done<T>, RegistryError>) {
        // A caller that went away has nothing to be told.
        match (self, done) {
            (Reply::Insert(reply), Ok(Done::Insert(done))) => drop(reply.send(Ok(done))),
            (Reply::Result(reply), Ok(Done::Result)) => drop(reply.send(Ok(()))),
            (Reply::Insert(reply), Err(e)) => drop(reply.send(Err(e))),
            (Reply::Result(reply), Err(e)) => drop(reply.send(Err(e))),
            (Reply::Insert(_), Ok(Done::Result)) | (Reply::Result(_), Ok(Done::Insert(_))) => {
                unreachable!("a write is answered by its own kind")
            }
        }
    }
}

/// Runs `writes` with one commit for all (group commit), each in a savepoint of its own (a lone
/// write needs none): a write that fails is rolled back alone and answered its error; the
/// others are answered once the commit returned (if it fails, every write is answered that
/// error and nothing of them is recorded). Nothing is answered before the commit, so no caller
/// acts on a row that is not durable.
pub(super) fn write_batch<S: RegistryStore, T>(store: &mut S, writes: Vec<Write<T>>) {
    let (ops, replies): (Vec<Op<T>>, Vec<Reply<T>>) = writes.into_iter().map(Write::split).unzip();
    if ops.len() == 1 {
        let op = ops.into_iter().next().expect("one write");
        let reply = replies.into_iter().next().expect("one write");
        let done = match op {
            Op::Insert {
                new,
                budget_cents,
                owner,
                ttl,
                stage,
            } => {
                insert_lone(store, &new, budget_cents, Some((&owner, ttl)), stage).map(Done::Insert)
            }
            op => store.transact(op.doing(), op.atomic(), |tx| op.run(tx)),
        };
        reply.send(done);
        return;
    }
    let done = store.transact("committing a group of writes", true, |tx| {
        let mut answers = Vec::with_capacity(ops.len());
        for op in ops {
            tx.savepoint("write")?;
            let done = op.run(tx);
            tx.end_savepoint("write", done.is_ok())?;
            answers.push(done);
        }
        Ok(answers)
    });
    match done {
        Ok(answers) => replies
            .into_iter()
            .zip(answers)
            .for_each(|(reply, done)| reply.send(done)),
        Err(e) => replies
            .into_iter()
            .for_each(|reply| reply.send(Err(e.again()))),
    }
}

/// The answer of a claim ([`RegistryStore::claim`]).
pub(super) fn claim<S: RegistryStore>(
    store: &mut S,
    handle: &PublicHandle,
    owner: &str,
    ttl: Duration,
) -> Result<Lease, RegistryError> {
    let claimed = store.claim(handle.as_str(), owner, ttl)?;
    let Some(status) = Status::parse(&claimed.status) else {
        return Err(RegistryError::Corrupt {
            path: store.location(),
            detail: format!("unknown status `{}`", claimed.status),
        });
    };
    Ok(match (status, claimed.granted, claimed.orphaned_ms) {
        (Status::Pending, Some(generation), _) => Lease::Granted { generation },
        (Status::Pending, None, Some(ms)) => Lease::Orphaned {
            expires_in: Duration::from_millis(ms.max(0) as u64),
        },
        (Status::Pending, None, None) => Lease::HeldElsewhere,
        (other, _, _) => Lease::NotPending(other),
    })
}

/// Records a final error of an operation, fenced by the dispatcher's lease `generation`.
pub(super) fn record_failure<S: RegistryStore>(
    store: &mut S,
    handle: &PublicHandle,
    generation: i64,
    code: &str,
    message: &str,
) -> Result<(), RegistryError> {
    let step = Step::RecordFailure {
        handle: handle.as_str(),
        generation,
        code,
        message,
    };
    fenced(apply(store, step)?, handle, "a failure")
}

/// The operation with `handle`, or [`RegistryError::UnknownHandle`].
fn known<S: RegistryStore>(store: &mut S, handle: &str) -> Result<Operation, RegistryError> {
    store
        .find_by_handle(handle)?
        .ok_or_else(|| RegistryError::UnknownHandle {
            handle: handle.to_string(),
            path: store.location(),
        })
}

/// A person's decision on an operation waiting for approval. Approving makes it `pending` (it
/// runs on `resume_operation` or redelivery); denying makes it `denied` for good.
pub(super) fn decide<S: RegistryStore>(
    store: &mut S,
    handle: &str,
    approve: bool,
    reason: Option<&str>,
) -> Result<Operation, RegistryError> {
    let op = known(store, handle)?;
    if op.status != Status::AwaitingApproval {
        return Err(RegistryError::NotAwaitingApproval {
            handle: handle.to_string(),
            status: op.status.name(),
        });
    }
    let message = match reason {
        Some(r) => format!("a person denied this operation: {r}"),
        None => "a person denied this operation".to_string(),
    };
    let step = if approve {
        Step::Approve { handle }
    } else {
        Step::Deny {
            handle,
            message: &message,
        }
    };
    // Conditional on the row still waiting: another person's decision may have come first.
    if !apply(store, step)? {
        return Err(RegistryError::NotAwaitingApproval {
            handle: handle.to_string(),
            status: "changed meanwhile",
        });
    }
    known(store, handle)
}

/// A person's resolution of an [`Status::InDoubt`] operation (see
/// [`super::Registry::resolve`]).
pub(super) fn resolve<S: RegistryStore>(
    store: &mut S,
    handle: &str,
    charged: bool,
    result: Option<&Value>,
    by: &str,
) -> Result<Operation, RegistryError> {
    let op = known(store, handle)?;
    if op.status != Status::InDoubt {
        return Err(RegistryError::NotInDoubt {
            handle: handle.to_string(),
            status: op.status.name(),
        });
    }
    let text = result.unwrap_or(&Value::Null).to_string();
    let step = if charged {
        Step::ResolveCharged {
            handle,
            result: &text,
            by,
        }
    } else {
        Step::ResolveNotCharged { handle, by }
    };
    // Conditional on the row still being in doubt: a second person's resolution, or the late
    // answer of the only dispatch, may have settled it meanwhile.
    if !apply(store, step)? {
        return Err(RegistryError::NotInDoubt {
            handle: handle.to_string(),
            status: "changed meanwhile",
        });
    }
    known(store, handle)
}
