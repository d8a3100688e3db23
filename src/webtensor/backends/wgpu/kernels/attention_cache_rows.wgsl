// What the cache variants of the prefill attention kernels (attention_tiled_cache.wgsl, attention_flash_cache.wgsl:
// included where they say `// #include attention_cache_rows.wgsl`, after kv_pages.wgsl) know of their rows and keys:
// one sequence's rows, at positions pos[t] of sequence slot[0] (device tensors: never trusted as indices), reading
// the paged pool through kv_pages.wgsl's kv_row. Row t sees keys j < row_limit(t) = pos[t] + 1 (at most n_ctx, the
// positions the table reaches), none at a negative position or when the sequence is outside the table;
// with a sliding window (p.window > 0) only keys j >= row_start(t) = pos[t] + 1 - window (cpu.py's `_seen`).
// block_keys is the largest limit among a block's 64 rows, block_first the smallest start (each found by one
// thread, read uniformly; a start is at most its row's limit). k_at / v_at: vec4
// d4 of key / value j of KV head kvh as the pool stores it, widened to f32 (float32 / float16: a vec4 of the
// pool's type; Q8: a quant word times its block's scale), zeros where kv_row gives no row; they read the key's row
// from key_rows, which tile_keys fills at the start of each tile of KEY_TILE keys (threads li < KEY_TILE: one
// table lookup a key, where a lookup a load would repeat it D4 times and divide each time).
// The includer declares p (with T, n_ctx, window, n_slots (the table's rows, or the contiguous cache's sequences), C4
// (the pool's words a position: KVH D4 vec4s, or KVH q8_words(D) words), kc_off / vc_off (in those words) and
// kv_pages.wgsl's fields), q at binding 1, o at binding 7, const D4 and const KEY_TILE (the body's key tile, at
// most 64, tiles starting at multiples of it; at least as many threads); this file declares the cache's bindings
// 2-6: pos, slot, kv_table, kc and vc (array<vec4<KV>>, or array<u32> with Q8).
// Bounds: pos is read at rows clamped to T - 1 and slot at 0 (the planner binds tensors of T rows from element 0);
// a limit is at most n_ctx and nonzero only for a slot < n_slots. A key's row r = kv_row(..) is < n_blocks
// block or NO_ROW (not read), so kc_off + r C4 + kvh HW + (d4 or D4 + d4 / 16) with kvh < KVH, d4 < D4 (HW the
// words of a head: D4, or q8_words(D) = D4 + ceil(D / 64) > D4 + d4 / 16) stays inside the (n_blocks, block, KVH,
// ..) pool view; key_rows is indexed by li < KEY_TILE <= 64 and j % KEY_TILE. Loops end: block_keys and block_first
// run over at most 64 rows.

@group(0) @binding(2) var<storage, read> pos: array<i32>;
@group(0) @binding(3) var<storage, read> slot: array<i32>;
@group(0) @binding(4) var<storage, read> kv_table: array<i32>;
// #if Q8
@group(0) @binding(5) var<storage, read> kc: array<u32>;
@group(0) @binding(6) var<storage, read> vc: array<u32>;
// #else
@group(0) @binding(5) var<storage, read> kc: array<vec4<KV>>;
@group(0) @binding(6) var<storage, read> vc: array<vec4<KV>>;
// #endif

// the sequence (n_slots where it is out of range: every limit is then 0, no key is read)
fn sequence() -> u32 { return min(u32(slot[0]), p.n_slots); }

fn row_limit(t: u32) -> u32 {
  let ps = pos[min(t, p.T - 1u)];
  if (ps < 0 || u32(slot[0]) >= p.n_slots) { return 0u; }
  return min(u32(ps) + 1u, p.n_ctx);
}

// the first key row t sees: 0, or (a sliding window) its position + 1 - window, at most its limit
fn row_start(t: u32) -> u32 {
  let ps = pos[min(t, p.T - 1u)];
  if (p.window == 0u || ps < 0 || u32(ps) + 1u <= p.window) { return 0u; }
  return min(u32(ps) + 1u - p.window, row_limit(t));
}

var<workgroup> n_keys_sh: u32;
var<workgroup> first_sh: u32;

fn block_keys(b: u32, li: u32) -> u32 {
  if (li == 0u) {
    var n = 0u;
    let t_end = min(p.T, b * 64u + 64u);
    for (var t = b * 64u; t < t_end; t = t + 1u) { n = max(n, row_limit(t)); }
    n_keys_sh = n;
  }
  return workgroupUniformLoad(&n_keys_sh);
}

fn block_first(b: u32, li: u32) -> u32 {
  if (li == 0u) {
    var f = 0xffffffffu;
    let t_end = min(p.T, b * 64u + 64u);
    for (var t = b * 64u; t < t_end; t = t + 1u) { f = min(f, row_start(t)); }
    first_sh = select(0u, f, t_end > b * 64u);
  }
  return workgroupUniformLoad(&first_sh);
}

var<workgroup> key_rows: array<u32, 64>;  // the pool rows of the current tile's keys (NO_ROW: none)

fn tile_keys(sq: u32, j0: u32, n: u32, li: u32) {
  if (li < KEY_TILE) { key_rows[li] = select(NO_ROW, kv_row(sq, j0 + li), j0 + li < n); }
  workgroupBarrier();
}

// #if Q8
fn k_at(sq: u32, j: u32, kvh: u32, d4: u32) -> vec4<f32> {
  let r = key_rows[j % KEY_TILE];
  if (r == NO_ROW) { return vec4<f32>(); }
  let b = p.kc_off + r * p.C4 + kvh * q8_words(4u * D4);
  return q8_lane(kc[b + d4], q8_scale(kc[b + D4 + d4 / 16u], d4 / 8u));
}
fn v_at(sq: u32, j: u32, kvh: u32, d4: u32) -> vec4<f32> {
  let r = key_rows[j % KEY_TILE];
  if (r == NO_ROW) { return vec4<f32>(); }
  let b = p.vc_off + r * p.C4 + kvh * q8_words(4u * D4);
  return q8_lane(vc[b + d4], q8_scale(vc[b + D4 + d4 / 16u], d4 / 8u));
}
// #else
fn k_at(sq: u32, j: u32, kvh: u32, d4: u32) -> vec4<f32> {
  let r = key_rows[j % KEY_TILE];
  if (r == NO_ROW) { return vec4<f32>(); }
  return vec4<f32>(kc[p.kc_off + r * p.C4 + kvh * D4 + d4]);
}
fn v_at(sq: u32, j: u32, kvh: u32, d4: u32) -> vec4<f32> {
  let r = key_rows[j % KEY_TILE];
  if (r == NO_ROW) { return vec4<f32>(); }
  return vec4<f32>(vc[p.vc_off + r * p.C4 + kvh * D4 + d4]);
}
// #endif
