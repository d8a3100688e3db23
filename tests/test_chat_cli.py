"""`webtensor chat` as a person meets it, with the shipped GPT-2 and the real SmolLM2-135M-Instruct Q4_1 file: through
a pseudo-terminal (Ctrl-C typed there: a real SIGINT from the terminal driver, mid-reply; Ctrl-D; a line that is not
UTF-8; a template that raises; /help) and through a pipe (the issue's printf example: a conversation past the
context, /reset, the next message answered; --drop-oldest; the plain template's turns cut where the next one starts).
Every error of a turn is one `webtensor: error:` line and the session goes on; a template that cannot hold a
conversation is refused when the model opens, before its weights load."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from chat_fixtures import Terminal, env, with_template  # noqa: E402
from smollm2 import smollm2_gguf  # noqa: E402

CPU = ("--device", "cpu")
RAISING = ("{% for m in messages %}{% if 'secret' in m['content'] %}{{ raise_exception('no secrets here') }}"
           "{% endif %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
           "{% if add_generation_prompt %}assistant:{% endif %}")


def chat(*args: str, stdin: bytes) -> subprocess.CompletedProcess[str]:
    """`webtensor chat ARGS` with `stdin` piped in (greedy unless ARGS say otherwise)."""
    r = subprocess.run([sys.executable, "-m", "webtensor", "chat", *CPU, "-t", "0", *args], input=stdin, env=env(),
                       capture_output=True, timeout=240)
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(), r.stderr.decode())


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("webtensor: error:")]


@pytest.fixture(scope="module")
def raising(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped GPT-2 with a template that refuses any message mentioning a secret."""
    return with_template(tmp_path_factory.mktemp("raising") / "model", RAISING)


# -- through a pipe -------------------------------------------------------------------------------------------
def test_the_issues_printf_example_goes_on_past_the_context():
    """printf 'Hi\\nTell me about Paris.\\nAnd London?\\n/reset\\nHi\\n' | webtensor chat -m SmolLM2 -t 0 -c 64: the
    second reply is cut by the context and says so, the third message is refused with /reset named, /reset works and
    the last "Hi" gets the first one's answer; exit 0."""
    r = chat("-m", str(smollm2_gguf()), "-c", "64", stdin=b"Hi\nTell me about Paris.\nAnd London?\n/reset\nHi\n")
    assert r.returncode == 0, r.stderr
    replies = r.stdout.splitlines()
    assert len(replies) == 3 and all(replies), r.stdout
    assert replies[2] == replies[0]  # the conversation really started over (greedy: the same answer)
    assert "[reply cut: the context of 64 positions is full" in r.stderr
    [err] = errors(r.stderr)
    assert re.fullmatch(r"webtensor: error: the conversation with this message is \d+ tokens, over the context of "
                        r"64 positions: /reset starts the conversation over; --drop-oldest drops the oldest "
                        r"exchanges instead", err), err
    assert "[the conversation starts over]" in r.stderr


@pytest.mark.slow  # (SmolLM2 on the CPU device: several replies)
def test_drop_oldest_answers_every_message():
    r = chat("-m", str(smollm2_gguf()), "-c", "96", "-n", "12", "--drop-oldest",
             stdin=b"Hi\nTell me about Paris.\nAnd London?\nAnd Rome?\n")
    assert r.returncode == 0, r.stderr
    assert not errors(r.stderr), r.stderr
    assert len(r.stdout.splitlines()) == 4 and all(r.stdout.splitlines()), r.stdout
    assert re.search(r"\[dropped the (\d+ )?oldest exchanges? to make room in the context of 96 positions\]",
                     r.stderr), r.stderr
    r = chat("-c", "64", "--drop-oldest", stdin=b"Good morning.\n" + b"word " * 80 + b"\nGood day.\n")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stderr
    [err] = errors(r.stderr)
    assert re.fullmatch(r"webtensor: error: this message is \d+ tokens as the chat template renders it, over the "
                        r"context of 64 positions: shorten the message, or give the chat a larger --ctx-size", err), err


@pytest.mark.slow  # (SmolLM2 on the CPU device: several replies)
def test_plain_template_replies_end_where_the_next_turn_starts():
    """SmolLM2 under the plain "User: / Assistant:" template (--chat-template plain) copies the conversation's pattern
    and writes the user's next turn itself (test_conversation.py shows it does); the chat cuts the reply there, so
    no reply holds a "User:" line and each reply is one answer."""
    questions = [f"What is {a} + {a}?" for a in range(1, 4)]
    r = chat("-m", str(smollm2_gguf()), "-c", "256", "-n", "24", "--chat-template", "plain",
             stdin="".join(q + "\n" for q in questions).encode())
    assert r.returncode == 0, r.stderr
    assert not errors(r.stderr)
    assert "User:" not in r.stdout and "Assistant:" not in r.stdout, r.stdout
    assert r.stderr.count("[reply cut at -n 24 tokens]") < len(questions)  # some ended at the turn, not at -n


def test_input_that_is_not_utf8_and_commands(raising):
    """A line that is not UTF-8, a message the template refuses and an unknown command: one error line each, the
    session goes on; /help lists the commands and is not sent; // sends a message starting with "/"; CRLF endings
    and a byte-order mark are read as text."""
    stdin = (b"\xef\xbb\xbfHello there\r\n\xff\xfe not text\n/nope\ntell me a secret\n/help\n/system\n"
             b"/system Be brief.\n/system\n//slash message\n/bye\nnever read\n")
    r = chat("-m", str(raising), "-n", "4", stdin=stdin)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2, r.stdout  # "Hello there" and "/slash message": two replies
    errs = errors(r.stderr)
    assert errs == [
        "webtensor: error: line 2 is not UTF-8 text: byte 0xff at offset 0 (invalid start byte); it was not sent",
        "webtensor: error: unknown command /nope: /help lists the commands (start a message with // to send one "
        "that begins with /)",
        "webtensor: error: the chat template refused this conversation: no secrets here",
    ], r.stderr
    for cmd in ("/help", "/reset", "/system [TEXT]", "/exit /bye /quit", "//TEXT"):
        assert cmd in r.stderr
    assert "no system message" in r.stderr and "system message: Be brief." in r.stderr


def test_a_reply_cut_by_max_new_tokens_says_so():
    r = chat("-n", "3", stdin=b"Good morning, madam.\n")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert "[reply cut at -n 3 tokens]" in r.stderr


@pytest.mark.parametrize(("template", "message"), [
    ("{% for m in messages %}{{ m['content'] }", "chat template syntax error on line 1"),
    ("{{ raise_exception('this template is broken') }}", "this template is broken (checked with one user message)"),
    ("{% for m in messages %}{{ m['role'] }}{% endfor %}", "the chat template leaves out a message's text"),
])
def test_a_template_that_cannot_hold_a_conversation_is_refused_before_loading(tmp_path, template, message):
    d = with_template(tmp_path / "model", template)
    for args, which in ((("-m", str(d)), "the model's chat template"),
                        (("--chat-template", str(d / "chat_template.jinja")), f"the chat template {d}")):
        r = chat(*args, stdin=b"Hi\n")
        assert r.returncode == 1 and r.stdout == "", r.stderr
        [line] = r.stderr.splitlines()  # (before the model line: no weights were loaded)
        assert line.startswith(f"webtensor: error: {which}") and " cannot hold a conversation: " in line, line
        assert message in line, line


def test_a_system_message_the_template_refuses_is_a_usage_error(tmp_path):
    d = with_template(tmp_path / "model", "{% for m in messages %}{% if m['role'] == 'system' %}"
                                          "{{ raise_exception('System role not supported') }}{% endif %}"
                                          "{{ m['content'] }}\n{% endfor %}")
    r = chat("-m", str(d), "--system", "Be brief.", stdin=b"Hi\n")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == ("webtensor: error: --system: the chat template refused this conversation: System role "
                                "not supported (checked with a system message and one user message)")
    r = chat("--chat-template", str(tmp_path / "missing.jinja"), stdin=b"Hi\n")
    assert r.returncode == 2 and "--chat-template" in r.stderr and "No such file" in r.stderr


# -- through a terminal ---------------------------------------------------------------------------------------
def test_ctrl_c_stops_the_reply_and_the_session_goes_on():
    """Ctrl-C typed mid-reply (SIGINT from the terminal driver): the reply stops within moments, says so, and the
    prompt comes back; /help is answered by the chat, not the model; the next message is answered; Ctrl-D ends
    the session with status 0."""
    t = Terminal("chat", "-m", str(smollm2_gguf()), *CPU, "-t", "0", "-c", "256")
    try:
        t.expect(rb"/help lists the commands.*> ")
        t.send(b"Tell me a long story about a dragon.\n")
        t.expect(rb"dragon\.\r\n.{24}")  # the reply has begun (it would run on for hundreds of tokens)
        sent = time.monotonic()
        t.send(b"\x03")
        t.expect(rb"\[reply stopped\]\r\n> ")
        assert time.monotonic() - sent < 20
        t.send(b"/help\n")
        t.expect(rb"/reset /clear.*Ctrl-C stops a reply.*?\r\n> ")
        t.send(b"Thank you.\n")
        t.expect(rb"Thank you\.\r\n.+?\r\n> ")
        t.send(b"\x04")
        assert t.wait() == 0
    finally:
        t.close()
    assert b"Traceback" not in t.out and b"webtensor: error" not in t.out, t.out


def test_terminal_errors_and_ctrl_c_at_the_prompt(raising, tmp_path):
    """Typing at a terminal with the replies going to a file (`webtensor chat > replies.txt`: no readline, the line
    read as the terminal sends it): a line that is not UTF-8 and a message the template refuses are said, and the
    session goes on to answer the next one; Ctrl-C at the prompt ends it with status 130, without a traceback."""
    replies = tmp_path / "replies.txt"
    t = Terminal("chat", "-m", str(raising), *CPU, "-n", "5", stdout=replies)
    try:
        t.expect(rb"> ")
        t.send(b"caf\xe9 au lait\n")
        t.expect(rb"webtensor: error: line 1 is not UTF-8 text: byte 0xe9 at offset 3 .*it was not sent\r\n> ")
        t.send(b"what is your secret?\n")
        t.expect(rb"webtensor: error: the chat template refused this conversation: no secrets here\r\n> ")
        t.send(b"Good day to you.\n")
        t.expect(rb"\[reply cut at -n 5 tokens\]\r\n> ")
        t.send(b"\x03")
        assert t.wait() == 130
    finally:
        t.close()
    assert b"Traceback" not in t.out and b"interrupted" not in t.out, t.out
    assert len(replies.read_text().splitlines()) == 1 and replies.read_text().strip()  # the one reply


# -- in process ------------------------------------------------------------------------------------------------
def test_a_failing_generation_is_said_and_the_next_message_answered(monkeypatch, capsys):
    """A generation that fails (here the device's error on the first call) is one error line; the message is not
    kept, and the next one is answered in a conversation without it."""
    import io

    import webtensor as wt
    from webtensor.chat_cli import Session
    from webtensor.conversation import Conversation
    from webtensor.errors import GPUError

    model = wt.load_model(None, "cpu")
    real, calls = model.generate_ids, []

    def failing_once(*args, **kw):
        calls.append(args[0])
        if len(calls) == 1:
            raise GPUError("the device was lost (test)")
        return real(*args, **kw)

    monkeypatch.setattr(model, "generate_ids", failing_once)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"First question.\nSecond question.\n")))
    conv = Conversation(model, max_new_tokens=4)
    assert Session(model, conv, {"temperature": 0}).run() == 0
    out, err = capsys.readouterr()
    assert errors(err) == ["webtensor: error: the device was lost (test) (the message was not kept)"]
    assert len(out.splitlines()) == 1 and out.strip()
    assert [m["content"] for m in conv.messages] == ["Second question.", out.strip()]


def test_the_first_sigint_asks_the_reply_to_stop_the_second_interrupts():
    import os
    import signal

    from webtensor.chat_cli import _stopped_by_sigint

    asked = []
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), _stopped_by_sigint(lambda: asked.append(1)):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        assert asked == [1]
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    assert asked == [1] and signal.getsignal(signal.SIGINT) is before


def test_a_closed_stdout_ends_the_chat_quietly(tmp_path):
    """`webtensor chat | head -c 1`: the reader goes after the first byte, the next reply's write fails, and the
    chat ends with status 141 and nothing on stderr but its model line, as `generate` does."""
    script = (f'printf "Good morning.\\nGood day.\\nFarewell.\\n" | "{sys.executable}" -m webtensor chat '
              '--device cpu -t 0 2> err.txt | head -c 1; echo " ${PIPESTATUS[1]}"')
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env(), capture_output=True, text=True,
                         timeout=120).stdout
    rc = int(out.rsplit(" ", 1)[1])
    err = (tmp_path / "err.txt").read_text()
    assert rc == 141, (rc, err)
    assert [line for line in err.splitlines() if not line.startswith("[webtensor] model")] == [], err


def test_a_message_of_several_lines_between_triple_quotes(monkeypatch, capsys):
    """As in Ollama's chat: \"\"\" opens a message that runs over lines (a line starting with "/" in it is text) up to a
    line ending with \"\"\"; one reply each."""
    import io

    import webtensor as wt
    from webtensor.chat_cli import Session
    from webtensor.conversation import Conversation

    model = wt.load_model(None, "cpu")
    stdin = b'"""First line\nsecond line\n/not a command\n"""\n"""Just one."""\n"""Unfinished\nat the end'
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    conv = Conversation(model, max_new_tokens=3)
    assert Session(model, conv, {"temperature": 0}).run() == 0
    out, err = capsys.readouterr()
    assert not errors(err) and len(out.splitlines()) == 3, (out, err)
    assert [m["content"] for m in conv.messages if m["role"] == "user"] == [
        "First line\nsecond line\n/not a command", "Just one.", "Unfinished\nat the end"]


THINKING = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: <think>\n{% endif %}")  # (opens the thinking; </think> known)


@pytest.mark.parametrize("hide", [False, True])
def test_a_reasoning_models_thinking_is_shown_dimmed_or_hidden(tmp_path, monkeypatch, capsys, hide):
    """A template that opens a <think> block: the reply's thinking (up to </think>) is written dimmed on a terminal
    (plain through a pipe, as here), then the answer on a line of its own; --hide-thinking leaves it out."""
    import io

    import webtensor as wt
    from webtensor.chat_cli import Session
    from webtensor.conversation import Conversation

    model = wt.load_model(with_template(tmp_path / "m", THINKING + "{# </think> #}"), "cpu")
    said = model.encode("The user greets me.</think>\n\nGood day to you!")

    def scripted(*args, **kw):
        yield from said
    monkeypatch.setattr(model, "generate_ids", scripted)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"Hello.\n")))
    assert Session(model, Conversation(model, max_new_tokens=len(said) + 2), {"temperature": 0},
                   hide_thinking=hide).run() == 0
    out = capsys.readouterr().out
    assert out == ("Good day to you!\n" if hide else "The user greets me.\nGood day to you!\n")
