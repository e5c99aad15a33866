//! How people items read in a terminal. Agents write these texts and may be prompt-injected:
//! every agent-written string goes through [`inert`], so no escape sequence reaches the
//! terminal and no bidi override reorders what the person reads.

use serde_json::Value;

/// `text` made safe to print: control characters (escape sequences among them) become `�`,
/// bidi controls are shown by name (`⟦U+202E⟧`), newlines are kept.
pub fn inert(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push('\n'),
            '\u{200e}'
            | '\u{200f}'
            | '\u{061c}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}' => {
                out.push_str(&format!("⟦U+{:04X}⟧", u32::from(c)));
            }
            c if c.is_control() => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

fn field<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn one_line(text: &str, max: usize) -> String {
    let text = inert(text).replace('\n', " ");
    if text.chars().count() <= max {
        text
    } else {
        format!("{}…", text.chars().take(max - 1).collect::<String>())
    }
}

/// A page of a person's inbox.
pub fn inbox(value: &Value) -> Option<String> {
    let items = value.get("items")?.as_array()?;
    let mut out = Vec::new();
    if items.is_empty() {
        out.push("nothing waiting".to_owned());
    }
    for item in items {
        out.push(format!(
            "{}  {:<8} {:<10} from {} to {}{}\n  {}",
            field(item, "item_id"),
            field(item, "kind"),
            field(item, "state"),
            field(item, "from_agent"),
            field(item, "addressee"),
            item.get("action")
                .map(|action| format!("  [{}]", one_line(field(action, "tool"), 40)))
                .unwrap_or_default(),
            one_line(field(item, "message"), 160)
        ));
    }
    if let Some(senders) = value.get("senders").and_then(Value::as_array)
        && !senders.is_empty()
    {
        let shares: Vec<String> = senders
            .iter()
            .take(10)
            .map(|share| {
                format!(
                    "{} {}{}",
                    field(share, "agent"),
                    share.get("open").map(Value::to_string).unwrap_or_default(),
                    if share.get("at_cap") == Some(&Value::Bool(true)) {
                        " (at its share)"
                    } else {
                        ""
                    }
                )
            })
            .collect();
        out.push(format!("senders: {}", shares.join(", ")));
    }
    if let Some(next) = value.get("next").and_then(Value::as_u64) {
        out.push(format!("more: --after {next}"));
    }
    Some(out.join("\n"))
}

/// One item, whole.
pub fn item(value: &Value) -> Option<String> {
    let id = field(value, "item_id");
    if id.is_empty() {
        return None;
    }
    let mut out = vec![
        format!("{} {id} ({})", field(value, "kind"), field(value, "state")),
        format!(
            "from {} to {}, now for {}",
            field(value, "from_agent"),
            field(value, "to"),
            field(value, "addressee")
        ),
        format!("written {}", field(value, "created_at")),
    ];
    if let Some(deadline) = value.get("deadline").and_then(Value::as_str) {
        out.push(format!("deadline {deadline}"));
    }
    out.push(String::new());
    out.push(inert(field(value, "message")));
    if let Some(action) = value.get("action") {
        out.push(String::new());
        out.push(format!("action: {}", inert(field(action, "tool"))));
        out.push(format!(
            "arguments: {}",
            inert(
                &serde_json::to_string_pretty(action.get("arguments").unwrap_or(&Value::Null))
                    .unwrap_or_default()
            )
        ));
        out.push(format!("action_hash: {}", field(value, "action_hash")));
    }
    if let Some(answer) = value.get("answer") {
        out.push(String::new());
        out.push(format!(
            "answered by {} at {}{}: {}",
            field(answer, "by"),
            field(answer, "at"),
            answer
                .get("decision")
                .and_then(Value::as_str)
                .map(|d| format!(" ({d})"))
                .unwrap_or_default(),
            inert(field(answer, "message"))
        ));
    }
    Some(out.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_bidi_are_inert() {
        assert_eq!(inert("a\u{1b}[31mb"), "a\u{fffd}[31mb");
        assert_eq!(inert("x\u{202e}y"), "x⟦U+202E⟧y");
        assert_eq!(inert("line\nnext"), "line\nnext");
    }
}
