// Attention of a run of one sequence's rows (a prompt chunk) over its KV cache, on CPU adapters: q (T, H, D) float32
// a view (vec4 units), the caches (n_slots, n_ctx, KVH, D) float32 (kv_cache.wgsl's layout, at kc_off / vc_off
// vec4s, C4 = KVH D / 4 vec4s a position), the rows' positions pos (T,) and the sequence's slot slot[0] on the
// device (attention_cache_rows.wgsl: row t sees positions 0 .. pos[t], the chunk's own keys stored first). The
// loop: attention_flash_main.wgsl (key tiles from position 0: a row's result does not depend on its chunk).
// Output (T, H, D) float32 contiguous. attention_tiled_cache.wgsl is the GPUs' kernel for the same op.
// Header: const D4 (head dim / 4, at most 16).
// Bounds (the kernels run without the compiler's runtime checks): every key j < block_keys <= n_ctx of kh < KVH
// reads kv_row(s, j) C4 + kh D4 + d < n_slots n_ctx C4 past kc_off / vc_off (s < n_slots whenever block_keys > 0):
// inside the contiguous cache view; the body's bounds hold (the planner builds it for D % 4 == 0, D <= 64).
struct P {
  T: u32, scale: f32, group: u32, q_off: u32,
  q_ts: u32, q_hs: u32, o_ts: u32, o_hs: u32,
  n_ctx: u32, n_slots: u32, C4: u32, kc_off: u32,
  vc_off: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> pos: array<i32>;
@group(0) @binding(3) var<storage, read> slot: array<i32>;
@group(0) @binding(4) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> vc: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> o: array<vec4<f32>>;
// #include kv_cache.wgsl
// #include attention_cache_rows.wgsl

fn k_at(sq: u32, j: u32, kh: u32, d: u32) -> vec4<f32> { return kc[p.kc_off + kv_row(sq, j, p.n_ctx) * p.C4 + kh * D4 + d]; }
fn v_at(sq: u32, j: u32, kh: u32, d: u32) -> vec4<f32> { return vc[p.vc_off + kv_row(sq, j, p.n_ctx) * p.C4 + kh * D4 + d]; }
// #include attention_flash_main.wgsl
