//! Integration tests of `callid conform`.
