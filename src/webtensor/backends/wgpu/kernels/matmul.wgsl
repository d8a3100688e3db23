// Batched matmul C[b] = A[b] @ B[b] (+ C[b] when acc != 0): 64x64 output tiles per workgroup of
// 256 threads, 16-deep K steps staged through workgroup memory, a 4x4 block of outputs per thread
// held in four vec4 registers (no dynamically indexed private arrays: those spill).
// A is read through (row stride lda, unit K stride); B through two strides, so a transposed view
// (x @ W.T) costs nothing extra; const B_KMAJOR picks the coalesced load pattern for B.
// Epilogue (the fused `linear`): + bias[n], then GELU, then + residual[m, n], chosen by p.epi bits
// 1 / 2 / 4; unused bindings receive any buffer. Header: alias TA, TB, TC, TBIAS; const B_KMAJOR.
// Bounds (the kernels run without the compiler's runtime checks): load_a / load_b read only for m <
// M, n < N and k < K (zeros elsewhere), inside the views' strides; As / Bs [(lk + j) 16 + lm / 4] <
// 256 (lk + j < 16, lm < 64); store writes only m < M, n < N. Loops end: each runs to a uniform or
// constant bound in steps that cannot wrap (sizes stay under 2^31).
// #include epilogue.wgsl
struct P {
  M: u32, N: u32, K: u32, acc: u32,
  a_off: u32, lda: u32, b_off: u32, ldb_k: u32,
  ldb_n: u32, c_off: u32, ldc: u32, a_bs: u32,
  b_bs: u32, c_bs: u32, epi: u32, bias_off: u32,
  r_off: u32, r_ld: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> a: array<TA>;
@group(0) @binding(2) var<storage, read> b: array<TB>;
@group(0) @binding(3) var<storage, read> bias: array<TBIAS>;
@group(0) @binding(4) var<storage, read> res: array<TC>;
@group(0) @binding(5) var<storage, read_write> c: array<TC>;
var<workgroup> As: array<vec4<f32>, 256>;  // [k][m/4]: 16 x 16 vec4
var<workgroup> Bs: array<vec4<f32>, 256>;  // [k][n/4]

fn load_a(ab: u32, m: u32, k: u32) -> f32 {
  if (m < p.M && k < p.K) { return f32(a[ab + m * p.lda + k]); }
  return 0.0;
}

fn load_b(bb: u32, k: u32, n: u32) -> f32 {
  if (n < p.N && k < p.K) { return f32(b[bb + k * p.ldb_k + n * p.ldb_n]); }
  return 0.0;
}


fn store(cb: u32, m: u32, n0: u32, v: vec4<f32>) {
  if (m >= p.M) { return; }
  for (var j = 0u; j < 4u; j = j + 1u) {
    let n = n0 + j;
    if (n >= p.N) { return; }
    let ci = cb + m * p.ldc + n;
    write_out(ci, m, n, v[j]);
  }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let m0 = wg.y * 64u;
  let n0 = wg.x * 64u;
  let ab = p.a_off + wg.z * p.a_bs;
  let bb = p.b_off + wg.z * p.b_bs;
  let tx = li % 16u;  // output columns n0 + 4 tx ..
  let ty = li / 16u;  // output rows m0 + 4 ty ..
  // loaders: A as (m = li / 4, k = 4 (li % 4) ..), B likewise when k-major, else (k = li / 16, n = 4 (li % 16) ..)
  let lm = li / 4u;
  let lk = (li % 4u) * 4u;
  var c0 = vec4<f32>(); var c1 = vec4<f32>(); var c2 = vec4<f32>(); var c3 = vec4<f32>();
  for (var k0 = 0u; k0 < p.K; k0 = k0 + 16u) {
    let av = vec4<f32>(load_a(ab, m0 + lm, k0 + lk), load_a(ab, m0 + lm, k0 + lk + 1u),
                       load_a(ab, m0 + lm, k0 + lk + 2u), load_a(ab, m0 + lm, k0 + lk + 3u));
    for (var j = 0u; j < 4u; j = j + 1u) { As[(lk + j) * 16u + lm / 4u][lm % 4u] = av[j]; }
    if (B_KMAJOR) {
      let bv = vec4<f32>(load_b(bb, k0 + lk, n0 + lm), load_b(bb, k0 + lk + 1u, n0 + lm),
                         load_b(bb, k0 + lk + 2u, n0 + lm), load_b(bb, k0 + lk + 3u, n0 + lm));
      for (var j = 0u; j < 4u; j = j + 1u) { Bs[(lk + j) * 16u + lm / 4u][lm % 4u] = bv[j]; }
    } else {
      let bk = li / 16u;
      let bn = (li % 16u) * 4u;
      Bs[bk * 16u + li % 16u] = vec4<f32>(load_b(bb, k0 + bk, n0 + bn), load_b(bb, k0 + bk, n0 + bn + 1u),
                                          load_b(bb, k0 + bk, n0 + bn + 2u), load_b(bb, k0 + bk, n0 + bn + 3u));
    }
    workgroupBarrier();
    for (var k = 0u; k < 16u; k = k + 1u) {
      let a4 = As[k * 16u + ty];
      let b4 = Bs[k * 16u + tx];
      c0 = c0 + a4.x * b4;
      c1 = c1 + a4.y * b4;
      c2 = c2 + a4.z * b4;
      c3 = c3 + a4.w * b4;
    }
    workgroupBarrier();
  }
  let cb = p.c_off + wg.z * p.c_bs;
  let m = m0 + ty * 4u;
  let n = n0 + tx * 4u;
  store(cb, m, n, c0);
  store(cb, m + 1u, n, c1);
  store(cb, m + 2u, n, c2);
  store(cb, m + 3u, n, c3);
}
