"""One place decides where an assistant's turn ends (`chat.turn_stops`) and whether a template can hold a conversation
(`chat.check_template`); `conversation.Conversation` keeps a conversation within the context (refusing, or dropping
its oldest exchanges) and streams each reply (`Reply`: cut at the turn's end, stoppable, with its finish reason).
On the shipped GPT-2 (its copies with test templates) and the real SmolLM2 file, on the CPU device."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from chat_fixtures import CHATML, IM_END, with_template  # noqa: E402
from smollm2 import smollm2_gguf  # noqa: E402

import webtensor as wt  # noqa: E402
from webtensor.chat import (  # noqa: E402
    PLAIN_STOPS,
    PLAIN_TEMPLATE,
    ChatTemplate,
    TurnStops,
    check_template,
    stops_for,
    turn_stops,
)
from webtensor.conversation import Conversation  # noqa: E402
from webtensor.errors import ChatTemplateError, ContextLengthError  # noqa: E402
from webtensor.models import loader  # noqa: E402

ARITHMETIC = [m for a in range(1, 5) for m in ({"role": "user", "content": f"What is {a} + {a}?"},
                                                {"role": "assistant", "content": f"{2 * a}."})]


@pytest.fixture(scope="module", autouse=True)
def one_blas_thread():
    """numpy's BLAS on one thread, as `webtensor chat` runs it (its default --blas-threads 1)."""
    from webtensor.backends import blas

    before = blas.threads()
    if before is not None:
        blas.set_threads(1)
    yield
    if before is not None:
        blas.set_threads(before)


@pytest.fixture(scope="module")
def shipped():
    return wt.load_model(None, "cpu")


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    """The shipped GPT-2 with a ChatML template whose turns end with <|im_end|> (id IM_END, not its EOS)."""
    return wt.load_model(with_template(tmp_path_factory.mktemp("chatml") / "model", CHATML, im_end=True), "cpu")


@pytest.fixture(scope="module")
def smollm2():
    return wt.load_model(smollm2_gguf(), "cpu", n_ctx=256)


# -- where a turn ends ------------------------------------------------------------------------------------------
def test_turn_stops_follow_the_template(shipped, chatml, smollm2):
    assert turn_stops(shipped) == TurnStops(tuple(PLAIN_STOPS))  # no template: the next "User:" / "System:"
    assert stops_for(shipped) == PLAIN_STOPS and stops_for(chatml) == []  # (the strings alone)
    assert turn_stops(chatml) == TurnStops((), (IM_END,))  # ChatML's <|im_end|>, not an EOS id here
    assert turn_stops(smollm2) == TurnStops()  # ChatML's <|im_end|> is SmolLM2's EOS already
    ck = loader.open_checkpoint(smollm2_gguf())  # (what the CLI checks before loading: the same answer)
    assert turn_stops(ck) == TurnStops()


def test_a_reply_ends_at_the_templates_end_of_turn_token(chatml):
    """<|im_end|> forced as the first token (logit_bias): generation left alone goes on past it; the reply ends there,
    empty, with finish "stop"."""
    ids = chatml.apply_chat_template([{"role": "user", "content": "Good morning."}], tokenize=True)
    raw = chatml.generate(ids, 4, logit_bias={IM_END: 100})
    assert raw[0] == IM_END and len(raw) == 4  # (not an EOS: without the turn's stop, it runs on)
    conv = Conversation(chatml, max_new_tokens=4)
    turn = conv.prepare("Good morning.")
    assert turn.ids == ids
    reply = conv.reply(turn, logit_bias={IM_END: 100})
    assert list(reply) == [] and reply.finish == "stop" and reply.n_tokens == 1


def test_plain_template_reply_ends_before_the_invented_turn(smollm2):
    """SmolLM2 under the plain template copies the conversation's pattern and writes "\\nUser: ..." itself; the reply
    is the text before it, and the invented turn does not become part of the conversation."""
    own, smollm2.chat_template = smollm2.chat_template, None
    try:
        conv = Conversation(smollm2, max_new_tokens=32)
        conv.history = list(ARITHMETIC)
        turn = conv.prepare("What is 5 + 5?")
        raw = smollm2.decode(smollm2.generate(turn.ids, 32, stop_at_eos=False))
        assert "\nUser:" in raw  # what the model does when nothing stops it
        reply = conv.reply(turn, temperature=0)
        pieces = list(reply)
        assert reply.finish == "stop" and "".join(pieces) == raw[:raw.index("\nUser:")].strip()
        conv.commit(turn, reply)
        assert conv.messages[-1] == {"role": "assistant", "content": reply.text} and "User:" not in reply.text
    finally:
        smollm2.chat_template = own


# -- the template, checked at load ------------------------------------------------------------------------------
@pytest.mark.parametrize(("template", "system", "message"), [
    ("{% if %}", None, "chat template syntax error on line 1: Expected an expression, got 'end of statement block'"),
    ("{{ messages[5]['content'] }}", None,
     "the chat template failed to render this conversation: UndefinedError: list object has no element 5 "
     "(checked with one user message)"),
    ("{% for m in messages %}{% if loop.index > 1 %}{{ raise_exception('one message only') }}{% endif %}"
     "{{ m['content'] }}{% endfor %}", None,
     "the chat template refused this conversation: one message only (checked with a question, an answer and a "
     "question)"),
    ("{% for m in messages %}{{ m['role'] }}{% endfor %}", None,
     "the chat template leaves out a message's text ('Hello, who are you?') when it renders one user message"),
    ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}{% endif %}"
     "{{ m['content'] }}{% endfor %}", "Be brief.",
     "the chat template refused this conversation: no system (checked with a system message and one user message)"),
])
def test_check_template_names_what_fails(tmp_path, template, system, message):
    ck = loader.open_checkpoint(with_template(tmp_path / "model", template))
    with pytest.raises(ChatTemplateError) as e:
        check_template(ck, system)
    assert str(e.value) == message


def test_check_template_passes_real_templates(shipped, chatml, smollm2):
    for model in (shipped, chatml, smollm2):
        check_template(model)
        check_template(model, "You are terse.")


def test_plain_template_renders_content_parts_as_text():
    t = ChatTemplate(PLAIN_TEMPLATE)
    parts = [{"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
             {"role": "user", "content": [{"type": "text", "text": "Hi"}]}, {"role": "assistant", "content": None},
             {"role": "developer", "content": "Dev."}]
    assert t.render(parts) == "System: Be brief.\nUser: Hi\nAssistant: \nSystem: Dev.\nAssistant:"
    with pytest.raises(ChatTemplateError, match="renders text parts only, not image_url"):
        t.render([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(ChatTemplateError, match="renders system, developer, user and assistant messages, not tool"):
        t.render([{"role": "tool", "content": "42"}])


# -- a conversation within the context --------------------------------------------------------------------------
def test_a_conversation_past_the_context_is_refused_and_left_as_it_was(shipped):
    conv = Conversation(shipped, system="Be brief.")
    conv.history = [m for _ in range(12) for m in ({"role": "user", "content": "Tell me of the ball at Netherfield."},
                                                   {"role": "assistant", "content": "It was a fine ball. " * 3})]
    before = conv.messages
    with pytest.raises(ContextLengthError, match=r"^the conversation with this message is \d+ tokens, over the "
                                                 r"context of 256 positions$"):
        conv.prepare("And then?")
    assert conv.messages == before
    conv.reset()
    assert conv.messages == [{"role": "system", "content": "Be brief."}]
    assert conv.prepare("And then?").room > 0
    with pytest.raises(ContextLengthError, match=r"^this message is \d+ tokens as the chat template renders it after "
                                                 r"the system message, over the context of 256 positions$"):
        conv.prepare("word " * 300)


def test_drop_oldest_drops_whole_exchanges_and_keeps_the_system_message(shipped):
    conv = Conversation(shipped, system="Be brief.", drop_oldest=True, max_new_tokens=40)
    exchanges = [[{"role": "user", "content": f"Question {i}: tell me of the ball at Netherfield."},
                  {"role": "assistant", "content": f"Answer {i}: it was a fine ball, and " * 3}] for i in range(12)]
    conv.history = [m for e in exchanges for m in e]
    turn = conv.prepare("And then?")
    assert turn.dropped > 0 and turn.room >= 40
    kept = turn.messages[1:-1]
    assert turn.messages[0] == {"role": "system", "content": "Be brief."}
    assert kept == [m for e in exchanges[turn.dropped:] for m in e]  # the newest exchanges, whole, in order
    assert turn.messages[-1] == {"role": "user", "content": "And then?"}
    assert len(conv.history) == 24  # (nothing changes until the reply is committed)
    reply = conv.reply(turn, temperature=0)
    list(reply)
    conv.commit(turn, reply)
    assert conv.history == [*turn.messages[1:], {"role": "assistant", "content": reply.text}]


def test_a_stopped_reply_keeps_what_it_said(shipped):
    conv = Conversation(shipped, max_new_tokens=60)
    turn = conv.prepare("Good morning, madam.")
    reply = conv.reply(turn, temperature=0)
    pieces = []
    for piece in reply:
        pieces.append(piece)
        if len(pieces) == 3:
            reply.stop()  # (what the chat's SIGINT handler does)
    assert reply.finish == "interrupted" and reply.n_tokens < 10
    assert reply.text == "".join(pieces).strip() and reply.text
    conv.commit(turn, reply)
    assert conv.history[-1] == {"role": "assistant", "content": reply.text}
    again = conv.prepare("Again?")
    empty = conv.reply(again, temperature=0)
    empty.stop()
    assert list(empty) == [] and empty.finish == "interrupted"
    conv.commit(again, empty)  # interrupted before any text: the conversation stays as it was
    assert len(conv.history) == 2 and conv.history[-1] == {"role": "assistant", "content": reply.text}


def test_reply_finish_reasons(shipped):
    conv = Conversation(shipped, max_new_tokens=3)
    reply = conv.reply(conv.prepare("Good morning."), temperature=0)
    list(reply)
    assert (reply.finish, reply.n_tokens) == ("length", 3)
    conv = Conversation(shipped)  # no limit: the rest of the context
    conv.history = [{"role": "user", "content": "Tell me of the ball."},
                    {"role": "assistant", "content": "It was a fine ball, and the young ladies " * 20}]
    turn = conv.prepare("Good morning.")
    reply = conv.reply(turn, temperature=0)
    text = "".join(reply)
    assert (reply.finish, reply.n_tokens) == ("context", turn.room) and turn.room < 256 // 4
    assert text.strip() == reply.text and "User:" not in text
