//! The registry's state machine ([`super::machine`]) on both backends: one scenario, one
//! transcript, the same on a SQLite file and a PostgreSQL database (the latter skipped without
//! server binaries, never in CI). Beside the machine, not inside it, so the machine's file never
//! reaches into the backends that implement its primitives.

use super::machine::*;
use super::postgres::PgRegistry;
use super::sqlite::SqliteRegistry;
use super::*;
use super::{InsertDone, Write};
use crate::keys::{DEFAULT_HANDLE_PREFIX, DEFAULT_KEY_PREFIX, OperationKey};
use crate::storage::LayerTx;
use serde_json::json;
use tokio::sync::oneshot;

fn new_op(call: &str, amount_cents: u64) -> NewOperation {
    NewOperation {
        platform: "codex".into(),
        source_installation: String::new(),
        harness_call_id: call.into(),
        handle: PublicHandle::generate(DEFAULT_HANDLE_PREFIX),
        key: OperationKey::generate(DEFAULT_KEY_PREFIX, "codex"),
        tool: "generate_image".into(),
        request_hash: crate::canonical::request_hash("generate_image", &json!({"p": call}))
            .unwrap(),
        arguments: json!({"p": call}),
        amount_cents,
        needs_approval: false,
        at_most_once: false,
    }
}

/// A layer's step writing `x` into the test table `layer`, then answering `ok`.
fn layer(x: i32, ok: bool) -> InTransaction<(), String> {
    Box::new(move |tx| {
        let sql = format!("INSERT INTO layer VALUES ({x})");
        match tx {
            LayerTx::Sqlite(c) => c.execute_batch(&sql).map_err(|e| e.to_string())?,
            LayerTx::Postgres(t) => t.batch_execute(&sql).map_err(|e| e.to_string())?,
        }
        if ok {
            Ok(())
        } else {
            Err(format!("layer {x} refused"))
        }
    })
}

type InsertAnswer = oneshot::Receiver<Result<InsertDone<()>, RegistryError>>;

fn insert(
    call: &str,
    budget_cents: Option<u64>,
    stage: Option<InTransaction<(), String>>,
) -> (Write<()>, InsertAnswer) {
    let (reply, answer) = oneshot::channel();
    let write = Write::Insert {
        new: Box::new(new_op(call, 3)),
        budget_cents,
        owner: "2147483647:gone".into(),
        ttl: Duration::from_secs(60),
        stage,
        reply,
    };
    (write, answer)
}

fn result(
    handle: &PublicHandle,
    generation: i64,
    settle: Option<InTransaction<(), String>>,
) -> (Write<()>, oneshot::Receiver<Result<(), RegistryError>>) {
    let (reply, answer) = oneshot::channel();
    let write = Write::Result {
        handle: handle.clone(),
        result: json!({"ok": generation}),
        charged_cents: 3,
        generation,
        settle,
        reply,
    };
    (write, answer)
}

fn shown(done: Result<InsertDone<()>, RegistryError>) -> String {
    match done {
        Ok((Insert::Stored(op, created), leased, staged)) => format!(
            "{} created={created} leased={leased} staged={staged:?}",
            op.status.name()
        ),
        Ok((Insert::OverBudget { committed_cents }, ..)) => {
            format!("over budget, {committed_cents} committed")
        }
        Err(e) => error(&e),
    }
}

fn error(e: &RegistryError) -> String {
    match e {
        RegistryError::Fenced { doing, .. } => format!("fenced: {doing}"),
        RegistryError::Layer { detail, .. } => format!("layer: {detail}"),
        RegistryError::Batch { message } => format!("batch: {message}"),
        RegistryError::NotAwaitingApproval { status, .. } => format!("not awaiting: {status}"),
        RegistryError::NotInDoubt { status, .. } => format!("not in doubt: {status}"),
        other => format!("other: {other}"),
    }
}

/// Every step of the machine a new operation takes, lone and grouped, with the layers'
/// records beside them; the transcript and the layer rows left.
fn scenario<S: RegistryStore>(
    store: &mut S,
    layer_rows: impl Fn(&mut S) -> Vec<i32>,
) -> Vec<String> {
    let mut seen = vec![];
    let lone = |store: &mut S, write: Write<()>| write_batch(store, vec![write]);
    let (w, mut a) = insert("a", None, Some(layer(1, true)));
    lone(store, w);
    seen.push(shown(a.try_recv().unwrap()));
    // A lone write's failed stage: its layer record rolled back, the row and lease kept.
    let (w, mut b) = insert("b", None, Some(layer(2, false)));
    lone(store, w);
    seen.push(shown(b.try_recv().unwrap()));
    let (w, mut again) = insert("a", None, Some(layer(9, true)));
    lone(store, w);
    seen.push(shown(again.try_recv().unwrap()));
    let (w, mut plain) = insert("plain", None, None);
    lone(store, w);
    seen.push(shown(plain.try_recv().unwrap()));
    // 3 (a) + 3 (b) + 3 (plain) are open: a 10-cent budget takes no 4th row of 3.
    let (w, mut over) = insert("over", Some(10), Some(layer(8, true)));
    lone(store, w);
    seen.push(shown(over.try_recv().unwrap()));
    let (w, mut within) = insert("within", Some(12), None);
    lone(store, w);
    seen.push(shown(within.try_recv().unwrap()));
    let find = |store: &mut S, call: &str| {
        store
            .transact("looking up a call", false, |tx| {
                tx.find(CallKey {
                    platform: "codex",
                    source_installation: "",
                    harness_call_id: call,
                })
            })
            .unwrap()
            .unwrap()
            .handle
    };
    let (ha, hb) = (find(store, "a"), find(store, "b"));
    let (w, mut r) = result(&ha, 1, Some(layer(3, true)));
    lone(store, w);
    seen.push(format!(
        "{:?}",
        r.try_recv().unwrap().map_err(|e| error(&e))
    ));
    // A stale generation records nothing, its layers' record included.
    let (w, mut r) = result(&hb, 2, Some(layer(4, true)));
    lone(store, w);
    seen.push(format!(
        "{:?}",
        r.try_recv().unwrap().map_err(|e| error(&e))
    ));
    let (w, mut r) = result(&hb, 1, Some(layer(5, false)));
    lone(store, w);
    seen.push(format!(
        "{:?}",
        r.try_recv().unwrap().map_err(|e| error(&e))
    ));
    // A group: a new row whose stage fails, a result, and a fenced result.
    let (w1, mut g1) = insert("c", None, Some(layer(6, false)));
    let (w2, mut g2) = result(&hb, 1, Some(layer(7, true)));
    let (w3, mut g3) = result(&ha, 1, None);
    write_batch(store, vec![w1, w2, w3]);
    seen.push(shown(g1.try_recv().unwrap()));
    seen.push(format!(
        "{:?}",
        g2.try_recv().unwrap().map_err(|e| error(&e))
    ));
    seen.push(format!(
        "{:?}",
        g3.try_recv().unwrap().map_err(|e| error(&e))
    ));
    seen.push(format!(
        "{:?}",
        claim(store, &ha, "me", Duration::from_secs(5)).unwrap()
    ));
    seen.push(match decide(store, ha.as_str(), true, None) {
        Ok(op) => op.status.name().to_string(),
        Err(e) => error(&e),
    });
    seen.push(format!("layer rows {:?}", layer_rows(store)));
    seen
}

const TRANSCRIPT: &[&str] = &[
    "pending created=true leased=true staged=Some(Ok(()))",
    "pending created=true leased=true staged=Some(Err(\"layer 2 refused\"))",
    "pending created=false leased=false staged=None",
    "pending created=true leased=true staged=None",
    "over budget, 9 committed",
    "pending created=true leased=true staged=None",
    "Ok(())",
    "Err(\"fenced: the result\")",
    "Err(\"layer: layer 5 refused\")",
    "pending created=true leased=true staged=Some(Err(\"layer 6 refused\"))",
    "Ok(())",
    "Err(\"fenced: the result\")",
    "NotPending(Completed)",
    "not awaiting: completed",
    "layer rows [1, 3, 7]",
];

#[test]
fn both_backends_answer_every_step_alike_on_sqlite() {
    let mut store = SqliteRegistry::open_in_memory().unwrap();
    store
        .transact("creating the test table", true, |tx| {
            tx.savepoint("t")?;
            tx.layer(Box::new(|tx| match tx {
                LayerTx::Sqlite(c) => c
                    .execute_batch("CREATE TABLE layer (x INTEGER)")
                    .map_err(|e| e.to_string()),
                LayerTx::Postgres(_) => Err("not here".into()),
            }))?
            .unwrap();
            tx.end_savepoint("t", true)
        })
        .unwrap();
    let seen = scenario(&mut store, |s| {
        s.transact("reading the test table", true, |tx| {
            tx.layer::<Vec<i32>>(Box::new(|tx| {
                let LayerTx::Sqlite(c) = tx else {
                    unreachable!()
                };
                let mut st = c.prepare("SELECT x FROM layer ORDER BY x").unwrap();
                let rows = st.query_map([], |r| r.get::<_, i32>(0)).unwrap();
                Ok(rows.flatten().collect())
            }))
        })
        .unwrap()
        .unwrap()
    });
    assert_eq!(seen, TRANSCRIPT);
}

#[test]
fn both_backends_answer_every_step_alike_on_postgres() {
    let Some(cluster) = crate::storage::cluster::for_unit_test() else {
        return;
    };
    cluster
        .sql("callid", "CREATE TABLE layer (x integer)")
        .expect("the test table");
    let url = crate::storage::postgres::PgUrl::parse(&cluster.url("callid")).unwrap();
    let mut store = PgRegistry::open(&url).unwrap();
    let seen = scenario(&mut store, |s| {
        s.transact("reading the test table", true, |tx| {
            tx.layer::<Vec<i32>>(Box::new(|tx| {
                let LayerTx::Postgres(t) = tx else {
                    unreachable!()
                };
                let read = t
                    .query_typed("SELECT x FROM layer ORDER BY x", &[])
                    .unwrap();
                Ok(read.iter().map(|r| r.get::<_, i32>(0)).collect())
            }))
        })
        .unwrap()
        .unwrap()
    });
    assert_eq!(seen, TRANSCRIPT);
}
