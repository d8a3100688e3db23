// The lane types of cached_attention.wgsl and cached_attention_rope.wgsl (included where they say
// `// #include cached_attention_lanes.wgsl`): with VEC4 (head dims that are multiples of 4) a lane is
// a vec4 (VK in f32, VQ as q, the new keys and values are stored), else a scalar; LANE dims a lane,
// LANES the most lanes a head has (D <= 256); velem(v, c) is dim c < LANE of a lane as f32. VP is a
// lane of the pool: KV's (float32 / float16) or, with Q8, one u32 word of q8_0 quants or scales; to_pool /
// pool_round: a lane as a float pool stores it, and that widened again (kv_pages.wgsl's kv_of / kv_round).
// #if VEC4
alias VK = vec4<f32>;
alias VQ = vec4<TQ>;
const LANE: u32 = 4u;
fn dotv(a: VK, b: VK) -> f32 { return dot(a, b); }
fn velem(v: VQ, c: u32) -> f32 { return f32(v[c]); }
// #if Q8
alias VP = u32;
// #else
alias VP = vec4<KV>;
fn to_pool(x: VK) -> VP { return kv_of4(x); }
fn pool_round(x: VK) -> VK { return kv_round4(x); }
// #endif
// #else
alias VK = f32;
alias VQ = TQ;
alias VP = KV;
fn to_pool(x: VK) -> VP { return kv_of(x); }
fn pool_round(x: VK) -> VK { return kv_round(x); }
const LANE: u32 = 1u;
fn dotv(a: VK, b: VK) -> f32 { return a * b; }
fn velem(v: VQ, c: u32) -> f32 { return f32(v); }
// #endif
const LANES: u32 = 256u / LANE;
