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
