"""`webtensor serve` and chat templates. A template that cannot render a simple conversation is found when the server
starts: a warning names its error, and the server serves as vLLM does (completions need no template), answering each
request that needs the template with a 400 that names the error. A template whose turn ends with a special token
other than the EOS ends chat and responses replies there (`chat.turn_stops`, the chat CLI's and the page's rule too).
/tokenize gives special tokens' text; a message whose content is an empty list is refused, as one whose content is
null (OpenAI's schema: text or at least one part; null for an assistant only)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from chat_fixtures import CHATML, IM_END, with_template  # noqa: E402
from chat_fixtures import env as s_env  # noqa: E402
from serve_helpers import MODEL, Server, assert_openai_error, post  # noqa: E402

BROKEN = "{% for m in messages %}{{ m['content'] }"  # (an unclosed expression)


def _start(model: Path, *extra: str) -> tuple[Server, list[str]]:
    """A server of `model` on the CPU device, and what it said on stderr before it served."""
    s = Server.cli("--device", "cpu", "--max-batch", "2", "-m", str(model), *extra)
    said = []
    while not said or not said[-1].startswith("[webtensor] serving"):
        said.append(s.proc.stdout.readline().rstrip("\n"))
    return s, said


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    s, said = _start(with_template(tmp_path_factory.mktemp("broken") / "model", BROKEN))
    yield s, said
    s.stop()


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    s, _ = _start(with_template(tmp_path_factory.mktemp("chatml") / "model", CHATML, im_end=True))
    yield s
    s.stop()


def test_a_broken_template_is_said_at_start_and_answered_per_request(broken):
    s, said = broken
    [warning] = [line for line in said if "warning" in line]
    assert warning.startswith("webtensor: warning: the model's chat template cannot render conversations: chat "
                              "template syntax error on line 1"), said
    name = "model"
    for path, body, param in (
            ("/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "Hi"}]}, "messages"),
            ("/v1/responses", {"model": name, "input": "Hi"}, "input"),
            ("/tokenize", {"messages": [{"role": "user", "content": "Hi"}]}, "messages")):
        status, out, _ = post(s.url + path, body)
        assert status == 400, (path, out)
        err = assert_openai_error(out, "invalid_request_error")
        assert err["param"] == param and err["code"] == "chat_template_error", err
        assert "chat template syntax error on line 1" in err["message"] and "/v1/completions" in err["message"]
    status, out, _ = post(s.url + "/v1/completions", {"model": name, "prompt": "It was a fine morning",
                                                      "max_tokens": 4, "temperature": 0})
    assert status == 200 and out["choices"][0]["text"], out
    assert s.health()["status"] == "ok"


def test_chat_template_option_replaces_the_models(tmp_path):
    """--chat-template plain on the model with the broken template: no warning, and chats are answered with the
    plain template (its turn markers as stops); a file that cannot be read is refused before anything starts."""
    model = with_template(tmp_path / "model", BROKEN)
    s, said = _start(model, "--chat-template", "plain")
    try:
        assert not [line for line in said if "warning" in line], said
        msgs = [{"role": "user", "content": "Good morning."}]
        _, tok, _ = post(s.url + "/tokenize", {"messages": msgs, "return_token_strs": True})
        assert "".join(tok["token_strs"]) == "User: Good morning.\nAssistant:"
        status, out, _ = post(s.url + "/v1/chat/completions", {"model": "model", "messages": msgs, "max_tokens": 8,
                                                               "temperature": 0})
        assert status == 200 and "User:" not in out["choices"][0]["message"]["content"], out
    finally:
        s.stop()
    r = subprocess.run([sys.executable, "-m", "webtensor.cli", "serve", "-m", str(model), "--chat-template",
                        str(tmp_path / "none.jinja")], capture_output=True, text=True, env=s_env(), timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("webtensor: error: --chat-template "), r.stderr


def test_chat_ends_at_the_templates_end_of_turn_token(chatml):
    """<|im_end|> forced first (logit_bias): chat and responses end there with nothing said; a completion of the same
    rendered prompt, which is no conversation, goes on past it."""
    name, msgs = "model", [{"role": "user", "content": "Good morning."}]
    bias = {str(IM_END): 100}
    status, out, _ = post(chatml.url + "/v1/chat/completions", {"model": name, "messages": msgs, "max_tokens": 5,
                                                                "temperature": 0, "logit_bias": bias})
    assert status == 200, out
    assert out["choices"][0]["finish_reason"] == "stop" and out["choices"][0]["message"]["content"] == ""
    assert out["usage"]["completion_tokens"] == 1
    status, out, _ = post(chatml.url + "/v1/responses", {"model": name, "input": "Good morning.",
                                                         "max_output_tokens": 5, "temperature": 0})
    assert status == 200 and out["status"] in ("completed", "incomplete"), out
    _, tok, _ = post(chatml.url + "/tokenize", {"messages": msgs, "return_token_strs": True})
    prompt = "".join(tok["token_strs"])
    assert prompt == "<|im_start|>user\nGood morning.<|im_end|>\n<|im_start|>assistant\n"  # (special tokens as text)
    status, out, _ = post(chatml.url + "/v1/completions", {"model": name, "prompt": tok["tokens"], "max_tokens": 5,
                                                           "temperature": 0, "logit_bias": bias})
    assert status == 200 and out["choices"][0]["finish_reason"] == "length", out
    assert out["usage"]["completion_tokens"] == 5


def test_tokenize_gives_special_tokens_text(api_server):
    status, out, _ = post(api_server.url + "/tokenize", {"prompt": "<|endoftext|>Hello", "return_token_strs": True})
    assert status == 200, out
    assert out["tokens"][0] == 0 and out["token_strs"][0] == "<|endoftext|>"
    assert "".join(out["token_strs"]) == "<|endoftext|>Hello"


@pytest.mark.parametrize(("role", "content", "ok"), [
    ("user", None, False), ("user", [], False), ("system", [], False), ("system", None, False),
    ("assistant", None, True), ("assistant", [], False), ("user", [{"type": "text", "text": "Hi"}], True),
])
def test_content_null_and_empty_lists_follow_openais_schema(api_server, role, content, ok):
    msgs = [{"role": "user", "content": "Hello"}, {"role": role, "content": content}, {"role": "user", "content": "Go"}]
    status, out, _ = post(api_server.url + "/v1/chat/completions", {"model": MODEL, "messages": msgs,
                                                                    "max_tokens": 2})
    if ok:
        assert status == 200, out
        return
    assert status == 400, out
    err = assert_openai_error(out, "invalid_request_error")
    assert err["param"] == "messages.1.content", err
    assert f"a {role} message" in err["message"] and "at least one part" in err["message"], err
