// Scaled dot-product attention for many queries (prefill). A workgroup of 256 threads takes 64
// queries of one head; each query is shared by 4 threads that split the keys between them (key j
// goes to thread j % 4), each holding q and a partial output row in registers (D4 vec4s) with its
// own online softmax. Keys and values stream through workgroup memory in tiles of 32, so they are
// read once per 64 queries; at the end the 4 partial (max, sum, row) of each query are merged.
// Causal: query t sees keys j <= t + (S - T). Grouped-query: the workgroup's head h reads kv head
// h / p.group of k (S, KVH, D) and v. Strides and offsets in vec4 units.
// Header: const D4 (head dim / 4, at most 16).
// Bounds (the kernels run without the compiler's runtime checks): the planner builds it for float32
// with D % 4 == 0 and D <= 64, so D4 <= 16: kv[e] and kv[512 + e] with e < 32 D4 <= 512, kv[qi D4 +
// d] < 64 x 16 = 1,024, ml[qi + 192] < 256; k, v are read only for j < S, q and o only for live
// queries t < T, each inside its view. Loops end: each runs to a uniform or constant bound in steps
// that cannot wrap (sizes stay under 2^31).
struct P {
  T: u32, S: u32, causal: u32, scale: f32,
  q_off: u32, q_ts: u32, q_hs: u32, k_off: u32,
  k_ts: u32, k_hs: u32, v_off: u32, v_ts: u32,
  v_hs: u32, o_ts: u32, o_hs: u32, group: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> o: array<vec4<f32>>;
var<workgroup> kv: array<vec4<f32>, 1024>;  // keys [0, 512) and values [512, 1024) of a tile; then the merge
var<workgroup> ml: array<vec2<f32>, 256>;   // each thread's (max, sum)

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let h = wg.y;
  let kh = h / p.group;  // its key / value head
  let qi = li % 64u;
  let sp = li / 64u;
  let t = wg.x * 64u + qi;
  let live = t < p.T;
  var qr: array<vec4<f32>, D4>;
  var acc: array<vec4<f32>, D4>;
  if (live) {
    for (var d = 0u; d < D4; d = d + 1u) { qr[d] = q[p.q_off + t * p.q_ts + h * p.q_hs + d] * p.scale; }
  }
  var m = -3.4028234663852886e38;
  var l = 0.0;
  let t_last = min(p.T, wg.x * 64u + 64u) - 1u;
  var n_keys = p.S;  // keys this workgroup needs: up to its last query's causal limit
  if (p.causal != 0u) { n_keys = min(p.S, t_last + (p.S - p.T) + 1u); }
  var my_end = n_keys;  // this query's own limit
  if (p.causal != 0u) { my_end = min(n_keys, t + (p.S - p.T) + 1u); }
  for (var j0 = 0u; j0 < n_keys; j0 = j0 + 32u) {
    for (var e = li; e < 32u * D4; e = e + 256u) {
      let j = j0 + e / D4;
      let d = e % D4;
      if (j < p.S) {
        kv[e] = k[p.k_off + j * p.k_ts + kh * p.k_hs + d];
        kv[512u + e] = v[p.v_off + j * p.v_ts + kh * p.v_hs + d];
      }
    }
    workgroupBarrier();
    if (live) {
      for (var jj = sp; jj < 32u && j0 + jj < my_end; jj = jj + 4u) {
        var s = 0.0;
        for (var d = 0u; d < D4; d = d + 1u) { s = s + dot(qr[d], kv[jj * D4 + d]); }
        if (s > m) {
          let c = exp(m - s);
          l = l * c;
          for (var d = 0u; d < D4; d = d + 1u) { acc[d] = acc[d] * c; }
          m = s;
        }
        let pj = exp(s - m);
        l = l + pj;
        for (var d = 0u; d < D4; d = d + 1u) { acc[d] = acc[d] + pj * kv[512u + jj * D4 + d]; }
      }
    }
    workgroupBarrier();
  }
  // merge the 4 partials of each query: rescale to the common max, then sum rows through kv
  ml[li] = vec2<f32>(m, l);
  workgroupBarrier();
  let mx = max(max(ml[qi].x, ml[qi + 64u].x), max(ml[qi + 128u].x, ml[qi + 192u].x));
  var c = 0.0;
  if (l > 0.0) { c = exp(m - mx); }
  let total = ml[qi].y * select(0.0, exp(ml[qi].x - mx), ml[qi].y > 0.0)
            + ml[qi + 64u].y * select(0.0, exp(ml[qi + 64u].x - mx), ml[qi + 64u].y > 0.0)
            + ml[qi + 128u].y * select(0.0, exp(ml[qi + 128u].x - mx), ml[qi + 128u].y > 0.0)
            + ml[qi + 192u].y * select(0.0, exp(ml[qi + 192u].x - mx), ml[qi + 192u].y > 0.0);
  for (var r = 1u; r < 4u; r = r + 1u) {
    if (sp == r) {
      for (var d = 0u; d < D4; d = d + 1u) {
        if (r == 1u) { kv[qi * D4 + d] = acc[d] * c; } else { kv[qi * D4 + d] = kv[qi * D4 + d] + acc[d] * c; }
      }
    }
    workgroupBarrier();
  }
  if (sp == 0u && live) {
    let inv = 1.0 / total;
    for (var d = 0u; d < D4; d = d + 1u) { o[t * p.o_ts + h * p.o_hs + d] = (acc[d] * c + kv[qi * D4 + d]) * inv; }
  }
}
