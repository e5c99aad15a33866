//! What the CLI prints: readable text by default, the service's own JSON with `--json`.
//!
//! Every command's result is the service reply as JSON; a [`View`] says how to show it to a
//! person. A reply of an unexpected shape is shown as JSON rather than half-rendered. Writes
//! to a closed pipe (`switchboard agents | head -1`) end the program quietly instead of
//! panicking.

use std::io::Write;

use serde_json::Value;

/// How a command's reply reads for a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// Pretty JSON (no better reading exists).
    Json,
    /// `list_peers`.
    Peers,
    /// Every registered agent.
    Agents,
    /// One agent's card and state.
    Lookup,
    /// A register / heartbeat / deregister reply.
    Registry,
    /// A goal opened or closed.
    Goal,
    /// A send's delivery report.
    Delivery,
    /// A call: the answer, or where a parked answer lands.
    Call,
    /// A reply's acknowledgement.
    ReplyAck,
    /// Open calls, outgoing and incoming.
    Pending,
    /// Where a receipted message is, per receiving goal.
    SendStatus,
    /// A task (a `TaskReply` or a `TaskRecord`).
    Task,
    /// A page of tasks.
    TaskList,
    /// Audit records (thread, history, pending).
    Records,
    /// The chain verification.
    Verify,
    /// Dead letters.
    DeadLetters,
    /// A dead letter put back.
    Replayed,
    /// A page of a person's inbox.
    PeopleInbox,
    /// One item addressed to a person.
    PersonItem,
}

/// Writes `text` and a newline to stdout; a closed pipe ends the program (exit 0).
pub fn line(text: &str) {
    let mut out = std::io::stdout().lock();
    let written = writeln!(out, "{text}").and_then(|()| out.flush());
    if let Err(err) = written {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("switchboard: writing to stdout: {err}");
        std::process::exit(1);
    }
}

/// Prints a command's reply: JSON when asked (or when the view has no text form), else text.
pub fn show(view: View, value: &Value, json: bool) {
    if json || view == View::Json {
        line(&serde_json::to_string_pretty(value).unwrap_or_else(|err| err.to_string()));
    } else {
        line(render(view, value).trim_end());
    }
}

/// The text form of `value`, or pretty JSON when its shape is not the expected one.
pub fn render(view: View, value: &Value) -> String {
    let text = match view {
        View::Json => None,
        View::Peers => peers(value),
        View::Agents => agents(value),
        View::Lookup => lookup(value),
        View::Registry => registry(value),
        View::Goal => goal(value),
        View::Delivery => delivery(value),
        View::Call => call(value),
        View::ReplyAck => reply_ack(value),
        View::Pending => pending(value),
        View::SendStatus => send_status(value),
        View::Task => task(value.get("task").unwrap_or(value)).map(|mut text| {
            if let Some(goals) = value.get("delivered_to").and_then(Value::as_array)
                && !goals.is_empty()
            {
                text.push_str(&format!("\n  delivered to {} goal(s)", goals.len()));
            }
            if value.get("duplicate").and_then(Value::as_bool) == Some(true) {
                text.push_str("\n  (a retry: already done)");
            }
            if value.get("deadline_clamped").and_then(Value::as_bool) == Some(true) {
                text.push_str("\n  (deadline cut to the parent task's)");
            }
            for descendant in value
                .get("descendants")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                text.push_str(&format!(
                    "\n  subtask {} (of {}): {}",
                    s(descendant, "task_id"),
                    s(descendant, "parent"),
                    s(descendant, "state")
                ));
            }
            text
        }),
        View::TaskList => task_list(value),
        View::Records => records(value),
        View::Verify => verify(value),
        View::DeadLetters => dead_letters(value),
        View::Replayed => replayed(value),
        View::PeopleInbox => crate::people_text::inbox(value),
        View::PersonItem => crate::people_text::item(value),
    };
    text.unwrap_or_else(|| serde_json::to_string_pretty(value).unwrap_or_default())
}

fn s<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

fn list(value: &Value, key: &str) -> Vec<String> {
    value
        .get(key)
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .map(|item| {
                    item.as_str()
                        .map_or_else(|| item.to_string(), str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `text` cut to `max` characters, on one line.
fn short(text: &str, max: usize) -> String {
    let one_line = text.replace('\n', " ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

/// Rows as aligned columns (the last column is not padded).
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (n, cell) in row.iter().enumerate() {
            widths[n] = widths[n].max(cell.chars().count());
        }
    }
    let format_row = |cells: Vec<String>| {
        let last = cells.len().saturating_sub(1);
        cells
            .into_iter()
            .enumerate()
            .map(|(n, cell)| {
                if n == last {
                    cell
                } else {
                    format!("{cell:<width$}", width = widths[n])
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut out = format_row(header.iter().map(|h| (*h).to_owned()).collect());
    for row in rows {
        out.push('\n');
        out.push_str(&format_row(row.clone()));
    }
    out
}

fn peers(value: &Value) -> Option<String> {
    let peers = value.get("peers")?.as_array()?;
    let mut out = String::new();
    if peers.is_empty() {
        out.push_str("no peers");
    } else {
        let rows: Vec<Vec<String>> = peers
            .iter()
            .map(|peer| {
                vec![
                    s(peer, "agent_id").to_owned(),
                    s(peer, "status").to_owned(),
                    if peer.get("reachable").and_then(Value::as_bool) == Some(true) {
                        "yes".to_owned()
                    } else {
                        "no".to_owned()
                    },
                    short(s(peer, "description"), 60),
                ]
            })
            .collect();
        out.push_str(&table(
            &["AGENT", "STATUS", "REACHABLE", "DESCRIPTION"],
            &rows,
        ));
    }
    if let Some(next) = value.get("next").and_then(Value::as_str) {
        out.push_str(&format!("\n(more peers: ask again with --after {next})"));
    }
    if let Some(note) = value.get("note").and_then(Value::as_str) {
        out.push_str(&format!("\n({note})"));
    }
    Some(out)
}

fn agents(value: &Value) -> Option<String> {
    let agents = value.as_array()?;
    if agents.is_empty() {
        return Some("no agents registered".to_owned());
    }
    let rows: Vec<Vec<String>> = agents
        .iter()
        .map(|agent| {
            vec![
                s(agent, "agent_id").to_owned(),
                s(agent, "status").to_owned(),
                agent
                    .get("live_goals")
                    .map(Value::to_string)
                    .unwrap_or_default(),
                s(agent, "last_heartbeat").to_owned(),
                short(s(agent, "description"), 50),
            ]
        })
        .collect();
    Some(table(
        &["AGENT", "STATUS", "GOALS", "LAST HEARTBEAT", "DESCRIPTION"],
        &rows,
    ))
}

fn lookup(value: &Value) -> Option<String> {
    let card = value.get("card")?;
    let mut out = format!(
        "{}  ({})\n  {}",
        s(card, "agent_id"),
        s(value, "status"),
        if s(card, "description").is_empty() {
            "(no description)"
        } else {
            s(card, "description")
        }
    );
    for (label, items) in [
        ("capabilities", list(card, "capabilities")),
        ("live goals", list(value, "live_goals")),
        ("current tasks", list(value, "current_tasks")),
        ("allow_from", list(card, "allow_from")),
        ("can_talk_to", list(card, "can_talk_to")),
        ("deny_talk_to", list(card, "deny_talk_to")),
    ] {
        if !items.is_empty() {
            out.push_str(&format!("\n  {label}: {}", items.join(", ")));
        }
    }
    out.push_str(&format!(
        "\n  registered {}, last heartbeat {}",
        s(value, "registered_at"),
        s(value, "last_heartbeat")
    ));
    Some(out)
}

fn registry(value: &Value) -> Option<String> {
    let agent = s(value, "agent_id");
    if agent.is_empty() {
        return None;
    }
    if let Some(closed) = value.get("closed_goals").and_then(Value::as_array) {
        return Some(format!(
            "{agent} deregistered ({} goal(s) closed)",
            closed.len()
        ));
    }
    if !s(value, "registered_at").is_empty() {
        return Some(format!(
            "{agent} registered ({})",
            value
                .get("status")
                .and_then(Value::as_str)
                .unwrap_or("idle")
        ));
    }
    Some(format!(
        "{agent}: {}, last heartbeat {}",
        s(value, "status"),
        s(value, "last_heartbeat")
    ))
}

fn goal(value: &Value) -> Option<String> {
    let goal = s(value, "goal_id");
    if goal.is_empty() {
        return None;
    }
    let subject = s(value, "subject");
    Some(if subject.is_empty() {
        format!(
            "goal {goal} closed ({} unread message(s) purged)",
            value
                .get("purged")
                .map(Value::to_string)
                .unwrap_or_default()
        )
    } else {
        format!(
            "goal {goal} open\n  inbox:    {subject}\n  read it:  switchboard inbox --as <agent> --goal {goal}"
        )
    })
}

fn delivery(value: &Value) -> Option<String> {
    let goals = value.get("delivered_to")?.as_array()?;
    let mut out = format!("delivered to {} goal(s)", goals.len());
    let id = s(value, "message_id");
    if !id.is_empty() {
        out.push_str(&format!(" (message {id})"));
    }
    for reason in list(value, "unreachable_reasons") {
        out.push_str(&format!("\n  not delivered: {reason}"));
    }
    Some(out)
}

fn send_status(value: &Value) -> Option<String> {
    let goals = value.get("goals")?.as_array()?;
    let mut out = format!("message {}:", s(value, "message_id"));
    for goal in goals {
        out.push_str(&format!(
            "\n  {} of {}: {} (at {})",
            s(goal, "goal_id"),
            s(goal, "agent_id"),
            s(goal, "state"),
            s(goal, "at")
        ));
    }
    Some(out)
}

fn call(value: &Value) -> Option<String> {
    let clamped = if value.get("clamped").and_then(Value::as_bool) == Some(true) {
        " (its deadline was cut to the parent call's)"
    } else {
        ""
    };
    if let Some(body) = value.get("body").and_then(Value::as_str) {
        return Some(format!(
            "{} answered (call {}{clamped}):\n{body}",
            s(value, "from_agent_id"),
            s(value, "correlation_id")
        ));
    }
    let id = s(value, "correlation_id");
    (!id.is_empty()).then(|| {
        format!(
            "call {id} parked (deadline {}{clamped}): the answer, or a timeout notice, lands in \
             the calling goal's inbox",
            s(value, "deadline")
        )
    })
}

fn reply_ack(value: &Value) -> Option<String> {
    let delivered = s(value, "delivered");
    if delivered.is_empty() {
        return None;
    }
    let mut out = match delivered {
        "caller" => "answer delivered to the waiting caller".to_owned(),
        "inbox" => "answer delivered to the caller's inbox".to_owned(),
        other => format!("answer delivered ({other})"),
    };
    if value.get("duplicate").and_then(Value::as_bool) == Some(true) {
        out.push_str(" (a retry: already answered)");
    }
    Some(out)
}

fn pending(value: &Value) -> Option<String> {
    let mut out = String::new();
    for (label, key, peer) in [
        ("outgoing (you wait for)", "outgoing", "callee"),
        ("incoming (you owe an answer)", "incoming", "caller"),
    ] {
        let calls = value.get(key)?.as_array()?;
        out.push_str(&format!("{label}: {}\n", calls.len()));
        for call in calls {
            out.push_str(&format!(
                "  {}  {}  {}\n",
                s(call, "correlation_id"),
                s(call, peer),
                s(call, "state")
            ));
        }
    }
    Some(out)
}

fn task(value: &Value) -> Option<String> {
    let id = s(value, "task_id");
    if id.is_empty() {
        return None;
    }
    let mut out = format!(
        "task {id}  {}\n  {} → {}",
        s(value, "state"),
        s(value, "requester"),
        s(value, "assignee")
    );
    out.push_str(&format!("\n  {}", short(s(value, "message"), 200)));
    if let Some(parent) = value.get("parent").and_then(Value::as_str) {
        out.push_str(&format!("\n  parent: {parent}"));
    }
    let children = list(value, "children");
    if !children.is_empty() {
        out.push_str(&format!("\n  subtasks: {}", children.join(", ")));
    }
    if let Some(result) = value.get("result").and_then(Value::as_str) {
        out.push_str(&format!("\n  result: {result}"));
    }
    if let Some(reason) = value.get("reason").and_then(Value::as_str) {
        out.push_str(&format!("\n  reason: {reason}"));
    }
    if let Some(deadline) = value.get("deadline").and_then(Value::as_str) {
        out.push_str(&format!("\n  deadline: {deadline}"));
    }
    Some(out)
}

fn task_list(value: &Value) -> Option<String> {
    let tasks = value.get("tasks")?.as_array()?;
    let mut out = if tasks.is_empty() {
        "no tasks".to_owned()
    } else {
        let rows: Vec<Vec<String>> = tasks
            .iter()
            .map(|task| {
                vec![
                    s(task, "task_id").to_owned(),
                    s(task, "state").to_owned(),
                    format!("{} → {}", s(task, "requester"), s(task, "assignee")),
                    short(s(task, "message"), 50),
                ]
            })
            .collect();
        table(&["TASK", "STATE", "FROM → TO", "MESSAGE"], &rows)
    };
    if let Some(total) = value.get("total").and_then(Value::as_u64)
        && !tasks.is_empty()
    {
        out.push_str(&format!("\n{} of {total}", tasks.len()));
    }
    if let Some(cursor) = value.get("next_cursor").and_then(Value::as_str) {
        out.push_str(&format!("\n(more: --cursor {cursor})"));
    }
    Some(out)
}

/// The text of an audit record's source message, when it has one.
fn record_text(record: &Value) -> String {
    let payload = record.get("payload").unwrap_or(&Value::Null);
    for key in ["body", "message", "result", "reason", "answer"] {
        if let Some(text) = payload.get(key).and_then(Value::as_str) {
            return text.to_owned();
        }
    }
    if let Some(text) = payload.as_str() {
        return text.to_owned();
    }
    String::new()
}

fn records(value: &Value) -> Option<String> {
    let records = value.get("records")?.as_array()?;
    let mut out = if records.is_empty() {
        "no records".to_owned()
    } else {
        records
            .iter()
            .map(|record| {
                let route = match (
                    record.get("from_agent").and_then(Value::as_str),
                    record.get("to_agent").and_then(Value::as_str),
                ) {
                    (Some(from), Some(to)) => format!("{from} → {to}"),
                    (Some(from), None) => from.to_owned(),
                    (None, Some(to)) => format!("→ {to}"),
                    (None, None) => String::new(),
                };
                format!(
                    "{}  {:<20}  {:<30}  {}",
                    s(record, "at"),
                    s(record, "kind"),
                    route,
                    short(&record_text(record), 70)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    if let Some(cursor) = value.get("next_cursor").and_then(Value::as_u64) {
        out.push_str(&format!("\n(more: --cursor {cursor})"));
    }
    if value.get("truncated").and_then(Value::as_bool) == Some(true) {
        out.push_str("\n(truncated to fit one reply)");
    }
    Some(out)
}

fn verify(value: &Value) -> Option<String> {
    let ok = value.get("ok")?.as_bool()?;
    let n = |key: &str| value.get(key).map(Value::to_string).unwrap_or_default();
    Some(if ok {
        format!(
            "audit chain intact: {} records (sequences {}..{})",
            n("records"),
            n("first_seq"),
            n("last_seq")
        )
    } else {
        format!(
            "audit chain BROKEN after {} good records: {}",
            n("records"),
            serde_json::to_string(value.get("first_break").unwrap_or(value)).unwrap_or_default()
        )
    })
}

fn dead_letters(value: &Value) -> Option<String> {
    let letters = value.as_array()?;
    if letters.is_empty() {
        return Some("no dead letters".to_owned());
    }
    Some(
        letters
            .iter()
            .map(|letter| {
                let payload = letter.get("payload").unwrap_or(&Value::Null);
                let text = payload
                    .get("body")
                    .and_then(Value::as_str)
                    .map_or_else(|| payload.to_string(), str::to_owned);
                format!(
                    "#{}  {}  {} (seq {}, reader {})\n  {}\n  {}",
                    letter.get("seq").map(Value::to_string).unwrap_or_default(),
                    s(letter, "at"),
                    s(letter, "subject"),
                    letter
                        .get("source_seq")
                        .map(Value::to_string)
                        .unwrap_or_default(),
                    s(letter, "consumer"),
                    s(letter, "reason"),
                    short(&text, 120)
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

fn replayed(value: &Value) -> Option<String> {
    let subject = s(value, "subject");
    (!subject.is_empty()).then(|| {
        format!(
            "dead letter #{} replayed to {subject} (sequence {})",
            value.get("seq").map(Value::to_string).unwrap_or_default(),
            value
                .get("stream_seq")
                .map(Value::to_string)
                .unwrap_or_default()
        )
    })
}

#[cfg(test)]
mod tests;
