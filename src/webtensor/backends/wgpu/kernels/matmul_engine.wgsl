// The matmul engine for float operands (prefill, batches on GPUs): C[M, N] = A[M, K] @ B[K, N] + epilogue,
// A and B float32 or float16, through matmul_engine_core.wgsl (the tiles, the K loop, split-K, the
// epilogue). B is read either k-major (B_KMAJOR: W stored (N, K), row stride ldb, the layout WebGPU keeps
// weights in) or n-major (stored (K, N), row stride ldb), as vec4 along its unit-stride dim: rows and
// offsets 4-aligned (in elements), the dims arbitrary (tails masked). Offsets and strides are in vec4s.
// With APACK (BPACK), float16 A (B) is read as u32 words, two of them for each four values, and widened
// with unpack2x16float: no 16-bit storage access (the H200's Vulkan driver reads 16-bit storage several
// times slower, see gemv.wgsl); otherwise as `vec4<TA>` (`vec4<TB>`). With CPACK the float16 output (and
// residual) are u32 words too (epilogue.wgsl; c_off and ldc even).
// Header: the core's (matmul_engine_core.wgsl), and alias TA, TB; const APACK, BPACK.
// Bounds (the kernels run without the compiler's runtime checks): load_bk / load_bn read a vec4 only when
// its row (n < N or k < K) and its first element (4 kq < K or 4 nq < N) are in range; with K or N not a
// multiple of 4 its last lanes may pass the tensor's end, never its buffer (4-aligned offsets and strides,
// pool buffers whole 16-byte units: the core's header); those lanes are masked to 0. The rest: the core's.
struct P {
  M: u32, N: u32, K: u32, acc: u32,
  a_off4: u32, lda4: u32, b_off4: u32, ldb4: u32,
  c_off: u32, ldc: u32, epi: u32, bias_off: u32,
  r_off: u32, r_ld: u32, ks: u32, c_zs: u32,
}
@group(0) @binding(0) var<uniform> p: P;
// #if APACK
alias AV = vec2<u32>;  // four float16 values of A as two u32 words
fn a_vec(v: AV) -> vec4<TS> { return vec4<TS>(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y))); }
// #else
alias AV = vec4<TA>;
fn a_vec(v: AV) -> vec4<TS> { return vec4<TS>(v); }
// #endif
// #if BPACK
alias BV = vec2<u32>;  // four float16 values of B as two u32 words
fn b_vec(v: BV) -> vec4<TS> { return vec4<TS>(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y))); }
// #else
alias BV = vec4<TB>;
fn b_vec(v: BV) -> vec4<TS> { return vec4<TS>(v); }
// #endif
@group(0) @binding(1) var<storage, read> a: array<AV>;
@group(0) @binding(2) var<storage, read> b: array<BV>;
@group(0) @binding(3) var<storage, read> bias: array<TBIAS>;
// #if CPACK
@group(0) @binding(4) var<storage, read> res: array<u32>;  // float16 C and residual as u32 words
@group(0) @binding(5) var<storage, read_write> c: array<u32>;
// #else
@group(0) @binding(4) var<storage, read> res: array<TC>;
@group(0) @binding(5) var<storage, read_write> c: array<TC>;
// #endif

// k-major B: vec4 kq of stored row n
fn load_bk(n: u32, kq: u32) -> vec4<TS> {
  if (n >= p.N || kq * 4u >= p.K) { return vec4<TS>(); }
  let v = b_vec(b[p.b_off4 + n * p.ldb4 + kq]);
  return select(vec4<TS>(), v, lanes_below(kq * 4u, p.K));
}

// n-major B: vec4 nq (columns 4 nq ..) of stored row k
fn load_bn(k: u32, nq: u32) -> vec4<TS> {
  if (k >= p.K || nq * 4u >= p.N) { return vec4<TS>(); }
  let v = b_vec(b[p.b_off4 + k * p.ldb4 + nq]);
  return select(vec4<TS>(), v, lanes_below(nq * 4u, p.N));
}

fn fetch_b(e: u32, n0: u32, k0: u32) -> vec4<TS> {
  if (e >= B_VEC) { return vec4<TS>(); }
  if (B_KMAJOR) { return load_bk(n0 + e / KQ, k0 / 4u + e % KQ); }
  return load_bn(k0 + e / NV, n0 / 4u + e % NV);
}

// #include matmul_engine_core.wgsl
