//! Integration tests of `callid provider` and the backend layers.
