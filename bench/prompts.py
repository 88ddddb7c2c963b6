"""Fixed prompt sets. Deterministic; each request gets a distinct prompt unless the set
is about a shared prefix, so a server's prompt cache cannot turn repeats into free hits.
"""

from __future__ import annotations

from dataclasses import dataclass

Message = dict[str, str]

TOPICS = (
    "a lighthouse keeper who finds a message in a bottle",
    "the history of the printing press",
    "how bees decide where to build a new hive",
    "a detective solving a mystery on a night train",
    "why the sky is blue, explained to a child",
    "a chef who loses their sense of taste",
    "the life cycle of a star",
    "a robot learning to paint",
    "the invention of the bicycle",
    "a village that celebrates the first snow",
    "how a river shapes a valley over a million years",
    "two friends crossing a desert",
    "the rules of chess and why they changed",
    "a musician composing a symphony in a storm",
    "the migration of arctic terns",
    "a city built under the sea",
)

_SENTENCES = (
    "The committee met on day {i} to review the maintenance log of the northern bridge.",
    "Engineers noted that section {i} showed minor corrosion near the eastern support.",
    "A sample of {i} bolts was taken to the laboratory for a tensile strength test.",
    "Traffic counts for week {i} were higher than in the same week last year.",
    "The inspector recommended repainting panel {i} before the winter season.",
    "Residents asked whether the footpath on span {i} could be widened for cyclists.",
    "The budget line for item {i} was moved to the next financial quarter.",
    "Weather data from station {i} showed strong winds on three consecutive nights.",
)

# About 1.3 SmolLM2 tokens per word; sentences above are about 15 words (20 tokens).
TOKENS_PER_SENTENCE = 20


def _document(tokens: int, seed: int) -> str:
    count = max(1, tokens // TOKENS_PER_SENTENCE)
    return " ".join(
        _SENTENCES[(seed + i) % len(_SENTENCES)].format(i=seed * 1000 + i) for i in range(count)
    )


@dataclass(frozen=True)
class PromptSet:
    name: str
    description: str

    def messages(self, index: int) -> list[Message]:
        """The chat messages of request number `index` (distinct per index)."""
        topic = TOPICS[index % len(TOPICS)]
        if self.name == "short":
            return [
                {"role": "user", "content": f"Request {index}: write a long story about {topic}."}
            ]
        if self.name == "unique":
            # Distinct from the first token: no server can reuse a cached prompt prefix.
            system = f"Session {index}. You are a helpful assistant."
            content = f"Write a long story about {topic}."
            return [{"role": "system", "content": system}, {"role": "user", "content": content}]
        if self.name == "long600":
            report = _document(560, index)
            question = f"Request {index}: summarize the report above, then write about {topic}."
            return [{"role": "user", "content": f"{report}\n\n{question}"}]
        if self.name == "prefix2k":
            # The same 2k-token system prompt for every request; only the question differs.
            return [
                {"role": "system", "content": _document(2000, 0)},
                {"role": "user", "content": f"Request {index}: answer questions about {topic}."},
            ]
        raise ValueError(f"unknown prompt set {self.name!r}")


PROMPT_SETS = {
    "short": PromptSet("short", "short chat question (about 30 prompt tokens)"),
    "unique": PromptSet("unique", "short chat whose first tokens differ (no prefix reuse)"),
    "long600": PromptSet("long600", "a 600-token document plus a question"),
    "prefix2k": PromptSet("prefix2k", "a shared 2k-token system prompt plus a short question"),
}
