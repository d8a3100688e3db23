"""`ProcessEngine`: the engine in a child process (the server's default on the CPU device) gives the
tokens the same engine gives in-process; a failing step raises in the parent and the engine goes on;
a child that cannot start is a clear error."""

from __future__ import annotations

import pytest

from webtensor.errors import ArgumentError
from webtensor.serve.engine import Row, Sampling
from webtensor.serve.process import EngineProcessError, ProcessEngine, build_engine

SPEC = dict(model=None, device="cpu", dtype="float32", max_batch=3, engine="batched", name="webtensor-shipped",
            blas_threads=1)


def _steps(engine) -> list[list[int | None]]:
    g, s = Sampling(), Sampling(0.9, 40, None, 7)
    out = [engine.step([Row(0, (1, 2, 3), 0, g), Row(1, (5,), 0, s), Row(2, (9, 8), 0, g, sample=False)])]
    for i in range(6):
        a, b = out[-1][0], out[-1][1]
        out.append(engine.step([Row(0, (a,), 3 + i, g), Row(1, (b,), 1 + i, s)]))
    engine.release(0)
    out.append(engine.step([Row(0, (4, 4), 0, g)]))
    return out


def test_process_engine_equals_in_process():
    pe = ProcessEngine(SPEC)
    try:
        assert (pe.name, pe.max_batch, pe.engine) == ("webtensor-shipped", 3, "batched")
        assert pe.tokenizer.encode("hello") == build_engine(SPEC).tokenizer.encode("hello")
        assert _steps(pe) == _steps(build_engine(SPEC))
        with pytest.raises(EngineProcessError, match="ArgumentError: slot 7 is out of range"):
            pe.step([Row(7, (1,), 0, Sampling())])
        assert pe.step([Row(1, (3,), 0, Sampling())])[0] is not None  # it goes on serving
    finally:
        pe.close()
    with pytest.raises(EngineProcessError, match="gone"):
        pe.step([Row(0, (1,), 0, Sampling())])


def test_a_child_that_cannot_start_is_an_error():
    with pytest.raises(EngineProcessError, match="failed to start: .*nonexistent"):
        ProcessEngine({**SPEC, "model": "/nonexistent/model-dir"})


@pytest.mark.parametrize("device", ["cpu", pytest.param("lavapipe", marks=pytest.mark.wgpu)])
def test_process_engine_follows_in_the_child(device):
    """launch + follow queued before either is read: the child runs the followed steps with their
    tokens fed back, on the CPU and on lavapipe, which equal stepping
    in-process; a follow of a step not the last is refused."""
    g = Sampling()
    spec = {**SPEC, "device": device}
    ref = build_engine(spec)
    first = ref.step([Row(0, (1, 2, 3), 0, g), Row(1, (5,), 0, g)])
    want, last = [], first
    for k in range(3):
        last = ref.step([Row(0, (last[0],), 3 + k, g), Row(1, (last[1],), 1 + k, g)])
        want.append(last)
    pe = ProcessEngine(spec)
    try:
        assert pe.step([Row(0, (1, 2, 3), 0, g), Row(1, (5,), 0, g)]) == first
        rows = [Row(0, (first[0],), 3, g), Row(1, (first[1],), 1, g)]
        assert pe.can_follow(rows) and not pe.can_follow([Row(0, (1,), 3, Sampling(0.9, None, None, 1))])
        tickets = [pe.launch(rows)]
        for k in range(2):
            tickets.append(pe.follow(tickets[-1], [Row(0, (0,), 4 + k, g), Row(1, (0,), 2 + k, g)]))
        with pytest.raises(ArgumentError, match="last launched"):
            pe.follow(tickets[0], rows)
        assert [pe.collect(t)[0] for t in tickets] == want
        pe.release(1)  # answered in order after the steps
        ref.release(1)
        assert pe.step([Row(1, (7,), 0, g)]) == ref.step([Row(1, (7,), 0, g)])
    finally:
        pe.close()
