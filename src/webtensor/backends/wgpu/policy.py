"""KernelPolicy: which kernel variant each WebGPU planner picks (ops.py, q8_ops.py), and the tile,
split and threshold numbers it picks them with, frozen per device.

Each WgpuContext derives its policy once from its adapter (`KernelPolicy.for_adapter`): whether
it is a CPU adapter (lavapipe, SwiftShader, WARP: barrier-free kernels) or a GPU, and how many
compute units (NVIDIA SMs, AMD CUs, Apple / Intel cores) the tile and split-K rules count in,
from a table of known GPUs (WebGPU reports no unit count). Two devices in one process, or a
browser on an integrated GPU, each get their own. `Device.kernel_policy` reads a device's policy;
assigning `device.kernel_policy = device.kernel_policy.replace(...)` overrides fields for that
device (what tests and benchmarks do to force a variant; launches planned afterwards follow it,
graphs captured before keep theirs); the environment variable WEBTENSOR_POLICY ("field=value,...")
overrides fields of every device a process opens (benchmarks comparing variants in fresh processes).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

ENGINE_F16_MATHS = ("f32", "f16", "chunked")

# compute units of known GPUs, by a pattern of the adapter's name (first match wins)
KNOWN_UNITS: tuple[tuple[str, int], ...] = (
    (r"\bh100\b.*pcie", 114), (r"\bgh200\b|\bh200\b|\bh100\b", 132), (r"\ba100\b", 108),
    (r"\bl40s?\b", 142), (r"\bl4\b", 58), (r"\ba10g?\b", 72), (r"rtx 4090", 128), (r"rtx 4080", 76),
    (r"rtx 3090", 82), (r"rtx 3080", 68), (r"\bv100\b", 80), (r"\bt4\b", 40),
    (r"mi300", 304), (r"mi250", 208), (r"rx 7900 xtx", 96),
    (r"apple m\d (max)", 38), (r"apple m\d (pro)", 18), (r"apple m\d", 10),
)
CPU_ADAPTER_PREFILL = (128, 128)  # a CPU adapter's (prefill_chunk, prefill_budget)
DEFAULT_UNITS = {"DiscreteGPU": 64, "IntegratedGPU": 16, "VirtualGPU": 16, "CPU": 1}


@dataclass(frozen=True)
class KernelPolicy:
    """Every choice the WebGPU planners make that depends on the device. Fields, by kernel family:"""

    # the kernel family: GPU variants (workgroup memory, barriers, subgroups) or, on CPU adapters,
    # the barrier-free ones (one thread an output GEMV, matmul_regs, attention_flash)
    gpu_style: bool = True
    # multiprocessors the matmul engine's tile and split-K rules count in (H200: 132 SMs)
    compute_units: int = 64
    # GEMV (gemv.wgsl, gemv_quant.wgsl): up to gemv_max_rows rows of A a bandwidth-bound GEMV beats the
    # tiled kernels; a stack of one-row products takes gemv_group rows a workgroup; a stack of more
    # than gemv_stack_f16_max_rows rows with float16 weights, or gemv_stack_quant_max_rows with quantized
    # ones, goes to the engine on GPUs (None: never; ops.stack_goes_tiled);
    # float16 weights read as u32 pairs (gemv_packed_f16; H200: 4.5x faster LM-head GEMV); gemv_quant's
    # outputs a thread on CPU adapters and on GPUs (gemv_quant_nr, gemv_quant_nr_gpu)
    gemv_max_rows: int = 8
    gemv_group: int = 8
    gemv_stack_f16_max_rows: int | None = 16
    gemv_stack_quant_max_rows: int | None = 16
    gemv_packed_f16: bool = True
    gemv_quant_nr: int = 2
    gemv_quant_nr_gpu: int = 1
    # quantized GEMV on GPUs (quant_ops.kernel_for): int8 activations and packed 4x8-bit integer dot
    # products where the device's WGSL has them (gemv_quant_dot4.wgsl; else or when off the f32
    # gemv_quant.wgsl), with gemv_dot4_nr outputs a thread, its workgroups capped at gemv_dot4_waves a
    # compute unit (each quantizes the activations once, then loops over output groups), the
    # activations staged in at most gemv_dot4_stage_bytes of workgroup memory (0: the device's limit),
    # or quantized by a launch of their own first (gemv_dot4_prequant: quantize_q8.wgsl, then every
    # workgroup reads them from memory), the loads of gemv_dot4_unroll units issued together;
    # threads an output (gemv_quant_lanes; 0: quant_ops.quant_lanes' rule)
    gemv_quant_dot4: bool = True
    gemv_dot4_nr: int = 2
    gemv_dot4_waves: int = 4
    gemv_dot4_stage_bytes: int = 0
    gemv_dot4_prequant: bool = False
    gemv_dot4_unroll: int = 1
    gemv_quant_lanes: int = 0
    # mixture of experts (moe_ops.py): a step of more than moe_grouped_min_slots (row, expert) slots that need
    # not be one-row products goes through the grouped kernels on GPUs (moe_align.wgsl, expert_gemm*.wgsl:
    # each expert's weights read once a block of moe_block slots), else the expert GEMV (None: always the GEMV)
    moe_grouped_min_slots: int | None = 32
    moe_block: int = 32
    # the matmul engine (matmul_engine.wgsl; matmul_engine_quant.wgsl for quantized weights) for
    # M > gemv_max_rows on GPUs (False: matmul.wgsl, matmul_quant.wgsl);
    # float16 operands read as u32 words, float16 outputs written as words, float16 x float16 math in
    # "f32" (f32 tiles and FMAs), "f16" (f16 tiles) or "chunked" (packed f16 FMAs a BK step)
    engine: bool = True
    # the K step of f32 tiles: 8 (16 KiB of workgroup memory at most), or 16 (fewer barriers and loads a
    # FMA; 16 to 32 KiB by tile, taken only where the device's limit holds the tiles, else 8)
    engine_bk: int = 8
    engine_f16_words: bool = True
    engine_f16_out_words: bool = True
    engine_f16_math: str = "f32"
    # the engine's tile and split-K rule (ops.engine_tile / engine_split): below engine_deep_m rows
    # the rule for batched decode steps; K slices of at least engine_split_min_k
    engine_deep_m: int = 128
    engine_split_k: bool = True
    engine_split_min_k: int = 128
    # attention: attention_tiled.wgsl from tiled_min_queries queries (tiles of the largest of
    # tiled_keys keys whose workgroup memory fits, tiled_reserved_bytes kept free), else
    # attention_prefill.wgsl from prefill_min_queries (its partial scores by subgroup shuffles where
    # prefill_subgroups), else attention_flash.wgsl (CPU adapters) from flash_min_queries, else
    # attention.wgsl
    tiled: bool = True
    tiled_min_queries: int = 64
    tiled_keys: tuple[int, ...] = (64, 32, 16)
    tiled_reserved_bytes: int = 0
    prefill: bool = True
    prefill_min_queries: int = 256
    prefill_subgroups: bool = True
    flash_min_queries: int = 2
    # argmax: a row is split over up to 64 workgroups of this many columns
    argmax_cols_per_part: int = 1024
    # prompts (runtime.runner.prefill_policy): a prompt is read prefill_chunk tokens a replayed graph (the
    # prompt-chunk graphs' largest shape), and a server step adds at most prefill_budget prompt tokens beside
    # running decode rows (at least one chunk; none running: every waiting prompt's next chunk). GPUs: chunks
    # big enough to fill the matrix engine; CPU adapters (for_adapter): smaller, their products are slow
    prefill_chunk: int = 512
    prefill_budget: int = 512
    # submission (WgpuContext._lead): a batch of submit_split_min commands or more (a prompt chunk's) is
    # submitted in pieces, the first of submit_first commands, so the GPU starts while the rest is encoded;
    # smaller ones (a decode step) whole; 0: always whole (CPU adapters: their submit runs the kernels)
    submit_first: int = 64
    submit_split_min: int = 256

    def __post_init__(self) -> None:
        if self.engine_f16_math not in ENGINE_F16_MATHS:
            raise ValueError(f"engine_f16_math must be one of {ENGINE_F16_MATHS}, got {self.engine_f16_math!r}")
        if self.engine_bk not in (8, 16):
            raise ValueError(f"engine_bk must be 8 or 16, got {self.engine_bk!r}")
        if self.compute_units < 1:
            raise ValueError(f"compute_units must be positive, got {self.compute_units}")
        if self.gemv_quant_lanes not in (0, 1, 2, 4, 8, 16, 32, 64, 128, 256):
            raise ValueError(f"gemv_quant_lanes must be 0 (the rule) or a power of two in 1 .. 256, got "
                             f"{self.gemv_quant_lanes}")
        if self.gemv_dot4_nr not in (1, 2, 4, 8) or self.gemv_dot4_waves < 1 or self.gemv_dot4_unroll not in (1, 2):
            raise ValueError(f"gemv_dot4_nr must be 1, 2, 4 or 8, gemv_dot4_waves positive and gemv_dot4_unroll 1 "
                             f"or 2, got {self.gemv_dot4_nr}, {self.gemv_dot4_waves}, {self.gemv_dot4_unroll}")
        if self.prefill_chunk < 1 or self.prefill_budget < 1:
            raise ValueError(f"prefill_chunk and prefill_budget must be positive, got {self.prefill_chunk} and "
                             f"{self.prefill_budget}")

    @classmethod
    def for_adapter(cls, info: Any) -> KernelPolicy:
        """The policy of an adapter (`gpu_api.AdapterInfo`): CPU adapters the barrier-free kernels,
        GPUs the rest, compute units from KNOWN_UNITS or DEFAULT_UNITS by adapter type."""
        name = str(info.name).lower()
        units = next((n for pat, n in KNOWN_UNITS if re.search(pat, name)), None)
        if units is None:
            units = DEFAULT_UNITS.get(str(info.adapter_type), DEFAULT_UNITS["IntegratedGPU"])
        # int8 activations (gemv_quant_dot4) on GPUs (the H200: docs/performance-notes.md), not on CPU
        # adapters, where the packed dot products are emulated and the f32 kernel was faster (lavapipe, measured)
        if info.is_software:
            return cls(gpu_style=False, compute_units=units, prefill_chunk=CPU_ADAPTER_PREFILL[0],
                       prefill_budget=CPU_ADAPTER_PREFILL[1], submit_first=0,
                       gemv_quant_dot4=False)
        return cls(gpu_style=True, compute_units=units)

    def with_overrides(self, spec: str) -> KernelPolicy:
        """A copy with the fields `spec` names ("field=value,field=value": what WEBTENSOR_POLICY holds, for
        benchmarks comparing variants process by process), each value read as its field's type (booleans
        as 0 / 1 / true / false, "none" for None); ValueError naming the item for anything else."""
        types = {f.name: f.type for f in dataclasses.fields(self)}
        changes: dict[str, Any] = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            name, eq, raw = item.partition("=")
            name, raw = name.strip(), raw.strip()
            kind = str(types.get(name, ""))
            if not eq or not kind:
                raise ValueError(f"WEBTENSOR_POLICY: {item!r} is not field=value for a KernelPolicy field")
            low = raw.lower()
            try:
                if kind == "bool":
                    if low not in ("0", "1", "true", "false"):
                        raise ValueError
                    changes[name] = low in ("1", "true")
                elif low == "none" and "None" in kind:
                    changes[name] = None
                elif kind.startswith("int"):
                    changes[name] = int(raw)
                elif kind == "str":
                    changes[name] = raw
                else:
                    raise ValueError
            except ValueError:
                raise ValueError(f"WEBTENSOR_POLICY: {item!r}: {raw!r} is not a value of {name} ({kind})") from None
        return self.replace(**changes)

    def replace(self, **changes: Any) -> KernelPolicy:
        """A copy with `changes` (field names; ValueError for an unknown one or a bad value)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"KernelPolicy has no field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)
