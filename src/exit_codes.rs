//! Exit codes of every `callid` command, in one place so CI can rely on them.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success: every check passed, every verdict as expected |
//! | 1 | a check failed: a conformance failure, a stale expected failure, a matrix that differs from its data, a rejected verdict where acceptance was required |
//! | 2 | usage or setup error: bad flags, unreadable input, a router that could not be started |

/// Everything asked for was done and every check passed.
pub const SUCCESS: u8 = 0;
/// The command ran and found a failing check.
pub const CHECK_FAILED: u8 = 1;
/// The command could not run as asked: usage, input or setup error.
pub const SETUP_ERROR: u8 = 2;
