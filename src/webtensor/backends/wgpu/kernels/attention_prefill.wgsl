// Flash-style scaled dot-product attention for prefill on GPUs: a workgroup of 256 threads takes
// 64 queries of one head; the 4 adjacent threads of a query split its head dim in 4 slices of DT
// vec4s, each holding its slice of q (pre-scaled) and of the output row in f32 registers.
// Keys and values stream through workgroup memory in tiles of BKV (read once per 64 queries):
// each thread writes its partial dot products with the tile's keys to `sp`, a barrier later every
// thread of the query sums the 4 partials into the full scores, and the online softmax (running
// max m and sum l, rescaled once per tile) folds the tile's values into the output slice.
// Built with SG (devices with the subgroup feature; otherwise the source has no subgroup call),
// the 4 partials are summed by two subgroup shuffles instead, key by key, and `sp` with its
// barrier goes (the 4 threads of a query are adjacent lanes).
// Causal: query t sees keys j <= t + (S - T). q (T, H, D), k and v (S, KVH, D): views with row /
// head strides and unit stride along D (column slices of the fused qkv, rows of a KV cache); output
// (T, H, D) with its own strides. Grouped-query: query head h reads kv head h / p.group. Offsets
// and strides in vec4 units (D % 16 == 0, D <= 128).
// Header: alias TQ (q, k, v), TO (output), TS (workgroup tile: f16 for float16 inputs); const D4
// (D / 4), DT (D4 / 4), BKV (keys a tile); define SG selects the subgroup variant.
// Bounds (the kernels run without the compiler's runtime checks): the planner builds it only for D
// % 16 == 0, D <= 128 (DT <= 8) and a BKV whose tiles fit: ks / vs [e < BKV D4] and [jj D4 + d0 +
// d] with jj < BKV, d0 + d < D4; sp[qi SPQ + jj] with qi < 64, jj < BKV < SPQ; qr / acc [d < DT];
// k, v are read only for keys j < S, q and o only for live queries t < T, each inside its view.
// Loops end: each runs to a uniform or constant bound in steps that cannot wrap (sizes stay under
// 2^31).
struct P {
  T: u32, S: u32, causal: u32, scale: f32,
  q_off: u32, q_ts: u32, q_hs: u32, k_off: u32,
  k_ts: u32, k_hs: u32, v_off: u32, v_ts: u32,
  v_hs: u32, o_off: u32, o_ts: u32, o_hs: u32,
  group: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> q: array<vec4<TQ>>;
@group(0) @binding(2) var<storage, read> k: array<vec4<TQ>>;
@group(0) @binding(3) var<storage, read> v: array<vec4<TQ>>;
@group(0) @binding(4) var<storage, read_write> o: array<vec4<TO>>;

const SPQ = BKV + 1u;  // sp's row stride per query (padded against bank conflicts)
var<workgroup> ks: array<vec4<TS>, BKV * D4>;  // [key][d / 4]
var<workgroup> vs: array<vec4<TS>, BKV * D4>;
// #if SG
const SP_LEN = 1u;
// #else
const SP_LEN = 64u * SPQ;
// #endif
var<workgroup> sp: array<vec4<f32>, SP_LEN>;  // [query][key]: the 4 slices' partial scores (not with SG)

// the partial dot product of this thread's q slice with key jj of the tile
fn partial_score(qr: ptr<function, array<vec4<f32>, DT>>, jj: u32, d0: u32) -> f32 {
  var s = 0.0;
  for (var d = 0u; d < DT; d = d + 1u) { s = s + dot((*qr)[d], vec4<f32>(ks[jj * D4 + d0 + d])); }
  return s;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let h = wg.y;
  let kh = h / p.group;  // its key / value head
  let qi = li / 4u;
  let g = li % 4u;
  let t = wg.x * 64u + qi;
  let live = t < p.T;
  let d0 = g * DT;  // this thread's slice: vec4s d0 .. d0 + DT of the head dim
  var qr: array<vec4<f32>, DT>;
  var acc: array<vec4<f32>, DT>;
  if (live) {
    let qb = p.q_off + t * p.q_ts + h * p.q_hs + d0;
    for (var d = 0u; d < DT; d = d + 1u) { qr[d] = vec4<f32>(q[qb + d]) * p.scale; }
  }
  var m = -3.4028234663852886e38;
  var l = 0.0;
  let t_last = min(p.T, wg.x * 64u + 64u) - 1u;
  var n_keys = p.S;  // keys this workgroup needs: up to its last query's causal limit
  if (p.causal != 0u) { n_keys = min(p.S, t_last + (p.S - p.T) + 1u); }
  var my_end = n_keys;  // this query's own limit
  if (p.causal != 0u) { my_end = min(n_keys, t + (p.S - p.T) + 1u); }
  if (!live) { my_end = 0u; }
  for (var j0 = 0u; j0 < n_keys; j0 = j0 + BKV) {
    for (var e = li; e < BKV * D4; e = e + 256u) {
      let j = j0 + e / D4;
      let d = e % D4;
      if (j < p.S) {
        ks[e] = vec4<TS>(k[p.k_off + j * p.k_ts + kh * p.k_hs + d]);
        vs[e] = vec4<TS>(v[p.v_off + j * p.v_ts + kh * p.v_hs + d]);
      }
    }
    workgroupBarrier();
    var jn = 0u;  // keys of this tile the query sees
    if (my_end > j0) { jn = min(BKV, my_end - j0); }
    // #if SG
    {
      for (var jj = 0u; jj < BKV; jj = jj + 1u) {  // (uniform: every lane shuffles)
        var s = partial_score(&qr, jj, d0);
        s = s + subgroupShuffleXor(s, 1u);
        s = s + subgroupShuffleXor(s, 2u);
        if (jj < jn) {
          if (s > m) {
            let corr = exp(m - s);
            l = l * corr;
            for (var d = 0u; d < DT; d = d + 1u) { acc[d] = acc[d] * corr; }
            m = s;
          }
          let pj = exp(s - m);
          l = l + pj;
          for (var d = 0u; d < DT; d = d + 1u) { acc[d] = acc[d] + pj * vec4<f32>(vs[jj * D4 + d0 + d]); }
        }
      }
      workgroupBarrier();
      continue;
    }
    // #endif
    for (var jj = 0u; jj < BKV; jj = jj + 1u) { sp[qi * SPQ + jj][g] = partial_score(&qr, jj, d0); }
    workgroupBarrier();
    var tmax = m;
    for (var jj = 0u; jj < jn; jj = jj + 1u) { tmax = max(tmax, dot(sp[qi * SPQ + jj], vec4<f32>(1.0))); }
    if (jn > 0u) {
      let corr = exp(m - tmax);
      m = tmax;
      l = l * corr;
      for (var d = 0u; d < DT; d = d + 1u) { acc[d] = acc[d] * corr; }
      for (var jj = 0u; jj < jn; jj = jj + 1u) {
        let pj = exp(dot(sp[qi * SPQ + jj], vec4<f32>(1.0)) - m);
        l = l + pj;
        for (var d = 0u; d < DT; d = d + 1u) { acc[d] = acc[d] + pj * vec4<f32>(vs[jj * D4 + d0 + d]); }
      }
    }
    workgroupBarrier();
  }
  if (live) {
    let inv = 1.0 / l;
    let ob = p.o_off + t * p.o_ts + h * p.o_hs + d0;
    for (var d = 0u; d < DT; d = d + 1u) { o[ob + d] = vec4<TO>(acc[d] * inv); }
  }
}
