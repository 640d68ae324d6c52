//! Integration tests of `callid probe`.
