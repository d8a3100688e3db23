"""The activation functions `ops.linear` can fuse into its epilogue, by name, and the code each
has in the WGSL epilogue (`epilogue.wgsl`, bits 8.. of the epilogue word). The CPU reference of each
is `backends.cpu.activation`. Names follow the functions, not a model library; `models.gpt2.config`
maps Hugging Face's `activation_function` names onto them."""

from __future__ import annotations

from .errors import ArgumentError

# name -> epilogue code (0 is "no activation"); keep in step with epilogue.wgsl's `activate`
CODES: dict[str, int] = {
    "gelu_tanh": 1,  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    "gelu_erf": 2,  # 0.5 x (1 + erf(x / sqrt 2)), erf to ~1e-7 relative (a Chebyshev fit of erfc)
    "gelu_erf_clip10": 3,  # gelu_erf clamped to [-10, 10]
    "quick_gelu": 4,  # x sigmoid(1.702 x)
    "relu": 5,
    "relu2": 6,  # relu(x)^2
    "relu6": 7,  # min(max(x, 0), 6)
    "leaky_relu": 8,  # x if x >= 0 else 0.01 x
    "sigmoid": 9,
    "tanh": 10,
    "silu": 11,  # x sigmoid(x)
    "hardswish": 12,  # x min(max(x + 3, 0), 6) / 6
    "mish": 13,  # x tanh(softplus(x))
    "laplace": 14,  # 0.5 (1 + erf((x - 0.707107) / (0.282095 sqrt 2)))
    "sqrt_softplus": 15,  # sqrt(softplus(x))
}
ALIASES = {"gelu": "gelu_tanh"}  # the name `linear` took before it had a choice


def canonical(act: str | None) -> str | None:
    """`act` as a key of CODES (None: no activation); ArgumentError for anything else."""
    if act is None or act == "identity":
        return None
    name = ALIASES.get(act, act) if isinstance(act, str) else act
    if name not in CODES:
        raise ArgumentError(f"linear: act must be None or one of {', '.join(CODES)}, got {act!r}")
    return name


def code(act: str | None) -> int:
    """The epilogue code of a canonical name (0 for None)."""
    return 0 if act is None else CODES[act]
