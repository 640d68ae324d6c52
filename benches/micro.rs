//! Micro-benchmarks of the rule core's per-call work, each beside the plain serde_json work it
//! adds to (divan): `cargo bench --bench micro`.
//!
//! The ratios that issue 6 targets are taken by `callid bench` (interleaved rounds in one
//! process); these give per-function times and a stable target for profilers, e.g.
//! `valgrind --tool=callgrind target/release/deps/micro-* --bench shape_vs_parse`.

use callid::testing::fixtures;
use callid::{canonical, shape};
use divan::black_box;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

fn main() {
    divan::main();
}

/// Shape extraction of a Codex-sized `_meta` against parsing the same `_meta` (target: ≤ 2x).
mod shape_vs_parse {
    use super::*;

    #[divan::bench]
    fn meta_shape(bencher: divan::Bencher) {
        let meta = fixtures::codex_meta(7);
        let digester = shape::Digester::Plain;
        bencher.bench_local(|| shape::meta_shape(black_box(&meta), &digester));
    }

    #[divan::bench]
    fn meta_shape_keyed(bencher: divan::Bencher) {
        let meta = fixtures::codex_meta(7);
        let digester = shape::Digester::new(Some("bench-salt"));
        bencher.bench_local(|| shape::meta_shape(black_box(&meta), &digester));
    }

    /// One SHA-256 over the `_meta` text: the floor of any digest of it.
    #[divan::bench]
    fn sha256_of_text(bencher: divan::Bencher) {
        let text = fixtures::codex_meta_text(7);
        bencher.bench_local(|| Sha256::digest(black_box(text.as_bytes())));
    }

    #[divan::bench]
    fn serde_json_parse(bencher: divan::Bencher) {
        let text = fixtures::codex_meta_text(7);
        bencher.bench_local(|| serde_json::from_str::<Value>(black_box(&text)).expect("parses"));
    }
}

/// The request hash against `serde_json::to_vec` + SHA-256 of the same arguments (target: ≤ 3x).
mod hash_vs_to_vec {
    use super::*;

    #[divan::bench]
    fn request_hash(bencher: divan::Bencher) {
        let arguments = fixtures::generate_image_arguments();
        bencher.bench_local(|| {
            canonical::request_hash("generate_image", black_box(&arguments)).expect("hashes")
        });
    }

    #[divan::bench]
    fn canonical_json_only(bencher: divan::Bencher) {
        let arguments = fixtures::generate_image_arguments();
        bencher
            .bench_local(|| canonical::canonical_json(black_box(&arguments)).expect("canonical"));
    }

    #[divan::bench]
    fn to_vec_sha256(bencher: divan::Bencher) {
        let arguments = fixtures::generate_image_arguments();
        bencher.bench_local(|| {
            let bytes = serde_json::to_vec(black_box(&arguments)).expect("serializes");
            Sha256::digest(&bytes)
        });
    }
}

/// Identity normalization of the same `_meta` (context for the probe's and router's per-call
/// cost; no target of its own).
mod identity {
    use super::*;

    #[divan::bench]
    fn from_meta(bencher: divan::Bencher) {
        let meta = fixtures::codex_meta(7);
        bencher.bench_local(|| callid::identity::from_meta(Some(black_box(&meta))).expect("ok"));
    }

    #[divan::bench]
    fn check_arguments(bencher: divan::Bencher) {
        let arguments = fixtures::generate_image_arguments();
        bencher
            .bench_local(|| callid::identity::check_arguments(black_box(&arguments)).expect("ok"));
    }
}
