// Matrix-vector products for decode (rows of A): C[m, n] = sum_k A'[m, k] W[n, k], with W
// stored row-major as (N, K) ("k-major": each output reads one contiguous row), read as vec4.
// A workgroup of 256 threads computes 256 / LANES outputs for MR consecutive rows of A (rows
// wg.z * MR ..., fewer in the last group): LANES threads per W row, each reading its K/4/LANES vec4
// of W once and dotting them with each row's, then a tree reduction in workgroup memory
// (GPUs: LANES of 32..256,
// chosen so each thread keeps a few loads in flight and many workgroups cover the memory system).
// With LANES = 1 there is no reduction and no barrier at all: one thread per output, which is what
// CPU-backed adapters (lavapipe, SwiftShader) run fastest. Bandwidth-bound by design: W is read once
// per group of MR rows. Each row has its own accumulators and reduction, so a row's sum is computed
// in the same order whatever MR, the row's place in its group and the number of rows (a row of a
// launch over any number of rows is bit for bit that row alone).
// With const LN (LANES > 1 only), A' = LayerNorm(A) (weights lnw, lnb; eps in p.eps) is computed in
// the prologue, so "layer norm -> linear" is one dispatch; with LN and RMS, A' = RMSNorm(A)
// (A / sqrt(mean(A^2) + eps) * lnw; lnb is not read, the dummy buffer stands in). With const GLU
// > 0 (any LANES; not with LN), A's rows are 2K wide, [gate | up], and A'[m, k] = act(gate) * up =
// glu4 (common.wgsl: 1 SwiGLU silu, 2 GeGLU gelu_tanh) of A[m, k] and A[m, K + k]: the gated MLP's down
// projection reads its input through the gate in one dispatch. Epilogue: + bias[n], GELU, + residual
// (p.epi bits 1 / 2 / 4). With p.acc, C is read and added to (a K-chunked product).
// Needs K % 4 == 0 and 4-aligned offsets. Built with SG > 0 (the adapter's fixed subgroup
// size, at most LANES; only on devices with the `subgroup` feature) the reductions use subgroupAdd
// and a single barrier instead of a tree; otherwise the source has no subgroup call at all.
// With WPACK, float16 weights are read as u32 pairs and widened with unpack2x16float (the H200's
// Vulkan driver reads 16-bit storage far slower). Header: alias TA, TB, TC, TBIAS; const LN,
// LANES, SG, WPACK, MR (1..8: rows per workgroup; LANES >= MR where LANES > 1), RMS, GLU.
// Bounds (the kernels run without the compiler's runtime checks): the planner builds it only for K
// % 4 == 0 and 4-aligned rows (vec_ok): w[wb + k] for n < N and k < K4 is row n of this part of W;
// a[(m0 + m) lda4 + k] only for m < rows <= M - m0 (with GLU also a[... + K4 + k]: the planner's rows
// then hold 2 K4 vec4s, lda4 >= 2 K4); lnw / lnb [k < K4] (the layer norm's (K,)
// weights); red[m 256 + li] with m < MR <= 8 (MR x 256 entries); with SG red[lane 256 + r LANES +
// k] with lane < rows <= MR and r LANES + k < 256; red2 by li < 256 and li + st < 256. Loops end:
// each runs to a uniform or constant bound in steps that cannot wrap (sizes stay under 2^31).
// #include epilogue.wgsl
struct P {
  M: u32, N: u32, K4: u32, acc: u32,
  a_off4: u32, lda4: u32, b_off4: u32, c_off: u32,
  ldc: u32, epi: u32, bias_off: u32, r_off: u32,
  r_ld: u32, eps: f32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> a: array<vec4<TA>>;
// #if WPACK
alias WV = vec2<u32>;  // four float16 weights as two u32 words: no 16-bit storage access
fn wvec(v: WV) -> vec4<f32> { return vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)); }
// #else
alias WV = vec4<TB>;
fn wvec(v: WV) -> vec4<f32> { return vec4<f32>(v); }
// #endif
@group(0) @binding(2) var<storage, read> w: array<WV>;
@group(0) @binding(3) var<storage, read> bias: array<TBIAS>;
@group(0) @binding(4) var<storage, read> res: array<TC>;
@group(0) @binding(5) var<storage, read> lnw: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> lnb: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> c: array<TC>;


const ROWS: u32 = 256u / LANES;

// vec4 k of A's row starting at ab, through the gated prologue when GLU (1 SwiGLU, 2 GeGLU)
fn arow(ab: u32, k: u32) -> vec4<f32> {
  if (GLU != 0u) { return glu4(GLU, vec4<f32>(a[ab + k]), vec4<f32>(a[ab + p.K4 + k])); }
  return vec4<f32>(a[ab + k]);
}

// the prologue's normalisation of A's vec4 k of a row with statistics (mean, rstd)
fn norm4(x: vec4<f32>, mean: f32, rstd: f32, k: u32) -> vec4<f32> {
  if (RMS) { return x * rstd * lnw[k]; }
  return (x - mean) * rstd * lnw[k] + lnb[k];
}
var<workgroup> red2: array<vec2<f32>, 256>;  // LN statistics
var<workgroup> red: array<f32, MR * 256u>;  // [row of the group][thread]: partial sums

fn block_sum2(li: u32, v: vec2<f32>) -> vec2<f32> {
// #if SG
  red2[li] = subgroupAdd(v);
  workgroupBarrier();
  var t = vec2<f32>();
  for (var k = 0u; k < 256u; k = k + SG) { t = t + red2[k]; }
  workgroupBarrier();
  return t;
// #else
  red2[li] = v;
  workgroupBarrier();
  for (var st = 128u; st > 0u; st = st >> 1u) {
    if (li < st) { red2[li] = red2[li] + red2[li + st]; }
    workgroupBarrier();
  }
  let t = red2[0];
  workgroupBarrier();
  return t;
// #endif
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let r = li / LANES;     // which of the ROWS outputs
  let lane = li % LANES;
  let n = (wg.y * nwg.x + wg.x) * ROWS + r;
  let m0 = wg.z * MR;     // this group's first row of A
  let rows = min(MR, p.M - m0);
  var mean: array<f32, MR>;
  var rstd: array<f32, MR>;
  for (var m = 0u; m < MR; m = m + 1u) {
    mean[m] = 0.0;
    rstd[m] = 1.0;
    if (LN && m < rows) {
      // one pass: sums of (x - x0) and (x - x0)^2, shifted by x0 = a[0] against cancellation
      // (RMS: x0 = 0, the mean square only)
      let ab = p.a_off4 + (m0 + m) * p.lda4;
      var x0 = 0.0;
      if (!RMS) { x0 = vec4<f32>(a[ab]).x; }
      var acc = vec2<f32>();
      for (var k = li; k < p.K4; k = k + 256u) {
        let d = vec4<f32>(a[ab + k]) - x0;
        acc = acc + vec2<f32>(d.x + d.y + d.z + d.w, dot(d, d));
      }
      let tot = block_sum2(li, acc) / f32(p.K4 * 4u);
      if (RMS) {
        rstd[m] = inverseSqrt(tot.y + p.eps);
      } else {
        mean[m] = x0 + tot.x;
        rstd[m] = inverseSqrt(max(tot.y - tot.x * tot.x, 0.0) + p.eps);
      }
    }
  }
  var s: array<f32, MR>;
  var s1: array<f32, MR>;  // two accumulators a row: two independent loads in flight per iteration
  if (n < p.N) {
    let wb = p.b_off4 + n * p.K4;
    var k = lane;
    for (; k + LANES < p.K4; k = k + 2u * LANES) {
      let w0 = wvec(w[wb + k]);
      let w1 = wvec(w[wb + k + LANES]);
      for (var m = 0u; m < MR; m = m + 1u) {
        if (m < rows) {
          let ab = p.a_off4 + (m0 + m) * p.lda4;
          var x0 = arow(ab, k);
          var x1 = arow(ab, k + LANES);
          if (LN) {
            x0 = norm4(x0, mean[m], rstd[m], k);
            x1 = norm4(x1, mean[m], rstd[m], k + LANES);
          }
          s[m] = s[m] + dot(x0, w0);
          s1[m] = s1[m] + dot(x1, w1);
        }
      }
    }
    if (k < p.K4) {
      let w0 = wvec(w[wb + k]);
      for (var m = 0u; m < MR; m = m + 1u) {
        if (m < rows) {
          var x0 = arow(p.a_off4 + (m0 + m) * p.lda4, k);
          if (LN) { x0 = norm4(x0, mean[m], rstd[m], k); }
          s[m] = s[m] + dot(x0, w0);
        }
      }
    }
    for (var m = 0u; m < MR; m = m + 1u) { s[m] = s[m] + s1[m]; }
  }
  if (LANES == 1u) {  // (through workgroup memory: s indexed only by constants stays in registers)
    for (var m = 0u; m < MR; m = m + 1u) { red[m * 256u + li] = s[m]; }
    if (n < p.N) {
      for (var m = 0u; m < rows; m = m + 1u) { write_out(p.c_off + (m0 + m) * p.ldc + n, m0 + m, n, red[m * 256u + li]); }
    }
    return;
  }
  // LANES > 1: each row's partial sums reduced in workgroup memory; lane m writes row m (one
  // write_out call site: each is the whole activation switch)
// #if SG
  for (var m = 0u; m < MR; m = m + 1u) {
    if (m < rows) { red[m * 256u + li] = subgroupAdd(s[m]); }
  }
  workgroupBarrier();
  var t = 0.0;
  if (lane < rows) {  // combine the row's subgroups, in order
    let base = lane * 256u + r * LANES;
    t = red[base];
    for (var k = SG; k < LANES; k = k + SG) { t = t + red[base + k]; }
  }
// #else
  for (var m = 0u; m < MR; m = m + 1u) { red[m * 256u + li] = s[m]; }
  workgroupBarrier();
  for (var st = LANES / 2u; st > 0u; st = st >> 1u) {
    if (lane < st) {
      for (var m = 0u; m < MR; m = m + 1u) { red[m * 256u + li] = red[m * 256u + li] + red[m * 256u + li + st]; }
    }
    workgroupBarrier();
  }
  var t = 0.0;
  if (lane < rows) { t = red[lane * 256u + r * LANES]; }
// #endif
  if (lane < rows && n < p.N) { write_out(p.c_off + (m0 + lane) * p.ldc + n, m0 + lane, n, t); }
}
