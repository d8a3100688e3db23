// Scaled dot-product attention, one workgroup per (query t, head h), 256 threads:
// keys are visited in tiles of 256 with an online softmax (running max and sum), so S is
// unbounded. q: (T, H, D), k/v: (S, KVH, D), out: (T, H, D), each with row / head strides and
// unit stride along D (so q, k, v may be column slices of a fused qkv tensor, and k, v may be the
// first S rows of a preallocated KV cache). Grouped-query: query head h reads kv head
// h / p.group (group = H / KVH; 1 for plain multi-head). Causal: query t sees keys j <= t + (S - T),
// and with p.window > 0 only the last p.window of them (a sliding window: j > t + (S - T) - window).
// With p.softcap > 0 each scaled score s becomes softcap tanh(s / softcap) (Gemma 2's soft-capping).
// D <= 256. Header: alias TQ, TK, TO.
// Bounds (the kernels run without the compiler's runtime checks): D <= 256 (the planner refuses
// more): qs[li] only for li < D, ps[i] for i < 256; q, k, v are read at t < T, j < last <= S, d <
// D: their validated views' own elements; o[t, h, li] for li < D. Loops end: each runs to a uniform
// or constant bound in steps that cannot wrap (sizes stay under 2^31).
struct P {
  T: u32, S: u32, H: u32, D: u32,
  q_off: u32, q_ts: u32, q_hs: u32, causal: u32,
  k_off: u32, k_ts: u32, k_hs: u32, scale: f32,
  v_off: u32, v_ts: u32, v_hs: u32, o_off: u32,
  o_ts: u32, o_hs: u32, group: u32, window: u32,
  softcap: f32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> q: array<TQ>;
@group(0) @binding(2) var<storage, read> k: array<TK>;
@group(0) @binding(3) var<storage, read> v: array<TK>;
@group(0) @binding(4) var<storage, read_write> o: array<TO>;
var<workgroup> qs: array<f32, 256>;
var<workgroup> ps: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let t = wg.x;
  let h = wg.y;
  let kh = h / p.group;  // its key / value head
  if (li < p.D) { qs[li] = f32(q[p.q_off + t * p.q_ts + h * p.q_hs + li]) * p.scale; }
  workgroupBarrier();
  var last = p.S;  // keys [first, last) are visible
  var first = 0u;
  if (p.causal != 0u) {
    last = min(p.S, t + (p.S - p.T) + 1u);
    if (p.window != 0u && t + (p.S - p.T) + 1u > p.window) { first = t + (p.S - p.T) + 1u - p.window; }
  }
  var m = -3.4028234663852886e38;
  var l = 0.0;
  var acc = 0.0;  // this thread's output element d = li
  for (var j0 = first; j0 < last; j0 = j0 + 256u) {
    let j = j0 + li;
    var s = -3.4028234663852886e38;
    if (j < last) {
      let kb = p.k_off + j * p.k_ts + kh * p.k_hs;
      var d0 = 0.0;
      for (var d = 0u; d < p.D; d = d + 1u) { d0 = d0 + qs[d] * f32(k[kb + d]); }
      s = d0;
      if (p.softcap > 0.0) { s = tanh_f32(s / p.softcap) * p.softcap; }
    }
    let m_new = max(m, wg_max(li, s));
    var e = 0.0;
    if (j < last) { e = exp(s - m_new); }
    ps[li] = e;
    let corr = exp(m - m_new);
    l = l * corr + wg_sum(li, e);
    acc = acc * corr;
    let n = min(256u, last - j0);
    if (li < p.D) {
      for (var i = 0u; i < n; i = i + 1u) {
        acc = acc + ps[i] * f32(v[p.v_off + (j0 + i) * p.v_ts + kh * p.v_hs + li]);
      }
    }
    m = m_new;
    workgroupBarrier();
  }
  if (li < p.D) { o[p.o_off + t * p.o_ts + h * p.o_hs + li] = TO(acc / l); }
}
