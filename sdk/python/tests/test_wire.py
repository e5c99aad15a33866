"""switchboard/wire.py is what scripts/generate_types.py makes of docs/schema/*.json today:
a wire type changed in Rust (and its schema regenerated) fails here until the TypedDicts are
regenerated too (`python sdk/python/scripts/generate_types.py`)."""

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "generate_types.py"


def test_the_typed_dicts_match_the_committed_schemas():
    checked = subprocess.run([sys.executable, str(SCRIPT), "--check"])
    assert checked.returncode == 0, "switchboard/wire.py is stale: run scripts/generate_types.py"


def test_the_wire_types_import_and_name_what_the_agent_returns():
    from switchboard import wire

    assert "delivered_to" in wire.DeliveryReport.__annotations__
    assert "body" in wire.CallAnswer.__annotations__
    assert "from" in wire.TaskEvent.__annotations__
