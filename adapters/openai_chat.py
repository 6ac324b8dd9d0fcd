"""Chat fallback of the OpenAI client: for servers that refuse token-id prompts (hosted APIs,
chat-only endpoints), the replay's token ids become a conversation of deterministic text.

- A planned id is one common English word (" " + WORDS[id % len(WORDS)]): each a single token
  in the usual tokenizers, so a prompt's length stays close to the plan's; the server's own
  count (`usage.prompt_tokens`) is what is recorded, and the probe measures the ratio.
- What the server generates comes back as text; each streamed piece gets a synthetic id
  (>= SYNTHETIC) that stands for exactly that text, padded with empty ones to the server's
  `usage.completion_tokens`, so the next prompt carries back exactly what was generated.
- A prompt is split into messages as an agent's conversation is: runs of planned ids are user
  turns, runs of generated ids assistant turns; so the server's chat template renders earlier
  turns the same way on every call, and its prefix cache sees what a real agent would send.
"""

from __future__ import annotations

from typing import Any

CHAT_COMPLETIONS = "/v1/chat/completions"
SYNTHETIC = 1 << 40  # above any vocabulary: ids that stand for generated text
WORDS = (
    "the", "of", "and", "to", "in", "is", "for", "on", "that", "with", "as", "it", "at", "by",
    "from", "this", "be", "are", "or", "an", "was", "have", "not", "but", "all", "can", "has",
    "more", "one", "new", "will", "use", "time", "also", "data", "any", "each", "may", "other",
    "used", "when", "which", "their", "first", "two", "only", "such", "these", "some", "most",
    "its", "about", "over", "into", "than", "then", "them", "after", "where", "made", "make",
    "many", "work", "like", "well", "back", "year", "day", "part", "long", "high", "good",
    "take", "come", "find", "give", "place", "small", "large", "every", "great", "state",
    "world", "still", "under", "point", "line", "water", "form", "house", "right", "order",
    "group", "number", "show", "city", "case", "fact", "week", "night", "home", "money",
    "story", "month", "light", "level", "power", "game", "child", "class", "market", "family",
    "report", "table", "plan", "river", "price", "model", "field", "question", "course",
    "people", "system", "program", "public", "school", "health", "music", "paper", "value",
    "energy", "early", "free", "note", "head", "news", "art", "book", "test", "area", "board",
    "design", "simple", "space", "range", "sense", "plant", "voice", "issue", "study", "focus",
    "access", "store", "track", "rate",
)


class ChatText:
    """Token ids <-> chat messages, for one server (the synthetic ids' texts live here)."""

    def __init__(self) -> None:
        self._texts: dict[int, str] = {}
        self._next = SYNTHETIC

    def generated(self, text: str) -> int:
        """A new synthetic id standing for `text`."""
        sid = self._next
        self._next += 1
        self._texts[sid] = text
        return sid

    def pad(self, tokens: list[int], count: int | None) -> None:
        """Empty synthetic ids after `tokens` up to `count` (the server's completion tokens)."""
        while count is not None and len(tokens) < count:
            tokens.append(self.generated(""))

    def messages(self, ids: list[int]) -> list[dict[str, Any]]:
        """The conversation `ids` stand for: user turns of words, assistant turns of text."""
        out: list[dict[str, Any]] = []
        role: str | None = None
        parts: list[str] = []
        for i in ids:
            who = "assistant" if i >= SYNTHETIC else "user"
            if who != role and parts:
                out.append(_message(role, parts))
                parts = []
            role = who
            parts.append(self._texts.get(i, "") if who == "assistant"
                         else " " + WORDS[i % len(WORDS)])
        if parts:
            out.append(_message(role, parts))
        if not out or out[-1]["role"] != "user":  # a chat call answers a user turn
            out.append({"role": "user", "content": " " + WORDS[0]})
        return out


def _message(role: str | None, parts: list[str]) -> dict[str, Any]:
    return {"role": role or "user", "content": "".join(parts)}


def delta_text(chunk: dict[str, Any]) -> str:
    """The text a streamed chat chunk adds ('' when none)."""
    out = []
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and isinstance(delta.get("content"), str):
            out.append(delta["content"])
    return "".join(out)
