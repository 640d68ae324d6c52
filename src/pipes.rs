//! Standard input and output of callid's stdio servers (the probe, the router, the gateway and
//! the paid provider), read and written by the reactor when they are pipes.
//!
//! tokio's `stdin()` and `stdout()` (and rmcp's `transport::stdio()`, which is them) hand every
//! read and every write to its blocking thread pool and back: two thread hand-offs (and their
//! futex wake-ups) per message in each direction, on every tool call. MCP clients connect a
//! stdio server through pipes (or, as Node does, UNIX socket pairs), which epoll can watch;
//! [`open`] then registers duplicates of descriptors 0 and 1 with tokio's reactor, so a message
//! is read and its reply written by the worker thread that handles it, woken by epoll. A
//! terminal or a file keeps tokio's own streams.
//!
//! # Guarantees
//! - Descriptors 0 and 1 themselves stay open; the reactor owns duplicates.
//! - A duplicate shares its open file description, so the non-blocking mode the reactor needs
//!   applies to the description the server inherited. [`Restore::restore`] puts it back in
//!   blocking mode when the server is done with it, so a process that shares the pipe after the
//!   server (a shell pipeline) does not inherit the mode. Nothing else of callid writes to
//!   standard output while a stdio server runs (logs go to standard error), and no child it
//!   starts inherits descriptors 0 and 1.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileTypeExt as _;
use tokio::io::{AsyncRead, AsyncWrite};

/// The input stream, whichever kind it is.
pub type Reader = Box<dyn AsyncRead + Unpin + Send>;
/// The output stream, whichever kind it is.
pub type Writer = Box<dyn AsyncWrite + Unpin + Send>;

/// What a descriptor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Fifo,
    Socket,
    Other,
}

/// A duplicate of `fd` and what it is.
fn duplicate(fd: impl AsFd) -> io::Result<(OwnedFd, Kind)> {
    let file = std::fs::File::from(fd.as_fd().try_clone_to_owned()?);
    let file_type = file.metadata()?.file_type();
    let kind = if file_type.is_fifo() {
        Kind::Fifo
    } else if file_type.is_socket() {
        Kind::Socket
    } else {
        Kind::Other
    };
    Ok((OwnedFd::from(file), kind))
}

/// Sets or clears `O_NONBLOCK` on the description `fd` refers to. `FIONBIO`, which std's
/// `UnixStream::set_nonblocking` issues, works on any descriptor, pipes included; the stream is
/// only the handle that owns (and then closes) this duplicate.
fn set_nonblocking(fd: OwnedFd, nonblocking: bool) -> io::Result<OwnedFd> {
    let handle = std::os::unix::net::UnixStream::from(fd);
    handle.set_nonblocking(nonblocking)?;
    Ok(OwnedFd::from(handle))
}

/// How to put descriptors 0 and 1 back as they were.
#[derive(Debug, Default)]
pub struct Restore {
    fds: Vec<OwnedFd>,
}

impl Restore {
    /// Puts the inherited descriptions back in blocking mode (call after the streams are
    /// dropped; errors are ignored: the server is exiting).
    pub fn restore(self) {
        for fd in self.fds {
            let _ = set_nonblocking(fd, false);
        }
    }
}

/// `fd` as a stream of the reactor when it is a pipe (made by `fifo`) or a socket (by
/// `socket`), from a non-blocking duplicate whose description goes into `restore`; `None` when
/// it is neither. A stream that could not be made leaves the description blocking again.
fn on_reactor<T>(
    fd: impl AsFd,
    restore: &mut Restore,
    fifo: impl FnOnce(OwnedFd) -> io::Result<T>,
    socket: impl FnOnce(tokio::net::UnixStream) -> T,
) -> io::Result<Option<T>> {
    let (fd, kind) = duplicate(fd)?;
    if kind == Kind::Other {
        return Ok(None);
    }
    let kept = fd.try_clone()?;
    // The `_unchecked` constructors take the descriptor as it is: non-blocking it must be.
    let fd = set_nonblocking(fd, true)?;
    let made = match kind {
        Kind::Fifo => fifo(fd),
        _ => {
            let std = std::os::unix::net::UnixStream::from(fd);
            tokio::net::UnixStream::from_std(std).map(socket)
        }
    };
    match made {
        Ok(stream) => {
            restore.fds.push(kept);
            Ok(Some(stream))
        }
        Err(e) => {
            let _ = set_nonblocking(kept, false);
            Err(e)
        }
    }
}

/// The reactor's stream, or tokio's own (`fallback`) when the descriptor is neither a pipe nor
/// a socket, or could not be registered (`what` names it in the debug log).
fn or_tokio<T>(stream: io::Result<Option<T>>, what: &str, fallback: impl FnOnce() -> T) -> T {
    match stream {
        Ok(Some(stream)) => stream,
        Ok(None) => fallback(),
        Err(e) => {
            tracing::debug!("standard {what} stays on tokio's thread pool: {e}");
            fallback()
        }
    }
}

/// Standard input as the reactor's stream when it is a pipe or a socket, else tokio's.
fn input(restore: &mut Restore) -> Reader {
    let stream = on_reactor(
        io::stdin(),
        restore,
        |fd| {
            Ok(
                Box::new(tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(
                    fd,
                )?) as Reader,
            )
        },
        |socket| Box::new(socket) as Reader,
    );
    or_tokio(stream, "input", || Box::new(tokio::io::stdin()))
}

/// Standard output as the reactor's stream when it is a pipe or a socket, else tokio's.
fn output(restore: &mut Restore) -> Writer {
    let stream = on_reactor(
        io::stdout(),
        restore,
        |fd| Ok(Box::new(tokio::net::unix::pipe::Sender::from_owned_fd_unchecked(fd)?) as Writer),
        |socket| Box::new(socket) as Writer,
    );
    or_tokio(stream, "output", || Box::new(tokio::io::stdout()))
}

/// Standard input and output for a stdio server, and how to restore them. Must run inside the
/// tokio runtime (the reactor registers the descriptors).
pub fn open() -> (Reader, Writer, Restore) {
    let mut restore = Restore::default();
    let reader = input(&mut restore);
    let writer = output(&mut restore);
    (reader, writer, restore)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_told_apart() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(duplicate(&a).unwrap().1, Kind::Socket);
        let file = tempfile::tempfile().unwrap();
        assert_eq!(duplicate(&file).unwrap().1, Kind::Other);
    }

    #[test]
    fn blocking_mode_is_set_and_cleared_on_the_shared_description() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let dup = a.as_fd().try_clone_to_owned().unwrap();
        let dup = set_nonblocking(dup, true).unwrap();
        let mut buf = [0u8; 1];
        // The original descriptor shares the description: a read now fails instead of waiting.
        let err = std::io::Read::read(&mut &a, &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        Restore { fds: vec![dup] }.restore();
        b.set_nonblocking(false).unwrap();
        std::io::Write::write_all(&mut &b, b"x").unwrap();
        assert_eq!(std::io::Read::read(&mut &a, &mut buf).unwrap(), 1);
    }
}
