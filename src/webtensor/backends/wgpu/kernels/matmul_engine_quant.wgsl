// The matmul engine with a quantized weight (prefill, batches on GPUs): C[M, N] = A[M, K] @ W^T + epilogue,
// A float32 (M, K) and W (N, K) in webtensor's GPU layout of one of ggml's block types (quant_dequant.wgsl;
// the type by its define), through matmul_engine_core.wgsl (the tiles, the K loop, split-K, the epilogue).
// The B tile of each K step is dequantized on its way into workgroup memory: vec4 e of the tile is values
// 4 kq .. 4 kq + 3 of W's row n (the type file's wvec(n, kq): exactly the numpy reference's values), so the
// inner loop is the float engine's f32 FMAs, and no dequantized copy of W exists anywhere but in the tile.
// W is k-major by construction (each row's blocks contiguous): B_KMAJOR. A row chunk of W (a weight over
// the binding limit) is one launch: its qs and scales buffers start at its first row, its outputs at
// column c_off.
// Header: the core's (matmul_engine_core.wgsl) with TS = CT = f32, CHUNKED false, B_KMAJOR true, no CPACK;
// alias TA (f32); the block type's define (Q8_0, Q4_0, ...).
// Bounds (the kernels run without the compiler's runtime checks): fetch_b calls wvec(n, kq) only for
// n < N (rows of the bound chunk) and 4 kq < K, and K is whole blocks (a multiple of 32), so kq < K / 4:
// the type file's bounds (quant_dequant.wgsl) hold. The rest: the core's.
struct P {
  M: u32, N: u32, K: u32, acc: u32,
  a_off4: u32, lda4: u32, d_ld: u32, c_off: u32,
  ldc: u32, epi: u32, bias_off: u32, r_off: u32,
  r_ld: u32, ks: u32, c_zs: u32,
}
@group(0) @binding(0) var<uniform> p: P;
alias AV = vec4<TA>;
fn a_vec(v: AV) -> vec4<TS> { return vec4<TS>(v); }
@group(0) @binding(1) var<storage, read> a: array<AV>;
@group(0) @binding(2) var<storage, read> qs: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> bias: array<TBIAS>;
@group(0) @binding(5) var<storage, read> res: array<TC>;
@group(0) @binding(6) var<storage, read_write> c: array<TC>;
// #include quant_dequant.wgsl

// vec4 e of the B tile: values 4 kq .. of W's row n, dequantized (zero outside [0, N) x [0, K))
fn fetch_b(e: u32, n0: u32, k0: u32) -> vec4<TS> {
  if (e >= B_VEC) { return vec4<TS>(); }
  let n = n0 + e / KQ;
  let kq = k0 / 4u + e % KQ;
  if (n >= p.N || kq * 4u >= p.K) { return vec4<TS>(); }
  return vec4<TS>(wvec(n, kq));
}

// #include matmul_engine_core.wgsl
