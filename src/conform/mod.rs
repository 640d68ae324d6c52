//! The conformance runner: replays `scenarios/*.yaml` against any router.
