//! Turns probe logs into one identity verdict per client.
