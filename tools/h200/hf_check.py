"""H200: why HF's batched generate in bench-serve is slow (`python3 tools/h200/hf_check.py DIR`):
per-token time of `generate` for batch 1 and 64 of the checkpoint DIR in float16 on CUDA, with
and without the attention mask and `min_new_tokens`, and the attention implementation in use; then
bench-serve's own `hf_tok_s` on the same machine, and generate with its pad token (EOS)."""

import sys
import time

import torch
from transformers import GPT2LMHeadModel

d = sys.argv[1]
model = GPT2LMHeadModel.from_pretrained(d, dtype=torch.float16).to("cuda").eval()
print("attn:", model.config._attn_implementation, "device:", model.device, "dtype:", model.dtype, flush=True)
for B in (1, 64):
    x = torch.randint(0, 50000, (B, 12), device="cuda")
    mask = torch.ones_like(x)
    for kw in ({}, {"attention_mask": mask}, {"attention_mask": mask, "min_new_tokens": 64},
               {"attention_mask": mask, "min_new_tokens": 64, "pad_token_id": 50256}):
        with torch.inference_mode():
            kw = {"pad_token_id": 0, **kw}
            warm = {k: v for k, v in kw.items() if k != "min_new_tokens"}
            model.generate(x, max_new_tokens=4, do_sample=False, **warm)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model.generate(x, max_new_tokens=64, do_sample=False, **kw)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        n = out.shape[1] - x.shape[1]
        print(f"B={B} {sorted(kw)}: {n} tokens, {dt / n * 1e3:.2f} ms/step, {B * n / dt:,.0f} tok/s", flush=True)

from webtensor.serve.bench import hf_tok_s  # noqa: E402

for B in (1, 64):
    print(f"hf_tok_s B={B}: {hf_tok_s(d, B, 64, 'cuda', 'float16'):,.0f} tok/s", flush=True)
