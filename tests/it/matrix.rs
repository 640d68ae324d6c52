//! Integration tests of `callid matrix`.
