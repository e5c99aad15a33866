//! One event, one log line: the text log's writer escapes every line break and control
//! character an event's fields carry, so text a client or an agent wrote (a webhook URL, a
//! card, an error quoting a request) can never start a line of its own — a forged timestamp
//! and `ERROR audit: … the audit chain is broken` stays inside the field that carried it
//! (issue 37). The JSON log escapes by itself; the text log goes through [`SafeLines`].
//!
//! The fmt layer formats each event into one buffer, ending in a newline, and writes it with
//! one `write_all`: the writer escapes all but that last newline. Escaping happens in the
//! writer rather than field by field so that no `warn!(x = %untrusted)` anywhere can be
//! missed; the only bytes it lets through raw are the formatter's own colour codes
//! (`ESC [ digits ; m`) when colours are on.

use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;

/// A [`MakeWriter`] whose writers escape control characters, keeping one event on one line.
#[derive(Clone, Debug)]
pub struct SafeLines<M> {
    inner: M,
    colours: bool,
}

impl<M> SafeLines<M> {
    /// Wraps `inner`; `colours` keeps the formatter's ANSI colour codes (terminal output).
    pub fn new(inner: M, colours: bool) -> Self {
        Self { inner, colours }
    }
}

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for SafeLines<M> {
    type Writer = SafeWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        SafeWriter {
            inner: self.inner.make_writer(),
            colours: self.colours,
        }
    }
}

/// The writer of one event (see [`SafeLines`]).
#[derive(Debug)]
pub struct SafeWriter<W> {
    inner: W,
    colours: bool,
}

impl<W: Write> Write for SafeWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write_all(&escape(buf, self.colours))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// `buf` with every control character but a final newline written as an escape (`\n`, `\r`,
/// `\u{1b}`), and the Unicode line and paragraph separators and NEL too. With `colours`,
/// SGR sequences (`ESC [ 0-9 ; m`) stay as they are.
pub fn escape(buf: &[u8], colours: bool) -> Vec<u8> {
    let (body, end) = match buf.strip_suffix(b"\n") {
        Some(body) => (body, &b"\n"[..]),
        None => (buf, &b""[..]),
    };
    let text = String::from_utf8_lossy(body);
    let mut out = String::with_capacity(text.len() + 8);
    let mut rest = text.as_ref();
    while let Some(c) = rest.chars().next() {
        if colours
            && c == '\u{1b}'
            && let Some(len) = sgr_len(rest)
        {
            out.push_str(&rest[..len]);
            rest = &rest[len..];
            continue;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push('\t'),
            // Controls, line and paragraph separators, and the bidirectional overrides and
            // isolates that reorder what a terminal shows (Trojan Source).
            c if c.is_control()
                || matches!(
                    c,
                    '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}'
                        | '\u{2066}'..='\u{2069}'
                ) =>
            {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
        rest = &rest[c.len_utf8()..];
    }
    let mut out = out.into_bytes();
    out.extend_from_slice(end);
    out
}

/// The length of the SGR sequence (`ESC [ digits/semicolons m`) `text` starts with, if any.
fn sgr_len(text: &str) -> Option<usize> {
    let rest = text.strip_prefix("\u{1b}[")?;
    let params = rest
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b';')
        .count();
    (rest.as_bytes().get(params) == Some(&b'm')).then_some(2 + params + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(text: &str, colours: bool) -> String {
        String::from_utf8(escape(text.as_bytes(), colours)).unwrap()
    }

    #[test]
    fn a_forged_line_stays_inside_its_field() {
        let event = "2026-11-28T10:00:00Z  WARN a2a_gateway: push target refused url=http://x/\n\
                     2026-11-28T10:00:01Z ERROR audit: the audit chain is broken\r\n";
        let out = escaped(event, false);
        assert_eq!(out.matches('\n').count(), 1, "{out}");
        assert!(out.ends_with("broken\\r\n"), "{out}");
        assert!(out.contains("url=http://x/\\n2026-11-28T10:00:01Z ERROR"));
    }

    #[test]
    fn control_characters_and_separators_are_escaped_colours_kept_when_on() {
        let out = escaped("a\u{1b}[2Jb\u{0}c\u{2028}d\u{85}e\tf", false);
        assert_eq!(out, "a\\u{1b}[2Jb\\u{0}c\\u{2028}d\\u{85}e\tf");
        let out = escaped("x\u{202e}gnp.exe\u{2066}y", false);
        assert_eq!(out, "x\\u{202e}gnp.exe\\u{2066}y");
        let out = escaped("\u{1b}[1;31mERROR\u{1b}[0m x=\u{1b}[2J", true);
        assert_eq!(out, "\u{1b}[1;31mERROR\u{1b}[0m x=\\u{1b}[2J");
    }

    #[test]
    fn a_writer_passes_one_escaped_event_through() {
        let mut sink = Vec::new();
        {
            let mut writer = SafeWriter {
                inner: &mut sink,
                colours: false,
            };
            writer.write_all(b"one\ntwo\n").unwrap();
        }
        assert_eq!(sink, b"one\\ntwo\n");
    }
}
