//! Measures real agent clients offline against the probe.
