// The body of cached_attention.wgsl and cached_attention_rope.wgsl (included where they say
// `// #include cached_attention_main.wgsl`; see their headers): the includer declares p, q, ps (positions
// at pos_off, slots at slot_off), kv_table, kc, vc, o, the new keys' and values' lane readers kn_at /
// vn_at, the tables' readers rope_cos / rope_sin, const ROPE (0: none; 1 rotate_half, 2 interleaved) and
// the lanes (cached_attention_lanes.wgsl).
// With ROPE, every workgroup of a row rotates its query head and the row's new key dim by dim (threads
// li < D = D4 LANE <= 256: rq, rk) before use, so the key it stores and attends to is the rotated one.
// The row's own key and value (p.write) go through the pool's type before anyone attends to them
// (`kvq`: float16 rounds each value; q8_0 quantizes each 32-dim block as cache_write.wgsl does, in
// threads li < 2 D / 32), so every workgroup of the row attends to exactly what is stored, as a later
// step reading the cache will.
// Bounds: a workgroup returns unless t < T; h < H by the grid. A row whose position is negative or
// whose slot is outside the table (unpaged: the cache) attends to nothing and stores nothing (L = 0:
// its output is 0 / 0, NaN). Key j < L <= n_ctx is read only where kv_row gives it a row (< n_blocks
// block: kv_pages.wgsl), at kc_off4 + (row KVH + kvh) RW + e with kvh < KVH and e < RW (D4 lanes, or
// q8_words(D) words): inside the (n_blocks, block, KVH, RW) pool view; a key without a row scores
// nothing (e = 0) and its value is not read; the own row is stored only where kv_row gives it one.
// q, kn, vn indices are elements of their views (offsets and strides from the planner's views, t < T,
// kvh < KVH, e < D4); ps at pos_off + t and slot_off + t, t < T past them, inside the bound view; o's
// index (t H + h) D4 + e < T H D4. Workgroup arrays: qs, rq, rk, kvq, kvw by li < 256 or e < D4 <=
// LANES (q8_0: lanes 8 j + e < D4 of a block j < D / 32 <= 8, kvsc[j] and [8 + j]), sc / rows_sh /
// acc4 by li < 256 or jj < 256.
// Loops end: each runs to a uniform or constant bound in steps that cannot wrap.
// #include kv_pages.wgsl
var<workgroup> qs: array<VK, LANES>;
var<workgroup> sc: array<f32, 256>;
var<workgroup> rows_sh: array<u32, 256>;  // the pool rows of the tile's keys (NO_ROW: none)
var<workgroup> acc4: array<VK, 256>;
var<workgroup> len_sh: u32;
var<workgroup> fresh_sh: u32;
var<workgroup> own_sh: u32;
var<workgroup> kvq: array<VK, 2 * LANES>;  // (fresh) the row's own key [0, D4) and value [LANES, ..) as stored
var<workgroup> rq: array<f32, 256>;  // (ROPE) the row's query and key dims, rotated
var<workgroup> rk: array<f32, 256>;
// #if Q8
var<workgroup> kvw: array<u32, 128>;  // (fresh) the own key's quant words [0, D4), the value's [64, ..)
var<workgroup> kvsc: array<f32, 16>;  // their blocks' scales: key [0, 8), value [8, 16)
// #endif

// lane i of the rotated query / key (dims i LANE ..)
// #if VEC4
fn rq_at(i: u32) -> VK { return VK(rq[4u * i], rq[4u * i + 1u], rq[4u * i + 2u], rq[4u * i + 3u]); }
fn rk_at(i: u32) -> VK { return VK(rk[4u * i], rk[4u * i + 1u], rk[4u * i + 2u], rk[4u * i + 3u]); }
// #else
fn rq_at(i: u32) -> VK { return rq[i]; }
fn rk_at(i: u32) -> VK { return rk[i]; }
// #endif

// dim d of the query head starting at lane b, of the new key starting at lane b
fn q_el(b: u32, d: u32) -> f32 { return velem(q[b + d / LANE], d % LANE); }
fn kn_el(b: u32, d: u32) -> f32 { return velem(kn_at(b + d / LANE), d % LANE); }

// lane e of head kvh at pool row `row` of the keys / values; the words of a (row, head): RW
// #if Q8
fn row_words() -> u32 { return q8_words(4u * p.D4); }
fn k_lane(row: u32, kvh: u32, e: u32) -> VK {
  let b = p.kc_off4 + (row * (p.H / p.group) + kvh) * row_words();
  return q8_lane(kc[b + e], q8_scale(kc[b + p.D4 + e / 16u], e / 8u));
}
fn v_lane(row: u32, kvh: u32, e: u32) -> VK {
  let b = p.vc_off4 + (row * (p.H / p.group) + kvh) * row_words();
  return q8_lane(vc[b + e], q8_scale(vc[b + p.D4 + e / 16u], e / 8u));
}
// #else
fn k_lane(row: u32, kvh: u32, e: u32) -> VK { return VK(kc[p.kc_off4 + (row * (p.H / p.group) + kvh) * p.D4 + e]); }
fn v_lane(row: u32, kvh: u32, e: u32) -> VK { return VK(vc[p.vc_off4 + (row * (p.H / p.group) + kvh) * p.D4 + e]); }
// #endif

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let h = wg.x;
  let t = wg.y * 65535u + wg.z;
  if (t >= p.T) { return; }  // (uniform: the whole workgroup leaves)
  let pos = ps[p.pos_off + t];
  let seq = u32(ps[p.slot_off + t]);
  if (li == 0u) {
    let ok = pos >= 0 && seq < select(p.n_seqs, p.n_blocks, p.max_blocks == 0u);
    len_sh = select(0u, min(u32(pos) + 1u, p.n_ctx), ok);
    var own = NO_ROW;
    if (ok && p.write != 0u && u32(pos) < p.n_ctx) { own = kv_row(seq, u32(pos)); }
    own_sh = own;
    fresh_sh = select(0u, 1u, own != NO_ROW);  // its own key is new (and has a row to go to)
  }
  let L = workgroupUniformLoad(&len_sh);  // uniform, so loops with barriers may depend on it
  let fresh = workgroupUniformLoad(&fresh_sh) != 0u;
  let own = workgroupUniformLoad(&own_sh);
  let kvh = h / p.group;
  let Lc = L - select(0u, 1u, fresh);  // positions read from the cache (fresh: position Lc from kvq)
  let kn0 = p.k_off4 + t * p.k_ts4 + kvh * p.k_hs4;  // (fresh) the row's own key and value
  let vn0 = p.v_off4 + t * p.v_ts4 + kvh * p.v_hs4;
  let qb = p.q_off4 + t * p.q_ts4 + h * p.q_hs4;
  if (ROPE != 0u) {  // q and the new key rotated dim by dim (rope.wgsl's arithmetic), into rq, rk
    let D = p.D4 * LANE;
    if (li < D) {
      var xq = q_el(qb, li);
      var xk = 0.0;
      if (fresh) { xk = kn_el(kn0, li); }
      if (li < 2u * p.half) {
        let pr = rope_pair(li, p.half, ROPE == 2u);
        let row = u32(clamp(pos, 0, i32(p.P - 1u)));
        let c = rope_cos(row * p.half + pr.y);
        let s = rope_sin(row * p.half + pr.y);
        xq = rope_rot(xq, q_el(qb, pr.x), c, s, pr.z == 1u);
        if (fresh) { xk = rope_rot(xk, kn_el(kn0, pr.x), c, s, pr.z == 1u); }
      }
      rq[li] = xq;
      rk[li] = xk;
    }
    workgroupBarrier();
  }
  if (li < p.D4) {
    if (ROPE != 0u) {
      qs[li] = rq_at(li) * p.scale;
      if (fresh) { kvq[li] = rk_at(li); }
    } else {
      qs[li] = VK(q[qb + li]) * p.scale;
      if (fresh) { kvq[li] = VK(kn_at(kn0 + li)); }
    }
    if (fresh) { kvq[LANES + li] = VK(vn_at(vn0 + li)); }
  }
  workgroupBarrier();
  if (fresh) {  // (uniform) the own key and value as the pool stores them, then stored once
// #if Q8
    let NB = p.D4 / 8u;  // 32-dim blocks a head
    if (li < 2u * NB) {  // thread li: block li % NB of the key (li < NB) or of the value
      let j = li % NB;
      let at = select(0u, LANES, li >= NB) + 8u * j;
      var amax = 0.0;
      for (var e = 0u; e < 8u; e = e + 1u) {
        let x = abs(kvq[at + e]);
        amax = max(amax, max(max(x.x, x.y), max(x.z, x.w)));
      }
      let s = q8_scale_of(amax);
      for (var e = 0u; e < 8u; e = e + 1u) {
        let x = kvq[at + e];
        let qv = vec4<i32>(q8_quant(x.x, s.y), q8_quant(x.y, s.y), q8_quant(x.z, s.y), q8_quant(x.w, s.y));
        kvw[select(0u, 64u, li >= NB) + 8u * j + e] = q8_pack(qv.x, qv.y, qv.z, qv.w);
        kvq[at + e] = vec4<f32>(qv) * s.x;
      }
      kvsc[select(0u, 8u, li >= NB) + j] = s.x;
    }
    workgroupBarrier();
    if (h % p.group == 0u) {  // one workgroup of the kv head stores the row (none reads it back)
      let rw = row_words();
      let kb = p.kc_off4 + (own * (p.H / p.group) + kvh) * rw;
      let vb = p.vc_off4 + (own * (p.H / p.group) + kvh) * rw;
      if (li < p.D4) {
        kc[kb + li] = kvw[li];
        vc[vb + li] = kvw[64u + li];
      }
      if (li < rw - p.D4) {  // scale words: blocks 2 li and 2 li + 1 (0 past the last)
        let hi = 2u * li + 1u < NB;
        kc[kb + p.D4 + li] = pack2x16float(vec2<f32>(kvsc[2u * li], select(0.0, kvsc[min(2u * li + 1u, 7u)], hi)));
        vc[vb + p.D4 + li] = pack2x16float(vec2<f32>(kvsc[8u + 2u * li],
                                                      select(0.0, kvsc[8u + min(2u * li + 1u, 7u)], hi)));
      }
    }
// #else
    if (li < p.D4) {
      let kx = to_pool(kvq[li]);
      let vx = to_pool(kvq[LANES + li]);
      kvq[li] = pool_round(kvq[li]);  // (float16: rounded as stored; float32: the same value)
      kvq[LANES + li] = pool_round(kvq[LANES + li]);
      if (h % p.group == 0u) {  // one workgroup of the kv head stores the row (none reads it back)
        kc[p.kc_off4 + (own * (p.H / p.group) + kvh) * p.D4 + li] = kx;
        vc[p.vc_off4 + (own * (p.H / p.group) + kvh) * p.D4 + li] = vx;
      }
    }
// #endif
  }
  workgroupBarrier();
  let G = 256u / p.D4;
  let g = li / p.D4;
  let d = li % p.D4;
  var m = -3.0e38;
  var l = 0.0;
  var acc = VK();
  for (var j0 = 0u; j0 < L; j0 = j0 + 256u) {
    let j = j0 + li;
    var s = -3.0e38;
    var live = false;
    var row = NO_ROW;
    if (j < Lc) {
      row = kv_row(seq, j);
      if (row != NO_ROW) {
        var dotq = 0.0;
        for (var e = 0u; e < p.D4; e = e + 1u) { dotq = dotq + dotv(qs[e], k_lane(row, kvh, e)); }
        s = dotq;
        live = true;
      }
    } else if (j < L) {  // (fresh: j == Lc) the row's own key
      var dotq = 0.0;
      for (var e = 0u; e < p.D4; e = e + 1u) { dotq = dotq + dotv(qs[e], kvq[e]); }
      s = dotq;
      live = true;
    }
    rows_sh[li] = row;
    let m_new = max(m, wg_max(li, s));
    let e = select(0.0, exp(s - m_new), live);
    sc[li] = e;
    let alpha = exp(m - m_new);
    l = l * alpha + wg_sum(li, e);  // (the reduction's barriers also publish sc and rows_sh)
    acc = acc * alpha;
    if (g < G) {
      let n_here = min(256u, Lc - j0);  // (j0 <= Lc: j0 < L <= Lc + 1)
      for (var jj = g; jj < n_here; jj = jj + G) {
        let r = rows_sh[jj];
        if (r != NO_ROW) { acc = acc + sc[jj] * v_lane(r, kvh, d); }
      }
      // the row's own value, in its group's order (its largest jj: last), as if read from the cache
      if (fresh && Lc - j0 < 256u && g == (Lc - j0) % G) { acc = acc + sc[Lc - j0] * kvq[LANES + d]; }
    }
    m = m_new;
    workgroupBarrier();  // sc and rows_sh are rewritten by the next tile
  }
  acc4[li] = acc;
  workgroupBarrier();
  if (li < p.D4) {
    var r = VK();
    for (var k = 0u; k < G; k = k + 1u) { r = r + acc4[k * p.D4 + li]; }
    o[(t * p.H + h) * p.D4 + li] = r / l;
  }
}
