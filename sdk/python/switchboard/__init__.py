"""Switchboard agents in Python: connect to the NATS fabric, read your inbox, send, call and
answer, give and work on tasks (docs/protocol.md is the contract this implements).

    from switchboard import Agent

What the fabric answers is typed (``switchboard.wire``, generated from docs/schema): objects
read with attributes that are dicts too. The ones the agent's methods return are exported here.
"""

from .agent import Agent, Lease, call_id
from .connection import ConfigError
from .errors import (AccessDenied, BadRequest, BudgetExhausted, Busy, CallFailed, CallTimeout,
                     Conflict, Expired, Internal, NotFound, SwitchboardError, Unavailable)
from .message import Message, TaskHandle
from .serving import HANDLER_ERROR
from .wire import (ApprovalUsed, CallAnswer, CallParked, CallPart, DeliveryReport, LookupReply,
                   NoteReport, Parked, PartData, PartFile, PartText, PeerSummary, PendingCalls,
                   PendingItems, PeopleList, PersonItem, ReplyAck, ReplyError, SendStatusReply,
                   TaskList, TaskRecord, WireObject)

__all__ = ["Agent", "Lease", "call_id", "Message", "TaskHandle", "SwitchboardError", "BadRequest",
           "AccessDenied", "NotFound", "Conflict", "Busy", "BudgetExhausted", "Expired",
           "CallTimeout", "CallFailed",
           "Unavailable",
           "Internal", "HANDLER_ERROR", "ConfigError",
           # what the methods return (switchboard.wire has every wire type)
           "WireObject", "CallAnswer", "CallPart", "CallParked", "DeliveryReport", "LookupReply",
           "PeerSummary", "PendingCalls", "ReplyAck", "ReplyError", "SendStatusReply", "TaskList",
           "TaskRecord", "PartText", "PartData", "PartFile",
           # people (docs/protocol.md §14)
           "NoteReport", "Parked", "ApprovalUsed", "PersonItem", "PendingItems", "PeopleList"]
