"""Chat templates: webtensor's rendering equals transformers' `apply_chat_template(..., tokenize=False)` on
real templates (the SmolLM2 GGUF file's own, Llama 3.1 / 3.2, Qwen2.5, Qwen3, SmolLM3: tests/data/chat_templates)
over several conversations; refusals and failures are one ChatTemplateError line; where checkpoints keep
their template; and rendering with markupsafe's pure-Python fallback, as the page (Pyodide) must."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("jinja2")
pytestmark = pytest.mark.hf  # against transformers (the parity tier)

from text_fixtures import families, run_in_pyodide, write_family_tokenizer  # noqa: E402

from webtensor.chat import (  # noqa: E402
    PLAIN_TEMPLATE,
    ChatTemplate,
    TurnStops,
    check_template,
    find_chat_template,
    template_for,
    turn_stops,
)
from webtensor.errors import ChatTemplateError, CheckpointError  # noqa: E402
from webtensor.text.tokenizer import Tokenizer  # noqa: E402

TEMPLATES = Path(__file__).resolve().parent / "data" / "chat_templates"
ROOT = Path(__file__).resolve().parents[1]

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, today.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}
TOOL_CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}

CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "user": [{"role": "user", "content": "What is the capital of France?"}],
    "system+user": [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Name three primes."}],
    "multi-turn": [{"role": "system", "content": "Answer in French."},
                   {"role": "user", "content": "Hello!"},
                   {"role": "assistant", "content": "Bonjour !"},
                   {"role": "user", "content": "How are you?"}],
    "no system, ends with assistant": [{"role": "user", "content": "2+2?"},
                                       {"role": "assistant", "content": "4"}],
    "unicode": [{"role": "user", "content": "Привет 😀 日本語 «ok» e\u0301 <|im_end|> {{ not jinja }}\n\n  spaced  "}],
    "none-valued keys": [{"role": "user", "content": "Hi", "name": None, "tool_calls": None}],
}
TOOL_CONVERSATION = [
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
    {"role": "tool", "content": "{\"temp_c\": 21}"},
]
REASONING_CONVERSATION = [
    {"role": "user", "content": "Is 91 prime?"},
    {"role": "assistant", "content": "No: 7 x 13.", "reasoning_content": "91 = 7 * 13."},
    {"role": "user", "content": "And 97?"},
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Tokenizer]]:
    """family -> (transformers' tokenizer, ours) of a small checkpoint directory of that family."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("chat")
    out = {}
    for name, fam in families().items():
        d = write_family_tokenizer(root, fam, vocab_size=400)
        out[name] = (AutoTokenizer.from_pretrained(str(d)), Tokenizer.from_dir(d))
    return out


def _both(hf: Any, ours: Tokenizer, source: str, messages: list[dict[str, Any]], add_generation_prompt: bool,
          **kwargs: Any) -> tuple[str, str]:
    want = hf.apply_chat_template(messages, chat_template=source, tokenize=False,
                                  add_generation_prompt=add_generation_prompt, **kwargs)
    got = ChatTemplate(source, **ours.special_tokens_map).render(messages, add_generation_prompt, **kwargs)
    return got, want


# template file -> (the family whose special tokens it is rendered with, extra keywords, tools supported)
REAL = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("llama3", {"date_string": "26 Jul 2024"}, True),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("llama3", {"date_string": "02 Dec 2025"}, True),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("qwen2", {}, True),
    "Qwen-Qwen3-0.6B.jinja": ("qwen2", {}, True),
    "HuggingFaceTB-SmolLM3-3B.jinja": ("smollm", {}, False),
}


@pytest.mark.parametrize("template", sorted(REAL))
def test_real_templates_render_as_transformers(tokenizers: dict[str, tuple[Any, Tokenizer]], template: str) -> None:
    family, extra, with_tools = REAL[template]
    hf, ours = tokenizers[family]
    source = (TEMPLATES / template).read_text(encoding="utf-8")
    for name, messages in CONVERSATIONS.items():
        for agp in (True, False):
            got, want = _both(hf, ours, source, messages, agp, **extra)
            assert got == want, (name, agp)
    if with_tools:
        for messages in (CONVERSATIONS["user"], TOOL_CONVERSATION):
            got, want = _both(hf, ours, source, messages, True, tools=[WEATHER_TOOL], **extra)
            assert got == want and "get_weather" in got
    got, want = _both(hf, ours, source, CONVERSATIONS["user"], True,
                      documents=[{"title": "Doc", "text": "Paris is the capital of France."}], **extra)
    assert got == want


TURN_ENDS = {"meta-llama-Llama-3.1-8B-Instruct.jinja": "<|eot_id|>",
             "meta-llama-Llama-3.2-3B-Instruct.jinja": "<|eot_id|>", "Qwen-Qwen2.5-7B-Instruct.jinja": "<|im_end|>",
             "Qwen-Qwen3-0.6B.jinja": "<|im_end|>", "HuggingFaceTB-SmolLM3-3B.jinja": "<|im_end|>"}


@pytest.mark.parametrize("template", sorted(REAL))
def test_real_templates_turn_ends_and_check(tokenizers: dict[str, tuple[Any, Tokenizer]], template: str) -> None:
    """`turn_stops` finds each real template's end-of-turn token (where the model's EOS ids lack it: a base model's
    EOS, <|end_of_text|> / <|endoftext|>, with its instruct template), and `check_template` passes them all."""
    _, ours = tokenizers[REAL[template][0]]
    end = ours.token_to_id(TURN_ENDS[template])
    assert end is not None and end in ours.special_ids
    model = SimpleNamespace(chat_template=(TEMPLATES / template).read_text(encoding="utf-8"), tokenizer=ours,
                            eos_ids=frozenset())
    assert turn_stops(model) == TurnStops((), (end,))
    model.eos_ids = frozenset({end})
    assert turn_stops(model) == TurnStops()
    check_template(model)
    check_template(model, "You are terse.")


def test_qwen3_thinking_switch_and_reasoning(tokenizers: dict[str, tuple[Any, Tokenizer]]) -> None:
    hf, ours = tokenizers["qwen2"]
    source = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    rendered = {}
    for thinking in (True, False):
        for messages in (CONVERSATIONS["multi-turn"], REASONING_CONVERSATION):
            got, want = _both(hf, ours, source, messages, True, enable_thinking=thinking)
            assert got == want
            rendered[thinking] = got
    assert rendered[False].endswith("<think>\n\n</think>\n\n") and not rendered[True].endswith("</think>\n\n")
    # a message's reasoning under another name reaches the template as reasoning_content
    msgs = [dict(m) for m in REASONING_CONVERSATION[:2]] + [REASONING_CONVERSATION[2]]
    msgs[1]["thinking"] = msgs[1].pop("reasoning_content")
    got, want = _both(hf, ours, source, msgs, True)
    assert got == want


@pytest.fixture(scope="module")
def smollm2() -> tuple[Any, Tokenizer, str]:
    from smollm2 import smollm2_gguf
    from transformers import AutoTokenizer

    from webtensor.formats.gguf_pure import GGUFFile

    path = smollm2_gguf()
    meta = GGUFFile.from_path(path).metadata
    source = find_chat_template(meta)
    assert source is not None and source == meta["tokenizer.chat_template"]
    return (AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name),
            Tokenizer.from_gguf_metadata(meta, str(path)), source)


def test_smollm2_gguf_template_renders_as_transformers(smollm2: tuple[Any, Tokenizer, str]) -> None:
    hf, ours, source = smollm2
    assert hf.chat_template == source  # transformers reads the same template out of the file
    for name, messages in CONVERSATIONS.items():
        for agp in (True, False):
            got, want = _both(hf, ours, source, messages, agp)
            assert got == want, (name, agp)
    got, _ = _both(hf, ours, source, CONVERSATIONS["user"], True)
    assert got == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                   "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    ids = ours.encode(got)  # the prompt's token ids: the template's special tokens are single tokens
    assert ids == hf.apply_chat_template(CONVERSATIONS["user"], add_generation_prompt=True, tokenize=True,
                                         return_dict=False)
    assert ids.count(ours.bos_token_id) == 3 and ids.count(ours.eos_token_id) == 2


def test_template_for_a_model_uses_its_tokens(smollm2: tuple[Any, Tokenizer, str]) -> None:
    _, ours, source = smollm2

    class Model:
        tokenizer, chat_template = ours, source

    t = template_for(Model())
    assert t.variables["bos_token"] == "<|im_start|>" and t.variables["eos_token"] == "<|im_end|>"
    Model.chat_template = None
    plain = template_for(Model()).render(CONVERSATIONS["multi-turn"])
    assert plain == "System: Answer in French.\nUser: Hello!\nAssistant: Bonjour !\nUser: How are you?\nAssistant:"
    assert template_for(Model()).source == PLAIN_TEMPLATE


# -- refusals and failures: one line --------------------------------------------------------------

ALTERNATE = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
             "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
             "{% endif %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")


def test_raise_exception_is_one_line_and_matches_transformers(tokenizers: dict[str, tuple[Any, Tokenizer]]) -> None:
    import jinja2

    hf, ours = tokenizers["qwen2"]
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(jinja2.TemplateError, match="Conversation roles must alternate") as hf_error:
        hf.apply_chat_template(bad, chat_template=ALTERNATE, tokenize=False)
    with pytest.raises(ChatTemplateError) as info:
        ChatTemplate(ALTERNATE).render(bad)
    assert str(info.value) == f"the chat template refused this conversation: {hf_error.value}"
    good = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert ChatTemplate(ALTERNATE).render(good) == "[user] a\n[assistant] b\n"
    # a real template's own refusal: Llama 3.1 takes one tool call at a time
    source = (TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text(encoding="utf-8")
    two_calls = [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [TOOL_CALL, TOOL_CALL]}]
    with pytest.raises(ChatTemplateError, match="refused this conversation: This model only supports single tool"):
        ChatTemplate(source, bos_token="<|begin_of_text|>").render(two_calls)


@pytest.mark.parametrize(("source", "messages", "message"), [
    ("{% for m in messages %}{{ m.content }", CONVERSATIONS["user"], r"chat template syntax error on line 1: "),
    ("{% if x %}\n\n{% endfor %}", CONVERSATIONS["user"], "syntax error on line 3: .*endfor"),
    ("{{ messages[0]['content'] + 1 }}", CONVERSATIONS["user"], "failed to render this conversation: TypeError"),
    ("{{ ''.__class__.__mro__ }}", CONVERSATIONS["user"], "failed to render this conversation: SecurityError"),
    ("{% set ns = namespace(_x=1) %}", CONVERSATIONS["user"], "SecurityError: .*'_x'"),
    ("{{ messages.append(1) }}", CONVERSATIONS["user"], "SecurityError"),
    ("{{ m }}", "hello", "messages must be a list"),
    ("{{ m }}", [], "empty conversation"),
    ("{{ m }}", [{"content": "no role"}], "message 0 has no 'role'"),
    ("{{ m }}", ["text"], "message 0 must be a dict"),
])
def test_failures_are_one_line(source: str, messages: Any, message: str) -> None:
    with pytest.raises(ChatTemplateError, match=message) as info:
        ChatTemplate(source).render(messages)
    assert "\n" not in str(info.value)


def test_environment_as_transformers(tokenizers: dict[str, tuple[Any, Tokenizer]]) -> None:
    """tojson (non-ASCII kept, indent), loop controls, {% generation %}, dict(), strftime_now, kwargs
    overriding the special tokens: the same text as transformers."""
    hf, ours = tokenizers["qwen2"]
    source = ("{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% if m.role == 'system' %}"
              "{% continue %}{% endif %}{% generation %}{{ m.content | tojson(indent=2) }}{% endgeneration %}\n"
              "{% endfor %}{{ dict(a=1, b=[1, 'é']) | tojson }} {{ eos_token }} {{ pad_token }} {{ extra }}"
              "{{ tools | tojson }}{{ strftime_now('%Y') | length }}")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": {"q": "Zürich ✓"}},
                {"role": "user", "content": "never"}]
    got, want = _both(hf, ours, source, messages, True, extra="x", eos_token="<override>", tools=[WEATHER_TOOL])
    assert got == want and '"Zürich ✓"' in got and "<override>" in got and "never" not in got


# -- where a checkpoint keeps its template ----------------------------------------------------------

def test_find_chat_template(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    assert find_chat_template(d) is None
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "A"}), encoding="utf-8")
    assert find_chat_template(d) == "A"
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]}), encoding="utf-8")
    assert find_chat_template(d) == "D" and find_chat_template(d, "tool_use") == "T"
    with pytest.raises(ChatTemplateError, match=r"no chat template named 'rag' \(it has default, tool_use\)"):
        find_chat_template(d, "rag")
    (d / "chat_template.jinja").write_text("J", encoding="utf-8")  # newer transformers: the file wins
    assert find_chat_template(d) == "J" and find_chat_template(d, "tool_use") == "T"
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "x", "template": "X"}]}),
                                             encoding="utf-8")
    (d / "chat_template.jinja").unlink()
    with pytest.raises(ChatTemplateError, match=r"several chat templates \(x\) and no default"):
        find_chat_template(d)
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": 7}), encoding="utf-8")
    with pytest.raises(CheckpointError, match="chat_template must be a string or a list"):
        find_chat_template(d)
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "x"}]}), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"chat_template\[0\] must be"):
        find_chat_template(d)
    meta = {"tokenizer.chat_template": "G", "tokenizer.chat_template.rag": "R", "tokenizer.ggml.model": "gpt2"}
    assert find_chat_template(meta) == "G" and find_chat_template(meta, "rag") == "R"
    assert find_chat_template({"tokenizer.ggml.model": "gpt2"}) is None
    with pytest.raises(CheckpointError, match="tokenizer.chat_template must be a string"):
        find_chat_template({"tokenizer.chat_template": 3})


# -- the page: jinja2 on markupsafe's pure-Python fallback --------------------------------------------

_NO_SPEEDUPS = """
import sys
sys.modules["markupsafe._speedups"] = None  # as in Pyodide, where the C extension cannot load
import json, markupsafe
from webtensor.chat import ChatTemplate
assert markupsafe._escape_inner.__module__ == "markupsafe._native", markupsafe._escape_inner.__module__
data = json.load(sys.stdin)
print(json.dumps(ChatTemplate(data["source"], bos_token="<s>").render(data["messages"])))
"""


def test_renders_with_markupsafe_pure_python_fallback() -> None:
    source = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    messages = CONVERSATIONS["multi-turn"]
    run = subprocess.run([sys.executable, "-c", _NO_SPEEDUPS], capture_output=True, text=True, timeout=120,
                         input=json.dumps({"source": source, "messages": messages}),
                         env={"PYTHONPATH": str(ROOT / "src")})
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout) == ChatTemplate(source, bos_token="<s>").render(messages)


_PAGE = """
import json, sys
sys.path.insert(0, "/pkgs")
import markupsafe
from webtensor.chat import ChatTemplate
data = json.load(open("/case/in.json"))
out = {"markupsafe": markupsafe._escape_inner.__module__,
       "text": [ChatTemplate(s, **data["tokens"]).render(m, a, **data["kwargs"]) for s, m, a in data["cases"]]}
json.dump(out, open("/case/out.json", "w"))
"""


def test_page_python_renders_as_native(tmp_path: Path, smollm2: tuple[Any, Tokenizer, str]) -> None:
    """Inside Pyodide, with jinja2 and markupsafe copied as the page would ship them (their .py files
    only), the templates render as they do natively."""
    import shutil

    import jinja2
    import markupsafe

    lib = tmp_path / "lib"
    for pkg in (jinja2, markupsafe):
        src = Path(pkg.__file__).parent
        shutil.copytree(src, lib / src.name, ignore=lambda _d, names: [n for n in names if not n.endswith(".py")])
    shutil.copytree(ROOT / "src" / "webtensor", lib / "webtensor", ignore=shutil.ignore_patterns("__pycache__"))
    _, ours, smol = smollm2
    sources = [smol] + [(TEMPLATES / t).read_text(encoding="utf-8") for t in sorted(REAL)]
    cases = [(s, m, a) for s in sources for m in CONVERSATIONS.values() for a in (True, False)]
    kwargs = {"date_string": "26 Jul 2024"}
    (tmp_path / "case").mkdir()
    (tmp_path / "case" / "in.json").write_text(json.dumps({"cases": cases, "tokens": ours.special_tokens_map,
                                                           "kwargs": kwargs}), encoding="utf-8")
    run_in_pyodide(_PAGE, {"/pkgs": lib, "/case": tmp_path / "case"}, tmp_path)
    out = json.loads((tmp_path / "case" / "out.json").read_text(encoding="utf-8"))
    assert out["markupsafe"] == "markupsafe._native"
    assert out["text"] == [ChatTemplate(s, **ours.special_tokens_map).render(m, a, **kwargs) for s, m, a in cases]
