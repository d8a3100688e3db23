// Matrix-vector products with a quantized weight and int8 activations (decode on GPUs whose WGSL has
// the packed 4x8-bit integer dot products): C[m, n] = sum_k A'[m, k] W[n, k] with W (N, K) in
// webtensor's GPU layout of one of ggml's block types (quant_dequant.wgsl; the type by its define)
// and A' quantized to int8 in blocks of 32 (q8_act.wgsl; quant/q8.py is the numpy reference). llama.cpp's
// mmvq in WGSL: each 16-value run of a weight unit (unit_w: its bytes, scale and min) is dotted with the
// activations' bytes by four dot4I8Packed, and only the run's integer sum is scaled in f32:
//     d_x (scale (I - ZP S) + min S),  I = sum q_w q_x,  S = sum q_x,
// exact in its integers (|I| < 2^24, so f32(I) and the ZP correction are exact too).
//
// The activations are quantized once per workgroup, in the prologue, into workgroup memory (xq: 16
// int8 a vec4<u32>; xm: per block of 32 its ds, d and the two 16-value runs' sums: 1.25 bytes a value), through the
// fused RMS / layer norm or gated prologue (SwiGLU / GeGLU) of gemv_norm.wgsl (NORM, GLU), for the workgroup's
// MR rows of A (m0
// = wg.z MR ..): KT values of each row at a time (all of K when it fits the workgroup memory; else
// tiles of KT values, a multiple of 32 LANES values so each lane's units stay the same, staged one after
// the other between barriers). With PREQ they were quantized before, by quantize_q8.wgsl: A is then
// that kernel's output (row m: K / 16 vec4 of int8, then K / 32 ds pairs), read where it lies.
// The workgroup then loops over groups of ROWS = 256 NR / LANES outputs (group g, g + number of
// workgroups, ...: the grid is capped so that the prologue's cost is paid by few workgroups), LANES
// threads an output striding over its units (consecutive lanes, consecutive units: a warp reads a
// row's quants as one contiguous stretch; UNROLL units' loads issued before their arithmetic), each
// thread NR consecutive outputs, every row of A against every output; then a reduction over the LANES
// lanes (SG, the fixed subgroup size: subgroupAdd where LANES = SG and subgroupShuffleXor butterflies
// where LANES < SG, no barrier; subgroupAdd then workgroup memory where LANES > SG; else a tree in
// workgroup memory) and the epilogue (epilogue.wgsl: + bias[n], the activation, + residual[m, n]).
// Each row has its own quantization, accumulators and reduction, and each lane adds its units in
// increasing order whatever MR, NR, UNROLL and the tile: a row of a stack is bit for bit that row alone.
// Header: the type define, const LANES (4 .. 256, a power of two), MR (1 .. 8, a power of two), NR
// (MR NR <= LANES, <= 8), NORM, SG, GLU, KT, PREQ, UNROLL (1 or 2).
//
// Bounds (runtime checks may be off): outputs n >= N are neither read (row N - 1 instead) nor
// written; rows m0 + m < M only (m < rows); units u < K / 32 (an unrolled unit past the tile's end
// loads unit uend - 1 and adds nothing; quant_dequant.wgsl for the weight reads); the prologue reads
// A's vec4s (kb0 + b) 8 + j < K / 4 (b < nb, blocks of this tile) through arow (gemv_norm.wgsl's
// bounds); with PREQ, A's row m0 + m < M holds lda4 = K / 16 + ceil(K / 64) vec4s from a_off4 + (m0 + m)
// lda4 and the reads are k / 16 < K / 16 and K / 16 + k / 64 < lda4; workgroup arrays: xq [m KT / 16 + k / 16]
// and xm [m KT / 32 + k / 32] with m < MR and k < KT the value's place in its tile (unit_k4 of a unit of
// the tile, less the tile's start, is < KT / 4 since tiles are whole units), red [q RW + li / RSTEP]
// with q < MR NR, li < 256; the output c[c_off + (m0 + m) ldc + n] with n < N, m < rows. Loops end:
// their bounds are uniform, their steps positive.
alias TC = f32;
// #include epilogue.wgsl
// #include quant_linear_io.wgsl
@group(0) @binding(6) var<storage, read> lnw: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> lnb: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> c: array<f32>;
// #include gemv_norm.wgsl
// #include q8_act.wgsl

const ROWS: u32 = 256u * NR / LANES;  // outputs per group
// whether the lanes' sums meet in workgroup memory (not where an output's lanes lie within one subgroup), and
// its entries: one per subgroup (lane 0 writes) with subgroupAdd, else one a thread
const SHARED_RED: bool = !(SG > 0u && LANES <= SG);
const RSTEP: u32 = select(1u, SG, SG > 0u && LANES >= SG);
const RW: u32 = 256u / RSTEP;
var<workgroup> red: array<f32, select(1u, MR * NR * RW, SHARED_RED)>;
// (PREQ: the activations are read from A, these are not needed)
var<workgroup> xq: array<vec4<u32>, select(MR * KT / 16u, 1u, PREQ)>;  // [m][k / 16]: 16 int8 activations
var<workgroup> xm: array<vec2<u32>, select(MR * KT / 32u, 1u, PREQ)>;  // [m][k / 32]: q8_act.wgsl's ds

// the int8 activations of tile t of rows m0 .. m0 + rows - 1 into xq / xm (no barrier inside)
fn stage(li: u32, m0: u32, rows: u32, t: u32) {
  if (PREQ) { return; }
  let nbt = KT / 32u;  // blocks a tile
  let kb0 = t * nbt;
  let nb = min(nbt, p.K / 32u - kb0);  // blocks of this tile
  for (var i = li; i < MR * nbt; i = i + 256u) {
    let m = i / nbt;
    let b = i % nbt;
    if (m < rows && b < nb) {
      let q = q8_block(m0, m, (kb0 + b) * 8u);
      xq[m * (KT / 16u) + 2u * b] = q.lo;
      xq[m * (KT / 16u) + 2u * b + 1u] = q.hi;
      xm[m * (KT / 32u) + b] = q.ds;
    }
  }
}

// 16 int8 activations at value k (a multiple of 16, the tile's) of row m0 + m, and their block's meta
fn x16(m0: u32, m: u32, k: u32) -> vec4<u32> {
  if (PREQ) { return bitcast<vec4<u32>>(a[p.a_off4 + (m0 + m) * p.lda4 + k / 16u]); }
  return xq[m * (KT / 16u) + k / 16u];
}
fn xmeta(m0: u32, m: u32, k: u32) -> vec2<u32> {
  if (PREQ) {
    let v = bitcast<vec4<u32>>(a[p.a_off4 + (m0 + m) * p.lda4 + p.K / 16u + k / 64u]);
    return select(v.xy, v.zw, (k / 32u) % 2u == 1u);
  }
  return xm[m * (KT / 32u) + k / 32u];
}

// one run's contribution: d (scale (I - ZP S) + min S), I the four dot4I8Packed of weight bytes q with
// activation bytes x, S the run's activation sum (m: the block's ds, half: which run of the block)
fn run_i(q: vec4<u32>, sm: vec2<f32>, x: vec4<u32>, m: vec2<u32>, half: u32) -> f32 {
  let i = (dot4I8Packed(q.x, x.x) + dot4I8Packed(q.y, x.y)) + (dot4I8Packed(q.z, x.z) + dot4I8Packed(q.w, x.w));
  let s = run_sum(m, half);
  let v = f32(i) - f32(ZP) * s;
  if (HAS_MIN) { return q8_d(m) * (sm.x * v + sm.y * s); }
  return q8_d(m) * (sm.x * v);
}

// the sum over the LANES lanes of an output, for output slot q (call from uniform control flow): within the
// subgroup where an output's lanes are one (LANES = SG: subgroupAdd) or part of one (LANES < SG: butterflies of
// subgroupShuffleXor), every lane getting it; else each subgroup's (or each lane's) part goes to red, combined
// after a barrier (`combine`)
fn lane_sum(li: u32, q: u32, v: f32) -> f32 {
  var t = v;
// #if SG
  if (LANES == SG) { return subgroupAdd(v); }
  if (LANES < SG) {
    for (var o = LANES / 2u; o > 0u; o = o >> 1u) { t = t + subgroupShuffleXor(t, o); }
    return t;
  }
  let part = subgroupAdd(v);
  if (li % SG == 0u) { red[q * RW + li / SG] = part; }
// #else
  red[q * RW + li] = v;
// #endif
  return 0.0;
}

// after the barrier (SHARED_RED): output slot q's sum for the group of thread li (its parts, in order)
fn combine(li: u32, lane: u32, q: u32, own: f32) -> f32 {
  if (!SHARED_RED) { return own; }
  let g0 = li - lane;  // the group's first thread
// #if SG
  var t = red[q * RW + g0 / SG];
  for (var k = 1u; k < LANES / SG; k = k + 1u) { t = t + red[q * RW + g0 / SG + k]; }
  return t;
// #else
  return red[q * RW + g0];
// #endif
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let r = li / LANES;
  let lane = li % LANES;
  let units = p.K / 32u;
  let ku = KT / 32u;  // units a tile
  let tiles = (units + ku - 1u) / ku;
  let m0 = wg.z * MR;
  let rows = min(MR, p.M - m0);
  norm_stats(li, m0, rows);
  if (tiles == 1u) {
    stage(li, m0, rows, 0u);
    workgroupBarrier();
  }
  let groups = (p.N + ROWS - 1u) / ROWS;
  let step = nwg.x * nwg.y;
  // (declared out of the loop and reset in it: naga zero-initialises a loop's own `var` only once)
  var s: array<f32, MR * NR>;  // [m][j]: row m of A against output n0 + j
  var own: array<f32, MR * NR>;
  for (var g = wg.y * nwg.x + wg.x; g < groups; g = g + step) {
    let n0 = g * ROWS + r * NR;  // this thread's first output
    for (var q = 0u; q < MR * NR; q = q + 1u) { s[q] = 0.0; }
    for (var t = 0u; t < tiles; t = t + 1u) {
      if (tiles > 1u) {
        workgroupBarrier();
        stage(li, m0, rows, t);
        workgroupBarrier();
      }
      if (n0 < p.N) {
        let t4 = t * (KT / 4u);  // the tile's first activation vec4
        let uend = min(units, (t + 1u) * ku);
        for (var u = t * ku + lane; u < uend; u = u + LANES * UNROLL) {
          var w: array<WUnit, NR * UNROLL>;  // every load first (a unit past uend: unit uend - 1, unused)
          for (var e = 0u; e < UNROLL; e = e + 1u) {
            let ue = min(u + e * LANES, uend - 1u);
            for (var j = 0u; j < NR; j = j + 1u) { w[e * NR + j] = unit_w(min(n0 + j, p.N - 1u), ue); }
          }
          for (var e = 0u; e < UNROLL; e = e + 1u) {
            let ue = u + e * LANES;
            if (ue < uend) {
              let k0 = 4u * (unit_k4(ue, 0u) - t4);  // the runs' first values in the tile
              let k1 = 4u * (unit_k4(ue, 1u) - t4);
              for (var m = 0u; m < MR; m = m + 1u) {
                if (m < rows) {
                  let x0 = x16(m0, m, k0);
                  let x1 = x16(m0, m, k1);
                  let d0 = xmeta(m0, m, k0);
                  let d1 = xmeta(m0, m, k1);
                  for (var j = 0u; j < NR; j = j + 1u) {
                    let wj = w[e * NR + j];
                    s[m * NR + j] = s[m * NR + j] + (run_i(wj.lo, wj.s.xy, x0, d0, (k0 / 16u) % 2u)
                                                     + run_i(wj.hi, wj.s.zw, x1, d1, (k1 / 16u) % 2u));
                  }
                }
              }
            }
          }
        }
      }
    }
    for (var q = 0u; q < MR * NR; q = q + 1u) { own[q] = lane_sum(li, q, s[q]); }
    if (SHARED_RED) {
      workgroupBarrier();
// #if SG
// #else
      for (var st = LANES / 2u; st > 0u; st = st >> 1u) {  // the tree: lane k += lane k + st
        if (lane < st) {
          for (var q = 0u; q < MR * NR; q = q + 1u) { red[q * RW + li] = red[q * RW + li] + red[q * RW + li + st]; }
        }
        workgroupBarrier();
      }
// #endif
    }
    // lane q writes output slot q (row q / NR, column q % NR): one write_out call site
    var tot = 0.0;
    for (var q = 0u; q < MR * NR; q = q + 1u) {
      if (q == lane) { tot = combine(li, lane, q, own[q]); }
    }
    let m = lane / NR;
    let n = n0 + lane % NR;
    if (lane < rows * NR && n0 < p.N && n < p.N) { write_out(p.c_off + (m0 + m) * p.ldc + n, m0 + m, n, tot); }
    if (SHARED_RED) { workgroupBarrier(); }  // (red is written again by the next group)
  }
}
