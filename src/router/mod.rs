//! The reference router: trusted identity, request hash, durable registry, private keys and
//! public handles, scrubbing and approvals, in front of the backend layers.
