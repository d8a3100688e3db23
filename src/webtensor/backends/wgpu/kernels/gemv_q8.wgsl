// Matrix-vector products with a q8_0 weight (decode: rows of float32 activations):
// C[m, n] = sum_k A[m, k] W[n, k], W held in webtensor's GPU layout of llama.cpp's q8_0 (see
// backends/wgpu/q8_ops.py): quants 4 per u32 in k-major rows (row n: K / 4 words, read here as
// vec4<u32> "units" of 16 quants, half a 32-block), and one float16 scale per block in a separate
// array, two per u32 (block j of row n: word n * d_ld + j / 2, low half for even j). A unit's
// quants are widened to f32 in registers and dotted with each of the workgroup's rows: MR
// consecutive rows of A from wg.z * MR (fewer in the last group), so W is read once per group of
// MR rows; each row's 16 products are summed, then scaled by d once. Sums are f32. Each row has its
// own accumulator and reduction: a row's sum is computed in the same order whatever MR, its place
// in the group and the number of rows (with one MR, a row of any launch is bit for bit that row alone).
// A workgroup of 256 threads computes 256 / LANES outputs, LANES threads per W row striding over
// its units, then a tree reduction of the MR partial sums in workgroup memory, and lane m writes
// row m's output (LANES >= 32 >= MR). LANES = 1 (CPU adapters): one thread per output, no
// reduction, no barrier. No subgroup operations.
// Epilogue (epilogue.wgsl): + bias[n], the activation, + residual[m, n], chosen by p.epi.
// With const LN (LANES > 1 only), A' = LayerNorm(A) (weights lnw, lnb; eps in p.eps; statistics in
// the prologue, one shifted pass as in gemv.wgsl), so "layer norm -> linear" is one dispatch.
// Needs K % 32 == 0 (whole blocks) and A rows 4-aligned. Header: const LANES, MR (rows per
// workgroup, a power of two up to 8: the accumulators per thread), LN.
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

// row m0 + m of A (m: the row within the group), vec4 i (i < K / 4), layer-normalised when LN
fn arow(m0: u32, m: u32, i: u32) -> vec4<f32> {
  let x = a[p.a_off4 + (m0 + m) * p.lda4 + i];
  if (!LN) { return x; }
  let st = stats[m];
  return (x - st.x) * st.y * lnw[i] + lnb[i];
}

const ROWS: u32 = 256u / LANES;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let r = li / LANES;
  let lane = li % LANES;
  let n = (wg.y * nwg.x + wg.x) * ROWS + r;
  let units = p.K / 16u;
  let m0 = wg.z * MR;  // this group's first row of A
  let rows = min(MR, p.M - m0);
  if (LN) {  // each row's statistics, one shifted pass (as gemv.wgsl), by the whole workgroup
    let k4 = p.K / 4u;
    for (var m = 0u; m < rows; m = m + 1u) {
      let ab = p.a_off4 + (m0 + m) * p.lda4;
      let x0 = a[ab].x;
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
        stats[m] = vec2<f32>(x0 + tot.x, inverseSqrt(max(tot.y - tot.x * tot.x, 0.0) + p.eps));
      }
      workgroupBarrier();
    }
  }
  var s: array<f32, MR>;
  if (n < p.N) {
    let qb = n * units;
    for (var u = lane; u < units; u = u + LANES) {
      let q = qs[qb + u];
      let d = scale(n, u / 2u);
      let w0 = quants4(q.x);
      let w1 = quants4(q.y);
      let w2 = quants4(q.z);
      let w3 = quants4(q.w);
      let i = u * 4u;
      for (var m = 0u; m < MR; m = m + 1u) {
        if (m < rows) {
          s[m] = s[m] + d * ((dot(arow(m0, m, i), w0) + dot(arow(m0, m, i + 1u), w1))
                             + (dot(arow(m0, m, i + 2u), w2) + dot(arow(m0, m, i + 3u), w3)));
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
    if (lane < rows && n < p.N) {
      write_out(p.c_off + (m0 + lane) * p.ldc + n, m0 + lane, n, red[lane * 256u + r * LANES]);
    }
  } else if (n < p.N) {
    for (var m = 0u; m < rows; m = m + 1u) { write_out(p.c_off + (m0 + m) * p.ldc + n, m0 + m, n, s[m]); }
  }
}
