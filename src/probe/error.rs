//! Errors of the probe's transports, each with a stable code.

/// Why the probe could not start or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The shape log could not be opened or written.
    #[error(transparent)]
    Log(#[from] super::record::LogError),
    /// The HTTP address was refused or could not be bound.
    #[error(transparent)]
    Bind(#[from] crate::http_guard::BindError),
    /// The wrapped server could not be started.
    #[error("failed to start the wrapped server `{program}`; check the command after `--`")]
    Spawn {
        /// The program.
        program: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `--wrap` was given no command.
    #[error(
        "`--wrap` needs a server command after `--`, e.g. `callid probe --wrap -- npx my-server`"
    )]
    NoCommand,
    /// Reading from or writing to a stream failed.
    #[error("i/o failed while {doing}")]
    Io {
        /// What the probe was doing.
        doing: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl ProbeError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            ProbeError::Log(_) => "probe_log",
            ProbeError::Bind(_) => "probe_bind",
            ProbeError::Spawn { .. } => "probe_spawn",
            ProbeError::NoCommand => "probe_no_command",
            ProbeError::Io { .. } => "probe_io",
        }
    }
}
