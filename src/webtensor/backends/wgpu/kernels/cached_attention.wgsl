// Attention of query rows against a KV cache, one workgroup (256 threads) per (head, row): row t
// attends to positions 0..pos[t] of cache slot slot[t] (causal within its sequence; the rows of a
// batch may belong to different sequences). Grouped-query: query head h reads cache head
// h / p.group (the cache holds KVH = H / group heads). Positions and slots are GPU tensors, so one
// replayed decode step serves any position. Online softmax over tiles of 256 keys (one key a
// thread), so any context length fits; the weighted sum of V runs in G = 256 / D4 groups of D4
// threads.
// With p.write, row t's own key and value (kn, vn: (T, KVH, D) views) are stored at position pos[t]
// of its slot by the same launch (by the workgroup of the first query head of their kv head, h %
// group == 0), and every workgroup of the row attends to them from kn, vn (position pos[t] is the
// last key: its score and its share of V are read from there, in the place and order the cache's
// row would have), so no workgroup reads a cache row another workgroup of the launch writes. (The rows must then have distinct slots, as a decode step's sequences do.) A
// position past the context is not stored; the row then sees the cache's n_ctx positions.
// Built with VEC4 (head dims that are multiples of 4: offsets and strides then in vec4 units, D4 =
// D / 4 <= 256) or without (scalars, D4 = D <= 256): the lane type VK is vec4<f32> or f32.
// q: strided (T, H, D) view; caches (n_slots, n_ctx, KVH, D) f32; out (T, H, D) f32.
// Bounds: a workgroup returns unless t < T; h < H by the grid. A row whose slot is outside
// 0 .. n_slots-1 or whose position is negative attends to nothing and stores nothing (L = 0: its
// output is 0 / 0, NaN), so a cache is indexed only as its offset (kc_off4, vc_off4: where the cache
// view starts) + slot * slot_stride4 + j * C4 + kvh * D4 + e with slot < n_slots, j < L <= n_ctx,
// kvh < KVH, e < D4: inside the contiguous (n_slots, n_ctx, KVH, D) cache view.
// q, kn, vn indices are elements of their views (offsets and strides from the planner's views, t < T,
// kvh < KVH, e < D4; kn, vn are read only when p.write, when the planner binds them); o's index
// (t H + h) D4 + e < T H D4. Workgroup arrays are indexed by li < 256, or e < D4 <= 256.
// These bounds are what the kernel relies on: it runs without the shader compiler's runtime
// checks. Loops end: each runs to a uniform or constant bound in steps that cannot wrap.
// Header: alias TQ; define VEC4.
// #if VEC4
alias VK = vec4<f32>;
alias VQ = vec4<TQ>;
fn dotv(a: VK, b: VK) -> f32 { return dot(a, b); }
// #else
alias VK = f32;
alias VQ = TQ;
fn dotv(a: VK, b: VK) -> f32 { return a * b; }
// #endif
struct P {
  T: u32, H: u32, D4: u32, q_off4: u32,
  q_ts4: u32, q_hs4: u32, k_off4: u32, k_ts4: u32,
  k_hs4: u32, v_off4: u32, v_ts4: u32, v_hs4: u32,
  n_ctx: u32, slot_stride4: u32, write: u32, scale: f32,
  group: u32, n_slots: u32, kc_off4: u32, vc_off4: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> q: array<VQ>;
@group(0) @binding(2) var<storage, read> kn: array<VQ>;
@group(0) @binding(3) var<storage, read> vn: array<VQ>;
@group(0) @binding(4) var<storage, read> pos: array<i32>;
@group(0) @binding(5) var<storage, read> slot: array<i32>;
@group(0) @binding(6) var<storage, read_write> kc: array<VK>;
@group(0) @binding(7) var<storage, read_write> vc: array<VK>;
@group(0) @binding(8) var<storage, read_write> o: array<VK>;
var<workgroup> qs: array<VK, 256>;
var<workgroup> sc: array<f32, 256>;
var<workgroup> acc4: array<VK, 256>;
var<workgroup> len_sh: u32;
var<workgroup> base_sh: u32;
var<workgroup> fresh_sh: u32;

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
    base_sh = select(0u, sl * p.slot_stride4, ok);
    fresh_sh = select(0u, 1u, ok && p.write != 0u && u32(ps) < p.n_ctx);  // its own key is new
  }
  let L = workgroupUniformLoad(&len_sh);  // uniform, so loops with barriers may depend on it
  let base = workgroupUniformLoad(&base_sh);
  let fresh = workgroupUniformLoad(&fresh_sh) != 0u;
  let kvh = h / p.group;
  let C4 = (p.H / p.group) * p.D4;  // a cache position: KVH heads
  let kb0 = p.kc_off4 + base + kvh * p.D4;  // position 0 of this head in the slot's keys
  let vb0 = p.vc_off4 + base + kvh * p.D4;
  let Lc = L - select(0u, 1u, fresh);  // positions read from the cache (fresh: position Lc from kn, vn)
  let kn0 = p.k_off4 + t * p.k_ts4 + kvh * p.k_hs4;  // (fresh) the row's own key and value
  let vn0 = p.v_off4 + t * p.v_ts4 + kvh * p.v_hs4;
  if (li < p.D4) {
    qs[li] = VK(q[p.q_off4 + t * p.q_ts4 + h * p.q_hs4 + li]) * p.scale;
    if (fresh && h % p.group == 0u) {  // one workgroup of the kv head stores the row (none reads it back)
      kc[kb0 + Lc * C4 + li] = VK(kn[kn0 + li]);
      vc[vb0 + Lc * C4 + li] = VK(vn[vn0 + li]);
    }
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
    if (j < Lc) {
      let kb = kb0 + j * C4;
      var dotq = 0.0;
      for (var e = 0u; e < p.D4; e = e + 1u) { dotq = dotq + dotv(qs[e], kc[kb + e]); }
      s = dotq;
    } else if (j < L) {  // (fresh: j == Lc) the row's own key
      var dotq = 0.0;
      for (var e = 0u; e < p.D4; e = e + 1u) { dotq = dotq + dotv(qs[e], VK(kn[kn0 + e])); }
      s = dotq;
    }
    let m_new = max(m, wg_max(li, s));
    let e = select(0.0, exp(s - m_new), j < L);
    sc[li] = e;
    let alpha = exp(m - m_new);
    l = l * alpha + wg_sum(li, e);  // (the reduction's barriers also publish sc)
    acc = acc * alpha;
    if (g < G) {
      let n_here = min(256u, Lc - j0);  // (j0 <= Lc: j0 < L <= Lc + 1)
      for (var jj = g; jj < n_here; jj = jj + G) { acc = acc + sc[jj] * vc[vb0 + (j0 + jj) * C4 + d]; }
      // the row's own value, in its group's order (its largest jj: last), as if read from the cache
      if (fresh && Lc - j0 < 256u && g == (Lc - j0) % G) { acc = acc + sc[Lc - j0] * VK(vn[vn0 + d]); }
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
