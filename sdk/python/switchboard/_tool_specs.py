"""The tools of `switchboard mcp`: name, description and inputSchema of each, as the MCP
server lists them. Generated from docs/mcp-tools.json by scripts/generate_tools.py; do not edit
(tests/test_tools.py fails while it is stale)."""

# generated from docs/mcp-tools.json; do not edit

TOOLS = [
    {
        'description': (
            'Ask a person (or a role: its first member to answer answers) and wait for a human '
            'answer. The question is kept until answered or timed out, even across restarts. '
            'With wait_s the tool waits up to 50 s and returns the answer if it came (state '
            'answered, answer, answered_by); otherwise it returns state open and the answer '
            'arrives later in check_inbox as kind="response" from="person:…" with '
            'correlation_id = item_id (or a kind="notify" timeout notice). To tell a person '
            'something without waiting, use send_to_peer with to="person:<id>".'
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'properties': {
                'escalate_after_s': {
                    'default': None,
                    'description': (
                        'Unanswered this long (seconds), the question goes to escalate_to, '
                        'once.'
                    ),
                    'format': 'uint64',
                    'minimum': 0,
                    'type': [
                        'integer',
                        'null',
                    ],
                },
                'escalate_to': {
                    'default': None,
                    'description': 'Who gets it then: "person:<id>" or "role:<name>".',
                    'type': [
                        'string',
                        'null',
                    ],
                },
                'question': {
                    'description': 'Your question, written for a person.',
                    'type': 'string',
                },
                'timeout_s': {
                    'default': None,
                    'description': (
                        'How long the person may take, in seconds (default 3600, at most '
                        '604800).'
                    ),
                    'format': 'uint64',
                    'minimum': 0,
                    'type': [
                        'integer',
                        'null',
                    ],
                },
                'to': {
                    'description': (
                        '"person:<id>" or "role:<name>" (the first member of the role to '
                        'answer answers); see\nlist_people.'
                    ),
                    'type': 'string',
                },
                'wait_s': {
                    'default': None,
                    'description': (
                        'Wait this long for the answer before returning (0-50 s, default 0: '
                        'return at once; the\nanswer then arrives in check_inbox as '
                        'kind="response" from="person:…").'
                    ),
                    'format': 'uint64',
                    'minimum': 0,
                    'type': [
                        'integer',
                        'null',
                    ],
                },
            },
            'required': [
                'to',
                'question',
            ],
            'type': 'object',
        },
        'name': 'ask_person',
    },
    {
        'description': (
            'Cancel a task you created (its open subtasks are canceled too; the assignee is '
            'told). Returns the task record and descendants: every subtask with the state the '
            'cancel left it in, so you know what was stopped; or task_terminal if it already '
            'ended.'
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'properties': {
                'reason': {
                    'default': None,
                    'description': 'Why (optional; the assignee is told).',
                    'type': [
                        'string',
                        'null',
                    ],
                },
                'task_id': {
                    'description': 'A task you created (its open subtasks are canceled too).',
                    'type': 'string',
                },
            },
            'required': [
                'task_id',
            ],
            'type': 'object',
        },
        'name': 'cancel_task',
    },
    {
        'description': (
            'Read the new messages in your inbox (and take them: each is shown once). Returns '
            'a # PEER MESSAGES block of <peer-message> elements with the sender, time and, '
            'where present, correlation_id, kind (request, response, notify, task, '
            'task_update, receipt) and task_id. A kind="receipt" says a message you sent with '
            'receipt was delivered to or read by its peer (metadata.state). Answer '
            'kind="request" with reply_to_peer; act on kind="task" with update_task.'
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'type': 'object',
        },
        'name': 'check_inbox',
    },
    {
        'description': (
            'Deliver your result for a task or subtask you worked on: the result goes to '
            'whoever gave it to you and the task ends (completed). This is the only way a '
            "subagent's findings reach its parent."
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'properties': {
                'attachments': {
                    'default': [],
                    'description': (
                        'Files to pass on (optional, at most 16): the `ref` of each, from an '
                        '<attachment> in\ncheck_inbox or a file you uploaded; the receiver may '
                        'then read them.'
                    ),
                    'items': {
                        'type': 'string',
                    },
                    'type': 'array',
                },
                'result': {
                    'description': (
                        'Your findings: the result handed to whoever gave you the task.'
                    ),
                    'type': 'string',
                },
                'task_id': {
                    'description': 'The task (or subtask) you finished.',
                    'type': 'string',
                },
            },
            'required': [
                'task_id',
                'result',
            ],
            'type': 'object',
        },
        'name': 'complete_task',
    },
    {
        'description': (
            'Give a task to another agent and keep working: it gets a kind="task" message, '
            'accepts and works on it, and every change of state comes back to your inbox as '
            'kind="task_update" (the last one carries the result). Returns the task record '
            'with its task_id. Call list_peers first.'
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'properties': {
                'attachments': {
                    'default': [],
                    'description': (
                        'Files to pass on (optional, at most 16): the `ref` of each, from an '
                        '<attachment> in\ncheck_inbox or a file you uploaded; the receiver may '
                        'then read them.'
                    ),
                    'items': {
                        'type': 'string',
                    },
                    'type': 'array',
                },
                'deadline_in_ms': {
                    'default': None,
                    'description': (
                        'Fail the task if it is not finished within this many milliseconds '
                        '(optional).'
                    ),
                    'format': 'uint64',
                    'minimum': 0,
                    'type': [
                        'integer',
                        'null',
                    ],
                },
                'message': {
                    'description': 'What to do: a complete, self-contained description.',
                    'type': 'string',
                },
                'receipt': {
                    'default': None,
                    'description': (
                        '"delivered" or "read" (optional): receipts in your check_inbox when '
                        "the assignee's\nsession receives and reads the task."
                    ),
                    'type': [
                        'string',
                        'null',
                    ],
                },
                'to': {
                    'description': (
                        'The agent id that should do the task (from list_peers), or '
                        '"skill:<name>" for the\nleast loaded agent that has the skill and '
                        'room for it.'
                    ),
                    'type': 'string',
                },
            },
            'required': [
                'to',
                'message',
            ],
            'type': 'object',
        },
        'name': 'create_task',
    },
    {
        'description': (
            'List the other agents you can talk to: their ids, descriptions, capabilities, '
            'status (idle/busy/offline) and whether you may reach them. Call this before '
            'send_to_peer, talk_to_agent or create_task to find the right agent id. Peers come '
            'in pages in id order; when the answer has `next`, call again with `after` set to '
            'it for more. Give `skill` to list only the agents that can do one thing; or skip '
            'the choice and address work to `skill:<name>` (send_to_peer, talk_to_agent, '
            'create_task): the fabric picks an idle, least loaded agent with that skill.'
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'properties': {
                'after': {
                    'default': None,
                    'description': (
                        'Continue after this agent id: the `next` of the previous answer.'
                    ),
                    'type': [
                        'string',
                        'null',
                    ],
                },
                'limit': {
                    'default': None,
                    'description': 'Most peers in the answer (default 100, at most 1000).',
                    'format': 'uint32',
                    'minimum': 0,
                    'type': [
                        'integer',
                        'null',
                    ],
                },
                'skill': {
                    'default': None,
                    'description': 'Only agents whose card lists this skill, e.g. "translate".',
                    'type': [
                        'string',
                        'null',
                    ],
                },
            },
            'type': 'object',
        },
        'name': 'list_peers',
    },
    {
        'description': (
            'The people you can ask or notify: persons (person:<id>) with their roles and '
            'whether they can approve, and roles (role:<name>) with their members; reachable '
            'says whether you may address them. Call before ask_person, request_approval, or '
            'send_to_peer to a person.'
        ),
        'inputSchema': {
            'properties': {},
            'type': 'object',
        },
        'name': 'list_people',
    },
    {
        'description': (
            'Where a message you sent with receipt="delivered" or "read" is, for each session '
            'of the receiver: stored (not picked up yet), delivered (received, not read yet), '
            'read, or expired_unread (dropped unread: its inbox was full). Use it before '
            'sending a reminder or giving up on an answer; the kind="receipt" messages in '
            'check_inbox say the same as it happens.'
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'properties': {
                'message_id': {
                    'description': (
                        "The message id: `message_id` of send_to_peer's report, or "
                        '`message_id` of the task\ncreate_task returned.'
                    ),
                    'type': 'string',
                },
            },
            'required': [
                'message_id',
            ],
            'type': 'object',
        },
        'name': 'message_status',
    },
    {
        'description': (
            'The open correlated calls: outgoing (you asked, no answer yet) and incoming '
            '(others wait for your reply_to_peer), with correlation ids and callers. Use it to '
            'see what you still owe.'
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'type': 'object',
        },
        'name': 'pending_requests',
    },
    {
        'description': (
            'Read a file a message carried (an <attachment> in check_inbox) or one you '
            'uploaded: its name, media type, size and digest, and its text when it is text of '
            'at most 64 KiB (otherwise a note saying it was not shown). To pass a file on, put '
            'its ref in the attachments of send_to_peer, talk_to_agent, reply_to_peer, '
            'create_task, update_task or complete_task: the bytes are not copied.'
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'properties': {
                'ref': {
                    'description': (
                        "The file's ref: the `ref` of an <attachment> in check_inbox, or of a "
                        'file you uploaded.'
                    ),
                    'type': 'string',
                },
            },
            'required': [
                'ref',
            ],
            'type': 'object',
        },
        'name': 'read_attachment',
    },
    {
        'description': (
            'Answer a peer that asked you something (a message with kind="request" in '
            'check_inbox). No target needed: without correlation_id it answers the most recent '
            'request you have not answered yet. With partial=true it sends part of a long '
            'answer now and keeps the request open; the next reply_to_peer without partial '
            "ends it. Returns the service's acknowledgement, or an error (e.g. expired when "
            'the caller stopped waiting).'
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'properties': {
                'attachments': {
                    'default': [],
                    'description': (
                        'Files to pass on (optional, at most 16): the `ref` of each, from an '
                        '<attachment> in\ncheck_inbox or a file you uploaded; the receiver may '
                        'then read them.'
                    ),
                    'items': {
                        'type': 'string',
                    },
                    'type': 'array',
                },
                'correlation_id': {
                    'default': None,
                    'description': (
                        'The correlation_id of the request you answer; omit it to answer the '
                        'most recent request\nyou have not answered yet.'
                    ),
                    'type': [
                        'string',
                        'null',
                    ],
                },
                'message': {
                    'description': 'Your answer.',
                    'type': 'string',
                },
                'partial': {
                    'default': False,
                    'description': (
                        'true: this is part of your answer, sent now; the request stays open '
                        'and you send more\n(the last one without partial ends it). For long '
                        'answers the asker can start on.'
                    ),
                    'type': 'boolean',
                },
            },
            'required': [
                'message',
            ],
            'type': 'object',
        },
        'name': 'reply_to_peer',
    },
    {
        'description': (
            'Ask a person to approve one exact action before you do it (a payment, a deploy, a '
            'deletion): the approval is bound to this tool and these arguments and no others. '
            'Returns approval_id and state (open until a person decides; with wait_s the tool '
            'waits up to 50 s). The decision also arrives in check_inbox as kind="response" '
            'from="person:…". When approved, call use_approval with the same tool and '
            'arguments right before acting; never act on an approval you have not used.'
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'properties': {
                'arguments': {
                    'description': 'Its exact arguments: the approval is for these and no others.',
                },
                'escalate_after_s': {
                    'default': None,
                    'description': 'Undecided this long (seconds), it goes to escalate_to, once.',
                    'format': 'uint64',
                    'minimum': 0,
                    'type': [
                        'integer',
                        'null',
                    ],
                },
                'escalate_to': {
                    'default': None,
                    'description': 'Who gets it then.',
                    'type': [
                        'string',
                        'null',
                    ],
                },
                'expires_in_s': {
                    'description': (
                        'How long the request may wait and the approval stay usable, in '
                        'seconds.'
                    ),
                    'format': 'uint64',
                    'minimum': 0,
                    'type': 'integer',
                },
                'reason': {
                    'description': 'Why, for the person deciding.',
                    'type': 'string',
                },
                'to': {
                    'description': 'An approver: "person:<id>" or "role:<name>"; see list_people.',
                    'type': 'string',
                },
                'tool': {
                    'description': 'The tool you want to call.',
                    'type': 'string',
                },
                'wait_s': {
                    'default': None,
                    'description': (
                        'Wait this long for the decision before returning (0-50 s, default 0).'
                    ),
                    'format': 'uint64',
                    'minimum': 0,
                    'type': [
                        'integer',
                        'null',
                    ],
                },
            },
            'required': [
                'tool',
                'arguments',
                'reason',
                'to',
                'expires_in_s',
            ],
            'type': 'object',
        },
        'name': 'request_approval',
    },
    {
        'description': (
            'Send a one-way message to another agent (fire and forget): it lands in every live '
            'session of that agent. Use to="*" to broadcast to every peer you may reach. '
            'Returns the delivery report: which sessions got it and, for peers it could not '
            'reach, why. Call list_peers first to pick the id. To get an answer back, use '
            'talk_to_agent instead. to="person:<id>" or "role:<name>" notes a person '
            "(list_people); a person's answer comes only through ask_person."
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'properties': {
                'attachments': {
                    'default': [],
                    'description': (
                        'Files to pass on (optional, at most 16): the `ref` of each, from an '
                        '<attachment> in\ncheck_inbox or a file you uploaded; the receiver may '
                        'then read them.'
                    ),
                    'items': {
                        'type': 'string',
                    },
                    'type': 'array',
                },
                'correlation_id': {
                    'default': None,
                    'description': 'A correlation id to carry (optional).',
                    'type': [
                        'string',
                        'null',
                    ],
                },
                'in_reply_to': {
                    'default': None,
                    'description': (
                        'The message id this one answers or follows up (optional; threads the '
                        'conversation).'
                    ),
                    'type': [
                        'string',
                        'null',
                    ],
                },
                'message': {
                    'description': 'The message text.',
                    'type': 'string',
                },
                'receipt': {
                    'default': None,
                    'description': (
                        '"delivered" or "read" (optional): kind="receipt" messages in your '
                        "check_inbox tell you\nwhen the peer's session received it and when it "
                        'read it; message_status asks any time.'
                    ),
                    'type': [
                        'string',
                        'null',
                    ],
                },
                'to': {
                    'description': (
                        'The peer\'s agent id from list_peers, "skill:<name>" for one agent '
                        'that has the skill,\nor "*" to broadcast to every peer you may reach.'
                    ),
                    'type': 'string',
                },
            },
            'required': [
                'to',
                'message',
            ],
            'type': 'object',
        },
        'name': 'send_to_peer',
    },
    {
        'description': (
            'Hand part of the task you are working on to a subagent and keep working: omit '
            "agent to spawn a copy of yourself, or name an expert agent. The subagent's result "
            'returns to your inbox as a task_update. Returns the subtask record; its task_id '
            'is the handle for subagent_status. Subtasks nest at most 3 deep, with at most 8 '
            "open per task, and never outlive your task's deadline (deadline_clamped: true "
            'when it was cut).'
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'properties': {
                'agent': {
                    'default': None,
                    'description': (
                        'A named agent to delegate to; omit it to spawn a copy of yourself '
                        '(every live session\nof your own agent is offered the subtask).'
                    ),
                    'type': [
                        'string',
                        'null',
                    ],
                },
                'deadline_in_ms': {
                    'default': None,
                    'description': (
                        'Fail the subtask if it is not finished within this many milliseconds '
                        '(optional).'
                    ),
                    'format': 'uint64',
                    'minimum': 0,
                    'type': [
                        'integer',
                        'null',
                    ],
                },
                'message': {
                    'description': (
                        'What the subagent should do: a complete, self-contained description.'
                    ),
                    'type': 'string',
                },
                'parent_task_id': {
                    'description': 'The task you are working on that this subtask belongs to.',
                    'type': 'string',
                },
            },
            'required': [
                'parent_task_id',
                'message',
            ],
            'type': 'object',
        },
        'name': 'spawn_subagent',
    },
    {
        'description': (
            "Check on tasks: with task_id, that task's record (state, result, history); with "
            'parent_task_id, every subtask of that task and its state. Read-only.'
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'properties': {
                'parent_task_id': {
                    'default': None,
                    'description': 'A parent task: list all its subtasks and their states.',
                    'type': [
                        'string',
                        'null',
                    ],
                },
                'task_id': {
                    'default': None,
                    'description': (
                        'One task or subtask (the handle spawn_subagent or create_task '
                        'returned).'
                    ),
                    'type': [
                        'string',
                        'null',
                    ],
                },
            },
            'type': 'object',
        },
        'name': 'subagent_status',
    },
    {
        'description': (
            'Consult another agent and wait for its answer (a correlated call): returns the '
            'answer text (the whole of it when the agent answers in parts; each part is '
            'reported as progress while you wait), or an error with kind timeout, cycle, '
            'depth_exceeded, expired or unreachable. Use it when you need the answer before '
            'you can go on; the other agent answers with reply_to_peer. While you answer '
            "another agent's request you may ask that agent a question back with this tool (it "
            "is part of its call, not a cycle). A call made while you answer another agent's "
            'call never outlives that call: its timeout is cut to what is left (clamped: true '
            'says so).'
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'properties': {
                'attachments': {
                    'default': [],
                    'description': (
                        'Files to pass on (optional, at most 16): the `ref` of each, from an '
                        '<attachment> in\ncheck_inbox or a file you uploaded; the receiver may '
                        'then read them.'
                    ),
                    'items': {
                        'type': 'string',
                    },
                    'type': 'array',
                },
                'message': {
                    'description': 'Your question or request.',
                    'type': 'string',
                },
                'receipt': {
                    'default': None,
                    'description': (
                        '"delivered" or "read" (optional): receipts in your check_inbox while '
                        'you wait, so you\ncan tell a slow answer from a question nobody has '
                        'read yet.'
                    ),
                    'type': [
                        'string',
                        'null',
                    ],
                },
                'timeout_ms': {
                    'default': None,
                    'description': (
                        'How long to wait for the answer, in milliseconds (default 30000, at '
                        'most 300000).'
                    ),
                    'format': 'uint64',
                    'minimum': 0,
                    'type': [
                        'integer',
                        'null',
                    ],
                },
                'to': {
                    'description': (
                        'The agent id to consult (from list_peers), or "skill:<name>" for one '
                        'agent that has\nthe skill.'
                    ),
                    'type': 'string',
                },
            },
            'required': [
                'to',
                'message',
            ],
            'type': 'object',
        },
        'name': 'talk_to_agent',
    },
    {
        'description': (
            'Move a task given to you through its life: accept (take it), reject (decline, say '
            'why), start, progress (a note to the requester), input_required (ask the '
            'requester a question), complete (with the result), fail (say why). Returns the '
            'task record, or an error such as illegal_transition, at_capacity or '
            'task_terminal.'
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'properties': {
                'action': {
                    'description': (
                        'The step to take (the tool description says what each one does).'
                    ),
                    'enum': [
                        'accept',
                        'reject',
                        'start',
                        'progress',
                        'input_required',
                        'complete',
                        'fail',
                    ],
                    'type': 'string',
                },
                'attachments': {
                    'default': [],
                    'description': (
                        'Files to pass on (optional, at most 16): the `ref` of each, from an '
                        '<attachment> in\ncheck_inbox or a file you uploaded; the receiver may '
                        'then read them.'
                    ),
                    'items': {
                        'type': 'string',
                    },
                    'type': 'array',
                },
                'message': {
                    'default': None,
                    'description': (
                        'The note, question, result or reason that goes with the action.'
                    ),
                    'type': [
                        'string',
                        'null',
                    ],
                },
                'task_id': {
                    'description': (
                        'The task id (the task_id attribute of the task message in '
                        'check_inbox).'
                    ),
                    'type': 'string',
                },
            },
            'required': [
                'task_id',
                'action',
            ],
            'type': 'object',
        },
        'name': 'update_task',
    },
    {
        'description': (
            'Spend an approval right before acting: succeeds once, only if a person approved '
            'exactly this tool and these arguments and it has not expired. Refusals: '
            'action_mismatch (the arguments differ from what was approved: do not act), '
            'approval_pending (not decided yet), approval_denied, approval_used (already '
            'spent), expired.'
        ),
        'inputSchema': {
            '$schema': 'https://json-schema.org/draft/2020-12/schema',
            'properties': {
                'approval_id': {
                    'description': 'The approval_id request_approval returned.',
                    'type': 'string',
                },
                'arguments': {
                    'description': 'The exact arguments you are about to pass.',
                },
                'tool': {
                    'description': 'The tool you are about to call.',
                    'type': 'string',
                },
            },
            'required': [
                'approval_id',
                'tool',
                'arguments',
            ],
            'type': 'object',
        },
        'name': 'use_approval',
    },
]
