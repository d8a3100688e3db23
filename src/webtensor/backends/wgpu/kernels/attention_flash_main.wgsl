// The body of attention_flash.wgsl and attention_flash_cache.wgsl (included where they say `// #include
// attention_flash_main.wgsl`): scaled dot-product attention for many queries on CPU adapters. A workgroup of 256
// threads takes 64 queries of one head; each query is shared by 4 threads that split the keys between them (key j
// goes to thread j % 4), each holding q and a partial output row in registers (D4 vec4s) with its own online
// softmax. Keys and values stream through workgroup memory in tiles of 32 from key 0, so they are read once per 64
// queries (and a row's sums do not depend on which block or chunk it is in); at the end the 4 partial (max, sum,
// row) of each query are merged. Which keys a row sees is the includer's: `row_limit(t)` (keys j < it are
// visible), `block_keys(block, li)` the keys the block reads (at least every live row's limit; uniform, called by
// every thread). A row that sees no key writes zeros. Grouped-query: the workgroup's head h reads kv head h /
// p.group.
// The includer declares: struct P with T, scale, q_off, q_ts, q_hs, o_ts, o_hs, group (vec4 units), bindings p, q
// and o (vec4<f32>), `sequence()`, `tile_keys(sq, j0, n_keys, li)` (called by every thread at the start of each tile
// of keys j0 .. j0 + 31), `k_at(sq, j, kh, d)` / `v_at(sq, j, kh, d)` (vec4 d of key / value j, called for
// j < block_keys only, of the current tile), `row_limit`, `block_keys`; const D4 (head dim / 4, at most 16).
// Bounds (what the body indexes; the includers bound their own reads): kv[e] and kv[512 + e] with e < 32 D4 <= 512,
// kv[qi D4 + d] < 64 x 16 = 1,024, ml[qi + 192] < 256; q and o only for live queries t < T, each inside its view.
// Loops end: each runs to a uniform or constant bound in steps that cannot wrap (sizes stay under 2^31).
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
  let sq = sequence();
  let n_keys = block_keys(wg.x, li);  // keys this workgroup reads: up to its rows' largest limit
  var my_end = 0u;  // this query's own limit
  if (live) { my_end = row_limit(t); }
  for (var j0 = 0u; j0 < n_keys; j0 = j0 + 32u) {
    tile_keys(sq, j0, n_keys, li);  // (the cache variant: the tile's keys' pool rows, looked up once)
    for (var e = li; e < 32u * D4; e = e + 256u) {
      let j = j0 + e / D4;
      let d = e % D4;
      if (j < n_keys) {
        kv[e] = k_at(sq, j, kh, d);
        kv[512u + e] = v_at(sq, j, kh, d);
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
    let inv = select(0.0, 1.0 / total, total > 0.0);  // (a row that sees no key: zeros)
    for (var d = 0u; d < D4; d = d + 1u) { o[t * p.o_ts + h * p.o_hs + d] = (acc[d] * c + kv[qi * D4 + d]) * inv; }
  }
}
