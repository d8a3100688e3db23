// Scaled dot-product attention for many queries (prefill): one thread per query holds its q and
// its output row in registers (D4 vec4s each) and streams the keys with an online softmax; a
// workgroup of 64 queries of one head shares each tile of 32 keys and values through workgroup
// memory (16 KiB), so K and V are read from memory once per 64 queries. Causal: query t sees keys
// j <= t + (S - T). Strides and offsets in vec4 units. Header: const D4 (head dim / 4, at most 16).
struct P {
  T: u32, S: u32, causal: u32, scale: f32,
  q_off: u32, q_ts: u32, q_hs: u32, k_off: u32,
  k_ts: u32, k_hs: u32, v_off: u32, v_ts: u32,
  v_hs: u32, o_ts: u32, o_hs: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> k: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> v: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> o: array<vec4<f32>>;
var<workgroup> ks: array<vec4<f32>, 512>;  // 32 keys x up to 16 vec4
var<workgroup> vs: array<vec4<f32>, 512>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let h = wg.y;
  let t = wg.x * 64u + li;
  let live = t < p.T;
  var qr: array<vec4<f32>, D4>;
  var acc: array<vec4<f32>, D4>;
  if (live) {
    for (var d = 0u; d < D4; d = d + 1u) { qr[d] = q[p.q_off + t * p.q_ts + h * p.q_hs + d] * p.scale; }
  }
  var m = -3.4028234663852886e38;
  var l = 0.0;
  // keys this workgroup needs: up to its last query's causal limit
  let t_last = min(p.T, wg.x * 64u + 64u) - 1u;
  var n_keys = p.S;
  if (p.causal != 0u) { n_keys = min(p.S, t_last + (p.S - p.T) + 1u); }
  var my_last = p.S;
  if (p.causal != 0u) { my_last = t + (p.S - p.T) + 1u; }
  for (var j0 = 0u; j0 < n_keys; j0 = j0 + 32u) {
    for (var e = li; e < 32u * D4; e = e + 64u) {
      let j = j0 + e / D4;
      let d = e % D4;
      if (j < p.S) {
        ks[e] = k[p.k_off + j * p.k_ts + h * p.k_hs + d];
        vs[e] = v[p.v_off + j * p.v_ts + h * p.v_hs + d];
      }
    }
    workgroupBarrier();
    if (live) {
      let jn = min(32u, min(n_keys, my_last) - min(j0, min(n_keys, my_last)));
      for (var jj = 0u; jj < jn; jj = jj + 1u) {
        var s = 0.0;
        for (var d = 0u; d < D4; d = d + 1u) { s = s + dot(qr[d], ks[jj * D4 + d]); }
        if (s > m) {
          let c = exp(m - s);
          l = l * c;
          for (var d = 0u; d < D4; d = d + 1u) { acc[d] = acc[d] * c; }
          m = s;
        }
        let pj = exp(s - m);
        l = l + pj;
        for (var d = 0u; d < D4; d = d + 1u) { acc[d] = acc[d] + pj * vs[jj * D4 + d]; }
      }
    }
    workgroupBarrier();
  }
  if (live) {
    let inv = 1.0 / l;
    for (var d = 0u; d < D4; d = d + 1u) { o[t * p.o_ts + h * p.o_hs + d] = acc[d] * inv; }
  }
}
