"""Tool calls and reasoning without a server: each family's format chosen from its real template; each parser on
answers as the real models write them (one call, several, text before a call, arguments before the name,
malformed JSON kept as text, an answer cut mid-call); streamed in any pieces it gives what it gives whole; the
<think> split; the forced-call grammar of each format, walked at random through llguidance's masks, always ends
in valid calls; and the server's prompt with tools and a tool-calling history is transformers' own rendering of
the same template."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webtensor.serve import reply, tools

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from tool_models import FAMILIES, TEMPLATES, write_tokenizer  # noqa: E402

TEMPLATE_FORMATS = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes", "Qwen-Qwen3-0.6B.jinja": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3_json", "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3_json",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral", "Qwen3.5-4B.jinja": "qwen3_xml",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral_args",
}


@pytest.mark.parametrize("name", sorted(TEMPLATE_FORMATS))
def test_the_format_is_the_templates(name):
    assert tools.format_for((TEMPLATES / name).read_text()).name == TEMPLATE_FORMATS[name]
    assert tools.knows_tools((TEMPLATES / name).read_text())


def test_a_template_without_tools_gets_the_plain_format():
    assert tools.format_for(None).name == "plain" and not tools.knows_tools(None)
    chatml = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    assert tools.format_for(chatml).name == "plain"
    smollm3 = (TEMPLATES / "HuggingFaceTB-SmolLM3-3B.jinja").read_text()  # (renders no tools it is given)
    assert tools.format_for(smollm3).name == "plain" and not tools.knows_tools(smollm3)


W = {"city": "Paris, France", "unit": "celsius"}
# (format, the answer as the model writes it, content, [(name, arguments)])
REAL = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris, France", "unit": "celsius"}}\n'
               '</tool_call>', None, [("get_weather", W)]),
    ("hermes", "Let me look that up.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris, "
               "France\", \"unit\": \"celsius\"}}\n</tool_call>", "Let me look that up.", [("get_weather", W)]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris, France", "unit": "celsius"}}\n'
               '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris", "h24": true, '
               '"n": [1, 2.5e3, null]}}\n</tool_call>', None,
     [("get_weather", W), ("get_time", {"tz": "Europe/Paris", "h24": True, "n": [1, 2.5e3, None]})]),
    # Hermes 2 Pro writes the arguments first
    ("hermes", '<tool_call>\n{"arguments": {"symbol": "TSLA"}, "name": "get_stock_fundamentals"}\n</tool_call>',
     None, [("get_stock_fundamentals", {"symbol": "TSLA"})]),
    # arguments as a JSON string (some fine-tunes)
    ("hermes", '<tool_call>\n{"name": "f", "arguments": "{\\"q\\": \\"a } b\\"}"}\n</tool_call>', None,
     [("f", {"q": "a } b"})]),
    ("hermes", 'Sure: <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',
     'Sure: <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>', []),  # malformed
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', '<tool_call>\n{"name": '
               '"get_weather", "arguments": {"city": "Par', []),  # cut by max_tokens
    ("hermes", "The weather is {\"sunny\": true} today, no <tool_call", "The weather is {\"sunny\": true} today, "
               "no <tool_call", []),
    ("hermes", '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool', None, [("ping", {})]),  # cut in the tag
    ("llama3_json", '{"name": "get_current_conditions", "parameters": {"location": "San Francisco, CA", '
                    '"unit": "Fahrenheit"}}', None,
     [("get_current_conditions", {"location": "San Francisco, CA", "unit": "Fahrenheit"})]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris, France", "unit": '
                    '"celsius"}}', None, [("get_weather", W)]),
    ("llama3_json", '{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"x": 1}}', None,
     [("a", {}), ("b", {"x": 1})]),
    ("llama3_json", '{"answer": 42, "name": "x"}', '{"answer": 42, "name": "x"}', []),  # JSON, not a call
    ("llama3_json", 'The answer: {"name": "a", "parameters": {}}', 'The answer: {"name": "a", "parameters": {}}', []),
    ("llama3_json", '{"name": "a", "parameters": {"x": tru}}', '{"name": "a", "parameters": {"x": tru}}', []),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris, France", "unit": "celsius"}}]',
     None, [("get_weather", W)]),
    ("mistral", 'Checking. [TOOL_CALLS] [{"name": "a", "arguments": {"x": [1]}}, {"name": "b", "arguments": {}}]',
     "Checking.", [("a", {"x": [1]}), ("b", {})]),
    ("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}', '[TOOL_CALLS][{"name": "a", "arguments": '
                '{"x": 1}', []),
    ("mistral_args", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris, France", "unit": "celsius"}', None,
     [("get_weather", W)]),
    ("mistral_args", '[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[CALL_ID]a1b2c3d4e[ARGS]{}', None,
     [("a", {"x": 1}), ("b", {})]),
    ("mistral_args", "No tools needed: 4.", "No tools needed: 4.", []),
    ("qwen3_xml", "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis, France\n"
                  "</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>", "I will check.",
     [("get_weather", W)]),
    ("qwen3_xml", "<tool_call>\n<function=get_time>\n<parameter=tz>\n42\n</parameter>\n<parameter=h24>\nTrue\n"
                  "</parameter>\n<parameter=n>\n[1, 2.5e3, null]\n</parameter>\n</function>\n</tool_call>\n"
                  "<tool_call>\n<function=ping>\n</function>\n</tool_call>", None,
     [("get_time", {"tz": "42", "h24": True, "n": [1, 2.5e3, None]}), ("ping", {})]),
    ("qwen3_xml", "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "<tool_call>\n<function="
                  "get_weather>\n<parameter=city>\nPar", []),
    ("qwen3_xml", "<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>", "<tool_call>\n{\"name\": "
                  "\"get_weather\"}\n</tool_call>", []),
]
# the tools' parameters the answers call (qwen3_xml reads its values by their types)
SCHEMAS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}},
           "get_time": {"type": "object", "properties": {"tz": {"type": "string"}, "h24": {"type": "boolean"},
                                                          "n": {"type": "array"}}}}


def _ids(case: tuple) -> str:
    return f"{case[0]}-{REAL.index(case)}"


@pytest.mark.parametrize("case", REAL, ids=_ids)
def test_parsed_whole(case):
    fmt, text, content, calls = case
    got = reply.ReplyParser(False, False, tools.get_format(fmt), schemas=SCHEMAS).whole(text)
    assert got.content == content and got.reasoning is None
    assert [(c.name, json.loads(c.arguments)) for c in got.calls] == calls
    ids = [c.id for c in got.calls]
    assert len(set(ids)) == len(ids)
    if fmt.startswith("mistral"):  # (Mistral's templates take 9 letters and digits, nothing else)
        assert all(len(i) == 9 and i.isalnum() for i in ids)
    else:
        assert all(i.startswith("call_") for i in ids)
    if calls:  # parallel_tool_calls false: the first call alone
        one = reply.ReplyParser(False, False, tools.get_format(fmt), parallel=False, schemas=SCHEMAS).whole(text)
        assert [(c.name, json.loads(c.arguments)) for c in one.calls] == calls[:1]


def _streamed(parser: reply.ReplyParser, text: str, cuts: list[int]) -> tuple[str, str, list[dict]]:
    """The deltas of `text` fed in pieces cut at `cuts`: (reasoning, content, calls by index)."""
    bounds = [0, *sorted(set(c % (len(text) + 1) for c in cuts)), len(text)]
    r, c, calls = "", "", {}
    deltas = [parser.feed(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)] + [parser.finish()]
    for d in deltas:
        r, c = r + d.reasoning, c + d.content
        for piece in d.calls:
            if "id" in piece:  # (a call's first piece: index, id, type and name; the next ones its arguments)
                assert piece["index"] == len(calls) and piece["type"] == "function"
                calls[piece["index"]] = {"name": piece["function"]["name"], "arguments": ""}
            calls[piece["index"]]["arguments"] += piece["function"]["arguments"]
    return r, c, [calls[i] for i in sorted(calls)]


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from([c for c in REAL if c[1] != c[2]]), cuts=st.lists(st.integers(0, 10**6), max_size=12))
def test_streamed_in_any_pieces_is_the_whole(case, cuts):
    """Where the answer is valid (or no call at all), the stream's text and calls, however the text is cut, are
    the whole answer's; the arguments streamed in pieces join to the whole call's."""
    fmt, text, content, calls = case
    r, c, streamed = _streamed(reply.ReplyParser(False, False, tools.get_format(fmt), schemas=SCHEMAS), text, cuts)
    assert r == "" and c == (content or "")
    assert [(s["name"], json.loads(s["arguments"])) for s in streamed] == calls


QWEN3_THINKING = ("<think>\nOkay, the user asks about the weather in Paris. I should call get_weather.\n</think>\n\n"
                  '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris, France", "unit": "celsius"}}\n'
                  "</tool_call>")
REASONING = [  # (the prompt opened the block, answer, reasoning, content, calls)
    (False, QWEN3_THINKING, "\nOkay, the user asks about the weather in Paris. I should call get_weather.\n", None,
     [("get_weather", W)]),
    (False, "<think>\n\n</think>\n\nHello! How can I help?", "\n\n", "Hello! How can I help?", []),
    (False, "Hello! No thinking here.", None, "Hello! No thinking here.", []),
    (True, "The user greets me.\n</think>\n\nHi there!", "The user greets me.\n", "Hi there!", []),
    (True, "Still thinking when max_tokens ran out", "Still thinking when max_tokens ran out", None, []),
    (False, "  <think>a < b </thin", "a < b </thin", None, []),
]


@pytest.mark.parametrize("case", REASONING, ids=range(len(REASONING)))
def test_think_blocks_are_reasoning(case):
    inside, text, reasoning, content, calls = case
    got = reply.ReplyParser(True, inside, tools.get_format("hermes")).whole(text)
    assert got.reasoning == reasoning
    assert (got.content or None) == content
    assert [(c.name, json.loads(c.arguments)) for c in got.calls] == calls


@settings(max_examples=40, deadline=None)
@given(case=st.sampled_from(REASONING), cuts=st.lists(st.integers(0, 10**6), max_size=10))
def test_think_blocks_streamed_in_any_pieces(case, cuts):
    inside, text, reasoning, content, calls = case
    r, c, streamed = _streamed(reply.ReplyParser(True, inside, tools.get_format("hermes")), text, cuts)
    assert r == (reasoning or "") and c == (content or "")
    assert [(s["name"], json.loads(s["arguments"])) for s in streamed] == calls


def test_the_prompt_may_open_the_thinking():
    assert reply.thinks((TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text())
    assert not reply.thinks((TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text())
    assert reply.starts_thinking("<|im_start|>assistant\n<think>\n")
    assert not reply.starts_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not reply.starts_thinking("<|im_start|>assistant\n")


# -- the grammar of forced calls ---------------------------------------------------------------------------------
TOOLS = [
    {"name": "get_weather", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["city", "days"],
        "properties": {"city": {"type": "string", "maxLength": 12},
                       "days": {"type": "integer", "minimum": 1, "maximum": 9}}}},
    {"name": "set_mode", "parameters": {"type": "object", "required": ["mode"],
                                        "properties": {"mode": {"enum": ["on", "off", "auto"]},
                                                       "force": {"type": "boolean"}}}},
    {"name": "ping"},  # no parameters: an empty object
]


def _walk(matcher, tokenizer, vocab: int, eos: set[int], prefer: set[int], rng: random.Random, limit: int = 600):
    """A random answer the grammar allows: at each step a token drawn among the allowed ones (the end of text, and
    `prefer`, taken at once half the time where allowed, so that loops end)."""
    from webtensor.serve.grammar import unpack

    out = []
    for _ in range(limit):
        allowed = np.flatnonzero(unpack(np.frombuffer(matcher.compute_bitmask(), np.int32), vocab))
        assert len(allowed), matcher.get_error()
        short = [t for t in allowed if t in eos or t in prefer]
        t = int(rng.choice(short) if short and rng.random() < 0.5 else rng.choice(list(allowed)))
        if t in eos:
            assert matcher.is_accepting()
            return out, True
        assert matcher.consume_token(t), matcher.get_error()
        out.append(t)
    return out, False


@pytest.mark.parametrize("family", ["qwen2.5", "llama3.1", "mistral-nemo", "mistral-small-3.2", "qwen3.5", "hermes3"])
@pytest.mark.parametrize("parallel", [False, True])
def test_forced_calls_are_always_valid(tmp_path, family, parallel):
    """The grammar of tool_choice "required" (and of one named function) over the family's own tokenizer: every
    random walk through its masks parses into valid calls of the chosen tools (their arguments valid by the
    tools' schemas), one alone without parallel_tool_calls."""
    import llguidance

    from webtensor.serve import grammar as g
    from webtensor.serve.conversation import special_ids
    from webtensor.text.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(write_tokenizer(tmp_path, family))
    template = (TEMPLATES / FAMILIES[family][1]).read_text()
    fmt = tools.format_for(template)
    vocab = tok.vocab_size
    eos = {tok.token_to_id(e) for e in FAMILIES[family][4]}

    class Engine:  # (what special_ids reads)
        tokenizer, vocab_size = tok, vocab
    think_modes = ["inside", "open"] if reply.thinks(template) else ["no"]
    special = special_ids(Engine, (*fmt.markers, reply.THINK_OPEN, reply.THINK_CLOSE))  # type: ignore[arg-type]
    lltok = g.grammar_tokenizer(tok, vocab, eos)
    rng = random.Random(7)
    by_name = {t["name"]: t.get("parameters") or {"type": "object"} for t in TOOLS}
    for think in think_modes:
        for chosen in (TOOLS, TOOLS[1:2]):
            grammar = g.compile_lark(tools.grammar(fmt, chosen, parallel, special, think))  # type: ignore[arg-type]
            g.check(grammar, lltok)
            ended = 0
            for _ in range(6):
                m = llguidance.LLMatcher(lltok, grammar, log_level=0)
                close = {tok.token_to_id(reply.THINK_CLOSE)} - {None}
                ids, done = _walk(m, tok, vocab, eos, close, rng)
                if not done:
                    continue
                ended += 1
                text = b"".join(tok.token_bytes(i, skip_special_tokens=i not in special.values()) for i in ids)
                got = reply.ReplyParser(think != "no", think == "inside", fmt, parallel,
                                        {t["name"]: t.get("parameters") for t in TOOLS}).whole(text.decode())
                assert got.calls and (got.content or "").strip() == "", text
                assert parallel or len(got.calls) == 1
                for c in got.calls:
                    assert c.name in {t["name"] for t in chosen}
                    jsonschema.validate(json.loads(c.arguments), by_name[c.name])
            assert ended >= 3


# -- the prompt: the template's own rendering, as transformers passes tools ----------------------------------------
HISTORY = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Paris and Lyon?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "abcdefgh1", "type": "function", "function": {"name": "get_weather",
                                                             "arguments": '{"city": "Paris", "days": 2}'}}]},
    {"role": "tool", "tool_call_id": "abcdefgh1", "content": '{"temp": 21}'},
    {"role": "user", "content": "Thanks. And Lyon?"},
]


@pytest.mark.hf
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_prompt_is_transformers_rendering(tmp_path, family):
    """The server's prompt for a conversation with tools, an assistant's call and the tool's result is what
    transformers' apply_chat_template(messages, tools=...) renders with the same template, the call's arguments
    given as an object (as templates expect them); Mistral's templates and the history of a call the answer
    carried."""
    transformers = pytest.importorskip("transformers")
    from webtensor.serve import conversation
    from webtensor.serve.protocol import ChatMessage, ChatTool
    from webtensor.text.tokenizer import Tokenizer

    d = write_tokenizer(tmp_path, family)
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(d)
    tok = Tokenizer.from_dir(d)
    template = (TEMPLATES / FAMILIES[family][1]).read_text()

    class Engine:  # (what render reads)
        chat_template, tokenizer, vocab_size = template, tok, tok.vocab_size
    history = HISTORY if not family.startswith("mistral") else [HISTORY[0], *HISTORY[1:4]]
    functions = [ChatTool.model_validate(t).function.model_dump(exclude_none=True) for t in (
        {"type": "function", "function": {"name": "get_weather", "description": "The weather",
                                          "parameters": TOOLS[0]["parameters"]}},)]
    ours = conversation.render(Engine, [ChatMessage.model_validate(m) for m in history], functions,  # type: ignore[arg-type]
                               {"enable_thinking": False})
    theirs_msgs = json.loads(json.dumps(history))
    for m in theirs_msgs:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        if m["content"] is None:
            m["content"] = ""
    theirs = hf.apply_chat_template(theirs_msgs, tools=[{"type": "function", "function": f} for f in functions],
                                    add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert ours == theirs
    assert '"get_weather"' in ours or "get_weather" in ours
