//! Clap's "did you mean" tips, made to suit callid. Guarantees:
//! - a hidden subcommand or flag (internal plumbing such as `conform-upstream-relay`) is never
//!   offered, at any level of the command tree;
//! - a long flag one edit from a visible flag of the command it was given to (two for names of
//!   eight characters or more: `probe --lgo`) is offered that flag (clap's similarity score
//!   misses transpositions in short names), and a flag offered replaces clap's "use `-- --lgo`"
//!   tip of a command with a trailing `-- CMD`.
//!
//! Everything else of clap's error (kind, usage, exit code) is kept as clap made it.

use super::Cli;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Command, CommandFactory as _, FromArgMatches as _};
use std::collections::BTreeSet;
use std::ffi::OsString;

/// Parses `args` (program name first) into a [`Cli`]; an error carries only tips for visible
/// subcommands and flags.
pub fn try_parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let mut cmd = Cli::command();
    let parsed = cmd
        .try_get_matches_from_mut(args.iter().cloned())
        .and_then(|matches| Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd)));
    parsed.map_err(|err| {
        cmd.build();
        retip(err, &cmd, &args)
    })
}

/// The edited error: hidden names dropped from its tips, a near-miss flag offered.
fn retip(mut err: clap::Error, root: &Command, args: &[OsString]) -> clap::Error {
    let hidden = Hidden::of(root);
    if let Some(ContextValue::Strings(names)) = err.get(ContextKind::SuggestedSubcommand) {
        let visible: Vec<String> = names
            .iter()
            .filter(|name| !hidden.subcommands.contains(*name))
            .cloned()
            .collect();
        if visible.is_empty() {
            err.remove(ContextKind::SuggestedSubcommand);
        } else {
            err.insert(
                ContextKind::SuggestedSubcommand,
                ContextValue::Strings(visible),
            );
        }
    }
    if let Some(ContextValue::String(flag)) = err.get(ContextKind::SuggestedArg)
        && hidden.flags.contains(flag)
    {
        err.remove(ContextKind::SuggestedArg);
    }
    if let Some(ContextValue::StyledStrs(tips)) = err.get(ContextKind::Suggested) {
        let kept: Vec<_> = tips
            .iter()
            .filter(|tip| {
                let text = tip.to_string();
                !hidden
                    .flags
                    .iter()
                    .any(|f| text.contains(&format!(" {f}'")))
            })
            .cloned()
            .collect();
        err.insert(ContextKind::Suggested, ContextValue::StyledStrs(kept));
    }
    if err.kind() == ErrorKind::UnknownArgument
        && err.get(ContextKind::SuggestedArg).is_none()
        && let Some(ContextValue::String(given)) = err.get(ContextKind::InvalidArg)
        && let Some(near) = near_flag(given, subcommand_at(root, args))
    {
        err.insert(ContextKind::SuggestedArg, ContextValue::String(near));
    }
    // A mistyped flag is not meant for the `-- CMD` of `probe --wrap` or `gateway`.
    if err.kind() == ErrorKind::UnknownArgument && err.get(ContextKind::SuggestedArg).is_some() {
        err.remove(ContextKind::Suggested);
    }
    err
}

/// Every hidden subcommand name and hidden long flag (`--name`) of the tree.
#[derive(Default)]
struct Hidden {
    subcommands: BTreeSet<String>,
    flags: BTreeSet<String>,
}

impl Hidden {
    fn of(cmd: &Command) -> Hidden {
        let mut hidden = Hidden::default();
        hidden.add(cmd);
        hidden
    }

    fn add(&mut self, cmd: &Command) {
        for arg in cmd.get_arguments().filter(|a| a.is_hide_set()) {
            if let Some(long) = arg.get_long() {
                self.flags.insert(format!("--{long}"));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.is_hide_set() {
                self.subcommands.insert(sub.get_name().to_owned());
            }
            self.add(sub);
        }
    }
}

/// The deepest subcommand named on the command line (before any `--`).
fn subcommand_at<'a>(root: &'a Command, args: &[OsString]) -> &'a Command {
    let mut at = root;
    for arg in args.iter().skip(1) {
        let Some(arg) = arg.to_str() else { continue };
        if arg == "--" {
            break;
        }
        if let Some(sub) = at.find_subcommand(arg) {
            at = sub;
        }
    }
    at
}

/// The visible long flag of `cmd` nearest to `given` (`--lgo`, `--lgo=FILE`), if it is at most
/// one edit away (two for names of eight characters or more).
fn near_flag(given: &str, cmd: &Command) -> Option<String> {
    let name = given.strip_prefix("--")?.split('=').next()?;
    let limit = if name.chars().count() >= 8 { 2 } else { 1 };
    cmd.get_arguments()
        .filter(|arg| !arg.is_hide_set())
        .filter_map(|arg| arg.get_long())
        .map(|long| (crate::text::edits(name, long), long))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, long)| format!("--{long}"))
}

#[cfg(test)]
mod tests {
    use super::near_flag;
    use clap::{Arg, Command};

    #[test]
    fn a_near_miss_gets_the_nearest_visible_flag_only() {
        let cmd = Command::new("t")
            .arg(Arg::new("log").long("log"))
            .arg(Arg::new("logs").long("logs"))
            .arg(Arg::new("serve-baseline").long("serve-baseline").hide(true))
            .arg(Arg::new("registry").long("registry"));
        for (given, near) in [
            ("--lgo", Some("--log")),
            ("--lgo=FILE", Some("--log")),
            ("--loog", Some("--log")),
            ("--registyr", Some("--registry")),
            ("--regsitry", Some("--registry")),
            // Two edits from a name of fewer than eight characters: too far.
            ("--regstyr", None),
            // Two edits from a name of eight characters or more: near.
            ("--regstiry", Some("--registry")),
            ("--serve-baselin", None),
            ("--xyz", None),
            ("-l", None),
        ] {
            assert_eq!(near_flag(given, &cmd).as_deref(), near, "{given}");
        }
    }
}
