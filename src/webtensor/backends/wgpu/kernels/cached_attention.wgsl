// Attention of query rows against a KV cache, one workgroup (256 threads) per (head, row): row t
// attends to positions 0..pos[t] of cache slot slot[t] (causal within its sequence; the rows of a
// batch may belong to different sequences). With p.write, row t's own key and value (kn, vn) are
// first stored at position pos[t] of its slot by the same workgroup (so one launch both appends
// and attends; the rows must then have distinct slots, as a decode step's sequences do). Positions and slots are GPU tensors, so one replayed
// decode step serves any position. Online softmax over tiles of 256 keys (one key a thread), so
// any context length fits; the weighted sum of V runs in G = 256 / D4 groups of D4 threads.
// Built with VEC4 (head dims that are multiples of 4: offsets and strides then in vec4 units, D4 =
// D / 4 <= 256) or without (scalars, D4 = D <= 256): the lane type VK is vec4<f32> or f32.
// q: strided (T, H, D) view; caches (n_slots, n_ctx, H, D) f32; out (T, H, D) f32.
// A row whose slot is not one of the n_slots, or whose position is negative, attends to nothing
// and stores nothing (its output is 0 / 0 = NaN): positions and slots are GPU data, never trusted.
// Bounds (the kernels run without the compiler's runtime checks): q / kn / vn reads are their
// views' own elements (t < T, h < H, lane < D4); cache indices are base + h D4 + j C4 + e with slot
// < n_slots (base = slot * slot_stride4), j < L <= n_ctx, e < D4: inside the cache; qs, sc, acc4
// indices stay under 256 (D4 <= 256, the planner refuses more; g < G = 256 / D4 and k G + li < G D4
// <= 256). Loops end: each runs to a uniform or constant bound in steps that cannot wrap (sizes
// stay under 2^31).
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
  n_slots: u32,
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

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let h = wg.x;
  let t = wg.y * 65535u + wg.z;
  if (t >= p.T) { return; }  // (uniform: the whole workgroup leaves)
  if (li == 0u) {
    let ps = pos[t];
    let sl = u32(slot[t]);
    len_sh = select(0u, min(u32(ps) + 1u, p.n_ctx), ps >= 0 && sl < p.n_slots);
    base_sh = select(0u, sl * p.slot_stride4, sl < p.n_slots);
  }
  let L = workgroupUniformLoad(&len_sh);  // uniform, so loops with barriers may depend on it
  let base = workgroupUniformLoad(&base_sh);
  let C4 = p.H * p.D4;
  let hb = base + h * p.D4;
  if (li < p.D4) {
    qs[li] = VK(q[p.q_off4 + t * p.q_ts4 + h * p.q_hs4 + li]) * p.scale;
    if (p.write != 0u && L > 0u && L == u32(pos[t]) + 1u) {  // (a position past the context is not stored)
      kc[hb + (L - 1u) * C4 + li] = VK(kn[p.k_off4 + t * p.k_ts4 + h * p.k_hs4 + li]);
      vc[hb + (L - 1u) * C4 + li] = VK(vn[p.v_off4 + t * p.v_ts4 + h * p.v_hs4 + li]);
    }
  }
  storageBarrier();  // the new row is visible to the whole workgroup (and qs, below)
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
    if (j < L) {
      let kb = hb + j * C4;
      var dotq = 0.0;
      for (var e = 0u; e < p.D4; e = e + 1u) { dotq = dotq + dotv(qs[e], kc[kb + e]); }
      s = dotq;
    }
    let m_new = max(m, wg_max(li, s));
    let e = select(0.0, exp(s - m_new), j < L);
    sc[li] = e;
    let alpha = exp(m - m_new);
    l = l * alpha + wg_sum(li, e);  // (the reduction's barriers also publish sc)
    acc = acc * alpha;
    if (g < G) {
      let n_here = min(256u, L - j0);
      for (var jj = g; jj < n_here; jj = jj + G) { acc = acc + sc[jj] * vc[hb + (j0 + jj) * C4 + d]; }
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
