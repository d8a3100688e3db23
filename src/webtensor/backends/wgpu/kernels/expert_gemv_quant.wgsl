// Each row through its own experts (llama.cpp's MUL_MAT_ID), a quantized stack of expert matrices in
// webtensor's GPU layout of one of ggml's block types (quant_dequant.wgsl; the type by its define): the
// same products as expert_gemv.wgsl (o[s, n] = x[xrow(s)] . W[ids[s] N + n], W the E experts' (N, K)
// matrices stacked along the rows), each weight row dequantized in registers a vec4 at a time (wvec:
// exactly the numpy reference's values) and dotted in f32 in a fixed order. One launch per row chunk of the
// stack (its quants and scales bound; rows row0 .. row0 + rows - 1), each computing the outputs whose
// weight row falls in it. K is a multiple of the block.
// Bounds (runtime checks may be off): slot s < slots and n < N return before any read; an id outside
// 0 .. E - 1 (a negative one too, as u32) or a weight row outside the chunk returns before any read, so
// the chunk's row r < rows (see quant_dequant.wgsl for wvec's reads, i < K / 4); x[x_off + xrow K + c]
// with c < K and xrow < T X; o[s N + n] inside the new (T k, N) output. Loops end: a uniform bound in
// steps of 1.
struct P { slots: u32, k: u32, X: u32, E: u32, N: u32, K: u32, row0: u32, rows: u32, x_off: u32, ids_off: u32,
           d_ld: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> qs: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> ids: array<i32>;
@group(0) @binding(5) var<storage, read_write> o: array<f32>;
// #include quant_dequant.wgsl

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let s = wg.y * 65535u + wg.z;
  let n = wg.x * 64u + li;
  if (s >= p.slots || n >= p.N) { return; }
  let e = u32(ids[p.ids_off + s]);
  if (e >= p.E) { return; }
  let gr = e * p.N + n;
  if (gr < p.row0 || gr >= p.row0 + p.rows) { return; }
  var xrow = s / p.k;
  if (p.X > 1u) { xrow = s; }
  let xb = p.x_off + xrow * p.K;
  let r = gr - p.row0;
  var acc = 0.0;
  for (var i = 0u; i < p.K / 4u; i = i + 1u) {
    let xv = vec4<f32>(x[xb + 4u * i], x[xb + 4u * i + 1u], x[xb + 4u * i + 2u], x[xb + 4u * i + 3u]);
    acc = acc + dot(xv, wvec(r, i));
  }
  o[s * p.N + n] = acc;
}
