"""Error messages for constraints llguidance refuses: where in the request it went wrong.

llguidance names the problem (``Unknown format: bogus``, ``Unimplemented keys:
["uniqueItems"]``, a regex parse error with a caret); these helpers add what a client
needs to fix it: the JSON pointer in the schema, or the position in the regex.
"""

from __future__ import annotations

import re
from typing import Any

_LINE_COLUMN = re.compile(r"^(?:at )?(\d+)\((\d+)\): ")


def describe_error(kind: str, value: Any, message: str) -> str:
    """llguidance's message, with the schema path or the regex position it is about."""
    what = {
        "json_schema": "invalid JSON schema",
        "json_object": "invalid JSON schema",
        "regex": "invalid regex",
        "choice": "invalid choice",
        "grammar": "invalid grammar",
    }[kind]
    regex = _regex_error(message)
    if regex is not None:
        pattern, position, reason = regex
        where = ""
        if kind == "json_schema":
            path = _find(value, pattern, "#")
            where = f" at {path}" if path else ""
        return f"{what}{where}: regex {pattern!r} at position {position}: {reason}"
    if kind == "grammar":  # "at 2(3): ..." then an echo of the grammar: keep the first line
        first = message.strip().splitlines()[0] if message.strip() else ""
        message = _LINE_COLUMN.sub(r"line \1, column \2: ", first)
    message = " ".join(message.split())[:500] or "invalid constraint"
    if kind == "json_schema":
        path = locate(value, message)
        if path is not None:
            return f"{what} at {path}: {message}"
    return f"{what}: {message}"


def _regex_error(message: str) -> tuple[str, int, str] | None:
    """(pattern, 0-based position, reason) from a regex parse error's echo and caret."""
    lines = (
        message.split("regex parse error:", 1)[-1].splitlines()[1:]
        if ("regex parse error:" in message)
        else []
    )
    if len(lines) < 3 or "^" not in lines[1]:
        return None
    echoed, caret = lines[0], lines[1]
    indent = len(echoed) - len(echoed.lstrip(" "))
    reason = lines[2].removeprefix("error:").strip()
    return echoed[indent:], max(0, caret.index("^") - indent), reason


def locate(schema: Any, message: str) -> str | None:
    """The JSON pointer of the last keyword or value the message names, if any."""
    words = [w.strip("'\"`.,()[]") for w in message.replace(": ", " ").split()]
    for word in reversed(words):
        if word and word.lower() not in _PROSE:
            found = _find(schema, word, "#")
            if found is not None:
                return found
    return None


# Words of llguidance's messages that are not schema names.
_PROSE = frozenset(
    {"a", "an", "the", "is", "does", "exist", "unknown", "invalid", "unimplemented",
     "keys", "key", "type", "value", "of", "for", "in", "and", "or", "must", "be", "pointer"}
)  # fmt: skip


def _find(node: Any, word: str, path: str) -> str | None:
    if isinstance(node, dict):
        for key, child in node.items():
            here = f"{path}/{key}"
            if key == word or (isinstance(child, str) and _names(child, word)):
                return here
        for key, child in node.items():
            found = _find(child, word, f"{path}/{key}")
            if found is not None:
                return found
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found = _find(child, word, f"{path}/{index}")
            if found is not None:
                return found
    return None


def _names(value: str, word: str) -> bool:
    # A $ref's pointer is quoted without its leading "#".
    return value == word or (word.startswith("/") and value == "#" + word)
