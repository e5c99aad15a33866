"""What the a2a-sdk test clients (a2a_client.py, a2a_conformance.py) share: a user message
and the check that ends a run at the first thing that is not as the A2A spec says."""

import sys
import uuid

from a2a.types import Message, Part, Role


def message(text: str, task_id: str = "", context_id: str = "", parts=()) -> Message:
    """A user message with a fresh id: `text`, then `parts`, in `task_id`/`context_id`."""
    return Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), task_id=task_id,
                   context_id=context_id, parts=[Part(text=text), *parts])


def check(condition: bool, what: str) -> None:
    """Ends the run (exit 1, `FAILED: <what>` on stderr) unless `condition` holds."""
    if not condition:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
