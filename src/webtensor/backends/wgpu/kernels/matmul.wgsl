// Batched matmul C[b] = A[b] @ B[b] (+ C[b] when acc != 0), 64x64 output tiles, 16-deep K steps
// through workgroup memory, 4x4 outputs per thread. B is read through two strides, so a
// transposed view (x @ W.T) costs nothing extra. A's rows are contiguous along K.
// Epilogue (the fused `linear`): + bias[n], then GELU, then + residual[m, n], chosen by p.epi bits
// 1 / 2 / 4; unused bindings receive any buffer. Header: alias TA, TB, TC, TBIAS.
struct P {
  M: u32, N: u32, K: u32, acc: u32,
  a_off: u32, lda: u32, b_off: u32, ldb_k: u32,
  ldb_n: u32, c_off: u32, ldc: u32, a_bs: u32,
  b_bs: u32, c_bs: u32, epi: u32, bias_off: u32,
  r_off: u32, r_ld: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> a: array<TA>;
@group(0) @binding(2) var<storage, read_write> b: array<TB>;
@group(0) @binding(3) var<storage, read_write> c: array<TC>;
@group(0) @binding(4) var<storage, read_write> bias: array<TBIAS>;
@group(0) @binding(5) var<storage, read_write> res: array<TC>;
var<workgroup> As: array<f32, 1024>;  // [k][m], 16 x 64
var<workgroup> Bs: array<f32, 1024>;  // [k][n], 16 x 64

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let m0 = wg.y * 64u;
  let n0 = wg.x * 64u;
  let ab = p.a_off + wg.z * p.a_bs;
  let bb = p.b_off + wg.z * p.b_bs;
  let tx = li % 16u;
  let ty = li / 16u;
  var acc: array<array<f32, 4>, 4>;
  for (var k0 = 0u; k0 < p.K; k0 = k0 + 16u) {
    for (var r = 0u; r < 4u; r = r + 1u) {
      let idx = li + 256u * r;
      let ak = idx % 16u; let am = idx / 16u;
      var av = 0.0;
      if (m0 + am < p.M && k0 + ak < p.K) { av = f32(a[ab + (m0 + am) * p.lda + k0 + ak]); }
      As[ak * 64u + am] = av;
      let bn = idx % 64u; let bk = idx / 64u;
      var bv = 0.0;
      if (n0 + bn < p.N && k0 + bk < p.K) { bv = f32(b[bb + (k0 + bk) * p.ldb_k + (n0 + bn) * p.ldb_n]); }
      Bs[bk * 64u + bn] = bv;
    }
    workgroupBarrier();
    for (var k = 0u; k < 16u; k = k + 1u) {
      var av: array<f32, 4>;
      var bv: array<f32, 4>;
      for (var i = 0u; i < 4u; i = i + 1u) { av[i] = As[k * 64u + ty * 4u + i]; bv[i] = Bs[k * 64u + tx * 4u + i]; }
      for (var i = 0u; i < 4u; i = i + 1u) {
        for (var j = 0u; j < 4u; j = j + 1u) { acc[i][j] = acc[i][j] + av[i] * bv[j]; }
      }
    }
    workgroupBarrier();
  }
  let cb = p.c_off + wg.z * p.c_bs;
  for (var i = 0u; i < 4u; i = i + 1u) {
    let m = m0 + ty * 4u + i;
    if (m >= p.M) { continue; }
    for (var j = 0u; j < 4u; j = j + 1u) {
      let n = n0 + tx * 4u + j;
      if (n >= p.N) { continue; }
      let ci = cb + m * p.ldc + n;
      var v = acc[i][j];
      if (p.acc != 0u) { v = v + f32(c[ci]); }
      if ((p.epi & 1u) != 0u) { v = v + f32(bias[p.bias_off + n]); }
      if ((p.epi & 2u) != 0u) { v = gelu_tanh(v); }
      if ((p.epi & 4u) != 0u) { v = v + f32(res[p.r_off + m * p.r_ld + n]); }
      c[ci] = TC(v);
    }
  }
}

fn gelu_tanh(v: f32) -> f32 {
  // 0.5 v (1 + tanh(u)) = v * sigmoid(2u), u = sqrt(2/pi) (v + 0.044715 v^3): no cancellation for v < 0
  let u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
  return v / (1.0 + exp(-2.0 * clamp(u, -40.0, 40.0)));
}
