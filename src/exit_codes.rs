//! Exit codes of every `callid` command, in one place so CI can rely on them.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success: every check passed, every verdict as expected |
//! | 1 | a check failed: a conformance failure, a stale expected failure, a matrix that differs from its data, a rejected verdict where acceptance was required |
//! | 2 | usage or setup error: bad flags, unreadable input, a router that could not be started |
//! | 129, 130, 143 | `callid conform` interrupted by SIGHUP, SIGINT or SIGTERM (128 + the signal's number), after ending what it started |

/// Everything asked for was done and every check passed.
pub const SUCCESS: u8 = 0;
/// The command ran and found a failing check.
pub const CHECK_FAILED: u8 = 1;
/// The command could not run as asked: usage, input or setup error.
pub const SETUP_ERROR: u8 = 2;
/// `callid conform` ended by SIGHUP (128 + 1).
pub const INTERRUPTED_SIGHUP: u8 = 129;
/// `callid conform` ended by SIGINT (128 + 2).
pub const INTERRUPTED_SIGINT: u8 = 130;
/// `callid conform` ended by SIGTERM (128 + 15).
pub const INTERRUPTED_SIGTERM: u8 = 143;
