//! The paid image provider: charges once per idempotency key, with a durable ledger.
