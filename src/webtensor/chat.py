"""Chat templates: a conversation rendered as the model's own jinja2 template renders it (as transformers renders
it), or, for a model without one (GPT-2), webtensor's plain template:

    System: You are terse.
    User: Hello!
    Assistant: Hi.
    User: How are you?
    Assistant:

("developer" messages read as "System"); generation with the plain template stops at the start of the next
turn (`PLAIN_STOPS`)."""

from __future__ import annotations

from typing import Any

PLAIN_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{ {'system': 'System', 'developer': 'System', 'user': 'User', 'assistant': 'Assistant'}[m['role']] }}: "
    "{{ m['content'] }}\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}Assistant:{% endif -%}")
PLAIN_STOPS = ["\nUser:", "\nSystem:"]


def template_for(model: Any) -> Any:
    """The ChatTemplate a model renders conversations with (its own, or the plain one)."""
    tok = model.tokenizer
    source = model.chat_template or PLAIN_TEMPLATE
    return ChatTemplate(source, bos_token=getattr(tok, "bos_token", "") or "",
                        eos_token=getattr(tok, "eos_token", "") or "")


def stops_for(model: Any) -> list[str]:
    """Stop strings a chat needs besides the model's EOS ids: the plain template's turn boundaries."""
    return [] if model.chat_template else list(PLAIN_STOPS)


class ChatTemplate:
    """A jinja2 chat template, rendered in a sandbox as transformers renders it."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        import jinja2.sandbox

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self.template = env.from_string(source)
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: Any, add_generation_prompt: bool = True, **kwargs: Any) -> str:
        return self.template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                    bos_token=self.bos_token, eos_token=self.eos_token, **kwargs)
