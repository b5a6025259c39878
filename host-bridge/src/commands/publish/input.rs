//! `publish`'s input: files or stdin read line by line on a blocking thread, bounded, or
//! the `-m` messages; and a record's timestamp from a JSON field.

use std::io::BufRead;

/// What `publish` says about one input in messages: the file, or stdin.
pub(super) fn input_name(p: Option<&std::path::Path>) -> String {
    match p {
        Some(p) if p.as_os_str() != "-" => p.display().to_string(),
        _ => "stdin".to_string(),
    }
}

/// The timestamp of a record from the top-level `field` of its payload, a JSON object:
/// an RFC 3339 string (`2026-12-01T01:02:03.5Z`, `…+01:00`) or a number of µs since the
/// Unix epoch. Errors say what is wrong (not an object, no such field, not a time, a time
/// before 1970).
pub fn timestamp_from_field(payload: &[u8], field: &str) -> Result<u64, String> {
    let obj: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(payload).map_err(|_| "not a JSON object".to_string())?;
    match obj.get(field) {
        None => Err(format!("no field {field:?}")),
        Some(serde_json::Value::String(s)) => {
            let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
                .map_err(|e| format!("{field:?} is {s:?}, not an RFC 3339 time ({e})"))?;
            u64::try_from(t.unix_timestamp_nanos() / 1000)
                .map_err(|_| format!("{field:?} is {s:?}, before 1970"))
        }
        Some(serde_json::Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| format!("{field:?} is {n}, not a whole number of µs since 1970")),
        Some(v) => Err(format!(
            "{field:?} is {v}, neither an RFC 3339 string nor µs since 1970"
        )),
    }
}

/// Opens `publish`'s input: the file, or stdin for `None` and `-`.
pub(super) fn open_input(
    input: Option<&std::path::Path>,
) -> std::io::Result<Box<dyn BufRead + Send>> {
    Ok(match input {
        None => Box::new(std::io::BufReader::new(std::io::stdin())),
        Some(p) if p.as_os_str() == "-" => Box::new(std::io::BufReader::new(std::io::stdin())),
        Some(p) => {
            let file = std::fs::File::open(p)?;
            if file.metadata()?.is_dir() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::IsADirectory,
                    "it is a directory, not a file of lines",
                ));
            }
            Box::new(std::io::BufReader::new(file))
        }
    })
}

/// The input of `publish`: lines of readers one after the other, or the `-m` messages.
pub(super) enum Input {
    Lines(Vec<Box<dyn BufRead + Send>>),
    Messages(Vec<Vec<u8>>),
}

/// The input file (of `names`, starting at the input lines `starts`) and the line number
/// in it of input line `line`.
pub(super) fn locate(names: &[String], starts: &[u64], line: u64) -> (String, u64) {
    let i = starts.iter().rposition(|&s| s <= line).unwrap_or(0);
    let start = starts.get(i).copied().unwrap_or(1);
    (names.get(i).cloned().unwrap_or_default(), line - start + 1)
}

/// ` (FILE line N)` for input line `line` when there are several input files, else
/// nothing.
pub(super) fn at_suffix(several: bool, names: &[String], starts: &[u64], line: u64) -> String {
    if !several {
        return String::new();
    }
    let (file, n) = locate(names, starts, line);
    format!(" ({file} line {n})")
}

/// One item of the input.
pub(super) enum Line {
    /// The next input file starts (its lines follow).
    NextFile,
    /// A record's payload.
    Record(Vec<u8>),
    /// A line longer than the limit, of this many bytes (without its `\n`), passed over.
    TooLong(u64),
}

/// The line limit when the gateway gives none (a gateway before producer sessions, or
/// `--ack none` without a producer id), bytes.
pub const UNLIMITED_LINE: usize = 16 << 20;

/// Reads one line of at most `limit` bytes (without its `\n` or `\r\n`: one `\r` right
/// before the `\n`, or at the end of the input, is part of the line ending); a longer line
/// is read through to its end without keeping more than `limit + 1` bytes, and its length
/// is counted without the line ending too. `None` at the end of the input.
pub(super) fn read_line(input: &mut dyn BufRead, limit: usize) -> std::io::Result<Option<Line>> {
    let mut line = Vec::new();
    let mut len = 0u64;
    // The line's last byte before its `\n`.
    let mut last = None;
    let mut seen = false;
    loop {
        let buf = match input.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            break;
        }
        seen = true;
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(p) => (&buf[..p], Some(p + 1)),
            None => (buf, None),
        };
        len += chunk.len() as u64;
        last = chunk.last().copied().or(last);
        let room = (limit + 1).saturating_sub(line.len());
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let used = done.unwrap_or(buf.len());
        input.consume(used);
        if done.is_some() {
            break;
        }
    }
    if !seen {
        return Ok(None);
    }
    if last == Some(b'\r') {
        len -= 1;
        // Kept whole (not cut at `limit + 1` bytes): the `\r` is its last byte.
        if line.len() as u64 > len {
            line.pop();
        }
    }
    if len > limit as u64 {
        return Ok(Some(Line::TooLong(len)));
    }
    Ok(Some(Line::Record(line)))
}

/// Reads `input` on a blocking thread and hands each line (without its `\n` or `\r\n`; a
/// line over `limit` bytes as [`Line::TooLong`]) or each message through a channel of at
/// most `queue` items, so a slow gateway holds the reader back instead of filling memory.
/// The channel closes at the end of the input, after an error (sent as the last item), or
/// when the receiver is dropped.
pub(super) fn spawn_line_reader(
    input: Input,
    limit: usize,
    queue: usize,
) -> smol::channel::Receiver<std::io::Result<Line>> {
    let (tx, rx) = smol::channel::bounded(queue.max(1));
    std::thread::spawn(move || match input {
        Input::Messages(messages) => {
            for m in messages {
                let item = if m.len() > limit {
                    Line::TooLong(m.len() as u64)
                } else {
                    Line::Record(m)
                };
                if tx.send_blocking(Ok(item)).is_err() {
                    return;
                }
            }
        }
        Input::Lines(inputs) => {
            for (i, mut input) in inputs.into_iter().enumerate() {
                if i > 0 && tx.send_blocking(Ok(Line::NextFile)).is_err() {
                    return;
                }
                loop {
                    let item = match read_line(&mut *input, limit) {
                        Ok(None) => break,
                        Ok(Some(l)) => Ok(l),
                        Err(e) => Err(e),
                    };
                    let failed = item.is_err();
                    if tx.send_blocking(item).is_err() || failed {
                        return;
                    }
                }
            }
        }
    });
    rx
}
