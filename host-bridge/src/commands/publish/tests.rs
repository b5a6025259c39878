//! Tests of `publish`'s line reading, summary and resume command.

use super::input::read_line;
use super::*;

fn lines(text: &[u8], limit: usize) -> Vec<String> {
    let mut r = std::io::BufReader::with_capacity(4, text);
    let mut out = Vec::new();
    while let Some(l) = read_line(&mut r, limit).unwrap() {
        out.push(match l {
            Line::Record(p) => String::from_utf8(p).unwrap(),
            Line::TooLong(n) => format!("<{n}>"),
            Line::NextFile => "<next>".to_string(),
        });
    }
    out
}

#[test]
fn timestamps_from_a_json_field() {
    let t = |p: &str| timestamp_from_field(p.as_bytes(), "ts");
    assert_eq!(
        t(r#"{"ts":"2023-11-14T22:13:20Z","v":1}"#),
        Ok(1_700_000_000_000_000)
    );
    assert_eq!(
        t(r#"{"ts":"2023-11-14T23:13:20.000001+01:00"}"#),
        Ok(1_700_000_000_000_001)
    );
    assert_eq!(t(r#"{"ts":1700000000000000}"#), Ok(1_700_000_000_000_000));
    for bad in [
        r#"{"x":1}"#,
        r#"{"ts":"yesterday"}"#,
        r#"{"ts":-1}"#,
        r#"{"ts":1.5}"#,
        "21.5",
        r#"{"ts":"1969-12-31T23:59:59Z"}"#,
    ] {
        assert!(t(bad).is_err(), "{bad}");
    }
}

#[test]
fn lines_over_the_limit_are_passed_over_with_their_length() {
    assert_eq!(
        lines(b"ab\r\nabcdefgh\nabcd\n\nxyz", 4),
        ["ab", "<8>", "abcd", "", "xyz"]
    );
    assert_eq!(lines(b"abcd\r\n", 4), ["abcd"]);
    assert_eq!(lines(b"", 4), Vec::<String>::new());
}

/// CRLF input: the `\r` right before each `\n` (or at the very end of the input) is part
/// of the line ending and taken off, as most line tools do; only one, and any other `\r`
/// stays in the payload.
#[test]
fn a_cr_before_the_line_feed_is_part_of_the_line_ending() {
    assert_eq!(
        lines(b"one\r\ntwo\r\n\r\nbare\rcr\ntwo crs\r\r\nlast\r", 16),
        ["one", "two", "", "bare\rcr", "two crs\r", "last"]
    );
    // The limit counts the payload, not the line ending.
    assert_eq!(lines(b"abcd\r\nabcde\r\n", 4), ["abcd", "<5>"]);
}

fn args_with(inputs: &[&str], carried: &[(&str, &str)]) -> PublishArgs {
    PublishArgs {
        gateway: "tls://gw.example:7879".parse().unwrap(),
        topic: "t".to_string(),
        ack: AckLevel::Durable,
        producer_id: Some(7),
        resume: false,
        inputs: inputs.iter().map(PathBuf::from).collect(),
        timestamp_field: None,
        messages: Vec::new(),
        retry_for: Duration::from_secs(5),
        reply_timeout: Duration::from_secs(10),
        max_record_bytes: None,
        carried: carried
            .iter()
            .map(|(f, v)| (f.to_string(), v.to_string()))
            .collect(),
    }
}

/// Found by a break-it run: the printed command dropped `--tls-ca` and `--config` (so it
/// failed with exit 2 against a TLS gateway), and for stdin it ended in a parenthesis the
/// shell cannot parse. It now repeats the connection's flags, carries the record limit the
/// run numbered lines under, and is a command a shell runs as printed.
#[test]
fn the_resume_command_repeats_the_connection_flags_and_parses_as_shell() {
    let carried = [
        ("--config", "my bridge.toml"),
        ("--tls-ca", "ca.pem"),
        ("--retry-for", "30000ms"),
    ];
    let cases = [
        (args_with(&["in.txt"], &carried), 1, "in.txt"),
        (args_with(&[], &carried), 1, "# the same input on stdin"),
        (
            args_with(&["-"], &carried),
            1,
            "- # the same input on stdin",
        ),
        (
            args_with(&["in.txt"], &carried),
            51,
            "tail -n +51 in.txt | ",
        ),
        (args_with(&[], &carried), 51, "from its line 51 on"),
        (
            args_with(&["a", "b"], &carried),
            51,
            "read as one input from its line 51 on",
        ),
    ];
    for (args, from, part) in cases {
        let cmd = summary::resume_command(&args, 7, from, Some(4096));
        assert!(
            cmd.contains("spillway-bridge publish --config 'my bridge.toml' --tls-ca ca.pem --retry-for 30000ms --gateway tls://gw.example:7879 --topic t --producer-id 7 --resume --max-record-bytes 4096"),
            "{cmd}"
        );
        assert!(cmd.replace("  ", " ").contains(part), "{cmd}");
        let parsed = std::process::Command::new("bash")
            .args(["-n", "-c", &cmd])
            .status()
            .unwrap();
        assert!(parsed.success(), "not a shell command: {cmd}");
    }
}
