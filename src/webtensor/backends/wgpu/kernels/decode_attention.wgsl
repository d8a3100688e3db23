// Decode step attention for one new token, one workgroup (256 threads) per head: append this
// position's key and value (from the fused qkv row) to the KV cache, then attend over positions
// 0..pos with a softmax held in workgroup memory. pos comes from the step state.
// qkv: (3C) = [q | k | v], caches: (n_ctx, C) with head h at columns h*D .. h*D+D.
// Header: const MAX_CTX (the cache length).
struct P { H: u32, D: u32, C: u32, scale: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> state: array<u32>;
@group(0) @binding(2) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(3) var<storage, read_write> kc: array<f32>;
@group(0) @binding(4) var<storage, read_write> vc: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
var<workgroup> qs: array<f32, 256>;
var<workgroup> sc: array<f32, MAX_CTX>;
var<workgroup> red: array<f32, 256>;

fn reduce(li: u32, v: f32, is_max: bool) -> f32 {
  red[li] = v;
  workgroupBarrier();
  for (var s = 128u; s > 0u; s = s >> 1u) {
    if (li < s) {
      if (is_max) { red[li] = max(red[li], red[li + s]); } else { red[li] = red[li] + red[li + s]; }
    }
    workgroupBarrier();
  }
  let r = red[0];
  workgroupBarrier();
  return r;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let h = wg.x;
  let pos = state[0];
  let hb = h * p.D;
  for (var d = li; d < p.D; d = d + 256u) {
    kc[pos * p.C + hb + d] = qkv[p.C + hb + d];
    vc[pos * p.C + hb + d] = qkv[2u * p.C + hb + d];
    qs[d] = qkv[hb + d] * p.scale;
  }
  storageBarrier();
  workgroupBarrier();
  let L = pos + 1u;
  var m = -3.4028234663852886e38;
  for (var j = li; j < L; j = j + 256u) {
    var s = 0.0;
    let kb = j * p.C + hb;
    for (var d = 0u; d < p.D; d = d + 1u) { s = s + qs[d] * kc[kb + d]; }
    sc[j] = s;
    m = max(m, s);
  }
  m = reduce(li, m, true);
  var t = 0.0;
  for (var j = li; j < L; j = j + 256u) { let e = exp(sc[j] - m); sc[j] = e; t = t + e; }
  let inv = 1.0 / reduce(li, t, false);  // (the reduction's barriers also publish sc)
  // output: G = 256 / D groups of D threads; group g sums positions j = g, g + G, ...
  let G = max(1u, 256u / p.D);
  let g = li / p.D;
  let d = li % p.D;
  var acc = 0.0;
  if (g < G && d < p.D) {
    for (var j = g; j < L; j = j + G) { acc = acc + sc[j] * vc[j * p.C + hb + d]; }
  }
  red[li] = acc;
  workgroupBarrier();
  if (li < p.D) {
    var o = 0.0;
    for (var k = 0u; k < G; k = k + 1u) { o = o + red[k * p.D + li]; }
    out[hb + li] = o * inv;
  }
}
