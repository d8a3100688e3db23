// Grouped expert products (llama.cpp's MUL_MAT_ID for many rows) with a quantized stack of expert matrices
// (E x N, K) in webtensor's GPU layout of one of ggml's block types (quant_dequant.wgsl; the type by its
// define): each weight vec4 dequantized once in registers (wvec: the numpy reference's values) for the
// thread's MS slots (expert_gemm_main.wgsl). One launch per row chunk of the stack (its quants and scales).
// Header: the type define; const BM (slots a block, a multiple of 8).
// Bounds (runtime checks may be off): see expert_gemm_main.wgsl; a term i < K / 4 reads x[xb + 4 i + 3] <
// x_off + (xrow + 1) K with xrow < T X, and wvec(r, i) with r < rows of this chunk (quant_dequant.wgsl).
// Loops end: uniform bounds in steps of 1.
struct P { slots: u32, k: u32, X: u32, N: u32, K: u32, row0: u32, rows: u32, x_off: u32, d_ld: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> qs: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> order: array<u32>;
@group(0) @binding(5) var<storage, read> block_expert: array<u32>;
@group(0) @binding(6) var<storage, read> n_blocks: array<u32>;
@group(0) @binding(7) var<storage, read_write> o: array<f32>;
const NONE: u32 = 0xffffffffu;
// #include quant_dequant.wgsl

// one vec4 a term
fn n_terms() -> u32 { return p.K / 4u; }
fn wterm(r: u32, i: u32) -> vec4<f32> { return wvec(r, i); }
fn xterm(xb: u32, i: u32) -> vec4<f32> {
  return vec4<f32>(x[xb + 4u * i], x[xb + 4u * i + 1u], x[xb + 4u * i + 2u], x[xb + 4u * i + 3u]);
}
fn tdot(a: vec4<f32>, b: vec4<f32>) -> f32 { return dot(a, b); }
// #include expert_gemm_main.wgsl
