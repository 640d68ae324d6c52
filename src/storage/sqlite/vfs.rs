//! The VFS every read-write store connection goes through ([`NAME`]): SQLite's own `unix` VFS
//! with one change. The frames a transaction appends to its `-wal` file reach the kernel in one
//! `write` at the sync that commits them, instead of two per frame (SQLite writes each frame's
//! 24-byte header, then its page, each with a system call of its own).
//!
//! A new operation's three commits write about 22 frames: 44 system calls through `unix`, 3
//! through this VFS (BENCHMARKS.md, "One write per commit", has what that saved).
//!
//! ## What it guarantees
//! - **Nothing else changes.** Main database files, their `-shm` and every other method (locks,
//!   shared memory, reads, syncs, deletes) are the `unix` VFS's own, called with its own
//!   arguments; only a `-wal` file's writes are held.
//! - **A commit is as durable as before.** Held bytes go to the kernel before the `-wal` is
//!   synced, read, sized, truncated, locked, closed or asked anything through
//!   `xFileControl`, and before a write that does not extend them. With `synchronous=FULL`
//!   (what [`super::connect`] sets, and the only setting it is used with) SQLite syncs the
//!   `-wal` before it publishes a commit's frames in the WAL index, so no other connection (of
//!   this process or another, through any VFS) can read a frame that is still held here. A
//!   process killed while frames are held loses only frames of a transaction that had not
//!   committed, as a `kill -9` between two of SQLite's own writes would.
//! - **Errors are SQLite's.** A write that fails when the held bytes are handed over answers
//!   the call that handed them over with the `unix` VFS's code (`SQLITE_FULL` for a full disk,
//!   `SQLITE_IOERR_WRITE` otherwise), so the transaction fails and rolls back as it would have.
//! - **Bounded memory.** At most [`HOLD`] bytes are held per open `-wal` file; a larger
//!   transaction is handed over in pieces of that size.

use rusqlite::ffi;
use std::ffi::{CStr, c_int, c_void};
use std::ptr;
use std::sync::OnceLock;

/// The name the VFS is registered under (never the default VFS of the process).
pub const NAME: &CStr = c"callid-unix";

/// The most bytes held for one `-wal` file before they are handed over: the most the `unix`
/// VFS writes in one call (`seekAndWriteFd` keeps the low 17 bits of a length, so a write of
/// exactly 128 KiB would write nothing and fail with `SQLITE_FULL`).
pub const HOLD: usize = 0x1_ffff;

/// Registers the VFS (once per process) and returns its name, or SQLite's error code when
/// the `unix` VFS is missing or registration fails.
pub fn name() -> Result<&'static CStr, c_int> {
    static REGISTERED: OnceLock<Result<(), c_int>> = OnceLock::new();
    (*REGISTERED.get_or_init(register)).map(|()| NAME)
}

fn register() -> Result<(), c_int> {
    // SAFETY: `sqlite3_vfs_find` and `sqlite3_vfs_register` are thread-safe; the `unix` VFS is
    // static for the life of the process, and the VFS registered here is leaked, so it is too.
    unsafe {
        let rc = ffi::sqlite3_initialize();
        if rc != ffi::SQLITE_OK {
            return Err(rc);
        }
        let real = ffi::sqlite3_vfs_find(c"unix".as_ptr());
        if real.is_null() {
            return Err(ffi::SQLITE_ERROR);
        }
        // Every method but `xOpen` is the `unix` VFS's own: they take the VFS as an argument and
        // read nothing from it but what is copied here (`mxPathname`).
        let mut vfs = ptr::read(real);
        vfs.pNext = ptr::null_mut();
        vfs.zName = NAME.as_ptr();
        vfs.pAppData = real.cast::<c_void>();
        vfs.szOsFile = c_int::try_from(REAL_AT).map_err(|_| ffi::SQLITE_ERROR)? + (*real).szOsFile;
        vfs.xOpen = Some(open);
        let rc = ffi::sqlite3_vfs_register(Box::leak(Box::new(vfs)), 0);
        if rc == ffi::SQLITE_OK {
            Ok(())
        } else {
            Err(rc)
        }
    }
}

/// A `-wal` file open through this VFS: SQLite's handle, the `unix` VFS's file (stored right
/// after it, at [`REAL_AT`] in the same allocation) and the bytes held for it.
#[repr(C)]
struct WalFile {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    held: Vec<u8>,
    /// The file offset of `held[0]`.
    at: i64,
}

/// Where the `unix` VFS's file starts in a [`WalFile`]'s allocation (aligned to 16 bytes).
const REAL_AT: usize = std::mem::size_of::<WalFile>().next_multiple_of(16);

unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite gives `file` `szOsFile` bytes (REAL_AT + the unix file's size) and `vfs` is
    // the VFS registered above, whose `pAppData` is the `unix` VFS.
    unsafe {
        let real_vfs = (*vfs).pAppData.cast::<ffi::sqlite3_vfs>();
        let real_open = (*real_vfs).xOpen.expect("the unix VFS opens files");
        if flags & ffi::SQLITE_OPEN_WAL == 0 {
            // Not a `-wal`: the unix file lives at the start of the allocation, as it would
            // through the unix VFS itself, with its own methods.
            return real_open(real_vfs, name, file, flags, out_flags);
        }
        let real = file.cast::<u8>().add(REAL_AT).cast::<ffi::sqlite3_file>();
        let rc = real_open(real_vfs, name, real, flags, out_flags);
        if rc != ffi::SQLITE_OK {
            (*file).pMethods = ptr::null();
            return rc;
        }
        ptr::write(
            file.cast::<WalFile>(),
            WalFile {
                base: ffi::sqlite3_file {
                    pMethods: &WAL_METHODS,
                },
                real,
                held: Vec::new(),
                at: 0,
            },
        );
        ffi::SQLITE_OK
    }
}

static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 1,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

/// The `WalFile` behind SQLite's handle, and the unix file's methods.
///
/// SAFETY (for every caller): `file` was opened by [`open`] with [`WAL_METHODS`], so it is a
/// `WalFile` whose `real` is an open unix file; SQLite calls one method of a file at a time.
unsafe fn parts<'a>(
    file: *mut ffi::sqlite3_file,
) -> (&'a mut WalFile, &'a ffi::sqlite3_io_methods) {
    unsafe {
        let wal = &mut *file.cast::<WalFile>();
        let methods = &*(*wal.real).pMethods;
        (wal, methods)
    }
}

/// Hands the held bytes to the unix file (one write); they are dropped either way, as a failed
/// write of SQLite's own would leave them unwritten.
fn hand_over(wal: &mut WalFile, methods: &ffi::sqlite3_io_methods) -> c_int {
    if wal.held.is_empty() {
        return ffi::SQLITE_OK;
    }
    let len = c_int::try_from(wal.held.len()).expect("at most HOLD + one write is held");
    let write = methods.xWrite.expect("the unix VFS writes");
    // SAFETY: `wal.real` is an open unix file; the buffer is `len` bytes.
    let rc = unsafe { write(wal.real, wal.held.as_ptr().cast::<c_void>(), len, wal.at) };
    wal.held.clear();
    rc
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    // SAFETY: see `parts`; SQLite's buffer holds `amount` bytes.
    unsafe {
        let (wal, methods) = parts(file);
        let len = usize::try_from(amount).unwrap_or(0);
        let extends = !wal.held.is_empty()
            && i64::try_from(wal.held.len()).is_ok_and(|held| wal.at + held == offset);
        if !extends || wal.held.len() + len > HOLD {
            let rc = hand_over(wal, methods);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        if len > HOLD {
            let write = methods.xWrite.expect("the unix VFS writes");
            return write(wal.real, buf, amount, offset);
        }
        if wal.held.is_empty() {
            wal.at = offset;
        }
        wal.held
            .extend_from_slice(std::slice::from_raw_parts(buf.cast::<u8>(), len));
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: see `parts`; the `WalFile` is dropped in place once, here, after its last use.
    unsafe {
        let (wal, methods) = parts(file);
        let handed = hand_over(wal, methods);
        let closed = methods
            .xClose
            .map_or(ffi::SQLITE_OK, |close| close(wal.real));
        ptr::drop_in_place(file.cast::<WalFile>());
        if handed != ffi::SQLITE_OK {
            handed
        } else {
            closed
        }
    }
}

/// A method that reads or changes the file: the held bytes go first, then the unix file's own.
macro_rules! after_hand_over {
    ($name:ident, $method:ident, ($($arg:ident: $ty:ty),*)) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file, $($arg: $ty),*) -> c_int {
            // SAFETY: see `parts`.
            unsafe {
                let (wal, methods) = parts(file);
                let rc = hand_over(wal, methods);
                if rc != ffi::SQLITE_OK {
                    return rc;
                }
                match methods.$method {
                    Some(method) => method(wal.real, $($arg),*),
                    None => ffi::SQLITE_NOTFOUND,
                }
            }
        }
    };
}

after_hand_over!(read, xRead, (buf: *mut c_void, amount: c_int, offset: i64));
after_hand_over!(truncate, xTruncate, (size: i64));
after_hand_over!(sync, xSync, (flags: c_int));
after_hand_over!(file_size, xFileSize, (size: *mut i64));
after_hand_over!(lock, xLock, (level: c_int));
after_hand_over!(unlock, xUnlock, (level: c_int));
after_hand_over!(check_reserved_lock, xCheckReservedLock, (out: *mut c_int));
after_hand_over!(file_control, xFileControl, (op: c_int, arg: *mut c_void));

unsafe extern "C" fn sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: see `parts`.
    unsafe {
        let (wal, methods) = parts(file);
        methods.xSectorSize.map_or(4096, |f| f(wal.real))
    }
}

unsafe extern "C" fn device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: see `parts`.
    unsafe {
        let (wal, methods) = parts(file);
        methods.xDeviceCharacteristics.map_or(0, |f| f(wal.real))
    }
}
