// Matrix-vector products with a q8_0 weight (decode: rows of float32 activations):
// C[m, n] = sum_k A[m, k] W[n, k], W held in webtensor's GPU layout of llama.cpp's q8_0 (see
// backends/wgpu/q8_ops.py): quants 4 per u32 in k-major rows (row n: K / 4 words, read here as
// vec4<u32> "units" of 16 quants, half a 32-block), and one float16 scale per block in a separate
// array, two per u32 (block j of row n: word n * d_ld + j / 2, low half for even j). A unit's
// quants are widened to f32 in registers and dotted with each of the workgroup's rows: MR
// consecutive rows of A from wg.z * MR (fewer in the last group), so W is read once per group of
// MR rows; each row's 16 products are summed, then scaled by d once. Sums are f32. Each row has its
// own accumulator and reduction: a row's sum is computed in the same order whatever MR, its place
// in the group and the number of rows.
// A workgroup of 256 threads computes 256 / LANES outputs, LANES threads per W row striding over
// its units, then a tree reduction of the MR partial sums in workgroup memory, and lane m writes
// row m's output (LANES >= 32 >= MR). LANES = 1 (CPU adapters): one thread per NR consecutive
// outputs, no reduction, no barrier; a unit's activations are loaded once for the NR rows (on a
// CPU adapter each load is a gather across the SIMD lanes: with NR = 1 the activations' loads
// outnumber the quants' four to one). One row of A there (decode, MR = 1, NR <= 2) takes a path
// with plain variables and no local arrays, which SwiftShader keeps in memory when they are
// indexed (2.4-3x slower); its sums are the general path's, in the same order: the same bits.
// No subgroup operations.
// Epilogue (epilogue.wgsl): + bias[n], the activation, + residual[m, n], chosen by p.epi.
// With const LN (LANES > 1 only), A' = LayerNorm(A) (weights lnw, lnb; eps in p.eps; statistics in
// the prologue, one shifted pass as in gemv.wgsl), so "layer norm -> linear" is one dispatch; with
// LN and RMS, A' = RMSNorm(A) (A / sqrt(mean(A^2) + eps) * lnw; lnb is not read).
// Needs K % 32 == 0 (whole blocks) and A rows 4-aligned. Header: const LANES, MR (rows of A a
// workgroup, a power of two up to 8: the accumulators per output), NR (outputs per thread: 1 where
// LANES > 1), LN, RMS.
alias TC = f32;
// #include epilogue.wgsl
@group(0) @binding(2) var<storage, read> qs: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> lnw: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> lnb: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> c: array<f32>;
// #include q8_dequant.wgsl

var<workgroup> red: array<f32, 2048>;  // [m][thread]: MR x 256 partial sums (MR <= 8)
var<workgroup> red2: array<vec2<f32>, 256>;
var<workgroup> stats: array<vec2<f32>, 8>;  // LN: (mean, rstd) of each row of A

// row m0 + m of A (m: the row within the workgroup's group), vec4 i (i < K / 4), layer-normalised
// when LN
fn arow(m0: u32, m: u32, i: u32) -> vec4<f32> {
  let x = a[p.a_off4 + (m0 + m) * p.lda4 + i];
  if (!LN) { return x; }
  let st = stats[m];
  if (RMS) { return x * st.y * lnw[i]; }
  return (x - st.x) * st.y * lnw[i] + lnb[i];
}

const ROWS: u32 = 256u * NR / LANES;  // outputs per workgroup

// a unit's 16 products: A's vec4s i .. i + 3 (x0 .. x3) against the 16 quants in q
fn dot16(x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, q: vec4<u32>) -> f32 {
  return (dot(x0, quants4(q.x)) + dot(x1, quants4(q.y))) + (dot(x2, quants4(q.z)) + dot(x3, quants4(q.w)));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let r = li / LANES;
  let lane = li % LANES;
  let n0 = (wg.y * nwg.x + wg.x) * ROWS + r * NR;  // this thread's first output
  let units = p.K / 16u;
  let m0 = wg.z * MR;  // this group's first row of A
  let rows = min(MR, p.M - m0);
  if (LN) {  // each row's statistics, one shifted pass (as gemv.wgsl), by the whole workgroup
    let k4 = p.K / 4u;
    for (var m = 0u; m < rows; m = m + 1u) {
      let ab = p.a_off4 + (m0 + m) * p.lda4;
      var x0 = 0.0;  // (RMS: no shift, the mean square only)
      if (!RMS) { x0 = a[ab].x; }
      var acc = vec2<f32>();
      for (var k = li; k < k4; k = k + 256u) {
        let dd = a[ab + k] - x0;
        acc = acc + vec2<f32>(dd.x + dd.y + dd.z + dd.w, dot(dd, dd));
      }
      red2[li] = acc;
      workgroupBarrier();
      for (var st = 128u; st > 0u; st = st >> 1u) {
        if (li < st) { red2[li] = red2[li] + red2[li + st]; }
        workgroupBarrier();
      }
      if (li == 0u) {
        let tot = red2[0] / f32(p.K);
        if (RMS) {
          stats[m] = vec2<f32>(0.0, inverseSqrt(tot.y + p.eps));
        } else {
          stats[m] = vec2<f32>(x0 + tot.x, inverseSqrt(max(tot.y - tot.x * tot.x, 0.0) + p.eps));
        }
      }
      workgroupBarrier();
    }
  }
  if (LANES == 1u && MR == 1u && NR <= 2u) {  // decode on a CPU adapter
    let n1 = min(n0 + 1u, p.N - 1u);  // the second output (past N: the last again, never written)
    var s0 = 0.0;
    var s1 = 0.0;
    if (n0 < p.N) {
      for (var u = 0u; u < units; u = u + 1u) {
        let i = u * 4u;
        let x0 = arow(m0, 0u, i);
        let x1 = arow(m0, 0u, i + 1u);
        let x2 = arow(m0, 0u, i + 2u);
        let x3 = arow(m0, 0u, i + 3u);
        s0 = s0 + scale(n0, u / 2u) * dot16(x0, x1, x2, x3, qs[n0 * units + u]);
        if (NR == 2u) { s1 = s1 + scale(n1, u / 2u) * dot16(x0, x1, x2, x3, qs[n1 * units + u]); }
      }
      let ci = p.c_off + m0 * p.ldc;
      write_out(ci + n0, m0, n0, s0);
      if (NR == 2u && n0 + 1u < p.N) { write_out(ci + n0 + 1u, m0, n0 + 1u, s1); }
    }
    return;
  }
  var s: array<f32, MR * NR>;  // [m][j]: row m of A against output n0 + j
  if (n0 < p.N) {
    for (var u = lane; u < units; u = u + LANES) {
      var w: array<mat4x4<f32>, NR>;  // the unit's 16 quants of each output, widened
      var d: array<f32, NR>;
      for (var j = 0u; j < NR; j = j + 1u) {
        let n = min(n0 + j, p.N - 1u);  // outputs past N repeat the last one (never written)
        let q = qs[n * units + u];
        d[j] = scale(n, u / 2u);
        w[j] = mat4x4<f32>(quants4(q.x), quants4(q.y), quants4(q.z), quants4(q.w));
      }
      let i = u * 4u;
      for (var m = 0u; m < MR; m = m + 1u) {
        if (m < rows) {
          let x0 = arow(m0, m, i);
          let x1 = arow(m0, m, i + 1u);
          let x2 = arow(m0, m, i + 2u);
          let x3 = arow(m0, m, i + 3u);
          for (var j = 0u; j < NR; j = j + 1u) {  // dot16's sums, on the widened quants
            s[m * NR + j] = s[m * NR + j] + d[j] * ((dot(x0, w[j][0]) + dot(x1, w[j][1]))
                                                   + (dot(x2, w[j][2]) + dot(x3, w[j][3])));
          }
        }
      }
    }
  }
  // one write_out call site (each is the whole activation switch: unrolled MR times it would
  // multiply the shader's size); the MR sums of a row go out through MR lanes, or a loop
  if (LANES > 1u) {
    for (var m = 0u; m < MR; m = m + 1u) { red[m * 256u + li] = s[m]; }
    workgroupBarrier();
    for (var st = LANES / 2u; st > 0u; st = st >> 1u) {
      if (lane < st) {
        for (var m = 0u; m < MR; m = m + 1u) { red[m * 256u + li] = red[m * 256u + li] + red[m * 256u + li + st]; }
      }
      workgroupBarrier();
    }
    if (lane < rows && n0 < p.N) {
      write_out(p.c_off + (m0 + lane) * p.ldc + n0, m0 + lane, n0, red[lane * 256u + r * LANES]);
    }
  } else {
    for (var j = 0u; j < NR; j = j + 1u) {
      let n = n0 + j;
      if (n < p.N) {
        for (var m = 0u; m < rows; m = m + 1u) { write_out(p.c_off + (m0 + m) * p.ldc + n, m0 + m, n, s[m * NR + j]); }
      }
    }
  }
}
