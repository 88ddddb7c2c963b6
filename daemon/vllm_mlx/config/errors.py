"""A configuration problem, located by origin, line and key path, and the YAML positions
that locate it. Both the YAML config (config/file.py) and the MCP JSON file
(config/mcp_file.py) report through these."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import yaml

KeyPath = tuple[str | int, ...]


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in the configuration, located as precisely as its origin allows."""

    key_path: str
    message: str
    origin: str  # the file path, "environment variable NAME", or "command line"
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = self.origin
        if self.line is not None:
            where += f":{self.line}:{self.column or 1}"
        key = f" {self.key_path}:" if self.key_path else ""
        return f"{where}:{key} {self.message}"


@dataclass
class ConfigError(Exception):
    issues: list[ConfigIssue] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(str(issue) for issue in self.issues)


class KeyPositions:
    """Line/column of every key and list item in a YAML document (1-based)."""

    def __init__(self) -> None:
        self.marks: dict[KeyPath, tuple[int, int]] = {}
        self.duplicates: list[tuple[KeyPath, int, int]] = []

    def walk(self, node: yaml.Node, path: KeyPath) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = str(key_node.value)
                child = (*path, key)
                mark = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                if child in self.marks:
                    self.duplicates.append((child, *mark))
                self.marks[child] = mark
                self.walk(value_node, child)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                child = (*path, index)
                self.marks[child] = (item.start_mark.line + 1, item.start_mark.column + 1)
                self.walk(item, child)

    def locate(self, path: KeyPath) -> tuple[int, int] | None:
        """The closest located ancestor (a missing key is reported at its parent)."""
        for end in range(len(path), 0, -1):
            if path[:end] in self.marks:
                return self.marks[path[:end]]
        return None


def format_key_path(path: Sequence[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
