// The body of attention_tiled.wgsl and attention_tiled_cache.wgsl (included where they say
// `// #include attention_tiled_main.wgsl`): register-blocked flash attention on GPUs (FlashAttention-2's
// loop, on SIMT FMAs). A workgroup of 16 KG threads takes 64 query rows of one query head h and
// streams the keys and values of its KV head h / G (grouped-query attention: G query heads share a
// KV head; G = 1 is plain multi-head attention) through workgroup memory in tiles of BK = 4 KG keys
// (64 on GPUs with 48 KiB of workgroup memory: 256 threads).
// Thread (qg, kg) = (li / KG, li % KG) owns query rows 4 qg .. 4 qg + 3 of the block, and
//   for the scores S = Q K^T: keys 4 kg .. 4 kg + 3 of the tile, a 4 x 4 block held as four vec4
//     (one per row) and summed over d by outer products: per dim, the 4 rows' q (read from global
//     memory, cached in L1: the block's q is reused by every tile) times the 4 keys' k (a vec4 of
//     the K^T tile `kt`, stored [d][key quad] with the quad index XOR-swizzled by d against bank
//     conflicts when it is written);
//   the online softmax: per row a running max m (the tile's row max by subgroup shuffles across
//     the KG threads of the row group where the subgroup size is fixed at KG or more (SG), else
//     through workgroup memory) and the thread's own part of the running sum l (summed across the
//     row group once, at the end); the output is rescaled once per tile;
//   for O += P V: output dims 4 (kg + KG v) .. + 3 (v < DV = D / BK) of its 4 rows; P goes to
//     `ps` ([key][row quad], vec4s of 4 rows, XOR-swizzled by the key's quad), V to `vs`
//     ([key][d / 4]), and every thread reads, for each key, its rows' P (one vec4) and its dims
//     of V (DV vec4s): 16 DV FMAs per two vec4 loads.
// Which keys a row sees is the includer's: `row_limits(t0)` gives rows t0 .. t0 + 3 their limits
// (keys j < lim are visible: causal within the sequence), `block_keys(qblock, li)` the keys the
// block reads (at least every limit of its live rows; uniform, called by every thread). Tiles run
// from key 0 in steps of BK whatever the rows are, so a row's sums are the same in any block and any
// chunk of its sequence (keys past its limit, in its last tiles or in tiles other rows need, add
// exactly 0 to its sums: P = 0, the running max and sum unchanged). Keys at or past the block's
// count are loaded as zeros (P = 0 meets V = 0, never garbage). A row with limit 0 (the cache
// variant's rows at negative positions or in a bad slot) attends to nothing: it writes zeros. Query
// rows at or past T read row T - 1 and write nothing. Heavy blocks first: workgroup x runs query
// block nqb - 1 - x.
// The includer declares: struct P with T, scale, G, q_off, q_ts, q_hs, o_ts, o_hs (q a (T, H, D)
// view with row / head strides and unit stride along D, offsets and strides in vec4s; output (T, H,
// D) at o_ts, o_hs vec4s), bindings p, q (QV words) and o (OV words); QV / f4 (q's words and their
// f32 values), KV / fk (the keys' and values' words), OV / o4 (the output's words from f32);
// `sequence()` (what its key reads need: 0, or the cache slot), `tile_keys(sq, j0, n_keys, li)`
// (called by every thread at the start of each tile of keys j0 .. j0 + BK - 1: what k_at / v_at
// need of the tile), `k_at(sq, j, kvh, d4)` / `v_at(sq, j, kvh, d4)` (vec4 d4 of key / value j of
// KV head kvh, called for j < block_keys(..) only, of the current tile), `row_limits`, `block_keys`; the tile type TS and const D4 (D / 4), KG (key quads a
// tile: 16, 8 or 4), SG (subgroup shuffles for the row maxima and sums).
// Bounds (what the body indexes; the includers bound their own reads): kt[d KG + (quad ^ sw)] with
// d < D and quad, sw < KG: under KG D; vs[key D4 + d4] with key < BK, d4 < D4; ps[key 16 + (qg ^ x)]
// with key < BK and qg, x < 16; the row-group reductions index ps under 16 KG; q rows are clamped to
// T - 1 at h < H (the grid) inside q's view; o rows only t < T. The planner builds it only for D a
// multiple of BK and BK (2 D sizeof(TS) + 256) bytes of workgroup memory within the device's limit.
// Loops end: each runs to a uniform or constant bound in steps that cannot wrap (sizes stay under
// 2^31).

const BK = 4u * KG;  // keys a tile
const WGS = 16u * KG;  // threads a workgroup: 16 row groups of 4 rows, KG key quads
const D = 4u * D4;
const DV = D4 / KG;  // output vec4s a thread per row
const NEG = -3.4028234663852886e38;  // masked scores and the initial running max (finite: no inf - inf)
var<workgroup> kt: array<vec4<TS>, KG * D>;  // K^T: [d][key quad ^ (d / 4 % KG)], 4 keys a vec4
var<workgroup> vs: array<vec4<TS>, BK * D4>;  // V: [key][d / 4]
var<workgroup> ps: array<vec4<f32>, BK * 16u>;  // P: [key][row quad ^ (key / 4)], 4 rows a vec4

// component c of the four rows' vec4s r0 .. r3, as one vec4 (rows in the components)
fn col(r0: vec4<f32>, r1: vec4<f32>, r2: vec4<f32>, r3: vec4<f32>, c: u32) -> vec4<f32> {
  return vec4<f32>(r0[c], r1[c], r2[c], r3[c]);
}

// the maximum (is_max) or sum of x over the KG threads of a row group (every one gets it)
fn group_reduce(x: vec4<f32>, li: u32, is_max: bool) -> vec4<f32> {
  var r = x;
// #if SG
  for (var s = 1u; s < KG; s = s << 1u) {
    let y = subgroupShuffleXor(r, s);
    r = select(r + y, max(r, y), is_max);
  }
// #else
  workgroupBarrier();  // (ps is free: its last readers are done)
  ps[li] = r;  // [qg][kg]
  workgroupBarrier();
  let qg = li / KG;
  r = ps[qg * KG];
  for (var g = 1u; g < KG; g = g + 1u) {
    let y = ps[qg * KG + g];
    r = select(r + y, max(r, y), is_max);
  }
  workgroupBarrier();
// #endif
  return r;
}

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let h = wg.y;
  let kvh = h / p.G;
  let qblock = nwg.x - 1u - wg.x;  // heavy (late, causal) blocks first
  let qg = li / KG;
  let kg = li % KG;
  let t0 = qblock * 64u + qg * 4u;  // this thread's first row
  // this thread's rows, clamped into the view (rows past T compute on row T - 1, write nothing)
  let qb0 = p.q_off + min(t0, p.T - 1u) * p.q_ts + h * p.q_hs;
  let qb1 = p.q_off + min(t0 + 1u, p.T - 1u) * p.q_ts + h * p.q_hs;
  let qb2 = p.q_off + min(t0 + 2u, p.T - 1u) * p.q_ts + h * p.q_hs;
  let qb3 = p.q_off + min(t0 + 3u, p.T - 1u) * p.q_ts + h * p.q_hs;
  let sq = sequence();
  let lim = row_limits(t0);  // per row: keys j < lim are visible
  let n_keys = block_keys(qblock, li);  // keys this block reads: up to its rows' largest limit
  var acc: array<vec4<f32>, 4u * DV>;  // [row i * DV + v]: dims 4 (kg + 16 v) .. of row i
  var m = vec4<f32>(NEG);  // running max of each row (components: rows)
  var l = vec4<f32>(0.0);  // this thread's part of each row's running sum
  for (var j0 = 0u; j0 < n_keys; j0 = j0 + BK) {
    workgroupBarrier();  // the previous tile's readers of kt, vs and ps are done
    tile_keys(sq, j0, n_keys, li);  // (the cache variant: the tile's keys' pool rows, looked up once)
    // K tile: thread (d4 = e % D4, quad) loads keys 4 quad .. + 3 at vec4 d4 (a key's row is read
    // by consecutive threads), then stores the 4 x 4 block transposed: kt[4 d4 + c][quad ^ sw]
    for (var e = li; e < KG * D4; e = e + WGS) {
      let d4 = e % D4;
      let quad = e / D4;
      let j = j0 + 4u * quad;
      var r0 = vec4<f32>(); var r1 = vec4<f32>(); var r2 = vec4<f32>(); var r3 = vec4<f32>();
      if (j < n_keys) { r0 = fk(k_at(sq, j, kvh, d4)); }
      if (j + 1u < n_keys) { r1 = fk(k_at(sq, j + 1u, kvh, d4)); }
      if (j + 2u < n_keys) { r2 = fk(k_at(sq, j + 2u, kvh, d4)); }
      if (j + 3u < n_keys) { r3 = fk(k_at(sq, j + 3u, kvh, d4)); }
      let sw = quad ^ (d4 % KG);
      for (var c = 0u; c < 4u; c = c + 1u) { kt[(4u * d4 + c) * KG + sw] = vec4<TS>(col(r0, r1, r2, r3, c)); }
    }
    // V tile, as stored (consecutive threads, consecutive vec4s of a key)
    for (var e = li; e < BK * D4; e = e + WGS) {
      let j = j0 + e / D4;
      var x = vec4<f32>();
      if (j < n_keys) { x = fk(v_at(sq, j, kvh, e % D4)); }
      vs[e] = vec4<TS>(x);
    }
    workgroupBarrier();
    // S = Q K^T for rows 4 qg .., keys 4 kg ..: s_i holds row i's four scores
    var s0 = vec4<f32>(); var s1 = vec4<f32>(); var s2 = vec4<f32>(); var s3 = vec4<f32>();
    for (var d4 = 0u; d4 < D4; d4 = d4 + 1u) {
      let q0 = f4(q[qb0 + d4]);
      let q1 = f4(q[qb1 + d4]);
      let q2 = f4(q[qb2 + d4]);
      let q3 = f4(q[qb3 + d4]);
      let sw = kg ^ (d4 % KG);
      for (var c = 0u; c < 4u; c = c + 1u) {
        let kk = vec4<f32>(kt[(4u * d4 + c) * KG + sw]);
        s0 = fma(vec4<f32>(q0[c]), kk, s0);
        s1 = fma(vec4<f32>(q1[c]), kk, s1);
        s2 = fma(vec4<f32>(q2[c]), kk, s2);
        s3 = fma(vec4<f32>(q3[c]), kk, s3);
      }
    }
    // scale, mask, the tile's row maxima
    let keys = vec4<u32>(j0 + 4u * kg) + vec4<u32>(0u, 1u, 2u, 3u);
    s0 = select(vec4<f32>(NEG), s0 * p.scale, keys < vec4<u32>(lim.x));
    s1 = select(vec4<f32>(NEG), s1 * p.scale, keys < vec4<u32>(lim.y));
    s2 = select(vec4<f32>(NEG), s2 * p.scale, keys < vec4<u32>(lim.z));
    s3 = select(vec4<f32>(NEG), s3 * p.scale, keys < vec4<u32>(lim.w));
    let mx = vec4<f32>(max(max(s0.x, s0.y), max(s0.z, s0.w)), max(max(s1.x, s1.y), max(s1.z, s1.w)),
                       max(max(s2.x, s2.y), max(s2.z, s2.w)), max(max(s3.x, s3.y), max(s3.z, s3.w)));
    let m_new = max(m, group_reduce(mx, li, true));
    let corr = exp(m - m_new);
    m = m_new;
    // P (masked scores give exp(NEG - m) = 0), this thread's part of the row sums, the rescale
    let p0 = exp(s0 - vec4<f32>(m.x));
    let p1 = exp(s1 - vec4<f32>(m.y));
    let p2 = exp(s2 - vec4<f32>(m.z));
    let p3 = exp(s3 - vec4<f32>(m.w));
    l = l * corr + vec4<f32>(dot(p0, vec4<f32>(1.0)), dot(p1, vec4<f32>(1.0)), dot(p2, vec4<f32>(1.0)),
                             dot(p3, vec4<f32>(1.0)));
    for (var v4 = 0u; v4 < DV; v4 = v4 + 1u) {
      acc[v4] = acc[v4] * corr.x;
      acc[DV + v4] = acc[DV + v4] * corr.y;
      acc[2u * DV + v4] = acc[2u * DV + v4] * corr.z;
      acc[3u * DV + v4] = acc[3u * DV + v4] * corr.w;
    }
    // P to ps: key 4 kg + c's vec4 holds the 4 rows
    for (var c = 0u; c < 4u; c = c + 1u) { ps[(4u * kg + c) * 16u + (qg ^ kg)] = col(p0, p1, p2, p3, c); }
    workgroupBarrier();
    // O += P V over the tile's keys (masked ones have P = 0 and V = 0 past the block's keys)
    for (var jj = 0u; jj < BK; jj = jj + 1u) {
      let pj = ps[jj * 16u + (qg ^ (jj / 4u))];
      for (var v4 = 0u; v4 < DV; v4 = v4 + 1u) {
        let x = vec4<f32>(vs[jj * D4 + kg + KG * v4]);
        acc[v4] = fma(vec4<f32>(pj.x), x, acc[v4]);
        acc[DV + v4] = fma(vec4<f32>(pj.y), x, acc[DV + v4]);
        acc[2u * DV + v4] = fma(vec4<f32>(pj.z), x, acc[2u * DV + v4]);
        acc[3u * DV + v4] = fma(vec4<f32>(pj.w), x, acc[3u * DV + v4]);
      }
    }
  }
  // 1 / the row sums; a row that sees no key (limit 0) writes zeros
  let inv = 1.0 / group_reduce(l, li, false);
  let live = lim > vec4<u32>(0u);
  let ob = h * p.o_hs + kg;
  for (var v4 = 0u; v4 < DV; v4 = v4 + 1u) {
    if (t0 < p.T) { o[t0 * p.o_ts + ob + KG * v4] = o4(select(vec4<f32>(), acc[v4] * inv.x, live.x)); }
    if (t0 + 1u < p.T) {
      o[(t0 + 1u) * p.o_ts + ob + KG * v4] = o4(select(vec4<f32>(), acc[DV + v4] * inv.y, live.y));
    }
    if (t0 + 2u < p.T) {
      o[(t0 + 2u) * p.o_ts + ob + KG * v4] = o4(select(vec4<f32>(), acc[2u * DV + v4] * inv.z, live.z));
    }
    if (t0 + 3u < p.T) {
      o[(t0 + 3u) * p.o_ts + ob + KG * v4] = o4(select(vec4<f32>(), acc[3u * DV + v4] * inv.w, live.w));
    }
  }
}
