//! Integration tests of `callid router`.
