//! Replicas under faults other than a clean kill: three replicas on one throwaway PostgreSQL
//! cluster, a short lease (`--lease-ttl 3` or 6), and one of these faults while replica A waits for
//! the provider: a PostgreSQL restart, `pg_terminate_backend` of every session, SIGSTOP past the
//! lease then SIGCONT, kill -9 (alone, or with the operation's row locked by another session
//! until after the lease the redeliveries claim meanwhile could have lapsed); redeliveries race
//! from the two other replicas meanwhile. Each
//! fault runs against a provider that honours the idempotency key (`callid router` in front of
//! the reference provider, served here with hooks that log each request's start and end) and
//! one that charges every request (`callid gateway` in front of
//! `tests/fixtures/paid_upstream.py`, which logs the same).
//!
//! Invariants, checked from the provider's own log, never from a replica's word: at most one
//! dispatch of an operation in flight at a time; one charge (key-honouring provider) or one
//! dispatch, then in doubt (the other); every delivery answered within a bound; one handle; and
//! once settled, one answer from every replica. Each test prints how long the redeliveries took
//! to settle after the fault (`FAULT ...` lines), the takeover times the module docs state.
//!
//! Without PostgreSQL binaries these tests print a SKIP outside CI and fail in CI, as
//! `replicas.rs` does.

use crate::common::mcp::{Served, code, codex_in_session as codex, env_of, fox, next_id};
use crate::common::{bin, repo};
use crate::pg::PgCluster;
use callid::jsonrpc::{Connection, Response};
use callid::provider::{HookAction, Ledger, ProviderHandle, ProviderHooks};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A fault injected into replica A while its dispatch waits for the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// `pg_ctl restart -m fast`: every session of every replica is dropped by the server.
    Restart,
    /// `pg_terminate_backend` of every session on the database.
    Terminate,
    /// SIGSTOP past the lease, SIGCONT once the others settled.
    Stop,
    /// kill -9.
    Kill,
    /// kill -9, then a transaction of another session holds the operation's row lock until
    /// [`ROW_LOCKED_FOR`] after the fault: the redeliveries' claims wait for it and come back
    /// later than the lease they took could last (the server counts it from before the wait).
    KillLockedRow,
    /// Every packet from A to the database dropped (A's own network namespace, a veth pair to
    /// the database with a zero-length `pfifo` queue on A's end), while A still reaches the
    /// provider; healed once the server dropped A's session.
    Partition,
}

impl Fault {
    /// The lease lifetime every replica runs with (`--lease-ttl`), in seconds: long enough for a
    /// restarted server to come back before the dispatcher must give up (it renews across the
    /// fault), short where the fault is that it cannot renew.
    fn ttl(self) -> f64 {
        match self {
            Fault::Restart | Fault::Terminate => 6.0,
            Fault::Kill | Fault::KillLockedRow | Fault::Stop | Fault::Partition => 3.0,
        }
    }

    /// How long the provider takes over each request, in seconds: past the lease where the
    /// dispatcher must renew across the fault, shorter where it cannot renew at all.
    fn hold(self) -> f64 {
        match self {
            Fault::Restart | Fault::Terminate => 4.0,
            Fault::Kill | Fault::KillLockedRow | Fault::Partition => 2.0,
            Fault::Stop => 1.0,
        }
    }
}

impl Fault {
    /// Whether the fault kills replica A.
    fn kills(self) -> bool {
        matches!(self, Fault::Kill | Fault::KillLockedRow)
    }
}

/// How long after a [`Fault::KillLockedRow`] its row lock is held: past A's lease (3 s) plus a
/// whole lease (3 s) more, so a claim that waited for the lock from the lease's expiry comes
/// back with a lease the server counted from before its wait, lapsed already; within the
/// registry's `lock_timeout` (5 s) of the wait.
const ROW_LOCKED_FOR: Duration = Duration::from_millis(7000);

/// Holds the row lock of the one pending operation from another session until `until` (on a
/// thread of its own: the sync client runs its own runtime); returns once it is held.
fn lock_pending_row(url: String, until: Instant) -> std::thread::JoinHandle<()> {
    let (held_tx, held) = std::sync::mpsc::channel();
    let holder = std::thread::spawn(move || {
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let mut tx = client.transaction().unwrap();
        let rows = tx
            .query(
                "SELECT handle FROM callid_operations WHERE status = 'pending' FOR UPDATE",
                &[],
            )
            .unwrap();
        assert_eq!(rows.len(), 1, "one pending operation to lock");
        held_tx.send(()).unwrap();
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
        tx.rollback().unwrap();
    });
    held.recv().expect("the row lock was never taken");
    holder
}

/// The two kinds of provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The reference provider behind `callid router`: honours the key.
    HonoursKey,
    /// `paid_upstream.py` behind `callid gateway`: charges every request.
    ChargesEvery,
}

/// One request at the provider: its key and when it was open (seconds on one clock).
#[derive(Debug, Clone)]
struct Dispatch {
    key: String,
    start: f64,
    end: f64,
}

/// Hooks of the reference provider that hold each request `hold` and log when it started and
/// when it was charged (or, for a request whose client went away, when its hold ended).
struct Recorder {
    t0: Instant,
    hold: Mutex<Duration>,
    log: Mutex<Vec<Held>>,
}

/// A request the [`Recorder`] saw, in seconds since its `t0`.
struct Held {
    key: String,
    start: f64,
    /// When it was charged (never, if its client went away during the hold).
    charged: Option<f64>,
    hold: f64,
}

impl ProviderHooks for Recorder {
    fn before_charge(&self, key: &str) -> HookAction {
        let hold = *self.hold.lock().unwrap();
        let now = self.t0.elapsed().as_secs_f64();
        self.log.lock().unwrap().push(Held {
            key: key.to_string(),
            start: now,
            charged: None,
            hold: hold.as_secs_f64(),
        });
        HookAction::Hold(hold)
    }

    fn after_charge(&self, key: &str, _replayed: bool) -> HookAction {
        let now = self.t0.elapsed().as_secs_f64();
        let mut log = self.log.lock().unwrap();
        // The open request of this key whose hold ended last before now: one whose client went
        // away (killed, or gave up) is dropped by the server and never charges.
        let open = log
            .iter_mut()
            .filter(|e| e.key == key && e.charged.is_none())
            .min_by(|x, y| {
                let off = |e: &Held| (now - e.start - e.hold).abs();
                off(x).total_cmp(&off(y))
            });
        if let Some(open) = open {
            open.charged = Some(now);
        }
        HookAction::Proceed
    }
}

/// A cluster, a provider of `kind`, and three replicas.
struct World {
    kind: Kind,
    dir: tempfile::TempDir,
    pg: PgCluster,
    recorder: Arc<Recorder>,
    _provider: Option<ProviderHandle>,
    provider_url: String,
}

impl World {
    /// A world whose reference provider (if any) listens on `provider_ip`.
    async fn new(test: &str, kind: Kind, provider_ip: std::net::IpAddr) -> Option<World> {
        let pg = PgCluster::start(test)?;
        let dir = tempfile::tempdir().unwrap();
        let recorder = Arc::new(Recorder {
            t0: Instant::now(),
            hold: Mutex::new(Duration::ZERO),
            log: Mutex::new(vec![]),
        });
        let (provider, provider_url) = match kind {
            Kind::HonoursKey => {
                let listener = tokio::net::TcpListener::bind((provider_ip, 0))
                    .await
                    .unwrap();
                let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
                let hooks: Arc<dyn ProviderHooks> = recorder.clone();
                let p = callid::provider::spawn(listener, ledger, Some(hooks)).unwrap();
                let url = p.base_url();
                (Some(p), url)
            }
            Kind::ChargesEvery => (None, String::new()),
        };
        Some(World {
            kind,
            dir,
            pg,
            recorder,
            _provider: provider,
            provider_url,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts replica `name` with its own data directory on the shared database, its leases
    /// lasting `ttl` seconds; inside network namespace `net` (reaching the database there) when
    /// given.
    async fn replica(&self, name: &str, ttl: f64, net: Option<&Net>) -> Served {
        let data = self.path(name);
        std::fs::create_dir_all(&data).unwrap();
        let ttl = ttl.to_string();
        let args: Vec<String> = match self.kind {
            Kind::HonoursKey => vec![
                "router".into(),
                "--provider-url".into(),
                self.provider_url.clone(),
                "--lease-ttl".into(),
                ttl,
            ],
            Kind::ChargesEvery => vec![
                "gateway".into(),
                "--spend".into(),
                "pay".into(),
                "--lease-ttl".into(),
                ttl,
                "--".into(),
                "python3".into(),
                repo()
                    .join("tests/fixtures/paid_upstream.py")
                    .display()
                    .to_string(),
                "--charges".into(),
                self.path("charges.jsonl").display().to_string(),
            ],
        };
        let url = match net {
            Some(net) => self.pg.url().replace("127.0.0.1", &net.db_host.to_string()),
            None => self.pg.url(),
        };
        let data = data.display().to_string();
        let env = env_of(
            &[
                ("CALLID_LOG", "debug"),
                ("CALLID_REGISTRY", url.as_str()),
                ("XDG_DATA_HOME", data.as_str()),
            ],
            &[],
        );
        match net {
            Some(net) => {
                let mut wrapped: Vec<String> =
                    ["netns", "exec", &net.ns].map(String::from).to_vec();
                wrapped.push(bin().display().to_string());
                wrapped.extend(args);
                let ip = PathBuf::from("ip");
                Served::start("the replica", &ip, &wrapped, &env, None).await
            }
            None => Served::start("the replica", &bin(), &args, &env, None).await,
        }
    }

    /// The paid tool and its arguments (the provider holds each request `hold` seconds).
    fn spend_call(&self, hold: f64) -> (&'static str, Value) {
        match self.kind {
            Kind::HonoursKey => ("generate_image", fox()),
            Kind::ChargesEvery => ("pay", json!({"amount_cents": 3, "seconds": hold})),
        }
    }

    fn set_hold(&self, hold: f64) {
        *self.recorder.hold.lock().unwrap() = Duration::from_secs_f64(hold);
    }

    /// Every request the provider saw, from its own log.
    fn dispatches(&self) -> Vec<Dispatch> {
        match self.kind {
            Kind::HonoursKey => self
                .recorder
                .log
                .lock()
                .unwrap()
                .iter()
                .map(|h| Dispatch {
                    key: h.key.clone(),
                    start: h.start,
                    end: h.charged.unwrap_or(h.start + h.hold),
                })
                .collect(),
            Kind::ChargesEvery => {
                let text = std::fs::read_to_string(self.path("charges.jsonl")).unwrap_or_default();
                let events: Vec<Value> = text
                    .lines()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect();
                events
                    .iter()
                    .filter(|e| e["event"] == "start")
                    .map(|s| {
                        let end = events
                            .iter()
                            .find(|e| e["event"] == "end" && e["charge"] == s["charge"])
                            .map(|e| e["time"].as_f64().unwrap());
                        let start = s["time"].as_f64().unwrap();
                        let seconds = s["arguments"]["seconds"].as_f64().unwrap_or(0.0);
                        Dispatch {
                            key: s["key"].as_str().unwrap_or_default().to_string(),
                            start,
                            end: end.unwrap_or(start + seconds),
                        }
                    })
                    .collect()
            }
        }
    }

    /// How many requests have reached the provider.
    fn started(&self) -> usize {
        self.dispatches().len()
    }

    /// Waits (at most 30 s) until `n` requests reached the provider.
    async fn until_started(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.started() < n {
            assert!(
                Instant::now() < deadline,
                "the provider never saw {n} requests"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The charges in the reference provider's ledger.
    fn ledger_charges(&self) -> usize {
        callid::provider::Ledger::open(&self.path("ledger.sqlite3"))
            .unwrap()
            .charge_count()
            .unwrap() as usize
    }
}

/// A network namespace for replica A with two veth pairs to this host: one to the database
/// (`db_host` on this side), which [`Net::cut`] cuts, and one to the provider (`provider_host`).
/// Deleted when dropped.
struct Net {
    ns: String,
    /// The host's side of each pair (and the namespace's side, `<dev>p`).
    devs: [String; 2],
    db_host: std::net::IpAddr,
    provider_host: std::net::IpAddr,
}

impl Net {
    /// Creates the namespace, or says why it cannot (not root, no `ip netns`).
    fn create() -> Result<Net, String> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("{:x}{n}", std::process::id() % 0xfffff);
        // 10.209.x.y: a /30 per pair, numbered from this process and counter.
        let third = (std::process::id() % 250) as u8;
        let fourth = ((n % 30) * 8) as u8;
        let ip = |last: u8| std::net::IpAddr::from([10, 209, third, fourth + last]);
        let net = Net {
            ns: format!("callid-f{tag}"),
            devs: [format!("cfd{tag}"), format!("cfp{tag}")],
            db_host: ip(1),
            provider_host: ip(5),
        };
        let sh = |args: &[&str]| -> Result<(), String> {
            let out = std::process::Command::new(args[0])
                .args(&args[1..])
                .output()
                .map_err(|e| format!("`{}`: {e}", args.join(" ")))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "`{}`: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        sh(&["ip", "netns", "add", &net.ns])?;
        sh(&[
            "ip", "netns", "exec", &net.ns, "ip", "link", "set", "lo", "up",
        ])?;
        for (i, dev) in net.devs.iter().enumerate() {
            let peer = format!("{dev}p");
            let (host, inner) = (ip(1 + 4 * i as u8), ip(2 + 4 * i as u8));
            sh(&[
                "ip", "link", "add", dev, "type", "veth", "peer", "name", &peer,
            ])?;
            sh(&["ip", "link", "set", &peer, "netns", &net.ns])?;
            sh(&["ip", "addr", "add", &format!("{host}/30"), "dev", dev])?;
            sh(&["ip", "link", "set", dev, "up"])?;
            let inner = format!("{inner}/30");
            sh(&[
                "ip", "netns", "exec", &net.ns, "ip", "addr", "add", &inner, "dev", &peer,
            ])?;
            sh(&[
                "ip", "netns", "exec", &net.ns, "ip", "link", "set", &peer, "up",
            ])?;
        }
        Ok(net)
    }

    /// Drops every packet A sends on the database's pair (`heal`: lets them through again). Only
    /// A's end drops: the server's probes then go unanswered as across a real partition, whereas
    /// a queue dropping them on the server's own host counts as local congestion, which the
    /// kernel retries forever without counting a failed keepalive probe.
    fn cut(&self, heal: bool) {
        let (verb, tail): (&str, &[&str]) = if heal {
            ("del", &[])
        } else {
            ("add", &["pfifo", "limit", "0"])
        };
        let dev = &self.devs[0];
        let peer = format!("{dev}p");
        let mut cmd = vec![
            "ip", "netns", "exec", &self.ns, "tc", "qdisc", verb, "dev", &peer, "root",
        ];
        cmd.extend(tail);
        let status = std::process::Command::new(cmd[0])
            .args(&cmd[1..])
            .status()
            .unwrap();
        assert!(status.success(), "`{}` failed", cmd.join(" "));
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for dev in &self.devs {
            let _ = std::process::Command::new("ip")
                .args(["link", "del", dev])
                .status();
        }
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.ns])
            .status();
    }
}

/// A namespace for the partition fault, or `None` after printing why not (not root, or the
/// kernel refuses one, as in a container without `CAP_NET_ADMIN`). Missing `ip` or `tc` fails
/// in CI (`CI=true`), where `.ci/run` installs them.
fn partition_net(test: &str) -> Option<Net> {
    let have = |tool: &str| {
        std::process::Command::new(tool)
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !(have("ip") && have("tc")) {
        let reason = "no `ip` and `tc` (install iproute2)";
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{test}: {reason} (CI=true: this test never skips for that)");
        }
        eprintln!("SKIP {test}: {reason}");
        return None;
    }
    match Net::create() {
        Ok(net) => Some(net),
        Err(why) => {
            eprintln!("SKIP {test}: this machine refuses a network namespace: {why}");
            None
        }
    }
}

/// How long any delivery may take to be answered (a locked row holds every claim for
/// [`ROW_LOCKED_FOR`] on top).
fn bound(fault: Fault) -> Duration {
    let locked = match fault {
        Fault::KillLockedRow => ROW_LOCKED_FOR,
        _ => Duration::ZERO,
    };
    Duration::from_secs_f64(fault.ttl() + fault.hold() + 15.0) + locked
}

/// Delivers `tool(args)` as call `call_id` on `conn`, answered within `limit` (panics if not).
async fn deliver(
    conn: &Connection,
    tool: &str,
    args: &Value,
    call_id: &str,
    limit: Duration,
) -> Response {
    let call = conn.call_tool(next_id(), tool, args.clone(), Some(codex(call_id)));
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| panic!("a delivery of `{call_id}` was not answered within {limit:?}"))
        .unwrap_or_else(|e| panic!("a delivery of `{call_id}` failed: {e}"))
}

/// Redelivers until the answer is not `operation_in_progress`: every answer, in order.
async fn redeliver_until_settled(
    conn: Connection,
    tool: &'static str,
    args: Value,
    call_id: &'static str,
    limit: Duration,
) -> Vec<Response> {
    let start = Instant::now();
    let mut answers = vec![];
    loop {
        let r = deliver(&conn, tool, &args, call_id, limit).await;
        let busy = r.is_tool_error() && code(&r) == "operation_in_progress";
        answers.push(r);
        if !busy {
            return answers;
        }
        assert!(
            start.elapsed() < limit,
            "`{call_id}` still in progress after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// At most one request of each key open at the provider at any moment.
fn one_in_flight(dispatches: &[Dispatch]) -> Result<(), String> {
    let mut by_key: std::collections::BTreeMap<&str, Vec<&Dispatch>> = Default::default();
    for d in dispatches {
        by_key.entry(&d.key).or_default().push(d);
    }
    for (key, mut ds) in by_key {
        ds.sort_by(|a, b| a.start.total_cmp(&b.start));
        for pair in ds.windows(2) {
            if pair[1].start < pair[0].end {
                return Err(format!(
                    "two dispatches of key `{key}` in flight at once: {ds:?}"
                ));
            }
        }
    }
    Ok(())
}

/// What a settled answer says: the completed result (scrubbed of volatile marks), or the error
/// code.
fn settled(kind: Kind, r: &Response) -> Value {
    if r.is_tool_error() {
        return json!({"error": code(r)});
    }
    let s = r.structured().unwrap().clone();
    match kind {
        Kind::HonoursKey => json!({"result": s["result"], "handle": s["handle"]}),
        Kind::ChargesEvery => json!({"result": s}),
    }
}

/// The handle an answer names, if any.
fn handle_of(r: &Response) -> Option<String> {
    let meta = r.tool_result()?["_meta"]["callid/handle"]
        .as_str()
        .map(String::from);
    meta.or_else(|| r.structured()?["handle"].as_str().map(String::from))
}

/// Runs `fault` against replica A of a world of `kind`, checks every invariant, and returns how
/// long the other replicas' redeliveries took to settle after the fault.
async fn fault_run(test: &str, kind: Kind, fault: Fault) -> Option<Duration> {
    let net = match fault {
        Fault::Partition => Some(partition_net(test)?),
        _ => None,
    };
    let provider_ip = net
        .as_ref()
        .map_or([127, 0, 0, 1].into(), |n| n.provider_host);
    let w = World::new(test, kind, provider_ip).await?;
    if let Some(net) = &net {
        w.pg.reconfigure(
            &[],
            &format!("listen_addresses = '127.0.0.1,{}'", net.db_host),
            &format!("host all all {}/24 trust", net.db_host),
        );
        w.pg.restart_server();
    }
    let mut a = w.replica("a", fault.ttl(), net.as_ref()).await;
    let b = w.replica("b", fault.ttl(), None).await;
    let c = w.replica("c", fault.ttl(), None).await;
    let hold = fault.hold();
    let limit = bound(fault);

    // Every replica has its sessions open before the fault. On a loaded machine a warm-up's
    // lease can take longer than the lease itself to take; the replica then answers
    // `operation_in_progress` without dispatching, as it must, and the warm-up is delivered
    // again, as that answer asks.
    let (tool, warm_args) = w.spend_call(0.0);
    for (r, id) in [(&a, "warm-a"), (&b, "warm-b"), (&c, "warm-c")] {
        let answers =
            redeliver_until_settled(r.conn.clone(), tool, warm_args.clone(), id, limit).await;
        let warm = answers.last().expect("one answer at least");
        assert!(!warm.is_tool_error(), "{}", warm.raw);
    }
    let before = w.started();
    w.set_hold(hold);
    let (tool, args) = w.spend_call(hold);

    let first = {
        let (conn, args) = (a.conn.clone(), args.clone());
        tokio::spawn(async move {
            let call = conn.call_tool(next_id(), tool, args, Some(codex("x")));
            tokio::time::timeout(limit, call).await
        })
    };
    w.until_started(before + 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = a.child.pid().unwrap() as i32;
    let locks_sql = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted";
    let locks_before = w.pg.sql("callid", locks_sql);
    let injected = Instant::now();
    match fault {
        Fault::Restart => w.pg.restart_server(),
        Fault::Terminate => {
            w.pg.sql(
                "callid",
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE datname = 'callid' AND pid <> pg_backend_pid()",
            );
        }
        // SAFETY: a signal to our own child process.
        Fault::Stop => assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0),
        Fault::Kill | Fault::KillLockedRow => a.child.kill9().await.unwrap(),
        Fault::Partition => net.as_ref().unwrap().cut(false),
    }
    let lock_gone = (fault == Fault::Partition).then(|| {
        // When the server drops A's half-open session and its liveness lock (a row without a
        // dispatch mark could be taken over from then on).
        let (pg_url, psql) = (w.pg.url(), w.pg.bindir().join("psql"));
        let fewer = (locks_before.parse::<u32>().unwrap() - 1).to_string();
        let at = injected;
        std::thread::spawn(move || {
            let count = || {
                let out = std::process::Command::new(&psql)
                    .args([pg_url.as_str(), "-Atc", locks_sql])
                    .output();
                out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            };
            while at.elapsed() < Duration::from_secs(30) {
                if count().is_ok_and(|n| n == fewer) {
                    return Some(at.elapsed());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            None
        })
    });
    let row_lock = (fault == Fault::KillLockedRow)
        .then(|| lock_pending_row(w.pg.url(), injected + ROW_LOCKED_FOR));
    let others = [b.conn.clone(), c.conn.clone()].map(|conn| {
        let args = args.clone();
        tokio::spawn(redeliver_until_settled(conn, tool, args, "x", limit))
    });
    let mut answers = vec![];
    for o in others {
        answers.extend(o.await.unwrap());
    }
    let took = injected.elapsed();
    if fault == Fault::Stop {
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    }
    // The cut lasts until the server dropped A's session (or 30 s), then heals.
    let lock_gone = lock_gone.map(|t| t.join().unwrap());
    if let Some(net) = &net {
        net.cut(true);
    }
    if let Some(holder) = row_lock {
        holder.join().unwrap();
    }
    let own = first.await.unwrap();
    match (fault, own) {
        (f, Ok(answer)) if f.kills() => assert!(answer.is_err(), "a killed replica answered"),
        (_, Ok(answer)) => answers.push(answer.expect("replica A's own answer")),
        (_, Err(_)) => panic!("{test}: replica A did not answer within {limit:?}"),
    }

    // Once settled, every live replica answers the same.
    let live: Vec<&Served> = match fault {
        f if f.kills() => vec![&b, &c],
        _ => vec![&a, &b, &c],
    };
    let mut finals = vec![];
    for r in live {
        let last = redeliver_until_settled(r.conn.clone(), tool, args.clone(), "x", limit).await;
        finals.push(last.last().unwrap().clone());
    }
    answers.extend(finals.iter().cloned());
    let first_final = settled(kind, &finals[0]);
    for f in &finals {
        assert_eq!(
            settled(kind, f),
            first_final,
            "{test}: one answer from every replica"
        );
    }

    // One handle; one result among every answer that carries one.
    let handles: std::collections::BTreeSet<String> =
        answers.iter().filter_map(handle_of).collect();
    assert_eq!(handles.len(), 1, "{test}: one handle: {handles:?}");
    let results: std::collections::BTreeSet<String> = answers
        .iter()
        .filter(|r| !r.is_tool_error())
        .map(|r| settled(kind, r).to_string())
        .collect();
    assert!(results.len() <= 1, "{test}: one result: {results:?}");

    // At the provider: one dispatch in flight at a time, one charge or one dispatch in doubt.
    let dispatches: Vec<Dispatch> = w.dispatches().into_iter().skip(before).collect();
    if let Err(e) = one_in_flight(&dispatches) {
        let logs: Vec<String> = [&a, &b, &c].iter().map(|r| r.child.stderr_text()).collect();
        panic!(
            "{test}: {e}; the fault came {:.2} s after the provider's clock started\n\
             A:\n{}\nB:\n{}\nC:\n{}",
            (injected - w.recorder.t0).as_secs_f64(),
            logs[0],
            logs[1],
            logs[2]
        );
    }
    match kind {
        Kind::HonoursKey => assert_eq!(w.ledger_charges(), 4, "{test}: three warm-ups and one"),
        Kind::ChargesEvery => {
            assert_eq!(
                dispatches.len(),
                1,
                "{test}: dispatched once: {dispatches:?}"
            );
            let status = first_final.to_string();
            assert!(
                status.contains("result") || status.contains("outcome_in_doubt"),
                "{test}: charged once, or in doubt: {status}"
            );
        }
    }
    eprintln!(
        "FAULT {fault:?} provider {kind:?}: redeliveries settled {:.2} s after the fault, as {first_final}",
        took.as_secs_f64()
    );
    if let Some(gone) = lock_gone {
        let gone = gone.expect("the server never dropped the cut-off replica's session");
        eprintln!(
            "FAULT {fault:?} provider {kind:?}: the server dropped A's liveness lock {:.2} s \
             after the cut",
            gone.as_secs_f64()
        );
    }
    for r in [a, b, c] {
        if !fault.kills() || r.child.pid().is_some() {
            r.stop().await;
        }
    }
    Some(took)
}

/// A new operation whose row insert waits in the registry (another session's uncommitted row of
/// the same call identity, rolled back after 3 s of a 6 s lease) is renewed from when its lease
/// was asked for, so its dispatcher does not give up on a healthy 4 s dispatch. A 6 s lease is
/// renewed every 2 s and given up 4.8 s after it was asked for: counted from the insert's
/// return, the first renewal would go at 5 s, past that deadline; counted from when the lease
/// was asked for, it goes at once and has 1.8 s to come back, enough on a loaded machine (with
/// 1.8 s of a 3 s lease it had 0.6 s, and once, at a load of 10, missed them).
#[tokio::test]
async fn a_dispatch_whose_insert_waited_is_renewed_in_time() {
    let test = "a_dispatch_whose_insert_waited_is_renewed_in_time";
    let Some(w) = World::new(test, Kind::HonoursKey, [127, 0, 0, 1].into()).await else {
        return;
    };
    let a = w.replica("a", 6.0, None).await;
    let limit = bound(Fault::Kill);
    let (tool, args) = w.spend_call(0.0);
    let warm = deliver(&a.conn, tool, &args, "warm-a", limit).await;
    assert!(!warm.is_tool_error(), "{}", warm.raw);
    let url = w.pg.url();
    let (held_tx, held) = std::sync::mpsc::channel();
    let holder = std::thread::spawn(move || {
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let mut tx = client.transaction().unwrap();
        tx.batch_execute(
            r"CREATE TEMP TABLE slow ON COMMIT DROP AS
                SELECT * FROM callid_operations WHERE harness_call_id LIKE '%warm-a%';
              UPDATE slow SET harness_call_id = replace(harness_call_id, 'warm-a', 'slow'),
                handle = handle || '-slow', operation_key = operation_key || '-slow',
                status = 'pending';
              INSERT INTO callid_operations SELECT * FROM slow;",
        )
        .unwrap();
        held_tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(3000));
        tx.rollback().unwrap();
    });
    held.recv().expect("the conflicting row was never inserted");
    w.set_hold(4.0);
    let (tool, args) = w.spend_call(4.0);
    let answer = deliver(&a.conn, tool, &args, "slow", limit).await;
    holder.join().unwrap();
    assert!(!answer.is_tool_error(), "{}", answer.raw);
    assert_eq!(w.ledger_charges(), 2, "the warm-up and one");
    a.stop().await;
}

macro_rules! fault_tests {
    ($($(#[$attr:meta])* $name:ident: $kind:expr, $fault:expr;)*) => {$(
        #[tokio::test]
        $(#[$attr])*
        async fn $name() {
            fault_run(stringify!($name), $kind, $fault).await;
        }
    )*};
}

fault_tests! {
    a_database_restart_never_doubles_a_dispatch_to_a_key_honouring_provider:
        Kind::HonoursKey, Fault::Restart;
    a_database_restart_never_doubles_a_dispatch_to_a_charging_provider:
        Kind::ChargesEvery, Fault::Restart;
    terminated_sessions_never_double_a_dispatch_to_a_key_honouring_provider:
        Kind::HonoursKey, Fault::Terminate;
    terminated_sessions_never_double_a_dispatch_to_a_charging_provider:
        Kind::ChargesEvery, Fault::Terminate;
    a_replica_paused_past_its_lease_is_taken_over_once_with_a_key_honouring_provider:
        Kind::HonoursKey, Fault::Stop;
    a_replica_paused_past_its_lease_is_in_doubt_with_a_charging_provider:
        Kind::ChargesEvery, Fault::Stop;
    a_killed_replica_is_taken_over_once_by_racing_replicas_with_a_key_honouring_provider:
        Kind::HonoursKey, Fault::Kill;
    a_killed_replica_is_in_doubt_for_racing_replicas_with_a_charging_provider:
        Kind::ChargesEvery, Fault::Kill;
    a_claim_that_waited_past_its_lease_never_doubles_a_dispatch_to_a_key_honouring_provider:
        Kind::HonoursKey, Fault::KillLockedRow;
    a_replica_cut_off_from_the_database_is_taken_over_once_with_a_key_honouring_provider:
        Kind::HonoursKey, Fault::Partition;
    a_replica_cut_off_from_the_database_is_in_doubt_with_a_charging_provider:
        Kind::ChargesEvery, Fault::Partition;
}
