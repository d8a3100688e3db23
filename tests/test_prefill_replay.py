"""The prompt pass as replayed graphs (`ModelRunner.prefill` / prompt rows of `launch`: `_ChunkGraph`): replayed
equal to the same chunks run eagerly, bit for bit, on the CPU device and on WebGPU (the CPU-adapter and the GPU
kernel variants), for GPT-2 and Llama-family random models; prompts crossing chunk and bucket boundaries, after a
cached prefix, with the LM head on every row; chunked equal to one chunk within float32's rounding (and the same
greedy tokens); a prompt of any length a handful of submits; the shapes few; graphs' memory bounded."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import set_policy
from tolerance import assert_close

import webtensor as wt
from webtensor.models import loader, registry
from webtensor.runtime import runner as R
from webtensor.runtime.runner import RunRow, chunk_bucket

LENGTHS = [1, 2, 15, 16, 17, 23, 24, 25, 40, 49, 100]  # chunks of 16: within one, at and across its ends
VOCAB = 512


def tiny(family: str, head_dim: int = 16, layers: int = 2) -> tuple[str, object]:
    """A small random config of `family`: GPT-2 (4 heads) or Llama (4 heads over 2 KV heads, GQA)."""
    if family == "gpt2":
        raw = dict(model_type="gpt2", vocab_size=VOCAB, n_embd=4 * head_dim, n_layer=layers, n_head=4,
                   n_positions=160, bos_token_id=0, eos_token_id=0)
    else:
        _, _, base = registry.preset("smollm2-135m")  # type: ignore[misc]
        raw = dict(base, vocab_size=VOCAB, hidden_size=4 * head_dim, intermediate_size=48, num_hidden_layers=layers,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=160, bos_token_id=0,
                   eos_token_id=0)
    fam = registry.by_name(family)
    return family, fam.config_from_hf(raw, "tests/test_prefill_replay.py")


@pytest.fixture(params=["gpt2", "llama"])
def family(request):
    return request.param


def model_on(dev: wt.Device, family: str, head_dim: int = 16, layers: int = 2):
    name, cfg = tiny(family, head_dim, layers)
    return loader.random(name, cfg, device=dev, n_ctx=160)


def prompt(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, n).tolist()


@pytest.fixture(params=["cpu", "wgpu-cpu-kernels", "wgpu-gpu-kernels"])
def dev(request, monkeypatch, gpu, cpu):
    if request.param == "cpu":
        return cpu
    set_policy(monkeypatch, gpu, gpu_style=request.param == "wgpu-gpu-kernels")
    return gpu


def test_chunk_bucket():
    widths = [chunk_bucket(n) for n in range(1, 4097)]
    assert all(w >= n for n, w in zip(range(1, 4097), widths, strict=True))
    assert all(3 * (w - n) < w for n, w in zip(range(17, 4097), widths[16:], strict=True))  # < a third padding
    assert widths[:16] == [16] * 16 and chunk_bucket(512) == 512 and chunk_bucket(513) == 768
    assert len(set(widths)) == 17  # 16, 24, 32, 48 .. 3072, 4096


def test_replayed_equals_eager(dev, family):
    """Every prompt length, chunks of 16: the replayed graphs' last-row logits are the eager forwards' bit for bit,
    and a prompt read after a cached prefix (p0 > 0) too."""
    m = model_on(dev, family)
    graphs, eager = m.runner(1, prefill_chunk=16), m.runner(1, use_graph=False, prefill_chunk=16)
    for n in LENGTHS:
        ids = prompt(n, n)
        a, b = graphs.prefill(0, ids).numpy(), eager.prefill(0, ids).numpy()
        assert a.shape == (1, VOCAB) and np.array_equal(a, b), n
    ids = prompt(60, 1)
    for p0 in (5, 16, 31):  # (the cache holds ids[:p0] from the last prefill)
        graphs.prefill(0, ids[:p0])
        eager.prefill(0, ids[:p0])
        assert np.array_equal(graphs.prefill(0, ids[p0:], p0).numpy(), eager.prefill(0, ids[p0:], p0).numpy())
    # every chunk of 2 to 16 tokens one graph of 16 rows (a head kind each), a chunk of one token the decode step's
    assert {k[:2] for k in graphs._graphs} == {("chunk", 16), ("step", 1)}


def test_chunked_equals_whole_and_hf_order(dev, family):
    """Chunks of 16 against one chunk of the whole prompt: the same logits within float32's rounding, the same
    greedy continuation; the prompt's every-row logits (`LanguageModel.logits`) end in the last-row ones, and each row's
    is its prefix's last-row logits (chunks of one graph: each one's read before the next replay)."""
    m = model_on(dev, family)
    small, whole = m.runner(1, prefill_chunk=16), m.runner(1, prefill_chunk=128)
    for n in (17, 49, 100):
        ids = prompt(n, 7 + n)
        a, b = small.prefill(0, ids).numpy()[0], whole.prefill(0, ids).numpy()[0]
        assert_close(a, b)  # (logits: VOCAB random outputs, no floor)
        full = m.logits(ids)
        assert full.shape == (n, VOCAB)
        assert_close(full[-1], b)
        # every row's logits in chunks of 16 (one graph, replayed a chunk): each chunk's read before the next rewrites
        every = small.collect(small.launch([RunRow(0, tuple(ids), 0, pick=False, every_logits=True)])).every_logits
        for k in (1, 16, 17, n):
            assert_close(every[0][k - 1], small.prefill(0, ids[:k]).numpy()[0])  # type: ignore[index]
    ids = prompt(40, 3)
    assert m.generate(ids, 8, stop_at_eos=False) == list(R_generate(small, ids, 8)) == list(R_generate(whole, ids, 8))


def R_generate(runner, ids, n):  # noqa: N802
    from webtensor.runtime.generate import generate

    return generate(runner, ids, n, True, lambda row, p: 0)


def test_prompt_rows_in_a_launch(dev, family):
    """Prompt rows of `launch` (each its own replayed chunks) beside decode rows: what each gets alone, the LM head
    on every row where asked (`every_logits`: one row per token, the last the choosing row's)."""
    m = model_on(dev, family)
    r = m.runner(3, prefill_chunk=16)
    alone = m.runner(3, prefill_chunk=16)
    ids = [prompt(n, n) for n in (5, 40, 33)]
    first = r.collect(r.launch([RunRow(0, tuple(ids[0]), 0)]))
    tok = first.tokens[0][0]
    got = r.collect(r.launch([RunRow(0, (tok,), 5, read_logits=True),
                              RunRow(1, tuple(ids[1]), 0, every_logits=True),
                              RunRow(2, tuple(ids[2][:20]), 0, pick=False)]))
    assert got.tokens[0][2] is None and got.every_logits[1].shape == (40, VOCAB)  # type: ignore[index]
    want1 = alone.collect(alone.launch([RunRow(1, tuple(ids[1]), 0, every_logits=True)]))
    assert np.array_equal(got.every_logits[1], want1.every_logits[0])  # type: ignore[index]
    assert got.tokens[0][1] == want1.tokens[0][0] == int(np.argmax(got.every_logits[1][-1]))  # type: ignore[index]
    alone.collect(alone.launch([RunRow(0, tuple(ids[0]), 0)]))
    want0 = alone.collect(alone.launch([RunRow(0, (tok,), 5, read_logits=True)]))
    assert got.tokens[0][0] == want0.tokens[0][0] and np.array_equal(got.logits[0], want0.logits[0])
    assert r.length(2) == 20 and r.length(1) == 40


@pytest.mark.parametrize("n", [7, 100, 150])
def test_a_prompt_is_a_handful_of_submits(gpu, n):
    """On WebGPU a prompt of n tokens is one submit a chunk (its inputs uploaded, its graph replayed) and the
    logits' copy, however many ops its forward has; the first pass captures, the next only replays."""
    m = model_on(gpu, "llama")
    r = m.runner(1, prefill_chunk=32)
    ids = prompt(n)
    r.prefill(0, ids).numpy()
    chunks = len(r.chunks(0, n))
    ctx = gpu.ctx
    before = dict(ctx.counters)
    r.prefill(0, ids).numpy()
    after = dict(ctx.counters)
    assert after["submits"] - before["submits"] <= chunks + 1
    assert after["pipelines_created"] == before["pipelines_created"]
    assert after["bind_groups_created"] - before["bind_groups_created"] <= 2  # (the copy's, the readback's)


def test_chunk_graph_memory_is_its_live_set(gpu):
    """A prompt-chunk graph holds about its largest live set (its intermediates' buffers reused within the graph),
    not one buffer per intermediate: a model of 8 layers' graph holds about what one of 2 layers' does."""
    held = []
    for layers in (2, 8):
        m = model_on(gpu, "llama", layers=layers)
        r = m.runner(1, prefill_chunk=128)
        before = gpu.ctx.bytes_in_use
        r.prefill(0, prompt(128)).numpy()
        held.append(gpu.ctx.bytes_in_use - before)
        r.close()
    assert held[1] < 1.25 * held[0], held  # (without the reuse: ~3.5 times)


def test_graphs_follow_the_device_policy(gpu):
    """The chunk size is the device policy's (`prefill_policy`: a CPU adapter's 128 here, a GPU's 512), and the
    runner's may be given."""
    m = model_on(gpu, "gpt2")
    assert m.runner(1).prefill_chunk == gpu.kernel_policy.prefill_chunk
    assert R.prefill_policy(wt.Device.cpu()) == R.CPU_PREFILL
    with pytest.raises(wt.ArgumentError, match="prefill_chunk must be >= 1"):
        m.runner(1, prefill_chunk=0)


def test_head_dim_without_tiles(monkeypatch, gpu):
    """A head dim the tiled kernel does not take (8: not a multiple of 16) runs chunk_attention through
    cached_attention's kernel: the same tokens as the CPU."""
    set_policy(monkeypatch, gpu, gpu_style=True)
    ids = prompt(30, 2)
    got = [model_on(d, "llama", head_dim=8).generate(ids, 6) for d in (gpu, wt.Device.cpu())]
    assert got[0] == got[1]


def test_big_batches_go_in_pieces(monkeypatch, gpu):
    """A batch of submit_split_min commands or more is submitted in pieces (the first of submit_first commands, then
    doubling), so a GPU starts while the rest is encoded: more submits, the same numbers."""
    m = model_on(gpu, "llama")
    ids = prompt(40)
    counts, results = [], []
    for first in (0, 4):
        set_policy(monkeypatch, gpu, submit_first=first, submit_split_min=16)
        r = m.runner(1, prefill_chunk=64)
        r.prefill(0, ids).numpy()
        before = gpu.ctx.counters["submits"]
        results.append(r.prefill(0, ids).numpy())
        counts.append(gpu.ctx.counters["submits"] - before)
    assert counts[0] == 2 and counts[1] >= 4  # (the chunk with the logits' copy, the readback; then 4, 8 .. first)
    assert np.array_equal(results[0], results[1])


def test_a_prompt_that_fills_the_context(dev, family):
    """A prompt of all n_ctx positions (its last chunk's padding rows at the last position, stored nowhere): the
    replay equals the eager pass, its every-row logits end in its last-row ones, and one more token is refused."""
    m = model_on(dev, family)
    ids = prompt(160, 5)
    r, e = m.runner(1, prefill_chunk=48), m.runner(1, use_graph=False, prefill_chunk=48)
    last = r.prefill(0, ids).numpy()
    assert np.array_equal(last, e.prefill(0, ids).numpy())
    assert_close(m.logits(ids)[-1], last[0])
    with pytest.raises(wt.ContextLengthError):
        r.prefill(0, ids + [1])
