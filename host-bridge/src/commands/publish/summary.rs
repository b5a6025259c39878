//! What `publish` did ([`PublishSummary`]) and the command that continues it.

use spillway_core::wire::AckLevel;

use super::PublishArgs;

/// What `publish` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishSummary {
    /// Records read from the input.
    pub read: u64,
    /// Records sent at least once.
    pub sent: u64,
    /// Records acknowledged (with `--ack none`: sent).
    pub acknowledged: u64,
    /// Acknowledged as duplicates of earlier sends.
    pub duplicates: u64,
    /// Records the gateway refused for good (too large, bad request) or that do not fit
    /// a frame: logged with their input line number, not resent.
    pub rejected: u64,
    /// Lowest acknowledged offset.
    pub first_offset: Option<u64>,
    /// Highest acknowledged offset.
    pub last_offset: Option<u64>,
    /// No acknowledgements were asked for (`--ack none`).
    pub unacknowledged_mode: bool,
    /// The producer id used (`None`: records carried no producer).
    pub producer_id: Option<u64>,
    /// The producer session's epoch (`None`: no session, a gateway before protocol
    /// version 3 or `--ack none` without `--producer-id`).
    pub session: Option<u32>,
    /// Input lines skipped because a resumed session had stored them already.
    pub skipped: u64,
    /// Set when publishing stopped before the end of the input (interrupted, input error,
    /// gateway unreachable, session fenced): the command that continues it.
    pub resume_command: Option<String>,
    /// Set with [`PublishSummary::resume_command`]: the first input line (from 1) not
    /// acknowledged; it and every line after it are what the resume command publishes.
    pub first_unacknowledged_line: Option<u64>,
    /// With several input files: the file and its line number of
    /// [`PublishSummary::first_unacknowledged_line`].
    pub first_unacknowledged_at: Option<(String, u64)>,
    /// Records whose `--timestamp-field` was missing or unusable (the gateway stamped
    /// them).
    pub unstamped: u64,
    /// Set when publishing stopped before a session was opened or anything acknowledged:
    /// running the same command again is the way on (there is no session to resume).
    pub stopped_before_storing: bool,
}

impl std::fmt::Display for PublishSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let o = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        if self.unacknowledged_mode {
            write!(
                f,
                "records read {}, sent {}, rejected {} (--ack none: the gateway acknowledges nothing)",
                self.read, self.sent, self.rejected
            )?;
        } else {
            write!(
                f,
                "records read {}, sent {}, acknowledged {} ({} duplicates), rejected {}, first offset {}, last offset {}",
                self.read,
                self.sent,
                self.acknowledged,
                self.duplicates,
                self.rejected,
                o(self.first_offset),
                o(self.last_offset)
            )?;
        }
        match (self.producer_id, self.session) {
            (Some(id), Some(epoch)) => write!(f, "; producer {id} session {epoch}")?,
            (Some(id), None) => write!(f, "; producer {id} (no session)")?,
            _ => {}
        }
        if self.skipped > 0 {
            write!(f, "; {} input lines skipped (already stored)", self.skipped)?;
        }
        if self.unstamped > 0 {
            write!(
                f,
                "; {} records without a usable timestamp field (stamped by the gateway)",
                self.unstamped
            )?;
        }
        if self.stopped_before_storing {
            write!(
                f,
                "\nstopped before anything was stored: run the same command again"
            )?;
        }
        if let Some(cmd) = &self.resume_command {
            write!(f, "\nstopped before the end of the input")?;
            if let Some(line) = self.first_unacknowledged_line {
                write!(f, "; first input line not acknowledged: {line}")?;
                if let Some((file, n)) = &self.first_unacknowledged_at {
                    write!(f, " ({file} line {n})")?;
                }
            }
            write!(
                f,
                " (the command below skips the lines the gateway stored: no duplicates)\nto continue: {cmd}"
            )?;
        }
        Ok(())
    }
}

/// Quotes `s` for a POSIX shell when it holds anything but plain word characters.
pub(super) fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@%+=,".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The `publish` command line that continues `args` with producer `id`'s session.
pub(super) fn resume_command(args: &PublishArgs, id: u64) -> String {
    let mut cmd = format!(
        "spillway-bridge publish --gateway {} --topic {} --producer-id {id} --resume",
        shell_quote(&args.gateway.to_string()),
        shell_quote(&args.topic)
    );
    match args.ack {
        AckLevel::Buffered => cmd.push_str(" --ack buffered"),
        AckLevel::None => cmd.push_str(" --ack none"),
        _ => {}
    }
    if !args.messages.is_empty() {
        for m in &args.messages {
            cmd.push_str(" -m ");
            cmd.push_str(&shell_quote(&String::from_utf8_lossy(m)));
        }
        return cmd;
    }
    if let Some(field) = &args.timestamp_field {
        cmd.push_str(" --timestamp-field ");
        cmd.push_str(&shell_quote(field));
    }
    if args.inputs.is_empty() {
        cmd.push_str(" (the same input on stdin)");
    }
    for p in &args.inputs {
        cmd.push(' ');
        if p.as_os_str() == "-" {
            cmd.push_str("- (the same input on stdin)");
        } else {
            cmd.push_str(&shell_quote(&p.to_string_lossy()));
        }
    }
    cmd
}
