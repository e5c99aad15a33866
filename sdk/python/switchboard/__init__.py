"""Switchboard agents in Python: connect to the NATS fabric, read your inbox, send, call and
answer, give and work on tasks (docs/protocol.md is the contract this implements).

    from switchboard import Agent
"""

from .agent import Agent
from .errors import (AccessDenied, BadRequest, Busy, CallFailed, CallTimeout, Conflict, Expired,
                     Internal, NotFound, SwitchboardError, Unavailable)
from .message import Message, TaskHandle
from .serving import HANDLER_ERROR

__all__ = ["Agent", "Message", "TaskHandle", "SwitchboardError", "BadRequest", "AccessDenied",
           "NotFound", "Conflict", "Busy", "Expired", "CallTimeout", "CallFailed", "Unavailable",
           "Internal", "HANDLER_ERROR"]
