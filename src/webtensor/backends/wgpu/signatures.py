"""What every WGSL kernel takes: its uniform parameters (`struct P`, by name and type) and its
storage bindings (by name, read or written), one short declaration per kernel.

The declaration is the contract between a planner (`backends/wgpu/ops.py`) and the shader:
parameters are packed by field name with WGSL's uniform layout (so an int where the struct wants
f32 is converted, never reinterpreted), and when a pipeline is created the declaration is checked
against the shader's own `struct P` and `@binding` lines, so the two cannot drift apart. Bindings
declared `read` are `var<storage, read>` in WGSL and read-only in the bind-group layout, so they
may alias each other (x + x) and a dummy buffer can stand in for an unused one.

Declaration syntax: params "M N K4 acc=0 eps:f32=0" (type u32 unless `:type`; `=0` gives a
default, every other field must be passed); bindings "a w bias? -> c" (inputs before `->`,
outputs after; `?` marks an optional input that gets the dummy buffer when not given).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import GPUError

_TYPES = {"u32": ("I", 4, 4, 1), "i32": ("i", 4, 4, 1), "f32": ("f", 4, 4, 1),
          "vec4u": ("4I", 16, 16, 4), "vec4f": ("4f", 16, 16, 4)}
_WGSL_TYPES = {"u32": "u32", "i32": "i32", "f32": "f32", "vec4<u32>": "vec4u", "vec4<f32>": "vec4f"}


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    offset: int
    default: float | int | None  # None: required


@dataclass(frozen=True)
class Binding:
    name: str
    writes: bool
    optional: bool


class Signature:
    """One kernel's parameters and bindings (see the module docstring for the syntax)."""

    def __init__(self, file: str, params: str, bindings: str):
        self.file = file
        fields, off = [], 0
        for tok in params.split():
            m = re.fullmatch(r"(\w+)(?::(\w+))?(?:=(-?[\d.]+))?", tok)
            if m is None:
                raise ValueError(f"{file}: bad parameter declaration {tok!r}")
            name, typ, default = m.group(1), m.group(2) or "u32", m.group(3)
            _, size, align, _ = _TYPES[typ]
            off = (off + align - 1) // align * align
            fields.append(Field(name, typ, off, None if default is None else float(default)))
            off += size
        self.fields = tuple(fields)
        self.size = max(16, (off + 15) // 16 * 16)  # a uniform struct's size rounds up to 16
        self._by_name = {f.name: f for f in fields}
        ins, _, outs = bindings.partition("->")
        self.bindings = tuple([Binding(n.rstrip("?"), False, n.endswith("?")) for n in ins.split()]
                              + [Binding(n, True, False) for n in outs.split()])
        self.read_only = tuple(not b.writes for b in self.bindings)
        self.binding_names = frozenset(b.name for b in self.bindings)
        self.binding_order = tuple((b.name, b.optional) for b in self.bindings)  # (what `launch` walks)
        # `pack`'s fast path: the whole block as one struct.Struct (fields at their offsets, pad bytes
        # between them and up to `size`), the fields in order as (name, default, is a vec4)
        fmt, pos = ["<"], 0
        for f in fields:
            code, size, _, _ = _TYPES[f.type]
            fmt.append(f"{f.offset - pos}x{code}" if f.offset > pos else code)
            pos = f.offset + size
        fmt.append(f"{self.size - pos}x" if self.size > pos else "")
        self._struct = struct.Struct("".join(fmt))
        self._names = frozenset(self._by_name)
        self._order = tuple((f.name, _typed(f), _TYPES[f.type][3] > 1) for f in fields)

    def pack(self, values: Mapping[str, Any], into: bytearray | None = None, at: int = 0) -> bytes:
        """The uniform bytes for `values` (by field name: numbers, numpy's too, or sequences of them for the
        vector fields); unknown or missing names are errors, a value that does not fit its field is a GPUError.

        A launch's parameters are packed by one struct.Struct call when every name is known, every
        field has a value and each vec4 field gets 4 values: struct converts each value as the field
        by field path below does (an int to f32 as float(v); an integer, or an object with __index__,
        to u32 / i32 as is), and anything it does not take as it stands (a float for a u32 field, a
        value out of range) goes to the field by field path, which converts or raises as it always
        did: the bytes, and the errors, are the same either way (tests/test_core.py checks both)."""
        if into is None and self._names.issuperset(values):
            try:
                args: list[Any] = []
                for name, default, vec in self._order:
                    v = values.get(name, default)
                    if v is None:
                        break
                    if vec:
                        if len(v) != 4:
                            break
                        args.extend(v)
                    else:
                        args.append(v)
                else:
                    return self._struct.pack(*args)
            except Exception:
                pass  # (the field by field path converts or raises)
        unknown = set(values) - set(self._by_name)
        if unknown:
            raise GPUError(f"{self.file}: no parameter(s) {sorted(unknown)}; it takes {[f.name for f in self.fields]}")
        out = into if into is not None else bytearray(self.size)
        for f in self.fields:
            v = values.get(f.name, f.default)
            if v is None:
                raise GPUError(f"{self.file}: parameter {f.name!r} is required")
            code = _TYPES[f.type][0]
            try:
                if code in ("I", "i"):
                    struct.pack_into("<" + code, out, at + f.offset, int(v))
                elif code == "f":
                    struct.pack_into("<f", out, at + f.offset, float(v))
                else:
                    cast = float if code == "4f" else int
                    struct.pack_into("<" + code, out, at + f.offset, *(cast(x) for x in v))
            except (struct.error, TypeError, ValueError) as e:
                raise GPUError(f"{self.file}: parameter {f.name}={v!r} does not fit {f.type}: {e}") from e
        return bytes(out) if into is None else b""

    def check_wgsl(self, code: str) -> None:
        """Raise GPUError unless `code`'s `struct P` and storage bindings match this declaration."""
        body = re.sub(r"//[^\n]*", "", code)
        m = re.search(r"struct\s+P\s*\{([^}]*)\}", body)
        wgsl_fields = [] if m is None else [
            (n, _WGSL_TYPES.get(t.replace(" ", ""), t)) for n, t in re.findall(r"(\w+)\s*:\s*([\w<> ]+?)\s*(?:,|$)",
                                                                                 m.group(1).strip())]
        mine = [(f.name, f.type) for f in self.fields]
        if wgsl_fields != mine:
            raise GPUError(f"{self.file}: the declared parameters {mine} differ from the shader's struct P "
                           f"{wgsl_fields}")
        decls = re.findall(r"@binding\(\s*(\d+)\s*\)\s*var\s*<\s*storage\s*,\s*(read|read_write)\s*>\s*(\w+)", body)
        got = [(int(b), n, acc == "read_write") for b, acc, n in decls]
        want = [(i + 1, b.name, b.writes) for i, b in enumerate(self.bindings)]
        if sorted(got) != want:
            raise GPUError(f"{self.file}: the declared bindings {want} (binding, name, written) differ from the "
                           f"shader's {sorted(got)}")


def _typed(f: Field) -> float | int | None:
    """A field's default as the field by field path packs it (int() for u32 / i32, float() for f32)."""
    if f.default is None or _TYPES[f.type][3] > 1:
        return f.default
    return float(f.default) if f.type == "f32" else int(f.default)


def _sig(file: str, params: str, bindings: str) -> Signature:
    return Signature(file, params, bindings)


_EPI = "epi=0 bias_off=0 r_off=0 r_ld=0"
_KV = "block max_blocks n_seqs n_blocks table_off"  # a KV cache's block table (kv_pages.wgsl)
SIGNATURES = {s.file: s for s in (
    _sig("elementwise", "shape:vec4u sa:vec4u sb:vec4u a_off b_off o_off=0 n", "a b -> o"),
    _sig("unary", "shape:vec4u si:vec4u so:vec4u i_off o_off n alpha:f32=1", "x -> o"),
    _sig("layer_norm", "rows cols x_off x_ld o_off=0 eps:f32 w_off=0 b_off=0", "x w bias -> o"),
    _sig("rms_norm", "rows cols x_off n_in ld_in ld_out eps:f32 w_off", "x w -> o"),
    _sig("rope", "T H D half x_off x_ts x_hs pos_off P c_off s_off", "x pos cos_t sin_t -> o"),
    _sig("softmax", "rows cols x_off x_ld o_off=0", "x -> o"),
    _sig("argmax", "rows cols x_off x_ld parts=1", "x -> o"),
    _sig("argmax_parts", "rows parts", "part -> o"),
    _sig("token_mask", "rows cols words x_off x_ld", "x bits -> o"),
    _sig("matmul", f"M N K acc=0 a_off lda b_off ldb_k ldb_n c_off=0 ldc a_bs=0 b_bs=0 c_bs=0 {_EPI}",
         "a b bias? res? -> c"),
    _sig("matmul_regs", f"M N K4 acc=0 a_off4 lda4 b_off4 c_off=0 ldc {_EPI}", "a w bias? res? -> c"),
    _sig("gemv", f"M N K4 acc=0 a_off4 lda4 b_off4 c_off=0 ldc {_EPI} eps:f32=0",
         "a w bias? res? lnw? lnb? -> c"),
    _sig("matmul_engine", f"M N K acc=0 a_off4 lda4 b_off4 ldb4 c_off=0 ldc {_EPI} ks=0 c_zs=0",
         "a b bias? res? -> c"),
    _sig("matmul_engine_quant", f"M N K acc=0 a_off4 lda4 d_ld c_off=0 ldc {_EPI} ks=0 c_zs=0",
         "a qs scales bias? res? -> c"),
    _sig("matmul_splitk_sum", "M N S ld_s acc=0 c_off=0 ldc epi=0 bias_off=0 r_off=0 r_ld=0", "part bias? res? -> c"),
    _sig("attention_prefill", "T S causal scale:f32 q_off q_ts q_hs k_off k_ts k_hs v_off v_ts v_hs o_off=0 o_ts o_hs "
         "group", "q k v -> o"),
    _sig("attention_tiled", "T S causal scale:f32 G q_off q_ts q_hs k_off k_ts k_hs v_off v_ts v_hs o_ts o_hs",
         "q k v -> o"),
    _sig("attention_tiled_cache", f"T scale:f32 G q_off q_ts q_hs o_ts o_hs n_ctx n_slots C4 kc_off vc_off {_KV}",
         "q pos slot kv_table? kc vc -> o"),
    _sig("attention_flash_cache", f"T scale:f32 group q_off q_ts q_hs o_ts o_hs n_ctx n_slots C4 kc_off vc_off {_KV}",
         "q pos slot kv_table? kc vc -> o"),
    *(_sig(k, f"M N K acc=0 a_off4 lda4 d_ld c_off=0 ldc {_EPI} eps:f32=0", "a qs scales bias? res? lnw? lnb? -> c")
      for k in ("gemv_quant", "gemv_quant_dot4")),
    _sig("quantize_q8", "M K a_off4 lda4 o_ld eps:f32=0", "a lnw? lnb? -> o"),
    *(_sig(k, f"M N K acc=0 a_off4 lda4 d_ld c_off=0 ldc {_EPI} eps:f32=0", "a qs scales bias? res? -> c")
      for k in ("matmul_quant", "matmul_quant_regs")),
    _sig("attention", "T S H D q_off q_ts q_hs causal k_off k_ts k_hs scale:f32 v_off v_ts v_hs o_off=0 o_ts o_hs "
         "group", "q k v -> o"),
    _sig("attention_flash", "T S causal scale:f32 q_off q_ts q_hs k_off k_ts k_hs v_off v_ts v_hs o_ts o_hs group",
         "q k v -> o"),
    _sig("embedding", "n_ids cols row0 rows ids_off o_off=0 t_off", "table ids -> o"),
    _sig("embedding_quant", "n_ids K row0 rows ids_off o_off=0 d_ld", "qs scales ids -> o"),
    _sig("cache_write", f"T H D src_off src_ts src_hs pos_off slot_off {_KV} c_off half=0 P=1 tc_off=0 ts_off=0",
         "src ps cos_t? sin_t? kv_table? -> cache"),
    _sig("cache_gather", f"n H D seq {_KV} c_off", "kv_table? cache -> o"),
    _sig("cached_attention", f"T H D4 q_off4 q_ts4 q_hs4 k_off4=0 k_ts4=0 k_hs4=0 v_off4=0 v_ts4=0 v_hs4=0 n_ctx "
         f"write=0 scale:f32 group pos_off slot_off {_KV} kc_off4 vc_off4 half=0 P=1 tc_off=0 ts_off=0",
         "q kn? vn? ps kv_table? -> kc vc o"),
    _sig("cached_attention_rope", f"T H D4 q_off4 q_ts4 q_hs4 k_off4=0 k_ts4=0 k_hs4=0 v_off4=0 v_ts4=0 v_hs4=0 "
         f"n_ctx write=0 scale:f32 group pos_off slot_off {_KV} kc_off4 vc_off4 half P tc_off ts_off",
         "q kv? ps tab kv_table? -> kc vc o"),
    _sig("advance_tokens", "B ring", "next_ids -> ids pos tokens count"),
)}
