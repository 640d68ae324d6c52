//! A TCP relay between the router and PostgreSQL that counts the router's round trips to the
//! server and can hold every byte a fixed time each way: [`Relay`].
//!
//! # Guarantees
//! - Bytes pass unchanged and in order in both directions; each accepted connection gets its own
//!   connection to the server, closed when either side closes.
//! - A **round trip** is counted when a client sends bytes after the relay delivered it bytes
//!   from the server (began writing them) since the client's previous send (the first send of a connection counts
//!   too): a client that waits for an answer before its next request makes one per request, a
//!   client that pipelines several statements before reading makes one for all of them. It is
//!   counted on the wire, whatever the client's library, statements or transactions.
//! - With a delay set ([`Relay::set_delay`]), each chunk read from either side is written to the
//!   other no earlier than that long after it was read, in order: a link that far away each way.
//!   The time each chunk was actually held, from read to the start of its write, is summed
//!   ([`Counts::held`]), so a reader can see what the scheduler added to the delay asked for.
//!
//! The relay runs on threads of its own (blocking sockets, timer slack cut to 1 µs), not on the
//! bench's runtime, whose timer has millisecond resolution.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a relay counted so far, over all its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Client round trips (see the module docs).
    pub round_trips: u64,
    /// Chunks forwarded, both directions.
    pub chunks: u64,
    /// Time the forwarded chunks were held in total, from read to the start of their write.
    pub held: Duration,
}

impl Counts {
    /// What was counted since `earlier`.
    pub fn since(self, earlier: Counts) -> Counts {
        Counts {
            round_trips: self.round_trips - earlier.round_trips,
            chunks: self.chunks - earlier.chunks,
            held: self.held.saturating_sub(earlier.held),
        }
    }

    /// The mean time a chunk was held (zero when none passed).
    pub fn mean_hold(self) -> Duration {
        match u32::try_from(self.chunks) {
            Ok(0) => Duration::ZERO,
            Ok(n) => self.held / n,
            Err(_) => Duration::from_secs_f64(self.held.as_secs_f64() / self.chunks as f64),
        }
    }
}

#[derive(Default)]
struct Shared {
    delay_ns: AtomicU64,
    round_trips: AtomicU64,
    chunks: AtomicU64,
    held_ns: AtomicU64,
    stop: AtomicBool,
    /// Every socket opened, so dropping the relay can shut them and end their threads.
    sockets: Mutex<Vec<TcpStream>>,
}

/// A relay listening on a loopback port, forwarding to one server address; stopped when dropped.
pub struct Relay {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    /// Listens on a free loopback port and forwards each connection to `server`.
    pub fn start(server: SocketAddr) -> std::io::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let accept = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("bench-relay".into())
                .spawn(move || accept_loop(&listener, server, &shared))?
        };
        Ok(Relay {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds every chunk `one_way` in each direction from now on (zero: forward at once).
    pub fn set_delay(&self, one_way: Duration) {
        let ns = u64::try_from(one_way.as_nanos()).unwrap_or(u64::MAX);
        self.shared.delay_ns.store(ns, Ordering::Relaxed);
    }

    /// What was counted so far.
    pub fn counts(&self) -> Counts {
        Counts {
            round_trips: self.shared.round_trips.load(Ordering::Relaxed),
            chunks: self.shared.chunks.load(Ordering::Relaxed),
            held: Duration::from_nanos(self.shared.held_ns.load(Ordering::Relaxed)),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop, which then sees `stop`.
        let _ = TcpStream::connect(self.addr);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        for socket in self.shared.sockets.lock().expect("not poisoned").drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(listener: &TcpListener, server: SocketAddr, shared: &Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let Ok(client) = client else { continue };
        // A connection the server refuses is closed at once: the client sees the failure.
        let Ok(upstream) = TcpStream::connect(server) else {
            continue;
        };
        let _ = relay_connection(client, upstream, shared);
    }
}

/// Starts the four threads of one connection: a reader and a writer each way.
fn relay_connection(
    client: TcpStream,
    server: TcpStream,
    shared: &Arc<Shared>,
) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    {
        let mut sockets = shared.sockets.lock().expect("not poisoned");
        sockets.push(client.try_clone()?);
        sockets.push(server.try_clone()?);
    }
    // Whether the client was delivered server bytes since its last send (a first send counts).
    let answered = Arc::new(AtomicBool::new(true));
    let up = Direction::Up {
        answered: answered.clone(),
    };
    let down = Direction::Down { answered };
    pump(client.try_clone()?, server.try_clone()?, up, shared)?;
    pump(server, client, down, shared)
}

/// Which way bytes flow, and what each end marks for the round-trip count.
#[derive(Clone)]
enum Direction {
    /// Client to server: a send after an answer is a round trip.
    Up { answered: Arc<AtomicBool> },
    /// Server to client: a delivered chunk is an answer.
    Down { answered: Arc<AtomicBool> },
}

/// A reader thread on `from` and a writer thread on `to`, a channel of timed chunks between.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    direction: Direction,
    shared: &Arc<Shared>,
) -> std::io::Result<()> {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reader_shared = shared.clone();
    let reader_direction = direction.clone();
    std::thread::Builder::new()
        .name("bench-relay-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let read_at = Instant::now();
                if let Direction::Up { answered } = &reader_direction
                    && answered.swap(false, Ordering::AcqRel)
                {
                    reader_shared.round_trips.fetch_add(1, Ordering::Relaxed);
                }
                if tx.send((read_at, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        })?;
    let shared = shared.clone();
    std::thread::Builder::new()
        .name("bench-relay-write".into())
        .spawn(move || {
            fine_timer_slack();
            for (read_at, chunk) in rx {
                let delay = Duration::from_nanos(shared.delay_ns.load(Ordering::Relaxed));
                let due = read_at + delay;
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                // Counted before the write: once the peer holds the bytes, it may act on them
                // (send its next request, read the counts) before this thread runs again.
                let held = u64::try_from(read_at.elapsed().as_nanos()).unwrap_or(u64::MAX);
                shared.held_ns.fetch_add(held, Ordering::Relaxed);
                shared.chunks.fetch_add(1, Ordering::Relaxed);
                if let Direction::Down { answered } = &direction {
                    answered.store(true, Ordering::Release);
                }
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            // The other side closed: pass the end on, so the peer sees it too.
            let _ = to.shutdown(Shutdown::Write);
        })?;
    Ok(())
}

/// Cuts this thread's timer slack to 1 µs (Linux's default of 50 µs would be a tenth of a
/// 0.5 ms delay).
fn fine_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes one unsigned long and touches only this thread's state.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers each line it reads with the same line, one connection at a time.
    fn line_echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                std::thread::spawn(move || {
                    let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
                    let mut writer = conn;
                    let mut line = String::new();
                    while std::io::BufRead::read_line(&mut reader, &mut line).unwrap_or(0) > 0 {
                        if writer.write_all(line.as_bytes()).is_err() {
                            return;
                        }
                        line.clear();
                    }
                });
            }
        });
        addr
    }

    fn read_lines(reader: &mut impl std::io::BufRead, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                line
            })
            .collect()
    }

    #[test]
    fn requests_that_wait_count_one_round_trip_each_and_a_pipeline_counts_one() {
        let relay = Relay::start(line_echo()).unwrap();
        let conn = TcpStream::connect(relay.addr()).unwrap();
        let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
        let mut writer = conn;
        for i in 0..5 {
            writer.write_all(format!("q{i}\n").as_bytes()).unwrap();
            assert_eq!(read_lines(&mut reader, 1), [format!("q{i}\n")]);
        }
        assert_eq!(relay.counts().round_trips, 5);
        // Three statements sent before reading any answer: one wait.
        let before = relay.counts();
        writer.write_all(b"a\nb\nc\n").unwrap();
        assert_eq!(read_lines(&mut reader, 3), ["a\n", "b\n", "c\n"]);
        assert_eq!(relay.counts().since(before).round_trips, 1);
        // A second connection counts on its own.
        let other = TcpStream::connect(relay.addr()).unwrap();
        let mut other_reader = std::io::BufReader::new(other.try_clone().unwrap());
        (&other).write_all(b"x\n").unwrap();
        assert_eq!(read_lines(&mut other_reader, 1), ["x\n"]);
        assert_eq!(relay.counts().since(before).round_trips, 2);
    }

    #[test]
    fn a_delay_holds_each_way_and_the_held_time_is_counted() {
        let relay = Relay::start(line_echo()).unwrap();
        let conn = TcpStream::connect(relay.addr()).unwrap();
        let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
        let mut writer = conn;
        writer.write_all(b"warm\n").unwrap();
        read_lines(&mut reader, 1);
        let delay = Duration::from_millis(20);
        relay.set_delay(delay);
        let before = relay.counts();
        let start = Instant::now();
        for _ in 0..3 {
            writer.write_all(b"ping\n").unwrap();
            assert_eq!(read_lines(&mut reader, 1), ["ping\n"]);
        }
        let elapsed = start.elapsed();
        let counts = relay.counts().since(before);
        assert!(
            elapsed >= 6 * delay,
            "three round trips of 2 x 20 ms: {elapsed:?}"
        );
        assert_eq!((counts.round_trips, counts.chunks), (3, 6), "{counts:?}");
        assert!(counts.mean_hold() >= delay, "{counts:?}");
        relay.set_delay(Duration::ZERO);
        let start = Instant::now();
        writer.write_all(b"fast\n").unwrap();
        read_lines(&mut reader, 1);
        assert!(
            start.elapsed() < 2 * delay,
            "no delay once set back to zero"
        );
    }

    #[test]
    fn dropping_the_relay_closes_its_connections() {
        let relay = Relay::start(line_echo()).unwrap();
        let conn = TcpStream::connect(relay.addr()).unwrap();
        let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
        (&conn).write_all(b"hi\n").unwrap();
        read_lines(&mut reader, 1);
        drop(relay);
        let mut rest = String::new();
        let n = std::io::Read::read_to_string(&mut reader, &mut rest).unwrap_or(0);
        assert_eq!(n, 0, "the connection ends: {rest:?}");
    }
}
