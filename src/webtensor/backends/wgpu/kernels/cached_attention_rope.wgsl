// cached_attention.wgsl with the rotary embedding fused: each row's query heads and its new key are
// rotated at the row's position (rope.wgsl's arithmetic, dims 0 .. 2 half - 1: pairs (i, i + half)
// with ROPE = 1, HF's rotate_half, or (2i, 2i + 1) with ROPE = 2, interleaved) before they are used,
// so the key stored in the cache and attended to is the rotated one (cached_attention_main.wgsl).
// Without p.write the cache's rows are taken as they are (keys stored rotated: cache_write's ROPE).
// The bindings fit WebGPU's minimum of 8 storage buffers: the new keys and values are read from one
// buffer kv (their views' offsets k_off4, v_off4 and strides as in cached_attention.wgsl), positions and
// slots from one buffer ps, the cos and sin tables (P, half) f32 from one buffer tab at tc_off, ts_off
// (views of one tensor); the planner runs rope launches and cached_attention.wgsl where they are not.
// Bounds: as cached_attention.wgsl (kv's indices are elements of the k_new and v_new views); the
// tables' index tc_off (ts_off) + row half + i with the position clamped to row <= P - 1 and i < half.
// Header: alias TQ; alias KV or define Q8; define VEC4; const ROPE (1 or 2).
// #include cached_attention_lanes.wgsl
// #include cached_attention_params.wgsl
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> q: array<VQ>;
@group(0) @binding(2) var<storage, read> kv: array<VQ>;
@group(0) @binding(3) var<storage, read> ps: array<i32>;
@group(0) @binding(4) var<storage, read> tab: array<f32>;
@group(0) @binding(5) var<storage, read> kv_table: array<i32>;
@group(0) @binding(6) var<storage, read_write> kc: array<VP>;
@group(0) @binding(7) var<storage, read_write> vc: array<VP>;
@group(0) @binding(8) var<storage, read_write> o: array<VK>;
fn kn_at(i: u32) -> VQ { return kv[i]; }
fn vn_at(i: u32) -> VQ { return kv[i]; }
fn rope_cos(i: u32) -> f32 { return tab[p.tc_off + i]; }
fn rope_sin(i: u32) -> f32 { return tab[p.ts_off + i]; }
// #include cached_attention_main.wgsl
