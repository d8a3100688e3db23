// Decode step attention for one new token, one workgroup (256 threads) per head: append this
// position's key and value (from the fused qkv row) to the KV cache, then attend over positions
// 0..pos with a softmax held in workgroup memory. pos comes from the step state. Everything moves
// as vec4 (head dims are multiples of 4 here). qkv: (3C) = [q | k | v]; caches: (n_ctx, C) with
// head h at columns h*D .. h*D+D. Header: const MAX_CTX (the cache length).
struct P { H: u32, D4: u32, C4: u32, scale: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> state: array<u32>;
@group(0) @binding(2) var<storage, read_write> qkv: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> kc: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> vc: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;
var<workgroup> qs: array<vec4<f32>, 64>;
var<workgroup> sc: array<f32, MAX_CTX>;
var<workgroup> acc4: array<vec4<f32>, 256>;
var<workgroup> pos_sh: u32;


@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let h = wg.x;
  if (li == 0u) { pos_sh = state[0]; }
  let pos = workgroupUniformLoad(&pos_sh);  // uniform, so loops with barriers may depend on it
  let hb = h * p.D4;
  if (li < p.D4) {
    kc[pos * p.C4 + hb + li] = qkv[p.C4 + hb + li];
    vc[pos * p.C4 + hb + li] = qkv[2u * p.C4 + hb + li];
    qs[li] = qkv[hb + li] * p.scale;
  }
  storageBarrier();
  workgroupBarrier();
  let L = pos + 1u;
  // scores: 4 threads per key (64 keys a pass), each a quarter of the head dim, summed in workgroup memory
  let q4 = li % 4u;
  var m = -3.4028234663852886e38;
  for (var j0 = 0u; j0 < L; j0 = j0 + 64u) {
    let j = j0 + li / 4u;
    var s = 0.0;
    if (j < L) {
      let kb = j * p.C4 + hb;
      for (var d = q4; d < p.D4; d = d + 4u) { s = s + dot(qs[d], kc[kb + d]); }
    }
    wg_red[li] = s;
    workgroupBarrier();
    if (q4 == 0u && j < L) {
      let t = wg_red[li] + wg_red[li + 1u] + wg_red[li + 2u] + wg_red[li + 3u];
      sc[j] = t;
      m = max(m, t);
    }
    workgroupBarrier();
  }
  m = wg_max(li, m);
  var t = 0.0;
  for (var j = li; j < L; j = j + 256u) { let e = exp(sc[j] - m); sc[j] = e; t = t + e; }
  let inv = 1.0 / wg_sum(li, t);  // (the reductions' barriers also publish sc)
  // output: G = 256 / D4 groups of D4 threads; group g sums positions j = g, g + G, ...
  let G = 256u / p.D4;
  let g = li / p.D4;
  let d = li % p.D4;
  var o0 = vec4<f32>();
  var o1 = vec4<f32>();
  if (g < G) {
    var j = g;
    for (; j + G < L; j = j + 2u * G) {
      o0 = o0 + sc[j] * vc[j * p.C4 + hb + d];
      o1 = o1 + sc[j + G] * vc[(j + G) * p.C4 + hb + d];
    }
    if (j < L) { o0 = o0 + sc[j] * vc[j * p.C4 + hb + d]; }
  }
  acc4[li] = o0 + o1;
  workgroupBarrier();
  if (li < p.D4) {
    var o = vec4<f32>();
    for (var k = 0u; k < G; k = k + 1u) { o = o + acc4[k * p.D4 + li]; }
    out[hb + li] = o * inv;
  }
}
