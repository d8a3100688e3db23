// Attention of a run of one sequence's rows (a prompt chunk) over its KV cache, on CPU adapters: q (T, H, D) float32
// a view (vec4 units), the caches a pool of blocks read through the block table (kv_pages.wgsl: float32, float16 or
// q8_0 words, at kc_off / vc_off words, C4 words a position; attention_cache_rows.wgsl reads a key as f32), the rows'
// positions pos (T,) and the sequence slot[0] on the device (attention_cache_rows.wgsl: row t sees positions 0 ..
// pos[t], the chunk's own keys stored first). The loop: attention_flash_main.wgsl (key tiles from position 0: a
// row's result does not depend on its chunk). Output (T, H, D) float32 contiguous. A sliding window
// (p.window > 0) and a score soft-cap (p.softcap > 0) as in cached_attention. attention_tiled_cache.wgsl is
// the GPUs' kernel for the same op.
// Header: const D4 (head dim / 4, at most 16); the pool: alias KV (f32 / f16, KV16 for f16) or define Q8.
// Bounds (the kernels run without the compiler's runtime checks): every key j < block_keys <= n_ctx is read through
// kv_row (attention_cache_rows.wgsl: inside the pool view, or not read); the body's bounds hold (the planner builds
// it for D % 4 == 0, D <= 64).
struct P {
  T: u32, scale: f32, group: u32, q_off: u32,
  q_ts: u32, q_hs: u32, o_ts: u32, o_hs: u32,
  n_ctx: u32, n_slots: u32, C4: u32, kc_off: u32,
  vc_off: u32, block: u32, max_blocks: u32, n_seqs: u32,
  n_blocks: u32, table_off: u32, window: u32, softcap: f32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> o: array<vec4<f32>>;
const KEY_TILE = 32u;  // (attention_flash_main.wgsl's key tile)
// #include kv_pages.wgsl
// #include attention_cache_rows.wgsl
// #include attention_flash_main.wgsl
