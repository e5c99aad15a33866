//! Header values built from text an agent may have written.
//!
//! async-nats panics when a header value holds CR or LF (they would end the header line and
//! let the rest be read as protocol), so every value that can carry an agent's words — an
//! error message naming a bad id, a reject reason — goes through [`safe_value`] first: a
//! hostile agent's text never becomes a panic, and never a forged header.

use async_nats::HeaderValue;

/// The longest header value we write from text (a NATS header line has no fixed limit; this
/// keeps error headers short next to the body that carries the full message).
pub const HEADER_TEXT_MAX_CHARS: usize = 512;

/// `text` as a header value: control characters (CR, LF, NUL, tabs…) become spaces, and at
/// most [`HEADER_TEXT_MAX_CHARS`] characters are kept.
pub fn safe_value(text: &str) -> HeaderValue {
    let clean: String = text
        .chars()
        .take(HEADER_TEXT_MAX_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    // Cannot fail: no CR or LF is left. The fallback keeps that true even if it could.
    clean
        .parse()
        .unwrap_or_else(|_| HeaderValue::from("(unprintable)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_never_reach_a_header() {
        let hostile = "bad\r\nNats-Service-Error-Code: 200\r\n\r\nPUB x 1\r\n\0";
        let value = safe_value(hostile);
        assert!(!value.as_str().contains(['\r', '\n', '\0']), "{value:?}");
        assert!(value.as_str().starts_with("bad  Nats-Service-Error-Code"));
        let long = "é".repeat(10_000);
        assert_eq!(
            safe_value(&long).as_str().chars().count(),
            HEADER_TEXT_MAX_CHARS
        );
    }
}
