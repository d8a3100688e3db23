// Attention of query rows against a KV cache, one workgroup (256 threads) per (head, row): row t
// attends to positions 0..pos[t] of cache slot slot[t] (causal within its sequence; the rows of a
// batch may belong to different sequences). Grouped-query: query head h reads cache head
// h / p.group (the cache holds KVH = H / group heads). Positions and slots are GPU tensors, so one
// replayed decode step serves any position. Online softmax over tiles of 256 keys (one key a
// thread), so any context length fits; the weighted sum of V runs in G = 256 / D4 groups of D4
// threads.
// With p.write, row t's own key and value (kn, vn: (T, KVH, D) views) are stored at position pos[t]
// of its slot by the same launch (by the workgroup of the first query head of their kv head, h %
// group == 0), and every workgroup of the row attends to them from kn, vn (position pos[t] is the
// last key: its score and its share of V are read from there, in the place and order the cache's
// row would have), so no workgroup reads a cache row another workgroup of the launch writes. (The rows must then have distinct slots, as a decode step's sequences do.) A
// position past the context is not stored; the row then sees the cache's n_ctx positions.
// Built with VEC4 (head dims that are multiples of 4: offsets and strides then in vec4 units, D4 =
// D / 4 <= 256) or without (scalars, D4 = D <= 256): the lane type VK is vec4<f32> or f32.
// q: strided (T, H, D) view; caches (n_slots, n_ctx, KVH, D) f32; out (T, H, D) f32.
// Bounds: a workgroup returns unless t < T; h < H by the grid. A row whose slot is outside
// 0 .. n_slots-1 or whose position is negative attends to nothing and stores nothing (L = 0: its
// output is 0 / 0, NaN), so a cache is indexed only as its offset (kc_off4, vc_off4: where the cache
// view starts) + slot * slot_stride4 + j * C4 + kvh * D4 + e with slot < n_slots, j < L <= n_ctx,
// kvh < KVH, e < D4: inside the contiguous (n_slots, n_ctx, KVH, D) cache view.
// q, kn, vn indices are elements of their views (offsets and strides from the planner's views, t < T,
// kvh < KVH, e < D4; kn, vn are read only when p.write, when the planner binds them); o's index
// (t H + h) D4 + e < T H D4. Workgroup arrays are indexed by li < 256, or e < D4 <= 256.
// These bounds are what the kernel relies on: it runs without the shader compiler's runtime
// checks. Loops end: each runs to a uniform or constant bound in steps that cannot wrap.
// Header: alias TQ; define VEC4. (cached_attention_rope.wgsl: the same with q and the new key rotated.)
// #include cached_attention_lanes.wgsl
// #include cached_attention_params.wgsl
const ROPE: u32 = 0u;
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> q: array<VQ>;
@group(0) @binding(2) var<storage, read> kn: array<VQ>;
@group(0) @binding(3) var<storage, read> vn: array<VQ>;
@group(0) @binding(4) var<storage, read> pos: array<i32>;
@group(0) @binding(5) var<storage, read> slot: array<i32>;
@group(0) @binding(6) var<storage, read_write> kc: array<VK>;
@group(0) @binding(7) var<storage, read_write> vc: array<VK>;
@group(0) @binding(8) var<storage, read_write> o: array<VK>;
fn kn_at(i: u32) -> VQ { return kn[i]; }
fn vn_at(i: u32) -> VQ { return vn[i]; }
fn rope_cos(i: u32) -> f32 { return 0.0; }  // (ROPE = 0: never called)
fn rope_sin(i: u32) -> f32 { return 0.0; }
// #include cached_attention_main.wgsl
