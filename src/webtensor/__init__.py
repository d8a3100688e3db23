"""webtensor: tensors on WebGPU (wgpu) with a numpy reference backend, and language-model inference (the families
in `models/registry.py`: Llama, Qwen2/2.5/3, Mistral, Gemma 2/3, Phi-3, OLMo-2, Granite, Qwen3-MoE, Mixtral, OLMoE,
GPT-2) from Hugging Face checkpoints and GGUF files.

    model = wt.load_model("SmolLM2-135M-Instruct.Q4_1.gguf")   # a directory, a .gguf file, or a local HF id
    print(model.decode(model.generate(model.encode("The capital of France is"), 16)))


    import numpy as np, webtensor as wt
    gpu = wt.Device.wgpu()
    x = wt.tensor(np.random.rand(4, 768).astype(np.float32), device=gpu)
    with gpu.dispatch_scope():
        y = wt.gelu(wt.layer_norm(x @ w + b, g, beta))
    y.numpy()
"""

from .device import Device
from .dtypes import DType, float16, float32, int32
from .errors import (
    ArgumentError,
    BufferLimitError,
    CheckpointError,
    ContextLengthError,
    DeviceMismatchError,
    DeviceReleasedError,
    DTypeError,
    GPUError,
    GraphCaptureError,
    NoAdapterError,
    SamplingError,
    ShapeError,
    TokenizerError,
    UsageError,
    WebtensorError,
)
from .models import load_model
from .ops import (
    add,
    advance_tokens,
    argmax,
    attention,
    broadcast_shapes,
    cache_gather,
    cache_write,
    cached_attention,
    cast,
    chunk_attention,
    copy,
    copy_into,
    div,
    embedding,
    expert_linear,
    geglu,
    gelu,
    layer_norm,
    linear,
    matmul,
    moe_route,
    mul,
    rms_norm,
    rope,
    softcap,
    softmax,
    sub,
    swiglu,
)
from .tensor import Tensor, empty, from_buffer, tensor, zeros

__version__ = "0.1.0"
__all__ = [
    "Device", "Tensor", "tensor", "empty", "zeros", "from_buffer", "DType", "float16", "float32", "int32",
    "add", "sub", "mul", "div", "matmul", "gelu", "layer_norm", "rms_norm", "linear", "softmax", "attention",
    "embedding", "rope", "swiglu", "geglu", "softcap",
    "argmax", "cast", "copy", "copy_into", "broadcast_shapes", "cache_write", "cached_attention", "cache_gather",
    "chunk_attention",
    "advance_tokens", "moe_route", "expert_linear",
    "WebtensorError", "ArgumentError", "ShapeError", "DTypeError", "DeviceMismatchError", "NoAdapterError",
    "DeviceReleasedError", "BufferLimitError", "GPUError", "GraphCaptureError", "CheckpointError", "TokenizerError",
    "ContextLengthError", "SamplingError", "UsageError", "load_model",
]
