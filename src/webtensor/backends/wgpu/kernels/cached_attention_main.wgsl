// The body of cached_attention.wgsl and cached_attention_rope.wgsl (included where they say
// `// #include cached_attention_main.wgsl`; see their headers): the includer declares p, q, pos, slot,
// kc, vc, o, the new keys' and values' lane readers kn_at / vn_at, the tables' readers rope_cos /
// rope_sin, const ROPE (0: none; 1 rotate_half, 2 interleaved) and the lanes (cached_attention_lanes.wgsl).
// With ROPE, every workgroup of a row rotates its query head and the row's new key dim by dim (threads
// li < D = D4 LANE <= 256: rq, rk) before use, so the key it stores and attends to is the rotated one.
// Bounds: rq, rk, kq, qs by li < 256 or e < D4 <= 256; q_el / kn_el dims d < D and their rope partner
// (< 2 half <= D) of the row's head; the tables at row * half + i with row <= P - 1, i < half.
var<workgroup> qs: array<VK, 256>;
var<workgroup> sc: array<f32, 256>;
var<workgroup> acc4: array<VK, 256>;
var<workgroup> len_sh: u32;
var<workgroup> lo_sh: u32;
var<workgroup> base_sh: u32;
var<workgroup> fresh_sh: u32;
var<workgroup> kq: array<VK, 256>;  // (fresh) the row's own key, as stored (rotated with ROPE)
var<workgroup> rq: array<f32, 256>;  // (ROPE) the row's query and key dims, rotated
var<workgroup> rk: array<f32, 256>;

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

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let h = wg.x;
  let t = wg.y * 65535u + wg.z;
  if (t >= p.T) { return; }  // (uniform: the whole workgroup leaves)
  if (li == 0u) {
    let ps = pos[t];
    let sl = u32(slot[t]);
    let ok = ps >= 0 && sl < p.n_slots;
    len_sh = select(0u, min(u32(ps) + 1u, p.n_ctx), ok);
    // a sliding window: positions ps + 1 - window .. (none before 0, none past the cache's)
    lo_sh = select(0u, min(len_sh, u32(ps) + 1u - p.window), ok && p.window != 0u && u32(ps) + 1u > p.window);
    base_sh = select(0u, sl * p.slot_stride4, ok);
    fresh_sh = select(0u, 1u, ok && p.write != 0u && u32(ps) < p.n_ctx);  // its own key is new
  }
  let L = workgroupUniformLoad(&len_sh);  // uniform, so loops with barriers may depend on it
  let lo = workgroupUniformLoad(&lo_sh);  // the first position seen (lo <= L - 1 where L > 0)
  let base = workgroupUniformLoad(&base_sh);
  let fresh = workgroupUniformLoad(&fresh_sh) != 0u;
  let kvh = h / p.group;
  let C4 = (p.H / p.group) * p.D4;  // a cache position: KVH heads
  let kb0 = p.kc_off4 + base + kvh * p.D4;  // position 0 of this head in the slot's keys
  let vb0 = p.vc_off4 + base + kvh * p.D4;
  let Lc = L - select(0u, 1u, fresh);  // positions read from the cache (fresh: position Lc from kn, vn)
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
        let row = u32(clamp(pos[t], 0, i32(p.P - 1u)));
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
      kq[li] = rk_at(li);
    } else {
      qs[li] = VK(q[qb + li]) * p.scale;
      if (fresh) { kq[li] = VK(kn_at(kn0 + li)); }
    }
    if (fresh && h % p.group == 0u) {  // one workgroup of the kv head stores the row (none reads it back)
      kc[kb0 + Lc * C4 + li] = kq[li];
      vc[vb0 + Lc * C4 + li] = VK(vn_at(vn0 + li));
    }
  }
  workgroupBarrier();
  let G = 256u / p.D4;
  let g = li / p.D4;
  let d = li % p.D4;
  var m = -3.0e38;
  var l = 0.0;
  var acc = VK();
  for (var j0 = lo; j0 < L; j0 = j0 + 256u) {
    let j = j0 + li;
    var s = -3.0e38;
    if (j < Lc) {
      let kb = kb0 + j * C4;
      var dotq = 0.0;
      for (var e = 0u; e < p.D4; e = e + 1u) { dotq = dotq + dotv(qs[e], kc[kb + e]); }
      s = dotq;
    } else if (j < L) {  // (fresh: j == Lc) the row's own key
      var dotq = 0.0;
      for (var e = 0u; e < p.D4; e = e + 1u) { dotq = dotq + dotv(qs[e], kq[e]); }
      s = dotq;
    }
    if (p.softcap > 0.0 && j < L) { s = tanh_f32(s / p.softcap) * p.softcap; }
    let m_new = max(m, wg_max(li, s));
    let e = select(0.0, exp(s - m_new), j < L);
    sc[li] = e;
    let alpha = exp(m - m_new);
    l = l * alpha + wg_sum(li, e);  // (the reduction's barriers also publish sc)
    acc = acc * alpha;
    if (g < G) {
      let n_here = min(256u, Lc - j0);  // (lo <= j0 <= Lc: j0 < L <= Lc + 1)
      for (var jj = g; jj < n_here; jj = jj + G) { acc = acc + sc[jj] * vc[vb0 + (j0 + jj) * C4 + d]; }
      // the row's own value, in its group's order (its largest jj: last), as if read from the cache
      if (fresh && Lc - j0 < 256u && g == (Lc - j0) % G) { acc = acc + sc[Lc - j0] * VK(vn_at(vn0 + d)); }
    }
    m = m_new;
    workgroupBarrier();  // sc is rewritten by the next tile
  }
  acc4[li] = acc;
  workgroupBarrier();
  if (li < p.D4) {
    var r = VK();
    for (var k = 0u; k < G; k = k + 1u) { r = r + acc4[k * p.D4 + li]; }
    o[(t * p.H + h) * p.D4 + li] = r / l;
  }
}
