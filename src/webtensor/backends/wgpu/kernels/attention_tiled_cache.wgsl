// Attention of a run of one sequence's rows (a prompt chunk) over its KV cache, on GPUs: q (T, H, D) a view (row /
// head strides, unit stride along D, in vec4s), the caches a pool of blocks read through the block table (kv_pages.wgsl:
// float32, float16 or q8_0 words, at kc_off / vc_off words, C4 words a position; attention_cache_rows.wgsl reads
// a key as f32), the rows' positions pos (T,) and the sequence slot[0] on the device (int32), so one captured graph
// serves every chunk of every prompt and any blocks. Which keys a row sees: attention_cache_rows.wgsl (row t:
// positions 0 .. pos[t] of the sequence, causal within the chunk and over the cached prefix; the chunk's own keys and
// values are stored, by cache_write, before this runs). Query tiles of 64 rows share every key and value tile they
// load (attention_tiled_main.wgsl, whose tiles run from position 0: a row's result does not depend on which chunk or
// tile it is in). Output (T, H, D) float32 contiguous. A sliding window (p.window > 0) and a score soft-cap
// (p.softcap > 0) as in cached_attention. With F16 q is float16 (read as u32 words); the tiles are float32 (a key
// as stored, widened). attention_flash_cache.wgsl is the CPU adapters' kernel for the same op.
// Bounds (the kernels run without the compiler's runtime checks): every key j < block_keys <= n_ctx is read through
// kv_row (attention_cache_rows.wgsl: inside the pool view, or not read). The body's bounds hold as in
// attention_tiled.wgsl (the planner builds it for D a multiple of BK and tiles that fit).
// Header: alias TS (tile type: f32); const D4 (D / 4), KG (key quads a tile), F16 (float16 q), SG; the pool: alias KV
// (f32 / f16, KV16 for f16) or define Q8.
struct P {
  T: u32, scale: f32, G: u32, q_off: u32,
  q_ts: u32, q_hs: u32, o_ts: u32, o_hs: u32,
  n_ctx: u32, n_slots: u32, C4: u32, kc_off: u32,
  vc_off: u32, block: u32, max_blocks: u32, n_seqs: u32,
  n_blocks: u32, table_off: u32, window: u32, softcap: f32,
}
@group(0) @binding(0) var<uniform> p: P;
// #if F16
alias QV = vec2<u32>;  // four float16 values as two u32 words
fn f4(x: QV) -> vec4<f32> { return vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y)); }
// #else
alias QV = vec4<f32>;
fn f4(x: QV) -> vec4<f32> { return x; }
// #endif
fn fk(x: vec4<f32>) -> vec4<f32> { return x; }  // (k_at / v_at widen the pool's values)
alias OV = vec4<f32>;
fn o4(x: vec4<f32>) -> OV { return x; }
@group(0) @binding(1) var<storage, read> q: array<QV>;
@group(0) @binding(7) var<storage, read_write> o: array<OV>;
const KEY_TILE = 4u * KG;  // (attention_tiled_main.wgsl's BK)
// #include kv_pages.wgsl
// #include attention_cache_rows.wgsl

fn row_limits(t0: u32) -> vec4<u32> {
  return vec4<u32>(row_limit(t0), row_limit(t0 + 1u), row_limit(t0 + 2u), row_limit(t0 + 3u));
}
fn row_starts(t0: u32) -> vec4<u32> {
  return vec4<u32>(row_start(t0), row_start(t0 + 1u), row_start(t0 + 2u), row_start(t0 + 3u));
}
// #include attention_tiled_main.wgsl
