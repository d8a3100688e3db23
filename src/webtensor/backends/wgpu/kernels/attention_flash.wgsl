// Scaled dot-product attention for many queries (prefill) on CPU adapters, over key / value views whose rows the
// host knows: q (T, H, D), k and v (S, KVH, D) views (row / head strides, vec4 units), output (T, H, D) with its own
// strides. Causal: query t sees keys j <= t + (S - T) (the queries are the last T of S positions); else all S.
// The loop, its tiles and its threads: attention_flash_main.wgsl.
// Header: const D4 (head dim / 4, at most 16).
// Bounds (the kernels run without the compiler's runtime checks): the planner builds it for float32 with D % 4 ==
// 0 and D <= 64 (the body's bounds); k, v are read only for j < block_keys <= S, each at kh < KVH inside its view.
struct P {
  T: u32, S: u32, causal: u32, scale: f32,
  q_off: u32, q_ts: u32, q_hs: u32, k_off: u32,
  k_ts: u32, k_hs: u32, v_off: u32, v_ts: u32,
  v_hs: u32, o_ts: u32, o_hs: u32, group: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> o: array<vec4<f32>>;

fn sequence() -> u32 { return 0u; }
fn tile_keys(sq: u32, j0: u32, n: u32, li: u32) {}  // (keys are rows of k and v: nothing to look up)
fn k_at(sq: u32, j: u32, kh: u32, d: u32) -> vec4<f32> { return k[p.k_off + j * p.k_ts + kh * p.k_hs + d]; }
fn v_at(sq: u32, j: u32, kh: u32, d: u32) -> vec4<f32> { return v[p.v_off + j * p.v_ts + kh * p.v_hs + d]; }

// query t sees keys j < row_limit(t): all S, or (causal) up to its own position t + S - T
fn row_limit(t: u32) -> u32 {
  if (p.causal == 0u) { return p.S; }
  return min(p.S, t + (p.S - p.T) + 1u);
}

// the keys block b reads: its last query's limit
fn block_keys(b: u32, li: u32) -> u32 { return row_limit(min(p.T, b * 64u + 64u) - 1u); }
// #include attention_flash_main.wgsl
