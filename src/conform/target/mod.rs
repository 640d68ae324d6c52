//! Target profiles: how the runner starts, reaches and operates one router.
//!
//! A [`Profile`] (YAML, strict) says how to start the router (a command over stdio, or a URL with
//! an optional start command), the spend, status and resume tools, three argument sets, the JSON
//! pointers of the handle, error code, status, result and charge id in a tool result, the private
//! key pattern to scan for, the operator commands, and the capabilities the runner may use. What a
//! target cannot do makes the scenarios that need it not applicable, never passed; a pointer set to
//! `null` (`handle`, `status`, `replayed`: a transparent proxy's results carry none) makes the
//! expectations that read it not checked, and each check is judged on the rest.
//!
//! # Strictness
//! Every key of a profile is checked: a key of a fixed mapping (`tools`, `pointers`,
//! `capabilities`, ...) or a word of a closed set (`transport`, `backend`) that is not known, and
//! a key of `statuses` or `error_codes` that is not one of the names a profile may map
//! ([`mappable_statuses`](profile::mappable_statuses),
//! [`mappable_error_codes`](profile::mappable_error_codes): the router's own catalogues), is
//! refused with every valid name and the nearest one ([`TargetError::UnknownName`]). Only `env`
//! maps and the argument sets take any key.
//!
//! # Placeholders (in command, args, env, url, registry, setup, operator commands, signed_envelopes)
//! `{callid}` this binary, `{state_dir}` a fresh directory per scenario, `{registry}`
//! (`{state_dir}/registry.sqlite3`, or the profile's `registry`), `{provider_url}` the runner's
//! provider, `{port}` a free loopback port picked per scenario (and router process), `{handle}`
//! (the operator commands only, [`OPERATOR_COMMANDS`](profile::OPERATOR_COMMANDS); anywhere
//! else an error saying so),
//! `{outcome}` (the `resolve` command only: `charged` or `not-charged`), `{profile_dir}` the
//! profile's directory, `{check_slug}` a unique SQL-identifier-safe name per
//! check run, `{env:NAME}` the environment variable `NAME` (a profile file naming an unset one is
//! refused on load).
//!
//! # Per-check state beyond a directory
//! `setup` commands run before each check's router starts (e.g. `createdb {check_slug}`), and
//! `registry` says what `{registry}` is (e.g. `{env:CALLID_CONFORM_POSTGRES}/{check_slug}`), so a
//! router on a database server gets a fresh database per check. `capabilities.shared_registry`
//! declares that two processes of the router may share one state (the scenarios' second router
//! process), and `redeliver_on_second` sends every redelivery to the second process (replicas).
//!
//! # Signed envelopes
//! `signed_envelopes` ([`SignedEnvelopes`](profile::SignedEnvelopes)) says how the router is started in the checks that
//! sign envelopes (`signature.*`): its `args` (instead of `args`) and `env` may use
//! [`SIGNING_PLACEHOLDERS`](profile::SIGNING_PLACEHOLDERS), `{trust_keys}` and `{signing_public_key}`, which hand it the public
//! half of the key the runner makes for each such check ([`super::signer`]), and must use one of
//! them. They are an error anywhere else. Left out, those checks are skipped.
//!
//! With `backend: upstream` ([`Backend`]): `{upstream_url}` the runner's upstream MCP endpoint,
//! `{upstream_command}` one shell-quoted command line of a stdio upstream that reaches it, and an
//! `args` element exactly `{upstream_argv}`, which becomes that command's words (program and
//! arguments) as several elements. A placeholder of the other backend is an error, as is
//! `{upstream_argv}` anywhere but as a whole `args` element.
//!
//! # Files
//! - `profile`: the [`Profile`] types, loading and validation, capabilities, the template.
//! - `placeholders`: the placeholder names and their expansion ([`Vars`]).
//! - `shell`: POSIX shell quoting and word splitting.

mod placeholders;
mod profile;
mod shell;

pub use placeholders::Vars;
pub use profile::{
    Backend, Can, OperatorCommand, Pointers, Profile, Shipped, TargetError, Transport,
    shipped_profile,
};
