"""A Mistral whose every layer slides (window 32, context 512), random weights written by transformers, generating
far past its window with the KV blocks behind the window given back (docs/design-kv.md, "Sliding windows"): every
decode step's logits equal transformers' forward over the same tokens, on the CPU device and lavapipe, while the
runner holds at most the window's blocks; the prompt read in chunks past the window too."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from llama_fixtures import make_llama  # noqa: E402
from tolerance import assert_close  # noqa: E402

import webtensor as wt  # noqa: E402
from webtensor.runtime.blocks import HOLE, window_blocks  # noqa: E402
from webtensor.runtime.generate import generate  # noqa: E402
from webtensor.runtime.runner import ModelRunner  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

WINDOW, N_CTX, PROMPT, NEW = 32, 512, 150, 250


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, list[int]]:
    """The checkpoint, a 150-token prompt, and transformers' logits over the prompt and 250 tokens after it."""
    d = make_llama(tmp_path_factory.mktemp("kvwin") / "mistral", "mistral", sliding_window=WINDOW,
                   max_position_embeddings=N_CTX)
    ids = [int(i) for i in np.random.default_rng(11).integers(0, 4096, PROMPT + NEW)]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    assert hf.config.sliding_window == WINDOW
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    return d, want, ids


@pytest.mark.parametrize("dev_name", ["cpu", "wgpu"])
def test_far_past_the_window_every_step_is_transformers(mistral, dev_name, gpu):
    """The prompt (150 tokens, chunks of 64 past the window) then 250 decode steps fed the reference's tokens (each
    step's logits read back): every row transformers' to float32's rounding, the blocks in use within the window's
    bound after every step, the first blocks given back."""
    d, want, ids = mistral
    dev = wt.Device.cpu() if dev_name == "cpu" else gpu
    m = wt.load_model(d, dev, n_ctx=N_CTX, kv_dtype="float32")
    runner = ModelRunner(m, 1, bucketed=False, prefill_chunk=64)
    assert runner.kv_window == WINDOW
    got: list[np.ndarray] = []

    def pick(row: np.ndarray, position: int) -> int:  # (teacher forcing: the next token is the reference's)
        got.append(np.array(row))
        held = sum(1 for b in runner._owned[0] if b != HOLE)
        assert held <= window_blocks(WINDOW, 64 if len(got) == 1 else 1, 16), (position, held)
        return ids[position]
    list(generate(runner, ids[:PROMPT], NEW, False, pick))
    assert runner._owned[0][:20] == [HOLE] * 20
    assert_close(np.stack(got), want[PROMPT - 1:PROMPT - 1 + NEW], rtol=1e-5 if dev_name == "cpu" else 1e-4)
    every = m.logits(ids)  # (the prompt path over all 400 tokens: chunks, each reading the window before it)
    assert_close(every, want, rtol=1e-5 if dev_name == "cpu" else 1e-4)
    runner.close()
