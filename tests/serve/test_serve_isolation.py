"""One bad request never hurts another. Each bad request here runs beside live streams, which must
finish whole and bit-identical to what they get alone:

- in the engine step: a row whose token cannot be chosen (sampling parameters the sampler refuses,
  sent past validation on purpose) fails its own request alone, on the batched, the reference and
  the process engine;
- at the door: seed < 0, NaN / Infinity, lone surrogates in a prompt or a message, stream_options
  without stream, bodies over the limit (by Content-Length and chunked), a prompt too long to
  tokenize, each refused by name while the streams run;
- the event loop stays free while a prompt is tokenized (a worker thread);
- usage counts the tokens streamed: a stop string in a batch of 20 greedy rows (followed steps,
  several tokens a launch) gives the completion_tokens it gives alone.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from webtensor.serve.engine import Row, Sampling
from webtensor.serve.process import ProcessEngine, build_engine
from webtensor.serve.scheduler import Event, Generation, Scheduler

sys.path.insert(0, str(Path(__file__).parent))
from serve_helpers import MODEL, assert_openai_error, free_port, get, post  # noqa: E402

openai = pytest.importorskip("openai")

SPEC = dict(model=None, device="cpu", dtype="float32", max_batch=8, engine="batched", name=MODEL, blas_threads=1)


# -- in the engine step ------------------------------------------------------------------------------
LIVE = [([10, 20, 30], 40, Sampling()), ([7] * 70, 30, Sampling(0.9, 40, None, 11)),  # (a prompt of 2 chunks)
        ([5, 6], 45, Sampling(1.2, None, 0.9, 12)), ([99, 98, 97, 96], 35, Sampling())]
BAD = [([1, 2, 3], 20, Sampling(1.0, None, None, -1)),  # seed < 0
       ([4, 5], 20, Sampling(math.nan, None, None, 3)),  # NaN temperature
       ([8] * 66, 20, Sampling(0.8, -5, None, 3))]  # top_k < 0, after a prompt of two chunks


async def _run(engine, jobs: Sequence[tuple[list[int], int, Sampling]], delays: Sequence[float]) -> list[list[Event]]:
    sched = Scheduler(engine, max_queue=64)
    sched.start()

    async def one(job: tuple[list[int], int, Sampling], delay: float) -> list[Event]:
        await asyncio.sleep(delay)
        g = Generation(job[0], job[1], job[2], ignore_eos=True)
        sched.submit(g)
        return [ev async for ev in g.stream()]

    try:
        return list(await asyncio.gather(*(one(j, d) for j, d in zip(jobs, delays, strict=True))))
    finally:
        await sched.stop()


def _outcome(events: list[Event]) -> tuple[str, int, str | None]:
    return "".join(e.text for e in events), sum(e.tokens for e in events), events[-1].finish


@pytest.mark.parametrize("kind", ["batched", "reference", "process"])
def test_a_row_whose_sampling_raises_fails_its_request_alone(kind):
    spec = {**SPEC, "engine": "reference" if kind == "reference" else "batched"}
    engine = ProcessEngine(spec) if kind == "process" else build_engine(spec)
    try:
        alone = [asyncio.run(_run(engine, [job], [0]))[0] for job in LIVE]
        assert all(_outcome(a)[1] == job[1] and a[-1].error is None for a, job in zip(alone, LIVE, strict=True))
        delays = [0, 0, 0.01, 0, 0, 0.005, 0.02]  # the bad ones among the live ones, some mid-stream
        together = asyncio.run(_run(engine, [*LIVE[:2], BAD[0], LIVE[2], BAD[1], LIVE[3], BAD[2]], delays))
    finally:
        if kind == "process":
            engine.close()
    live = [together[i] for i in (0, 1, 3, 5)]
    assert [_outcome(t) for t in live] == [_outcome(a) for a in alone]  # whole, and bit-identical
    for events, what in zip([together[i] for i in (2, 4, 6)], ("seed", "temperature", "top_k"), strict=True):
        assert len(events) == 1 and events[0].error is not None, events
        err = events[0].error
        assert err.status == 500 and err.code == "sampling_error" and what in err.message, err.message


def test_row_errors_are_values_and_the_rest_of_the_step_is_kept():
    """At the engine: the bad row's place holds a RowError, the other rows the tokens they get in a
    step without it."""
    from webtensor.serve.engine import RowError

    engine = build_engine(SPEC)
    good = [Row(0, (1, 2, 3), 0, Sampling(0.9, None, None, 5)), Row(2, (4,), 0, Sampling())]
    want = engine.step(good)
    engine.release(0), engine.release(2)
    got = engine.step([good[0], Row(1, (9, 9), 0, Sampling(1.0, None, None, -3)), good[1]])
    assert got[0] == want[0] and got[2] == want[1]
    assert isinstance(got[1], RowError) and "seed" in got[1].message


# -- at the door, over HTTP -------------------------------------------------------------------------
def _raw(url: str, path: str, body: bytes, headers: dict[str, str] | None = None,
         chunked: bool = False) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    if chunked:
        conn.request("POST", path, iter([body[i:i + 65536] for i in range(0, len(body), 65536)]), hdrs,
                     encode_chunked=True)
    else:
        conn.request("POST", path, body, hdrs)
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read())
    conn.close()
    return out


def _bad_sends() -> list[tuple[str, str, bytes, dict]]:
    """(what, path, body, how) for each bad request (made before the streams start)."""
    big = json.dumps({"model": MODEL, "prompt": "a" * (9 * 2**20)}).encode()  # over the 8 MiB limit
    long = json.dumps({"model": MODEL, "prompt": "ab " * 2_000_000}).encode()  # 6 MB: under it, too long to fit
    user = {"role": "user", "content": "hi"}
    sends = [
        ("seed -1", "/v1/completions", b'{"model": "%s", "prompt": "x", "temperature": 1, "seed": -1}'),
        ("NaN", "/v1/completions", b'{"model": "%s", "prompt": "x", "temperature": NaN}'),
        ("Infinity", "/v1/completions", b'{"model": "%s", "prompt": "x", "top_p": Infinity}'),
        ("-Infinity", "/v1/chat/completions",
         b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "presence_penalty": -Infinity}'),
        ("surrogate prompt", "/v1/completions", b'{"model": "%s", "prompt": "ab\\ud800c"}'),
        ("surrogate list", "/v1/completions", b'{"model": "%s", "prompt": ["ok", "\\udfff"]}'),
        ("surrogate message", "/v1/chat/completions",
         b'{"model": "%s", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]}'),
        ("surrogate stop", "/v1/completions", b'{"model": "%s", "prompt": "x", "stop": ["\\ud800"]}'),
        ("surrogate key", "/v1/completions", b'{"model": "%s", "prompt": "x", "\\ud800": 1}'),
        ("stream_options", "/v1/chat/completions",
         json.dumps({"model": "%s", "messages": [user], "stream_options": {"include_usage": True}}).encode()),
    ]
    out = [(what, path, body.replace(b"%s", MODEL.encode()), {}) for what, path, body in sends]
    return [*out, ("body over the limit", "/v1/completions", big, {}),
            ("chunked body over the limit", "/v1/completions", big, {"chunked": True}),
            ("too long to tokenize", "/v1/completions", long, {})]


def _bad_requests(url: str, sends: list[tuple[str, str, bytes, dict]]) -> list[tuple[str, int, str | None]]:
    """(what, status, the error's param, or code for a 413) for each bad request, one after another."""
    out = []
    for what, path, body, how in sends:
        t0 = time.monotonic()
        status, err = _raw(url, path, body, **how)
        e = assert_openai_error(err, "invalid_request_error")
        out.append((what, status, e["code"] if status == 413 else e["param"]))
        assert time.monotonic() - t0 < 5, what  # (the 6 MB prompt: refused without tokenizing, which takes seconds)
    return out


WANT = [("seed -1", 400, "seed"), ("NaN", 400, "temperature"), ("Infinity", 400, "top_p"),
        ("-Infinity", 400, "presence_penalty"), ("surrogate prompt", 400, "prompt"),
        ("surrogate list", 400, "prompt.1"), ("surrogate message", 400, "messages.0.content.0.text"),
        ("surrogate stop", 400, "stop.0"), ("surrogate key", 400, None),
        ("stream_options", 400, "stream_options"), ("body over the limit", 413, "request_too_large"),
        ("chunked body over the limit", 413, "request_too_large"), ("too long to tokenize", 400, "prompt")]


def test_bad_requests_are_refused_by_name_while_streams_run(api_server):
    url = api_server.url
    aclient = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    jobs = [dict(prompt=f"Story {i}:", max_tokens=240 + 3 * i, ignore_eos=True,
                 **(dict(temperature=0) if i % 2 else dict(temperature=0.9, seed=i))) for i in range(4)]

    async def stream(kw: dict, opened: asyncio.Event | None = None,
                     gate: asyncio.Event | None = None) -> tuple[str, str | None]:
        kw = dict(kw)
        extra = {"ignore_eos": kw.pop("ignore_eos")}
        s = await aclient.completions.create(model=MODEL, stream=True, extra_body=extra, **kw)
        text, finish = "", None
        async for c in s:
            text += c.choices[0].text
            finish = c.choices[0].finish_reason or finish
            if gate is not None and opened is not None and not opened.is_set():
                opened.set()  # live: held open (unread) until the bad requests are answered
                await gate.wait()
        return text, finish

    sends = _bad_sends()

    async def main() -> tuple[list, list, list]:
        alone = [await stream(j) for j in jobs]
        opened, gate = [asyncio.Event() for _ in jobs], asyncio.Event()
        tasks = [asyncio.create_task(stream(j, o, gate)) for j, o in zip(jobs, opened, strict=True)]
        for o in opened:
            await o.wait()
        bad = await asyncio.to_thread(_bad_requests, url, sends)  # every stream open, none read to its end
        gate.set()
        return alone, list(await asyncio.gather(*tasks)), bad

    alone, together, bad = asyncio.run(main())
    assert bad == WANT
    assert together == alone  # whole and bit-identical
    assert all(f == "length" for _, f in together)
    status, health, _ = get(url + "/health")
    assert status == 200 and health["active"] == 0


def test_stop_string_usage_in_a_batch_of_20_equals_alone(api_server):
    """20 greedy rows decode together (the scheduler follows steps, 4 tokens a launch at 16 rows or
    more); a stop string ends each: the tokens after it, already generated, are not counted."""
    url = api_server.url
    base = dict(model=MODEL, max_tokens=60, temperature=0, ignore_eos=True)
    prompts = [f"The {i} " for i in range(20)]
    full = [post(url + "/v1/completions", {**base, "prompt": p})[1]["choices"][0]["text"] for p in prompts]
    stops = [f[20:23] for f in full]
    alone = [post(url + "/v1/completions", {**base, "prompt": p, "stop": [s]})[1]
             for p, s in zip(prompts, stops, strict=True)]
    assert all(a["choices"][0]["finish_reason"] == "stop" for a in alone)

    def one(i: int, out: list) -> None:
        out[i] = post(url + "/v1/completions", {**base, "prompt": prompts[i], "stop": [stops[i]]})[1]

    together: list = [None] * 20
    threads = [threading.Thread(target=one, args=(i, together)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [t["choices"][0]["text"] for t in together] == [a["choices"][0]["text"] for a in alone]
    assert [t["usage"] for t in together] == [a["usage"] for a in alone]


# -- the event loop while a prompt is tokenized --------------------------------------------------------
class _SlowTokenizer:
    """Tokenizes by sleeping (as `tokenizers` does, without the GIL) for `seconds`."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        time.sleep(self.seconds)
        return [1] * min(len(text), 3)

    def token_bytes(self, i: int, *, skip_special_tokens: bool = True) -> bytes:
        return b"x"


class _EchoEngine:
    name, max_batch, n_ctx, vocab_size, eos_ids, bos_id, chat_template = MODEL, 2, 64, 16, frozenset(), None, None

    def __init__(self, tokenizer: _SlowTokenizer):
        self.tokenizer = tokenizer

    def step(self, rows: Sequence[Row]) -> list[int | None]:
        return [1 if r.sample else None for r in rows]

    def release(self, slot: int) -> None:
        pass


def test_tokenizing_leaves_the_event_loop_free():
    import uvicorn

    from webtensor.serve.app import create_app

    port = free_port()
    app = create_app(_EchoEngine(_SlowTokenizer(1.5)))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 20
        while not server.started and time.monotonic() < end:
            time.sleep(0.02)
        result: dict = {}
        slow = threading.Thread(target=lambda: result.update(
            r=post(url + "/v1/completions", {"model": MODEL, "prompt": "abc", "max_tokens": 2})))
        t0 = time.monotonic()
        slow.start()
        time.sleep(0.2)  # the prompt is being tokenized now
        latencies = []
        for _ in range(5):
            t = time.monotonic()
            assert get(url + "/health")[0] == 200
            latencies.append(time.monotonic() - t)
        slow.join()
        assert time.monotonic() - t0 >= 1.5 and result["r"][0] == 200
        assert max(latencies) < 0.5, latencies  # answered while the tokenizer worked
    finally:
        server.should_exit = True
        thread.join(10)


def test_port_in_use_is_found_before_anything_else():
    from webtensor.serve.server import bind

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(OSError):
            bind("127.0.0.1", port)
