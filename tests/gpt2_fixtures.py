"""Random-init Hugging Face GPT-2 checkpoints in temp dirs, written with numpy, safetensors and
tokenizers only (no torch, no transformers), in the layout transformers writes and reads."""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's a test, isn't it? We'll see what they'd say.",
    "Héllo wörld — naïve café. Привет мир. 你好世界. Γειά σου κόσμε. 😀👍🏽 🇫🇷",
    "Once upon a time there was a little model that generated text, one token at a time.\n\n  \t end",
]


def make_tokenizer(d: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.save(str(d / "tokenizer.json"))


# GPT2Config's fields as transformers writes them to config.json (its defaults)
HF_CONFIG: dict[str, object] = {
    "activation_function": "gelu_new", "add_cross_attention": False, "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "dtype": "float32", "embd_pdrop": 0.1, "initializer_range": 0.02, "layer_norm_epsilon": 1e-5,
    "model_type": "gpt2", "n_inner": None, "pad_token_id": None, "reorder_and_upcast_attn": False,
    "resid_pdrop": 0.1, "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True,
    "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
    "summary_type": "cls_index", "summary_use_proj": True, "tie_word_embeddings": True, "use_cache": True,
}


def make_checkpoint(d: Path, *, vocab_size: int, n_embd: int, n_layer: int, n_head: int, n_positions: int = 96,
                    seed: int = 0, init: float = 0.3, **config: object) -> Path:
    """A Hugging Face GPT-2 checkpoint with random weights, written with numpy and safetensors as
    `GPT2LMHeadModel.save_pretrained` writes one (its tensor names, Conv1D (in, out) layout, config.json,
    generation_config.json; transformers loads it), so that tests need neither torch nor transformers.
    Weights are drawn as transformers initialises them, with std `init` (large enough that greedy
    text varies): normal matrices and embeddings (the residual projections scaled by 1 / sqrt(2
    n_layer)), zero biases, unit layer-norm weights; `config`: further GPT2Config fields."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    eos = 256  # the tokenizer's <|endoftext|> (first id after the 256 byte tokens)
    cfg = {**HF_CONFIG, "bos_token_id": eos, "eos_token_id": eos, "initializer_range": init, "n_embd": n_embd,
           "n_head": n_head, "n_layer": n_layer, "n_positions": n_positions, "vocab_size": vocab_size, **config}
    rng = np.random.default_rng(seed)
    C, F = n_embd, int(cfg["n_inner"] or 4 * n_embd)  # type: ignore[call-overload]
    proj = init / np.sqrt(2 * n_layer)

    def normal(shape: tuple[int, ...], std: float = init) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    t: dict[str, np.ndarray] = {"transformer.wte.weight": normal((vocab_size, C)),
                                "transformer.wpe.weight": normal((n_positions, C))}
    for i in range(n_layer):
        h = f"transformer.h.{i}."
        for name, (k, n), std in (("attn.c_attn", (C, 3 * C), init), ("attn.c_proj", (C, C), proj),
                                  ("mlp.c_fc", (C, F), init), ("mlp.c_proj", (F, C), proj)):
            t[h + name + ".weight"], t[h + name + ".bias"] = normal((k, n), std), np.zeros(n, np.float32)
        for ln in ("ln_1", "ln_2"):
            t[h + ln + ".weight"], t[h + ln + ".bias"] = np.ones(C, np.float32), np.zeros(C, np.float32)
    t["transformer.ln_f.weight"], t["transformer.ln_f.bias"] = np.ones(C, np.float32), np.zeros(C, np.float32)
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = normal((vocab_size, C))
    d.mkdir(parents=True, exist_ok=True)
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    generation = {"_from_model_config": True, "bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
                  "output_attentions": False, "output_hidden_states": False, "use_cache": True}
    (d / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    make_tokenizer(d, min(vocab_size, 400))
    return d
