"""The one error the parser registries raise."""

from __future__ import annotations

from collections.abc import Sequence


class UnknownParserError(KeyError):
    """A configured parser name that no parser answers to; the message lists the valid
    names so a config error can be fixed from the message alone."""

    def __init__(self, kind: str, name: str, valid: Sequence[str]) -> None:
        self.kind = kind
        self.name = name
        self.valid = tuple(valid)
        super().__init__(name)

    def __str__(self) -> str:
        # KeyError.__str__ would show only repr(name).
        return f"unknown {self.kind} parser {self.name!r}; valid names: {', '.join(self.valid)}"
