//! End-to-end benchmarks, each figure run beside its baseline.
