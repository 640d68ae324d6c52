//! The probe's record writer: records are built and written off the reply path.
//!
//! The tap hands each message to a [`RecordWriter`] as it was parsed (the JSON value, or on
//! stdio its text, which is parsed here; its length; and a snapshot of the connection's context) and goes on answering; a writer thread
//! builds the record (shape digests, identity verdict, request digest), serializes it and appends
//! it to the [`ShapeLog`].
//!
//! # Guarantees
//! - The reply is never delayed by the log: handing a record over never blocks. The queue holds
//!   at most [`QUEUE_RECORDS`] records and [`QUEUE_BYTES`] bytes of message text; when either is
//!   reached the record is dropped and counted, and [`RecordWriter::finish`] reports the count in
//!   one summary line on standard error.
//! - The queue's memory follows its contents: nothing is set aside for the records that are not
//!   waiting (a queue allocated whole for [`QUEUE_RECORDS`] records took 850 kB of a 20 MB
//!   budget before the first call), and the byte bound caps what is held whatever the messages'
//!   sizes ([`QUEUE_RECORDS`] messages of the largest size the tap keeps would be 4 GiB).
//! - In normal operation nothing is dropped, on a busy machine too: the stdio probe answers on
//!   one thread and the writer has its own, and the writer gives way to other threads only while
//!   fewer than [`YIELD_BELOW`] records wait, so the queue stays short (a test sends 10,000 calls
//!   and finds 10,000 records; [`WriterSummary::most_queued`], logged at `info` on exit, says how
//!   short).
//! - Records are written in the order they were handed over, as whole lines: the lines of one
//!   drain go out in one `write` (at most about [`BATCH_BYTES`] each), never a line split across two.
//! - [`RecordWriter::finish`] writes everything still queued before it returns; [`flush`]
//!   waits until everything handed over so far is written.
//!
//! [`flush`]: RecordWriter::flush

use super::record::{Record, RecordContext, ShapeLog, record_for_request};
use crate::shape::Digester;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

/// Most records waiting to be written; past this, records are dropped and counted.
pub const QUEUE_RECORDS: usize = 4096;

/// Most bytes of message text waiting to be written (a record counts its message's length; one
/// the tap built itself counts its own size); past this, records are dropped and counted. About
/// [`QUEUE_RECORDS`] messages of a Codex-sized call (850 bytes), so for such calls the record
/// bound is reached first; for large messages this one is.
pub const QUEUE_BYTES: usize = 4 << 20;

/// One record to write: already built, or a parsed message to build it from.
#[derive(Debug)]
pub enum Job {
    /// A record built by the tap (refused or oversize messages, batch elements).
    Record(Box<Record>),
    /// A request or notification as the client sent it (the tap decided on its
    /// [`super::head`]): parsed here, then as [`Job::Message`].
    Text {
        /// The message's text.
        text: Vec<u8>,
        /// Its length in bytes as received.
        bytes: usize,
        /// The connection's context when it arrived.
        ctx: RecordContext,
    },
    /// A parsed request or notification: the record is [`record_for_request`] of it.
    Message {
        /// The whole message.
        message: Value,
        /// Its length in bytes.
        bytes: usize,
        /// The connection's context when it arrived.
        ctx: RecordContext,
    },
}

impl Job {
    /// What the job counts against [`QUEUE_BYTES`].
    fn queued_bytes(&self) -> usize {
        match self {
            Job::Record(_) => std::mem::size_of::<Record>(),
            Job::Text { text, .. } => text.len(),
            Job::Message { bytes, .. } => *bytes,
        }
    }
}

enum Item {
    Job(Job, usize),
    Flush(mpsc::Sender<()>),
}

/// What [`RecordWriter::finish`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterSummary {
    /// Records written to the log.
    pub written: u64,
    /// Records dropped because the queue was full.
    pub dropped: u64,
    /// Records the log refused (a write error, reported as it happened).
    pub failed: u64,
    /// The most records that were waiting at once.
    pub most_queued: u64,
    /// The most bytes (as counted against [`QUEUE_BYTES`]) that were waiting at once.
    pub most_queued_bytes: u64,
}

#[derive(Default)]
struct Counters {
    written: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
    /// Records handed over and not yet handled by the writer (the bound's count).
    queued: AtomicUsize,
    /// Their bytes.
    queued_bytes: AtomicUsize,
    most_queued: AtomicUsize,
    most_queued_bytes: AtomicUsize,
}

impl Counters {
    /// Takes room for one record of `bytes` in the queue; `false` (and nothing taken) when the
    /// queue is at either bound. Exact under concurrent callers: room is taken first, then given
    /// back if it went past a bound.
    fn reserve(&self, bytes: usize, records: usize, max_bytes: usize) -> bool {
        let queued = self.queued.fetch_add(1, Ordering::AcqRel) + 1;
        let queued_bytes = self.queued_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if queued > records || queued_bytes > max_bytes {
            self.release(bytes);
            return false;
        }
        self.most_queued.fetch_max(queued, Ordering::Relaxed);
        self.most_queued_bytes
            .fetch_max(queued_bytes, Ordering::Relaxed);
        true
    }

    /// Gives back the room of one record of `bytes`.
    fn release(&self, bytes: usize) {
        self.queued.fetch_sub(1, Ordering::AcqRel);
        self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// A bounded queue of records and the thread that writes them.
pub struct RecordWriter {
    tx: Mutex<Option<mpsc::Sender<Item>>>,
    capacity: usize,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for RecordWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordWriter")
            .field("written", &self.counters.written.load(Ordering::Relaxed))
            .field("dropped", &self.counters.dropped.load(Ordering::Relaxed))
            .finish()
    }
}

impl RecordWriter {
    /// Starts the writer thread for `log`, with a queue of [`QUEUE_RECORDS`].
    pub fn start(log: Arc<ShapeLog>, digester: Digester) -> Self {
        Self::with_capacity(log, digester, QUEUE_RECORDS)
    }

    /// Starts the writer thread with a queue of `capacity` records (and [`QUEUE_BYTES`]).
    pub fn with_capacity(log: Arc<ShapeLog>, digester: Digester, capacity: usize) -> Self {
        // Unbounded as a channel (its blocks are allocated as records arrive and freed as they
        // leave); bounded by `Counters::reserve` before anything is sent.
        let (tx, rx) = mpsc::channel::<Item>();
        let counters = Arc::new(Counters::default());
        let thread = {
            let counters = counters.clone();
            std::thread::Builder::new()
                .name("callid-probe-log".into())
                .spawn(move || write_loop(rx, &log, &digester, &counters))
                .expect("the record writer thread starts")
        };
        RecordWriter {
            tx: Mutex::new(Some(tx)),
            capacity,
            thread: Mutex::new(Some(thread)),
            counters,
        }
    }

    /// Hands a record over without waiting; counts it as dropped when the queue is full or the
    /// writer has finished.
    pub fn submit(&self, job: Job) {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let bytes = job.queued_bytes();
        let sent = match tx.as_ref() {
            Some(tx) if self.counters.reserve(bytes, self.capacity, QUEUE_BYTES) => {
                let sent = tx.send(Item::Job(job, bytes)).is_ok();
                if !sent {
                    self.counters.release(bytes);
                }
                sent
            }
            _ => false,
        };
        if !sent {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits until every record handed over before this call is written.
    pub fn flush(&self) {
        let (done_tx, done_rx) = mpsc::channel();
        let sender = self
            .tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .cloned();
        if let Some(tx) = sender
            && tx.send(Item::Flush(done_tx)).is_ok()
        {
            let _ = done_rx.recv();
        }
    }

    /// Writes what is queued, stops the thread, and returns the counts. When any record was
    /// dropped, says so in one line on standard error. Later records are counted as dropped.
    pub fn finish(&self) -> WriterSummary {
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
        let summary = self.summary();
        tracing::info!(
            written = summary.written,
            dropped = summary.dropped,
            most_queued = summary.most_queued,
            most_queued_bytes = summary.most_queued_bytes,
            "the record writer finished"
        );
        if summary.dropped > 0 {
            crate::logging::line(format_args!(
                "callid probe: {} records written, {} dropped because the log writer fell behind \
                 (queue of {} records or {QUEUE_BYTES} bytes); the replies were not delayed",
                summary.written, summary.dropped, self.capacity
            ));
        }
        summary
    }

    /// The counts so far.
    pub fn summary(&self) -> WriterSummary {
        WriterSummary {
            written: self.counters.written.load(Ordering::Relaxed),
            dropped: self.counters.dropped.load(Ordering::Relaxed),
            failed: self.counters.failed.load(Ordering::Relaxed),
            most_queued: self.counters.most_queued.load(Ordering::Relaxed) as u64,
            most_queued_bytes: self.counters.most_queued_bytes.load(Ordering::Relaxed) as u64,
        }
    }
}

impl Drop for RecordWriter {
    fn drop(&mut self) {
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

/// The record a job stands for.
pub fn build(job: Job, digester: &Digester) -> Record {
    match job {
        Job::Record(record) => *record,
        Job::Text { text, bytes, ctx } => match serde_json::from_slice::<Value>(&text) {
            Ok(message) => build(
                Job::Message {
                    message,
                    bytes,
                    ctx,
                },
                digester,
            ),
            // The head and rmcp read it, the whole parse did not (a number past f64 in a
            // member neither of them reads): recorded as malformed, its shape unknown.
            Err(e) => {
                let mut record = Record::new(super::record::Kind::Malformed, bytes, &ctx, digester);
                let too_deep = e.to_string().contains("recursion limit");
                record.error = Some(super::record::RecordError {
                    code: if too_deep {
                        "too_deep"
                    } else {
                        "malformed_json"
                    }
                    .to_string(),
                    message: format!("not valid JSON: {e}"),
                });
                record
            }
        },
        Job::Message {
            message,
            bytes,
            ctx,
        } => {
            let method = message.get("method").and_then(Value::as_str).unwrap_or("");
            record_for_request(
                method,
                message.get("id"),
                message.get("params"),
                bytes,
                &ctx,
                digester,
            )
        }
    }
}

/// How long the writer pauses between drains while records keep coming.
///
/// A record handed to a waiting writer wakes its thread (a futex wake on the reply path, and a
/// context switch); with one call in flight that was one wake-up per call. Once woken, the writer
/// writes the record, pauses, drains the queue, and pauses and drains again as long as it finds
/// records; it waits (to be woken by the next record) only after a pause that brought none: a
/// busy probe wakes it once per pause, not once per call. The queue holds far more than a pause
/// brings (a pause of 1 ms at 100,000 calls/s is 100 records against [`QUEUE_RECORDS`]).
pub const PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

/// Queued records below which the writer yields its core after each record it builds.
///
/// The yield keeps a reply path woken onto the writer's core from waiting for a whole drain
/// (BENCHMARKS.md, the probe round trip). On a busy machine each yield hands the core to every
/// other runnable thread first, so a writer that yields after every record builds one per time
/// slice: 10,000 calls beside six busy loops on two cores dropped 4,601 records. Past this many
/// queued the writer builds without yielding, like any thread, until it is back below, so the
/// queue stays far from [`QUEUE_RECORDS`]. A pause of [`PAUSE`] at 100,000 calls/s brings 100.
pub const YIELD_BELOW: usize = 256;

/// Most bytes of lines the writer holds before it writes them. A drain's lines go out in one
/// `write` (each append cost the writer thread about a third of its time on ext4, one per
/// record); a drain that brings more goes out in writes of about this size.
pub const BATCH_BYTES: usize = 64 << 10;

/// The lines of a drain, not yet written.
#[derive(Default)]
struct Batch {
    lines: Vec<u8>,
    records: u64,
}

impl Batch {
    fn push(&mut self, record: &Record) {
        super::record::push_line(&mut self.lines, record);
        self.records += 1;
    }

    /// Writes the lines held, in one write, and counts their records written or failed.
    fn write_out(&mut self, log: &ShapeLog, counters: &Counters) {
        if self.records == 0 {
            return;
        }
        match log.write_lines(&self.lines) {
            Ok(()) => {
                counters.written.fetch_add(self.records, Ordering::Relaxed);
            }
            Err(e) => {
                counters.failed.fetch_add(self.records, Ordering::Relaxed);
                tracing::error!("{e:#}");
            }
        }
        self.lines.clear();
        self.records = 0;
    }
}

fn write_loop(rx: mpsc::Receiver<Item>, log: &ShapeLog, digester: &Digester, counters: &Counters) {
    let mut batch = Batch::default();
    let handle = |item: Item, batch: &mut Batch| match item {
        Item::Flush(done) => {
            batch.write_out(log, counters);
            let _ = done.send(());
        }
        Item::Job(job, bytes) => {
            // Its room is given back once its message is no longer held.
            let record = build(job, digester);
            counters.release(bytes);
            batch.push(&record);
            if batch.lines.len() >= BATCH_BYTES {
                batch.write_out(log, counters);
            }
        }
    };
    // Waits for the first record after an idle spell, then drains between pauses (see PAUSE).
    while let Ok(item) = rx.recv() {
        handle(item, &mut batch);
        batch.write_out(log, counters);
        loop {
            std::thread::sleep(PAUSE);
            let mut drained = 0usize;
            let ended = loop {
                match rx.try_recv() {
                    Ok(item) => {
                        handle(item, &mut batch);
                        drained += 1;
                        // A reply path woken onto this core waits for one record at most,
                        // not for the whole drain; a writer behind yields no more (YIELD_BELOW).
                        if counters.queued.load(Ordering::Relaxed) < YIELD_BELOW {
                            std::thread::yield_now();
                        }
                    }
                    Err(mpsc::TryRecvError::Empty) => break false,
                    Err(mpsc::TryRecvError::Disconnected) => break true,
                }
            };
            batch.write_out(log, counters);
            if ended {
                return;
            }
            if drained == 0 {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::record::{Kind, Transport};
    use serde_json::json;
    use std::io::Write;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A gate the test opens once; the log's writes wait at it until then.
    #[derive(Clone, Default)]
    struct Gate(Arc<(Mutex<bool>, std::sync::Condvar)>);
    impl Gate {
        /// A log whose writes wait at this gate, then go to `out`.
        fn log(&self, out: impl Write + Send + 'static) -> Arc<ShapeLog> {
            Arc::new(ShapeLog::from_writer(Box::new(Gated {
                gate: self.clone(),
                out,
            })))
        }
        fn open(&self) {
            let (open, cv) = &*self.0;
            *open.lock().unwrap() = true;
            cv.notify_all();
        }
        fn wait(&self) {
            let (open, cv) = &*self.0;
            let mut open = open.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
        }
    }

    /// A writer that blocks until the test opens its gate.
    struct Gated<W> {
        gate: Gate,
        out: W,
    }
    impl<W: Write> Write for Gated<W> {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.gate.wait();
            self.out.write(b)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn message(n: u64) -> Job {
        Job::Message {
            message: json!({"jsonrpc": "2.0", "id": n, "method": "tools/call",
                "params": {"name": "t", "_meta": {"callId": format!("call_{n}")}}}),
            bytes: 10,
            ctx: RecordContext::new(Transport::Stdio),
        }
    }

    #[test]
    fn every_record_is_written_in_order() {
        let out = Shared::default();
        let log = Arc::new(ShapeLog::from_writer(Box::new(out.clone())));
        let writer = RecordWriter::start(log, Digester::Plain);
        for n in 0..500 {
            writer.submit(message(n));
        }
        writer.flush();
        assert_eq!(writer.summary().written, 500);
        let summary = writer.finish();
        assert_eq!(
            (summary.written, summary.dropped, summary.failed),
            (500, 0, 0)
        );
        assert!(
            (1..=500).contains(&summary.most_queued),
            "{}",
            summary.most_queued
        );
        // Each message counts its 10 bytes.
        assert!(
            (10..=5000).contains(&summary.most_queued_bytes),
            "{}",
            summary.most_queued_bytes
        );
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let records: Vec<Record> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(records.len(), 500);
        for (n, r) in records.iter().enumerate() {
            assert_eq!(r.kind, Kind::Request);
            assert_eq!(
                r.id.as_ref().unwrap().digest,
                Digester::Plain.value(&json!(n))
            );
        }
        assert!(!text.contains("call_"), "no value is copied");
    }

    /// Each `write` call's bytes, kept apart.
    #[derive(Clone, Default)]
    struct Writes(Arc<Mutex<Vec<Vec<u8>>>>);
    impl Write for Writes {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().push(b.to_vec());
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_drain_goes_out_in_whole_lines_in_one_write_per_batch() {
        let gate = Gate::default();
        let writes = Writes::default();
        let log = gate.log(writes.clone());
        let writer = RecordWriter::start(log, Digester::Plain);
        // The first record is written alone (held at the gate); every other one is queued by
        // then, so one drain takes them all.
        let total = 600u64;
        for n in 0..total {
            writer.submit(message(n));
        }
        gate.open();
        let summary = writer.finish();
        assert_eq!((summary.written, summary.dropped), (total, 0));
        let writes = writes.0.lock().unwrap().clone();
        let lines = |w: &[u8]| w.iter().filter(|&&b| b == b'\n').count();
        assert_eq!(lines(&writes[0]), 1, "the first record alone");
        let longest = writes
            .iter()
            .flat_map(|w| w.split(|&b| b == b'\n'))
            .map(<[u8]>::len)
            .max();
        let drain = &writes[1..];
        assert!(
            drain.len() >= 2,
            "{} writes: the drain is larger than one batch",
            drain.len()
        );
        for (i, w) in drain.iter().enumerate() {
            assert!(w.ends_with(b"\n"), "write {i} ends inside a line");
            if i + 1 < drain.len() {
                assert!(
                    (BATCH_BYTES..BATCH_BYTES + longest.unwrap() + 1).contains(&w.len()),
                    "write {i}: {} bytes",
                    w.len()
                );
            }
        }
        let all: Vec<u8> = writes.concat();
        let records: Vec<Record> = String::from_utf8(all)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(records.len() as u64, total);
        for (n, r) in records.iter().enumerate() {
            assert_eq!(
                r.id.as_ref().unwrap().digest,
                Digester::Plain.value(&json!(n))
            );
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_blocking() {
        let gate = Gate::default();
        let out = Shared::default();
        let log = gate.log(out.clone());
        let capacity = 8;
        let writer = RecordWriter::with_capacity(log, Digester::Plain, capacity);
        // The writer blocks on its first record; the queue then holds `capacity` more at most.
        for n in 0..100 {
            writer.submit(message(n));
        }
        let dropped = writer.summary().dropped;
        assert!(
            (100 - capacity as u64 - 1..=100 - capacity as u64).contains(&dropped),
            "{dropped}"
        );
        gate.open();
        let summary = writer.finish();
        assert_eq!(summary.written + summary.dropped, 100);
        assert_eq!(summary.dropped, dropped);
        let lines = String::from_utf8(out.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .count() as u64;
        assert_eq!(lines, summary.written);
        writer.submit(message(100));
        assert_eq!(writer.summary().dropped, dropped + 1, "after finish");
    }

    /// Large messages reach the byte bound long before the record bound: the queue never holds
    /// more than `QUEUE_BYTES` of them, and the rest are dropped and counted, without blocking.
    #[test]
    fn the_byte_bound_drops_large_messages_and_counts_them() {
        let gate = Gate::default();
        let out = Shared::default();
        let log = gate.log(out.clone());
        let writer = RecordWriter::start(log, Digester::Plain);
        let big = |n: u64| {
            let padding = "x".repeat(crate::probe::frame::MAX_MESSAGE_BYTES - 200);
            let text = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": n,
                "method": "tools/call", "params": {"name": "t", "arguments": {"p": padding}}}))
            .unwrap();
            Job::Text {
                bytes: text.len(),
                text,
                ctx: RecordContext::new(Transport::Stdio),
            }
        };
        // The writer holds at most one (built, blocked in its write) besides the queue.
        let fit = (QUEUE_BYTES / big(0).queued_bytes()) as u64;
        assert!(fit < 20);
        for n in 0..20 {
            writer.submit(big(n));
        }
        let dropped = writer.summary().dropped;
        assert!((20 - fit - 1..=20 - fit).contains(&dropped), "{dropped}");
        assert!(writer.summary().most_queued_bytes <= QUEUE_BYTES as u64);
        gate.open();
        let summary = writer.finish();
        assert_eq!(summary.written + summary.dropped, 20);
        assert_eq!(summary.dropped, dropped);
        let lines = String::from_utf8(out.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .count() as u64;
        assert_eq!(lines, summary.written);
    }
}
