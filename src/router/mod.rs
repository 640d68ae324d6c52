//! The reference router: trusted identity, request hash, durable registry, private keys and
//! public handles, scrubbing and approvals, in front of the backend layers.

pub mod policy;
pub mod preallocated;
pub mod registry;
pub mod scrub;
