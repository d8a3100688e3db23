"""The chat template. GPT-2 has none of its own, so chat messages become plain text, one line per
message, and the prompt ends with the assistant's turn to speak:

    System: You are terse.
    User: Hello!
    Assistant: Hi.
    User: How are you?
    Assistant:

("developer" messages read as "System"). Generation stops at the start of the next turn: the stop
sequences "\\nUser:" and "\\nSystem:" are added to the request's own."""

from __future__ import annotations

from collections.abc import Sequence

from .protocol import ChatMessage

ROLE_NAMES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}
TURN_STOPS = ["\nUser:", "\nSystem:"]


def render(messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> str:
    """The prompt text for `messages`, ending with "Assistant:" (the assistant's turn to speak)
    unless `add_generation_prompt` is False (/tokenize may ask for the conversation alone)."""
    lines = [f"{ROLE_NAMES[m.role]}: {m.text()}" for m in messages]
    return "\n".join([*lines, "Assistant:"] if add_generation_prompt else lines)


def stops(own: Sequence[str]) -> list[str]:
    """The request's stop sequences plus the turn boundaries (each once)."""
    return list(dict.fromkeys([*own, *TURN_STOPS]))
