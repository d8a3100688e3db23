// Matrix-vector products with a quantized weight and float32 activations (decode: a few rows, or a
// stack of one-row products; the integer-dot variant is gemv_quant_dot4.wgsl): C[m, n] = sum_k
// A'[m, k] W[n, k], W (N, K) in webtensor's GPU layout of one of ggml's block types
// (quant_dequant.wgsl; the type by its define), read one 32-value unit at a time (unit_w: a vec4 or
// two of quants, the block's scales once), its integers widened to f32 in registers and dotted with
// each of the workgroup's rows, each 16-value run's sum scaled once (plus the run's offset times the
// sum of its activations, for Q4_1 / Q5_1 / Q4_K): MR consecutive rows of A from wg.z * MR (fewer in
// the last group), so W is read once per group of MR rows. Each row has its own accumulator and reduction:
// a row's sum is computed in the same order whatever MR, its place in the group and the number of
// rows, so a row of a stack is bit for bit that row alone.
//
// A workgroup of 256 threads computes 256 NR / LANES outputs, LANES threads per output striding over
// its units (consecutive lanes read consecutive units: each warp's loads of a row are contiguous),
// each thread NR consecutive outputs (the activations of a unit loaded once for the NR), then a
// reduction of the MR x NR partial sums: a tree in workgroup memory, or with SG > 0 (the adapter's
// fixed subgroup size, at most LANES; only built on devices with the `subgroup` feature) subgroupAdd
// and one barrier; lane q writes output (row q / NR, column q % NR) (LANES >= 8 >= MR NR).
// LANES = 1 (CPU adapters): one thread an output group, no reduction, no barrier; one row of A there
// (decode, MR = 1, NR <= 2) takes a path with plain variables and no local arrays, which SwiftShader
// keeps in memory when they are indexed (2.4-3x slower); its sums are the general path's in the same
// order: the same bits. It works one run at a time (16 activations live, not 32: CPU registers), the
// unit's weights taken twice, each time only the run's half used (the rest is dead code).
// Prologue (gemv_norm.wgsl, LANES > 1 only): NORM = 1 layer norm, 2 RMS norm, 0 none, so
// "norm -> linear" is one dispatch; GLU > 0 (any LANES): A's rows are [gate | up], 2K wide, read through
// silu(gate) * up (GLU 1) or gelu_tanh(gate) * up (GLU 2). Epilogue (epilogue.wgsl): + bias[n], the activation,
// + residual[m, n], chosen by p.epi.
// Header: the type define, const LANES, MR (1..8, a power of two), NR (MR NR <= 8), NORM, SG, GLU.
//
// Bounds (runtime checks may be off): threads with n0 >= N compute nothing and write nothing; an
// output n0 + j past N (NR > 1) reads row N - 1 instead and is never written; rows m < rows only
// (m0 + m < M); units u < K / 32 (see quant_dequant.wgsl for the weight reads); activation vec4s
// unit_k4(u, r) + 0 .. 3 < K / 4 of rows m0 + m < M (with GLU the same + K / 4 in rows of K / 2); workgroup arrays: red [MR NR][256] with
// MR NR <= 8, stats[m] with m < MR <= 8; the output c[c_off + (m0 + m) ldc + n] with n < N, m < rows.
alias TC = f32;
// #include epilogue.wgsl
// #include quant_linear_io.wgsl
@group(0) @binding(6) var<storage, read> lnw: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> lnb: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> c: array<f32>;
// #include gemv_norm.wgsl

const ROWS: u32 = 256u * NR / LANES;  // outputs per workgroup
var<workgroup> red: array<f32, 2048>;  // [m * NR + j][thread]: MR x NR x 256 partial sums

struct Span { lo: mat4x4<f32>, hi: mat4x4<f32> }  // 32 values: two runs of 16, four vec4 each

// the 16 activations of run r of unit u of row m0 + m (A' through the prologue)
fn run_acts(m0: u32, m: u32, u: u32, r: u32) -> mat4x4<f32> {
  let k = unit_k4(u, r);
  return mat4x4<f32>(arow(m0, m, k), arow(m0, m, k + 1u), arow(m0, m, k + 2u), arow(m0, m, k + 3u));
}

// the 32 activations of unit u of row m0 + m
fn acts(m0: u32, m: u32, u: u32) -> Span { return Span(run_acts(m0, m, u, 0u), run_acts(m0, m, u, 1u)); }

// a run's 16 stored bytes as q - ZP in f32 (column i: values 4i .. 4i + 3)
fn runf(q: vec4<u32>) -> mat4x4<f32> { return mat4x4<f32>(bytes4f(q.x), bytes4f(q.y), bytes4f(q.z), bytes4f(q.w)); }

// sum x q over a run of 16: the four dots pairwise
fn rdot(x: mat4x4<f32>, q: mat4x4<f32>) -> f32 {
  return (dot(x[0], q[0]) + dot(x[1], q[1])) + (dot(x[2], q[2]) + dot(x[3], q[3]));
}

// sum x over a run of 16
fn rsum(x: mat4x4<f32>) -> f32 { return dot((x[0] + x[1]) + (x[2] + x[3]), vec4<f32>(1.0)); }

// a run's 16 products w x, summed: scale sum(x (q - ZP)) (+ min sum(x))
fn ulo(x: mat4x4<f32>, w: WUnit) -> f32 {
  if (HAS_MIN) { return w.s.x * rdot(x, runf(w.lo)) + w.s.y * rsum(x); }
  return w.s.x * rdot(x, runf(w.lo));
}
fn uhi(x: mat4x4<f32>, w: WUnit) -> f32 {
  if (HAS_MIN) { return w.s.z * rdot(x, runf(w.hi)) + w.s.w * rsum(x); }
  return w.s.z * rdot(x, runf(w.hi));
}

// a unit's 32 products, summed: the two runs' sums added
fn udot(x: Span, w: WUnit) -> f32 { return ulo(x.lo, w) + uhi(x.hi, w); }

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let r = li / LANES;
  let lane = li % LANES;
  let n0 = (wg.y * nwg.x + wg.x) * ROWS + r * NR;  // this thread's first output
  let units = p.K / 32u;
  let m0 = wg.z * MR;  // this group's first row of A
  let rows = min(MR, p.M - m0);
  norm_stats(li, m0, rows);
  if (LANES == 1u && MR == 1u && NR <= 2u) {  // decode on a CPU adapter
    let n1 = min(n0 + 1u, p.N - 1u);  // the second output (past N: the last again, never written)
    var s0 = 0.0;
    var s1 = 0.0;
    if (n0 < p.N) {
      for (var u = 0u; u < units; u = u + 1u) {
        let xl = run_acts(m0, 0u, u, 0u);
        let l0 = ulo(xl, unit_w(n0, u));
        var l1 = 0.0;
        if (NR == 2u) { l1 = ulo(xl, unit_w(n1, u)); }
        let xh = run_acts(m0, 0u, u, 1u);
        s0 = s0 + (l0 + uhi(xh, unit_w(n0, u)));
        if (NR == 2u) { s1 = s1 + (l1 + uhi(xh, unit_w(n1, u))); }
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
      var w: array<WUnit, NR>;
      for (var j = 0u; j < NR; j = j + 1u) { w[j] = unit_w(min(n0 + j, p.N - 1u), u); }
      for (var m = 0u; m < MR; m = m + 1u) {
        if (m < rows) {
          let x = acts(m0, m, u);
          for (var j = 0u; j < NR; j = j + 1u) { s[m * NR + j] = s[m * NR + j] + udot(x, w[j]); }
        }
      }
    }
  }
  // one write_out call site (each is the whole activation switch: unrolled it would multiply the
  // shader's size); the sums go out through MR NR lanes, or a loop
  if (LANES > 1u) {
    var t = 0.0;
// #if SG
    for (var q = 0u; q < MR * NR; q = q + 1u) {
      if (q < rows * NR) { red[q * 256u + li] = subgroupAdd(s[q]); }
    }
    workgroupBarrier();
    if (lane < rows * NR) {  // combine the output's subgroups, in order
      let base = lane * 256u + r * LANES;
      t = red[base];
      for (var k = SG; k < LANES; k = k + SG) { t = t + red[base + k]; }
    }
// #else
    for (var q = 0u; q < MR * NR; q = q + 1u) { red[q * 256u + li] = s[q]; }
    workgroupBarrier();
    for (var st = LANES / 2u; st > 0u; st = st >> 1u) {
      if (lane < st) {
        for (var q = 0u; q < MR * NR; q = q + 1u) { red[q * 256u + li] = red[q * 256u + li] + red[q * 256u + li + st]; }
      }
      workgroupBarrier();
    }
    if (lane < rows * NR) { t = red[lane * 256u + r * LANES]; }
// #endif
    let m = lane / NR;
    let n = n0 + lane % NR;
    if (lane < rows * NR && n < p.N) { write_out(p.c_off + (m0 + m) * p.ldc + n, m0 + m, n, t); }
  } else {
    for (var j = 0u; j < NR; j = j + 1u) {
      let n = n0 + j;
      if (n < p.N) {
        for (var m = 0u; m < rows; m = m + 1u) { write_out(p.c_off + (m0 + m) * p.ldc + n, m0 + m, n, s[m * NR + j]); }
      }
    }
  }
}
