//! The `callid` binary: parse the command line, run it, print any error once, exit with its code.

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = callid::cli::parse();
    match callid::app::run(cli) {
        Ok(code) => code,
        Err(err) => callid::app::report_error(&err),
    }
}
