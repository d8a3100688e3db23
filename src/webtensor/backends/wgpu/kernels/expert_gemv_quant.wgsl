// Each row through its own experts (llama.cpp's MUL_MAT_ID), a quantized stack of expert matrices in
// webtensor's GPU layout of one of ggml's block types (quant_dequant.wgsl; the type by its define): the
// same products as expert_gemv.wgsl (o[s, n] = x[xrow(s)] . W[ids[s] N + n], W the E experts' (N, K)
// matrices stacked along the rows), each weight row dequantized in registers a vec4 at a time (wvec:
// exactly the numpy reference's values) and dotted in f32, LANES threads an output (expert_gemv_main.wgsl).
// One launch per row chunk of the stack (its quants and scales bound; rows row0 .. row0 + rows - 1), each
// computing the outputs whose weight row falls in it. K is a multiple of the block.
// Header: the type define; const LANES (a power of two, 1 .. 256).
// Bounds (runtime checks may be off): see expert_gemv_main.wgsl (a term is read only for a live output: its
// id < E and its weight row r < rows of this chunk; quant_dequant.wgsl for wvec's reads, i < K / 4);
// x[xb + 4 i + 3] < x_off + (xrow + 1) K with xrow < T X. Loops end: a uniform bound in steps of LANES.
struct P { slots: u32, k: u32, X: u32, E: u32, N: u32, K: u32, row0: u32, rows: u32, x_off: u32, ids_off: u32,
           d_ld: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> qs: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> ids: array<i32>;
@group(0) @binding(5) var<storage, read_write> o: array<f32>;
// #include quant_dequant.wgsl

// x's K / 4 vec4s of a row, one a term, dotted with the weight row's dequantized vec4 (wvec)
fn n_terms() -> u32 { return p.K / 4u; }
fn term(xb: u32, r: u32, i: u32) -> f32 {
  let xv = vec4<f32>(x[xb + 4u * i], x[xb + 4u * i + 1u], x[xb + 4u * i + 2u], x[xb + 4u * i + 3u]);
  return dot(xv, wvec(r, i));
}
// #include expert_gemv_main.wgsl
