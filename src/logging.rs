//! Best-effort standard error: the one writer every log line and status line of callid goes
//! through, and the logging set-up ([`init`]).
//!
//! # Guarantees
//! - Writing to standard error never fails and never panics. A write that fails (a closed pipe:
//!   Rust ignores `SIGPIPE`, so the write returns `EPIPE`; a full disk: `ENOSPC`) is dropped and
//!   counted; the next line that does get through is preceded by a note saying
//!   how many were lost. A router that has just been charged must answer the call whatever
//!   happens to its log, so nothing on a reply path uses `eprintln!` (which panics on failure)
//!   or a writer whose errors `tracing` would report with `eprintln!`.
//! - ANSI colour only when standard error is a terminal. `NO_COLOR` (set and not empty) turns it
//!   off, `CLICOLOR_FORCE` (set, not empty and not `0`) turns it on for any stream; `NO_COLOR`
//!   wins when both are set ([`color`]).
//! - `CALLID_LOG` filters the log with `tracing`'s env-filter syntax (default [`DEFAULT_FILTER`];
//!   e.g. `info`, `debug`, `callid=debug,rmcp=warn`).
//! - No URL's user info, query values or fragment reach standard error: every line, callid's
//!   own and the libraries' (rmcp and reqwest quote the URL they failed to reach), passes
//!   through [`crate::secret::redact_urls`].

use std::io::{IsTerminal as _, Write};
use std::sync::atomic::{AtomicU64, Ordering};

/// Environment variable that sets the log filter.
pub const LOG_ENV: &str = "CALLID_LOG";

/// The log filter when [`LOG_ENV`] is unset: warnings, except rmcp's transport worker, whose
/// fatal error (a `Debug` dump of the HTTP client's error, with its Rust types and the URL
/// unredacted) is also the error of the request that met it, which callid reports in words.
pub const DEFAULT_FILTER: &str = "warn,rmcp::transport::worker=off";

/// Lines dropped because standard error could not be written, since the process started.
static STDERR_DROPS: Drops = Drops::new();

/// Sets up `tracing` for the whole process: best-effort standard error, filtered by
/// [`LOG_ENV`], coloured only as [`color`] decides. Calling it again does nothing.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_env(LOG_ENV)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_FILTER));
    let ansi = color(
        std::env::var_os("NO_COLOR").as_deref(),
        std::env::var_os("CLICOLOR_FORCE").as_deref(),
        std::io::stderr().is_terminal(),
    );
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| Stderr)
        .with_ansi(ansi)
        // Its own report of a failed write is an `eprintln!`, which panics on a broken stderr.
        .log_internal_errors(false)
        .with_target(false)
        .try_init();
}

/// Whether to colour a stream: `NO_COLOR` off, else `CLICOLOR_FORCE` on, else only a terminal.
pub fn color(
    no_color: Option<&std::ffi::OsStr>,
    clicolor_force: Option<&std::ffi::OsStr>,
    is_terminal: bool,
) -> bool {
    if no_color.is_some_and(|v| !v.is_empty()) {
        return false;
    }
    if clicolor_force.is_some_and(|v| !v.is_empty() && v != "0") {
        return true;
    }
    is_terminal
}

/// Writes one line (a newline is added) to standard error, best effort: the `eprintln!` of
/// callid's servers.
pub fn line(args: std::fmt::Arguments<'_>) {
    let mut text = args.to_string();
    text.push('\n');
    let _ = Stderr.write_all(text.as_bytes());
}

/// Standard error that never fails: see the module's guarantees. `write` always reports the
/// whole buffer written.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let text = String::from_utf8_lossy(buf);
        let shown = crate::secret::redact_urls(&text);
        STDERR_DROPS.write(&mut std::io::stderr().lock(), shown.as_bytes());
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A count of lines lost, and how many of them a note has already reported.
struct Drops {
    dropped: AtomicU64,
    noted: AtomicU64,
}

impl Drops {
    const fn new() -> Drops {
        Drops {
            dropped: AtomicU64::new(0),
            noted: AtomicU64::new(0),
        }
    }

    /// Writes `buf` to `sink`; on failure counts one dropped line instead. After a failure, the
    /// next write that gets through is preceded by a note with the count of lines lost since the
    /// last note.
    fn write(&self, sink: &mut dyn Write, buf: &[u8]) {
        let lost = self.dropped.load(Ordering::Relaxed);
        let noted = self.noted.load(Ordering::Relaxed);
        if lost > noted {
            let note = format!(
                "callid: {} log line(s) were lost: standard error could not be written\n",
                lost - noted
            );
            if sink.write_all(note.as_bytes()).is_ok() {
                self.noted.store(lost, Ordering::Relaxed);
            }
        }
        if sink.write_all(buf).and_then(|()| sink.flush()).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    /// Fails while `fail` is set, records what gets through.
    struct Flaky {
        fail: Option<std::io::ErrorKind>,
        got: Vec<u8>,
    }

    impl Write for Flaky {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            match self.fail {
                Some(kind) => Err(kind.into()),
                None => {
                    self.got.extend_from_slice(buf);
                    Ok(buf.len())
                }
            }
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn failed_writes_are_counted_and_noted_once_the_stream_works_again() {
        let drops = Drops::new();
        let mut sink = Flaky {
            fail: None,
            got: vec![],
        };
        drops.write(&mut sink, b"one\n");
        sink.fail = Some(std::io::ErrorKind::BrokenPipe);
        drops.write(&mut sink, b"two\n");
        sink.fail = Some(std::io::ErrorKind::StorageFull);
        drops.write(&mut sink, b"three\n");
        assert_eq!(drops.dropped.load(Ordering::Relaxed), 2);
        sink.fail = None;
        drops.write(&mut sink, b"four\n");
        drops.write(&mut sink, b"five\n");
        assert_eq!(
            String::from_utf8(sink.got).unwrap(),
            "one\ncallid: 2 log line(s) were lost: standard error could not be written\n\
             four\nfive\n"
        );
    }

    #[test]
    fn the_stderr_writer_reports_success_whatever_happens() {
        let mut w = Stderr;
        assert_eq!(w.write(b"").unwrap(), 0);
        w.flush().unwrap();
    }

    #[test]
    fn colour_only_on_a_terminal_unless_the_environment_says_otherwise() {
        let on = Some(OsStr::new("1"));
        let empty = Some(OsStr::new(""));
        let zero = Some(OsStr::new("0"));
        // (NO_COLOR, CLICOLOR_FORCE, is a terminal) => colour
        let table = [
            ((None, None, true), true),
            ((None, None, false), false),
            ((on, None, true), false),
            ((empty, None, true), true),
            ((None, on, false), true),
            ((None, zero, false), false),
            ((None, empty, false), false),
            ((on, on, true), false),
        ];
        for ((no_color, force, tty), want) in table {
            assert_eq!(
                color(no_color, force, tty),
                want,
                "NO_COLOR={no_color:?} CLICOLOR_FORCE={force:?} terminal={tty}"
            );
        }
    }
}
