// Matrix-vector products for decode (a few rows of A): C[m, n] = sum_k A'[m, k] W[n, k], with W
// stored row-major as (N, K) ("k-major": each output reads one contiguous row), read as vec4.
// A workgroup of 256 threads computes 256 / LANES outputs: LANES threads per W row, each summing
// K/4/LANES vec4 products, then a tree reduction in workgroup memory (GPUs: LANES of 32..256,
// chosen so each thread keeps a few loads in flight and many workgroups cover the memory system).
// With LANES = 1 there is no reduction and no barrier at all: one thread per output, which is what
// CPU-backed adapters (lavapipe, SwiftShader) run fastest. Bandwidth-bound by design: W is read once.
// With const LN (LANES > 1 only), A' = LayerNorm(A) (weights lnw, lnb; eps in p.eps) is computed in
// the prologue, so "layer norm -> linear" is one dispatch. Epilogue: + bias[n], GELU, + residual
// (p.epi bits 1 / 2 / 4). With p.acc, C is read and added to (a K-chunked product).
// Needs K % 4 == 0 and 4-aligned offsets. Built with SG > 0 (the adapter's fixed subgroup
// size, at most LANES; only on devices with the `subgroup` feature) the reductions use subgroupAdd
// and a single barrier instead of a tree; otherwise the source has no subgroup call at all.
// With WPACK, float16 weights are read as u32 pairs and widened with unpack2x16float (the H200's
// Vulkan driver reads 16-bit storage far slower). Header: alias TA, TB, TC, TBIAS; const LN,
// LANES, SG, WPACK.
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


var<workgroup> red2: array<vec2<f32>, 256>;

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
  return red2[0];
// #endif
}

const ROWS: u32 = 256u / LANES;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let r = li / LANES;     // which of the ROWS outputs
  let lane = li % LANES;
  let n = (wg.y * nwg.x + wg.x) * ROWS + r;
  let m = wg.z;
  let ab = p.a_off4 + m * p.lda4;
  var mean = 0.0;
  var rstd = 1.0;
  if (LN) {
    // one pass: sums of (x - x0) and (x - x0)^2, shifted by x0 = a[0] against cancellation
    let x0 = vec4<f32>(a[ab]).x;
    var acc = vec2<f32>();
    for (var k = li; k < p.K4; k = k + 256u) {
      let d = vec4<f32>(a[ab + k]) - x0;
      acc = acc + vec2<f32>(d.x + d.y + d.z + d.w, dot(d, d));
    }
    let tot = block_sum2(li, acc) / f32(p.K4 * 4u);
    mean = x0 + tot.x;
    rstd = inverseSqrt(max(tot.y - tot.x * tot.x, 0.0) + p.eps);
  }
  var s = 0.0;
  if (n < p.N) {
    let wb = p.b_off4 + n * p.K4;
    var s1 = 0.0;  // two accumulators: two independent loads in flight per iteration
    var k = lane;
    for (; k + LANES < p.K4; k = k + 2u * LANES) {
      var x0 = vec4<f32>(a[ab + k]);
      var x1 = vec4<f32>(a[ab + k + LANES]);
      if (LN) {
        x0 = (x0 - mean) * rstd * lnw[k] + lnb[k];
        x1 = (x1 - mean) * rstd * lnw[k + LANES] + lnb[k + LANES];
      }
      s = s + dot(x0, wvec(w[wb + k]));
      s1 = s1 + dot(x1, wvec(w[wb + k + LANES]));
    }
    if (k < p.K4) {
      var x0 = vec4<f32>(a[ab + k]);
      if (LN) { x0 = (x0 - mean) * rstd * lnw[k] + lnb[k]; }
      s = s + dot(x0, wvec(w[wb + k]));
    }
    s = s + s1;
  }
// #if SG
  if (LANES > 1u) {
    s = subgroupAdd(s);
    if (LANES > SG) {  // combine the row's subgroups
      wg_red[li] = s;
      workgroupBarrier();
      if (lane == 0u) {
        for (var k = SG; k < LANES; k = k + SG) { s = s + wg_red[li + k]; }
      }
    }
  }
// #else
  if (LANES > 1u) {
    wg_red[li] = s;
    workgroupBarrier();
    for (var st = LANES / 2u; st > 0u; st = st >> 1u) {
      if (lane < st) { wg_red[li] = wg_red[li] + wg_red[li + st]; }
      workgroupBarrier();
    }
    s = wg_red[li];
  }
// #endif
  if (lane == 0u && n < p.N) {
    let ci = p.c_off + m * p.ldc + n;
    write_out(ci, m, n, s);
  }
}
