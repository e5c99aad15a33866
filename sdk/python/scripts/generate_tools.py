#!/usr/bin/env python3
"""Writes switchboard/_tool_specs.py: the tools of `switchboard mcp` (docs/mcp-tools.json, each
tool's name, description and inputSchema exactly as the MCP server lists them) as a Python
literal, so the installed package carries them without reading outside its folder. Run it
after docs/mcp-tools.json changes; the suite's test_tools.py fails while the module is stale.

    python sdk/python/scripts/generate_tools.py [--check]
"""

import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE.parents[2] / "docs" / "mcp-tools.json"
OUT = HERE.parent / "switchboard" / "_tool_specs.py"

HEADER = '''"""The tools of `switchboard mcp`: name, description and inputSchema of each, as the MCP
server lists them. Generated from docs/mcp-tools.json by scripts/generate_tools.py; do not edit
(tests/test_tools.py fails while it is stale)."""

# generated from docs/mcp-tools.json; do not edit

'''

WIDTH = 99


def literal(value, indent: int, column: int | None = None) -> str:
    """`value` (JSON) as a Python literal, laid out one item a line, long strings split at
    spaces into adjacent literals (the same value, whatever the Python version)."""
    pad = " " * indent
    inner = " " * (indent + 4)
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return string(value, indent, indent if column is None else column)
    if isinstance(value, list):
        if not value:
            return "[]"
        items = [inner + literal(item, indent + 4, indent + 4) + "," for item in value]
        return "[\n" + "\n".join(items) + "\n" + pad + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = []
        for key, item in value.items():
            head = f"{inner}{key!r}: "
            items.append(head + literal(item, indent + 4, len(head)) + ",")
        return "{\n" + "\n".join(items) + "\n" + pad + "}"
    raise TypeError(f"not JSON: {value!r}")


def string(text: str, indent: int, column: int) -> str:
    """A string literal starting at `column`; one longer than the line becomes adjacent
    literals in parentheses."""
    whole = repr(text)
    if column + len(whole) + 1 <= WIDTH:
        return whole
    room = WIDTH - indent - 8
    chunks, current = [], ""
    for word in text.split(" "):
        piece = word if not current else " " + word
        if current and len(repr(current + piece)) > room:
            chunks.append(current + " ")
            current = word
        else:
            current += piece
    chunks.append(current)
    assert "".join(chunks) == text
    pad = " " * (indent + 4)
    return "(\n" + "\n".join(pad + repr(chunk) for chunk in chunks) + "\n" + " " * indent + ")"


def generate() -> str:
    tools = json.loads(SOURCE.read_text())
    if not isinstance(tools, list) or not all(
            isinstance(tool, dict) and {"name", "description", "inputSchema"} <= tool.keys()
            for tool in tools):
        raise SystemExit(f"{SOURCE}: expected a list of {{name, description, inputSchema}}")
    text = HEADER + "TOOLS = " + literal(tools, 0) + "\n"
    namespace: dict = {}
    exec(compile(text, str(OUT), "exec"), namespace)  # the literal is the JSON, exactly
    assert namespace["TOOLS"] == tools
    return text


if __name__ == "__main__":
    text = generate()
    if "--check" in sys.argv:
        sys.exit(0 if OUT.exists() and OUT.read_text() == text else 1)
    OUT.write_text(text)
    print(f"wrote {OUT}")
