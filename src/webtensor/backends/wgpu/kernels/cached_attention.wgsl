// Attention of query rows against a KV cache, one workgroup (256 threads) per (head, row): row t
// attends to positions 0..pos[t] of sequence slot[t] (causal within its sequence; the rows of a batch
// may belong to different sequences), each position's key and value read from the pool row the block
// table gives (kv_pages.wgsl's kv_row; a contiguous (n_slots, n_ctx, KVH, D) cache without a table).
// Grouped-query: query head h reads cache head h / p.group (the cache holds KVH = H / group heads).
// Positions and slots come from one int32 buffer (ps, at pos_off and slot_off), and the table is a
// tensor, so one replayed decode step serves any position and any blocks. Online softmax over tiles of
// 256 keys (one key a thread), so any context length fits; the weighted sum of V runs in G = 256 / D4
// groups of D4 threads.
// With p.write, row t's own key and value (kn, vn: (T, KVH, D) views) are stored at position pos[t]
// of its sequence by the same launch (by the workgroup of the first query head of their kv head, h %
// group == 0), and every workgroup of the row attends to them as stored (rounded to the pool's type:
// cached_attention_main.wgsl) from workgroup memory (position pos[t] is the last key: its score and its
// share of V taken in the place and order the cache's row would have), so no workgroup reads a cache
// row another workgroup of the launch writes. (The rows must then have distinct slots, as a decode
// step's sequences do.) A position past the context is not stored; the row then sees the cache's
// n_ctx positions.
// Built with VEC4 (head dims that are multiples of 4: offsets and strides then in vec4 units, D4 =
// D / 4 <= 64) or without (scalars, D4 = D <= 256): the lane type VK is vec4<f32> or f32. The pool:
// alias KV (float32 / float16, read as VK) or define Q8 (q8_0 words, VEC4 only: kv_pages.wgsl).
// q: strided (T, H, D) view; out (T, H, D) f32.
// Bounds: see cached_attention_main.wgsl (kn, vn are read only when p.write, when the planner binds them).
// Header: alias TQ; alias KV or define Q8; define VEC4. (cached_attention_rope.wgsl: the same with q and
// the new key rotated.)
// #include cached_attention_lanes.wgsl
// #include cached_attention_params.wgsl
const ROPE: u32 = 0u;
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> q: array<VQ>;
@group(0) @binding(2) var<storage, read> kn: array<VQ>;
@group(0) @binding(3) var<storage, read> vn: array<VQ>;
@group(0) @binding(4) var<storage, read> ps: array<i32>;
@group(0) @binding(5) var<storage, read> kv_table: array<i32>;
@group(0) @binding(6) var<storage, read_write> kc: array<VP>;
@group(0) @binding(7) var<storage, read_write> vc: array<VP>;
@group(0) @binding(8) var<storage, read_write> o: array<VK>;
fn kn_at(i: u32) -> VQ { return kn[i]; }
fn vn_at(i: u32) -> VQ { return vn[i]; }
fn rope_cos(i: u32) -> f32 { return 0.0; }  // (ROPE = 0: never called)
fn rope_sin(i: u32) -> f32 { return 0.0; }
// #include cached_attention_main.wgsl
