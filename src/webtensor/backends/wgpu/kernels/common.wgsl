// Functions shared by several kernels; context.kernel() puts this file after each kernel's header.
// Bounds (the kernels run without the compiler's runtime checks): wg_red is indexed by li < 256 and
// by li + s with li < s <= 128; unflatten4 returns idx < shape componentwise (its callers bound i
// by the element count). Loops end: each runs to a uniform or constant bound in steps that cannot
// wrap (sizes stay under 2^31).

// GPT-2's GELU (tanh form): 0.5 v (1 + tanh(u)), u = sqrt(2/pi) (v + 0.044715 v^3), written as the
// identical v * sigmoid(2u), which has no cancellation for v < 0. Below u = -40 the result is under
// 1e-33 in magnitude and is returned as -0.0 (also for v = -inf, where the formula gives NaN).
fn gelu_tanh(v: f32) -> f32 {
  let u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
  if (u < -40.0) { return -0.0; }
  return v / (1.0 + exp(-2.0 * u));
}

// tanh to a few ulps everywhere (WGSL's tanh may be computed as (e^2x - 1) / (e^2x + 1), whose
// cancellation loses all precision near 0, where soft-capping puts most scores): an odd Taylor
// polynomial below |x| = 0.25 (the next term's share under 1e-9), else (1 - e) / (1 + e) with
// e = exp(-2 |x|) <= 0.61 (no cancellation; e underflows to 0 for large |x|: +-1).
fn tanh_f32(x: f32) -> f32 {
  let a = abs(x);
  if (a < 0.25) {
    let y = x * x;
    return x * (1.0 + y * (-0.3333333333 + y * (0.1333333333 + y * (-0.0539682540 + y * 0.0218694885))));
  }
  let e = exp(-2.0 * a);
  return sign(x) * (1.0 - e) / (1.0 + e);
}
fn tanh4(x: vec4<f32>) -> vec4<f32> { return vec4<f32>(tanh_f32(x.x), tanh_f32(x.y), tanh_f32(x.z), tanh_f32(x.w)); }

// SwiGLU of four gate and up values: silu(g) * u = g * sigmoid(g) * u, sigmoid as 1 / (1 + exp(-g))
// (elementwise.wgsl's swiglu, the same operations: exp(-g) overflowing to inf gives silu(-large) = -0).
fn swiglu4(g: vec4<f32>, u: vec4<f32>) -> vec4<f32> { return g * (1.0 / (1.0 + exp(-g))) * u; }

// GeGLU of four gate and up values: gelu_tanh(g) * u (elementwise.wgsl's geglu, the same operations).
fn geglu4(g: vec4<f32>, u: vec4<f32>) -> vec4<f32> {
  return vec4<f32>(gelu_tanh(g.x), gelu_tanh(g.y), gelu_tanh(g.z), gelu_tanh(g.w)) * u;
}

// A gated prologue of kind `kind` (a kernel's const GLU: 1 SwiGLU, 2 GeGLU) of four gate and up values.
fn glu4(kind: u32, g: vec4<f32>, u: vec4<f32>) -> vec4<f32> {
  if (kind == 2u) { return geglu4(g, u); }
  return swiglu4(g, u);
}

// Rotary embedding of one dim d < R = 2 half of a head, as rope.wgsl computes it: its pair is (a, b) =
// dims (i, i + half) (rotate_half) or (2i, 2i + 1) (interleaved), rotated by the angle of table column
// i to (a c - b s, b c + a s). rope_pair(d): (its partner dim, the column i, 1 if d is the pair's a);
// rope_rot(x, y, c, s, first): the rotated value of a dim holding x whose partner holds y.
fn rope_pair(d: u32, half: u32, interleaved: bool) -> vec3<u32> {
  if (interleaved) { return vec3<u32>(d ^ 1u, d / 2u, 1u - d % 2u); }
  if (d < half) { return vec3<u32>(d + half, d, 1u); }
  return vec3<u32>(d - half, d - half, 0u);
}
fn rope_rot(x: f32, y: f32, c: f32, s: f32, first: bool) -> f32 {
  if (first) { return x * c - y * s; }
  return x * c + y * s;
}

// Index (i0, i1, i2, i3) of element i of a row-major tensor of (up to 4-d, left-padded) `shape`.
fn unflatten4(i: u32, shape: vec4<u32>) -> vec4<u32> {
  var r = i;
  let i3 = r % shape.w; r = r / shape.w;
  let i2 = r % shape.z; r = r / shape.z;
  return vec4<u32>(r / shape.y, r % shape.y, i2, i3);
}

// Sum / max over a workgroup of 256 threads (call from uniform control flow; every thread gets it).
var<workgroup> wg_red: array<f32, 256>;

fn wg_reduce(li: u32, v: f32, is_max: bool) -> f32 {
  wg_red[li] = v;
  workgroupBarrier();
  for (var s = 128u; s > 0u; s = s >> 1u) {
    if (li < s) {
      if (is_max) { wg_red[li] = max(wg_red[li], wg_red[li + s]); } else { wg_red[li] = wg_red[li] + wg_red[li + s]; }
    }
    workgroupBarrier();
  }
  let r = wg_red[0];
  workgroupBarrier();
  return r;
}

fn wg_sum(li: u32, v: f32) -> f32 { return wg_reduce(li, v, false); }
fn wg_max(li: u32, v: f32) -> f32 { return wg_reduce(li, v, true); }
