"""The clients people use, against a real server process on 127.0.0.1 (the shipped model on the CPU
device): the official `openai` client, sync and async, and LangChain's `langchain-openai` (chat and
completions models: invoke, stream, batch, async). Each gets the text the raw HTTP API gives for
the same greedy request, and its usage."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serve_helpers import MODEL, post  # noqa: E402

openai = pytest.importorskip("openai")

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def url(api_server):
    return api_server.url


def raw_completion(url: str, prompt: str | list, max_tokens: int = 8) -> dict:
    status, body, _ = post(url + "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                                                     "temperature": 0})
    assert status == 200, body
    return body


def raw_chat(url: str, messages: list, max_tokens: int = 8) -> dict:
    status, body, _ = post(url + "/v1/chat/completions", {"model": MODEL, "messages": messages,
                                                          "max_tokens": max_tokens, "temperature": 0})
    assert status == 200, body
    return body


def test_openai_sync(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")
    batch = client.completions.create(model=MODEL, prompt=["Once upon", "The cat"], max_tokens=8, temperature=0)
    want = raw_completion(url, ["Once upon", "The cat"])
    assert [c.text for c in batch.choices] == [c["text"] for c in want["choices"]]
    assert batch.usage.model_dump(exclude_none=True, exclude={"prompt_tokens_details"}) == \
        {k: v for k, v in want["usage"].items() if k != "prompt_tokens_details"}
    chunks = list(client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=8, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    chat = raw_chat(url, MSGS)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        chat["choices"][0]["message"]["content"]
    assert chunks[-1].usage.model_dump(exclude_none=True, exclude={"prompt_tokens_details"}) == \
        {k: v for k, v in chat["usage"].items() if k != "prompt_tokens_details"}
    whole = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=8, temperature=0)
    assert whole.choices[0].message.refusal is None and whole.choices[0].message.content == \
        chat["choices"][0]["message"]["content"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", seed=-1)
    assert e.value.body["param"] == "seed"


def test_openai_async_concurrent(url):
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    prompts = [[{"role": "user", "content": w}] for w in ("Hello", "The cat", "Once upon a time", "Why", "42", "Rain")]

    async def streamed(msgs: list) -> str:
        s = await client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0, stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in s if c.choices])

    async def whole(msgs: list) -> str:
        r = await client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0)
        return r.choices[0].message.content

    async def main() -> tuple[list[str], list[str]]:
        a = await asyncio.gather(*(streamed(m) for m in prompts))
        b = await asyncio.gather(*(whole(m) for m in prompts))
        return list(a), list(b)

    a, b = asyncio.run(main())
    want = [raw_chat(url, m)["choices"][0]["message"]["content"] for m in prompts]
    assert a == b == want and len(set(want)) > 1


def test_langchain_openai(url):
    lc = pytest.importorskip("langchain_openai")
    chat = lc.ChatOpenAI(base_url=url + "/v1", api_key="unused", model=MODEL, max_tokens=8, temperature=0,
                         max_retries=0, stream_usage=True)
    want = raw_chat(url, [{"role": "user", "content": "Hello"}])
    text = want["choices"][0]["message"]["content"]
    msg = chat.invoke("Hello")
    assert msg.content == text and msg.usage_metadata["output_tokens"] == want["usage"]["completion_tokens"]
    assert msg.usage_metadata["input_tokens"] == want["usage"]["prompt_tokens"]
    chunks = list(chat.stream("Hello"))
    assert "".join(c.content for c in chunks) == text
    assert [c.usage_metadata for c in chunks if c.usage_metadata][0]["total_tokens"] == want["usage"]["total_tokens"]
    others = [raw_chat(url, [{"role": "user", "content": q}])["choices"][0]["message"]["content"] for q in ("Hi", "Yo")]
    assert [m.content for m in chat.batch(["Hi", "Yo"])] == others
    llm = lc.OpenAI(base_url=url + "/v1", api_key="unused", model=MODEL, max_tokens=8, temperature=0, max_retries=0)
    prompts = ["Once upon", "The cat", "A B C"]
    texts = [c["text"] for c in raw_completion(url, prompts)["choices"]]
    assert llm.batch(prompts) == texts  # (one request: LangChain sends the prompts as a list)
    assert "".join(llm.stream("Once upon")) == texts[0]

    async def main() -> tuple[str, list[str]]:
        return (await chat.ainvoke("Hello")).content, await llm.abatch(prompts)

    assert asyncio.run(main()) == (text, texts)
