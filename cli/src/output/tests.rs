//! How replies read: the renderers checked against literal replies.

use super::*;
use serde_json::json;

#[test]
fn peers_read_as_a_table_with_the_note() {
    let text = render(
        View::Peers,
        &json!({"peers": [{"agent_id": "writer", "description": "writes", "status": "idle",
                           "reachable": true, "capabilities": []}]}),
    );
    assert_eq!(
        text,
        "AGENT   STATUS  REACHABLE  DESCRIPTION\nwriter  idle    yes        writes"
    );
    let text = render(
        View::Peers,
        &json!({"peers": [{"agent_id": "a", "status": "idle", "reachable": false,
                           "description": ""}], "next": "a"}),
    );
    assert!(
        text.ends_with("(more peers: ask again with --after a)"),
        "{text}"
    );
    let text = render(View::Peers, &json!({"peers": [], "note": "not registered"}));
    assert_eq!(text, "no peers\n(not registered)");
}

#[test]
fn a_delivery_report_names_what_was_not_delivered() {
    let text = render(
        View::Delivery,
        &json!({"delivered_to": ["g1"], "unreachable_reasons": ["unknown agent_id `x`"]}),
    );
    assert_eq!(
        text,
        "delivered to 1 goal(s)\n  not delivered: unknown agent_id `x`"
    );
}

#[test]
fn an_unexpected_shape_is_shown_as_json() {
    let value = json!({"surprise": 1});
    assert_eq!(
        render(View::Task, &value),
        serde_json::to_string_pretty(&value).unwrap()
    );
}

#[test]
fn long_text_is_cut_on_one_line() {
    assert_eq!(short("a\nb", 10), "a b");
    assert_eq!(short("abcdef", 4), "abc…");
}
