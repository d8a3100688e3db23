// The lane type of cached_attention.wgsl and cached_attention_rope.wgsl (included where they say
// `// #include cached_attention_lanes.wgsl`): with VEC4 (head dims that are multiples of 4) a lane is
// a vec4 (VK in f32, VQ as q, the new keys and values are stored), else a scalar; LANE dims a lane;
// velem(v, c) is dim c < LANE of a lane as f32.
// #if VEC4
alias VK = vec4<f32>;
alias VQ = vec4<TQ>;
const LANE: u32 = 4u;
fn dotv(a: VK, b: VK) -> f32 { return dot(a, b); }
fn velem(v: VQ, c: u32) -> f32 { return f32(v[c]); }
// #else
alias VK = f32;
alias VQ = TQ;
const LANE: u32 = 1u;
fn dotv(a: VK, b: VK) -> f32 { return a * b; }
fn velem(v: VQ, c: u32) -> f32 { return f32(v); }
// #endif
