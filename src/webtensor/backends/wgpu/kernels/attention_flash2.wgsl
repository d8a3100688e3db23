// Register-blocked flash attention (FlashAttention-2 style, SIMT) for prefill on GPUs: a workgroup
// of 256 threads takes BQ = 64 queries of one head and streams keys / values in tiles of 64 through
// one workgroup buffer `kv` (the K tile, then the V tile of the same keys).
// Thread (qg, kg) = (li / 16, li % 16) owns query rows 4 qg .. 4 qg + 3, keys kg + 16 j (j < 4) of
// each tile and output dims kg + 16 c (c < DT = D / 16) of its rows, all in f32 registers:
//   S = Q K^T: a 4 x 4 block of scores, the D loop reading K (from `kv`, laid out [d][key]) and q:
//     with QS from `qs` (the 64 queries staged once, [d][row]), else vec4s from global memory
//     (the 16 threads of a row group read the same ones, through L1);
//   softmax: per row a running max m and sum l; the tile's row max by subgroup shuffles across the
//     16 threads of the row group (SG, subgroups of 16 or more) or through `ps` (without); the
//     output is rescaled once per tile;
//   O += P V: P goes to `ps` ([key][row / 4] vec4s of 4 rows, the vec4 column XOR-swizzled by the
//     key against bank conflicts), the V tile to `kv` ([key][d]); every thread reads its rows' P
//     for the tile's keys, which also gives it the rows' tile sums for l.
// Causal: query t sees keys j <= t + (S - T); key tiles past the workgroup's last query's limit
// are skipped, the others masked per key. Tails: query rows >= T read row T - 1 and write nothing;
// keys >= S are masked (and loaded as 0). q, k, v: (T or S, H, D) views with row / head strides,
// unit stride along D (column slices of the fused qkv, rows of a KV cache), offsets and strides in
// vec4 units; output (T, H, D) contiguous, offsets and strides in elements.
// Header: alias TQ (q, k, v), TO (output), TS (the kv tile: f16 for float16 inputs); const D4 (D / 4),
// DT (D / 16); define SG selects the subgroup row max, QS the staged Q tile.
struct P {
  T: u32, S: u32, causal: u32, scale: f32,
  q_off: u32, q_ts: u32, q_hs: u32, k_off: u32,
  k_ts: u32, k_hs: u32, v_off: u32, v_ts: u32,
  v_hs: u32, o_off: u32, o_ts: u32, o_hs: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> q: array<vec4<TQ>>;
@group(0) @binding(2) var<storage, read> k: array<vec4<TQ>>;
@group(0) @binding(3) var<storage, read> v: array<vec4<TQ>>;
@group(0) @binding(4) var<storage, read_write> o: array<TO>;

const NEG = -3.4028234663852886e38;  // masked scores and the initial running max
var<workgroup> kv: array<TS, 64u * D4 * 4u>;  // K tile [d][key], then V tile [key][d]
var<workgroup> ps: array<vec4<f32>, 1024u>;  // [key][(row / 4) ^ (key % 16)]: P (or S, without SG)
// #if QS
var<workgroup> qs: array<vec4<TS>, 64u * D4>;  // [d][row / 4]: the workgroup's q (4 rows a vec4)
// #endif

fn ps_at(key: u32, qg: u32) -> u32 { return key * 16u + (qg ^ (key & 15u)); }

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let h = wg.y;
  let qg = li / 16u;
  let kg = li % 16u;
  let t0 = wg.x * 64u + qg * 4u;  // this thread's first row
  let shift = p.S - p.T;  // (S >= T) causal offset: a cache of shift keys before the queries
  var qb: array<u32, 4>;  // q row starts (vec4 units); rows past T read row T - 1
  var lim: array<u32, 4>;  // per row: keys j < lim are visible
  for (var i = 0u; i < 4u; i = i + 1u) {
    let t = min(t0 + i, p.T - 1u);
    qb[i] = p.q_off + t * p.q_ts + h * p.q_hs;
    lim[i] = p.S;
    if (p.causal != 0u) { lim[i] = min(p.S, t0 + i + shift + 1u); }
  }
// #if QS
  for (var e = li; e < 64u * D4; e = e + 256u) {  // (read after the loop's first barriers)
    let r = e % 64u;
    let d4 = e / 64u;
    let x = vec4<f32>(q[p.q_off + min(wg.x * 64u + r, p.T - 1u) * p.q_ts + h * p.q_hs + d4]);
    for (var c = 0u; c < 4u; c = c + 1u) { qs[(d4 * 4u + c) * 16u + r / 4u][r % 4u] = TS(x[c]); }
  }
// #endif
  var acc: array<f32, 4u * DT>;  // [row i][c]: output dim kg + 16 c of row i
  var m = vec4<f32>(NEG);
  var l = vec4<f32>(0.0);
  var n_keys = p.S;  // keys this workgroup needs: up to its last query's causal limit
  if (p.causal != 0u) { n_keys = min(p.S, min(p.T, wg.x * 64u + 64u) + shift); }
  // per-tile values, declared out here and reset in the loop (naga may zero loop-scoped vars only once)
  var s: array<vec4<f32>, 4>;  // the tile's scores [key j] (rows i in the components)
  var mx: vec4<f32>;  // the tile's row maxima
  var tsum: vec4<f32>;  // the tile's row sums of P
  for (var j0 = 0u; j0 < n_keys; j0 = j0 + 64u) {
    workgroupBarrier();  // the previous tile's readers of kv and ps are done
    for (var e = li; e < 64u * D4; e = e + 256u) {  // K tile: consecutive threads, consecutive keys
      let jj = e % 64u;
      let d4 = e / 64u;
      var x = vec4<f32>(0.0);
      if (j0 + jj < p.S) { x = vec4<f32>(k[p.k_off + (j0 + jj) * p.k_ts + h * p.k_hs + d4]); }
      for (var c = 0u; c < 4u; c = c + 1u) { kv[(d4 * 4u + c) * 64u + jj] = TS(x[c]); }
    }
    workgroupBarrier();
    for (var j = 0u; j < 4u; j = j + 1u) { s[j] = vec4<f32>(0.0); }
// #if QS
    for (var d = 0u; d < 4u * D4; d = d + 1u) {
      let qc = vec4<f32>(qs[d * 16u + qg]);  // dim d of the 4 rows
      let kb = d * 64u + kg;
      for (var j = 0u; j < 4u; j = j + 1u) { s[j] = s[j] + qc * f32(kv[kb + 16u * j]); }
    }
// #else
    for (var d4 = 0u; d4 < D4; d4 = d4 + 1u) {
      let q0 = vec4<f32>(q[qb[0] + d4]);
      let q1 = vec4<f32>(q[qb[1] + d4]);
      let q2 = vec4<f32>(q[qb[2] + d4]);
      let q3 = vec4<f32>(q[qb[3] + d4]);
      for (var c = 0u; c < 4u; c = c + 1u) {
        let qc = vec4<f32>(q0[c], q1[c], q2[c], q3[c]);  // dim 4 d4 + c of the 4 rows
        let kb = (d4 * 4u + c) * 64u + kg;
        for (var j = 0u; j < 4u; j = j + 1u) { s[j] = s[j] + qc * f32(kv[kb + 16u * j]); }
      }
    }
// #endif
    mx = vec4<f32>(NEG);
    for (var j = 0u; j < 4u; j = j + 1u) {
      let key = j0 + kg + 16u * j;
      for (var i = 0u; i < 4u; i = i + 1u) {
        if (key < lim[i]) { s[j][i] = s[j][i] * p.scale; } else { s[j][i] = NEG; }
      }
      mx = max(mx, s[j]);
    }
// #if SG
    mx = max(mx, subgroupShuffleXor(mx, 1u));
    mx = max(mx, subgroupShuffleXor(mx, 2u));
    mx = max(mx, subgroupShuffleXor(mx, 4u));
    mx = max(mx, subgroupShuffleXor(mx, 8u));
// #else
    for (var j = 0u; j < 4u; j = j + 1u) { ps[ps_at(kg + 16u * j, qg)] = s[j]; }
    workgroupBarrier();
    for (var jj = 0u; jj < 64u; jj = jj + 1u) { mx = max(mx, ps[ps_at(jj, qg)]); }
// #endif
    let m_new = max(m, mx);
    let corr = exp(m - m_new);
    m = m_new;
    l = l * corr;
    for (var i = 0u; i < 4u; i = i + 1u) {
      for (var c = 0u; c < DT; c = c + 1u) { acc[i * DT + c] = acc[i * DT + c] * corr[i]; }
    }
    workgroupBarrier();  // K (and, without SG, S) read by every thread
    for (var j = 0u; j < 4u; j = j + 1u) { ps[ps_at(kg + 16u * j, qg)] = exp(s[j] - m); }
    for (var e = li; e < 64u * D4; e = e + 256u) {  // V tile: consecutive threads along D
      let jj = e / D4;
      let d4 = e % D4;
      var x = vec4<f32>(0.0);
      if (j0 + jj < p.S) { x = vec4<f32>(v[p.v_off + (j0 + jj) * p.v_ts + h * p.v_hs + d4]); }
      for (var c = 0u; c < 4u; c = c + 1u) { kv[jj * D4 * 4u + d4 * 4u + c] = TS(x[c]); }
    }
    workgroupBarrier();
    let nk = min(64u, n_keys - j0);  // the rest are masked or past S: P = 0
    tsum = vec4<f32>(0.0);
    for (var jj = 0u; jj < nk; jj = jj + 1u) {
      let pj = ps[ps_at(jj, qg)];
      tsum = tsum + pj;
      for (var c = 0u; c < DT; c = c + 1u) {
        let x = f32(kv[jj * D4 * 4u + kg + 16u * c]);
        for (var i = 0u; i < 4u; i = i + 1u) { acc[i * DT + c] = acc[i * DT + c] + pj[i] * x; }
      }
    }
    l = l + tsum;
  }
  for (var i = 0u; i < 4u; i = i + 1u) {
    if (t0 + i < p.T) {
      let inv = 1.0 / l[i];
      let ob = p.o_off + (t0 + i) * p.o_ts + h * p.o_hs + kg;
      for (var c = 0u; c < DT; c = c + 1u) { o[ob + 16u * c] = TO(acc[i * DT + c] * inv); }
    }
  }
}
