"""switchboard/wire.py is what scripts/generate_types.py makes of docs/schema/*.json today:
a wire type changed in Rust (and its schema regenerated) fails here until the classes are
regenerated too (`python sdk/python/scripts/generate_types.py`). The rest needs no fabric:
the classes read as attributes and stay the dicts they were (issue 38)."""

import copy
import json
import pathlib
import pickle
import subprocess
import sys
import typing

import pytest

from switchboard import wire

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "generate_types.py"

ANSWER = {
    "answered_at": "2026-04-30T14:00:00Z",
    "body": "echo: hi",
    "correlation_id": "c-1",
    "from_agent_id": "echo",
    "parts": [{"type": "text", "text": "hi"}, {"type": "data", "data": {"n": 1}},
              {"type": "file", "uri": "s3://x"}],
}


def test_the_wire_classes_match_the_committed_schemas():
    checked = subprocess.run([sys.executable, str(SCRIPT), "--check"])
    assert checked.returncode == 0, "switchboard/wire.py is stale: run scripts/generate_types.py"


def test_the_wire_types_import_and_name_what_the_agent_returns():
    assert "delivered_to" in wire.DeliveryReport.__annotations__
    assert "body" in wire.CallAnswer.__annotations__
    # A keyword field is annotated by its attribute; the table maps it to its key.
    assert "from_" in wire.TaskEvent.__annotations__
    assert wire.TaskEvent._fields["from_"] == "from"
    assert issubclass(wire.CallAnswer, wire.WireObject) and issubclass(wire.CallAnswer, dict)
    # The annotations resolve at run time too, enums as Literals.
    hints = typing.get_type_hints(wire.CallAnswer)
    assert hints["parts"] == list[wire.PartText | wire.PartData | wire.PartFile]
    assert hints["error"] == wire.ReplyError | None and hints["streamed"] is int
    assert "completed" in typing.get_args(wire.TaskState)


def test_fields_read_as_attributes_and_as_keys():
    answer = wire.parse(wire.CallAnswer, ANSWER)
    assert isinstance(answer, wire.CallAnswer)
    assert answer.body == answer["body"] == "echo: hi"
    assert answer.from_agent_id == "echo" and answer.correlation_id == "c-1"
    assert answer.get("streamed") is None  # dict methods see the JSON as it came
    report = wire.parse(wire.DeliveryReport, {"delivered_to": ["g1"], "unreachable_reasons": []})
    assert report.delivered_to == ["g1"] and report.message_id is None
    peer = wire.PeerSummary(agent_id="a", description="", reachable=True, status="idle")
    assert peer.agent_id == "a" and peer.status == "idle" and peer["reachable"] is True


def test_absent_fields_read_as_their_defaults():
    answer = wire.CallAnswer({"body": "x"})
    # Never null on the wire: what leaving it out means (serde's default).
    assert answer.streamed == 0 and answer.clamped is False and answer.parts == []
    assert answer.error is None  # may be null: None
    assert "parts" not in answer  # reading a default stores nothing
    answer.parts.append("not kept")  # a fresh default every read
    assert answer.parts == []
    assert wire.AgentCard({"agent_id": "a"}).allow_from == ["*"]  # the schema's own default
    assert wire.ReplyError({"kind": "k"}).message == ""


def test_nested_objects_and_lists_of_them_become_their_classes():
    answer = wire.parse(wire.CallAnswer, {**ANSWER, "error": {"kind": "bad_input"}})
    text, data, file = answer.parts
    # A tagged union (`Part`, by `type`) picks the class of each variant.
    assert type(text) is wire.PartText and text.text == "hi"
    assert type(data) is wire.PartData and data.data == {"n": 1}
    assert type(file) is wire.PartFile and file.uri == "s3://x" and file.mime is None
    assert isinstance(answer.error, wire.ReplyError) and answer.error.kind == "bad_input"
    # Already converted when built: indexing sees the same objects.
    assert answer["parts"][0] is text
    reply = wire.parse(wire.TaskReply, {"task": {
        "task_id": "t", "state": "completed", "result": "done",
        "history": [{"from": "working", "op": "complete", "to": "completed", "at": "now"}]}})
    record = reply.task
    assert isinstance(record, wire.TaskRecord)
    assert record.state == "completed" and record.result == "done" and record.children == []
    assert isinstance(record.history[0], wire.TaskTransition)
    peers = wire.parse(wire.PeersReply, {"peers": [{"agent_id": "a", "status": "busy"}]})
    assert isinstance(peers.peers[0], wire.PeerSummary) and peers.peers[0].status == "busy"
    # An unknown tag stays a plain dict; so does anything that is not an object.
    odd = wire.CallAnswer({"parts": [{"type": "video", "uri": "x"}], "error": None})
    assert type(odd.parts[0]) is dict and odd.error is None


def test_a_plain_dict_stored_later_is_converted_when_read():
    answer = wire.CallAnswer(ANSWER)
    answer["error"] = {"kind": "late"}
    assert type(answer["error"]) is dict
    assert answer.error.kind == "late"
    assert type(answer["error"]) is wire.ReplyError  # kept converted


def test_keyword_fields_take_a_trailing_underscore():
    transition = wire.TaskTransition({"from": "working", "to": "completed", "op": "complete"})
    assert transition.from_ == "working" == transition["from"]
    built = wire.TaskTransition(from_="submitted", to="accepted")  # keywords by attribute too
    assert built == {"from": "submitted", "to": "accepted"}
    built.from_ = "working"
    assert built["from"] == "working"
    assert "from_" in dir(built) and "to" in dir(built)


def test_they_are_still_the_dicts_they_were():
    answer = wire.parse(wire.CallAnswer, ANSWER)
    assert answer == ANSWER and ANSWER == answer
    assert isinstance(answer, dict) and dict(answer) == ANSWER
    assert json.loads(json.dumps(answer)) == ANSWER  # a JSON round trip
    assert wire.parse(wire.CallAnswer, json.loads(json.dumps(answer))) == answer
    assert answer["parts"][0] == {"type": "text", "text": "hi"}
    assert list(answer) == list(ANSWER) and answer.get("nope", 1) == 1
    # The input is not changed: its nested dicts stay plain.
    assert type(ANSWER["parts"][0]) is dict
    # Copies keep the class.
    assert type(answer.copy()) is wire.CallAnswer
    for clone in (copy.deepcopy(answer), pickle.loads(pickle.dumps(answer))):
        assert type(clone) is wire.CallAnswer and clone == answer
        assert type(clone.parts[0]) is wire.PartText
    # parse of one already typed is that object.
    assert wire.parse(wire.CallAnswer, answer) is answer
    with pytest.raises(TypeError):
        wire.parse(wire.CallAnswer, ["not", "an", "object"])


def test_unknown_keys_are_kept_and_readable():
    answer = wire.parse(wire.CallAnswer, {**ANSWER, "added_later": {"x": 1}})
    assert answer["added_later"] == {"x": 1} and answer.added_later == {"x": 1}
    assert json.loads(json.dumps(answer))["added_later"] == {"x": 1}
    # A name that is neither a field nor a key is an AttributeError (a typo shows).
    with pytest.raises(AttributeError):
        answer.bdy
    assert not hasattr(answer, "bdy")
    with pytest.raises(AttributeError):
        answer.bdy = "x"  # set keys outside the schema by indexing
    answer["bdy"] = "x"
    assert answer.bdy == "x"


def test_setting_and_deleting_fields_change_the_dict():
    answer = wire.CallAnswer(ANSWER)
    answer.body = "changed"
    assert answer["body"] == "changed"
    del answer.body
    assert "body" not in answer and answer.body is None  # required, yet missing: None


def test_the_repr_names_the_class():
    assert repr(wire.ReplyError({"kind": "k"})) == "ReplyError({'kind': 'k'})"


def test_call_ids_are_uuid_v7_with_the_time_of_now():
    """A call id made now is a UUID v7 whose first 48 bits are this moment in milliseconds
    (docs/protocol.md §9, "Call ids": such a call records beside its request)."""
    import time
    import uuid

    from switchboard import call_id

    before = time.time_ns() // 1_000_000
    ids = [uuid.UUID(call_id()) for _ in range(1000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == 1000
    for made in ids:
        assert made.version == 7 and made.variant == uuid.RFC_4122
        assert before <= made.int >> 80 <= after
