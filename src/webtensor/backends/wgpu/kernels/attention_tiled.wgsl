// Prefill attention on GPUs over key / value views whose rows the host knows: q (T, H, D), k and v
// (S, KVH, D) views with row / head strides and unit stride along D (the fused qkv's column slices, a
// KV cache's rows), offsets and strides in vec4s of elements; output (T, H, D) contiguous, in q's
// dtype. Causal: query t sees keys j <= t + (S - T) (the queries are the last T of S positions);
// else every row sees all S keys. The loop, its tiles and its threads: attention_tiled_main.wgsl.
// With F16 the inputs are float16 read as u32 words (two per vec4, no 16-bit storage access), the
// tiles `kt` / `vs` are TS (f16: the values exactly, half the memory, which lets D = 128 fit) and
// the output float16 written as u32 words. All arithmetic and P are f32.
// Bounds (the kernels run without the compiler's runtime checks): the planner builds it only for D
// a multiple of BK, 4-aligned offsets and strides and tiles that fit (the body's bounds); k and v
// rows are read only for j < block_keys <= S, each at kvh < KVH (h < H = G KVH) inside its view.
// Header: alias TS (tile type); const D4 (D / 4), KG (key quads a tile: 16, 8 or 4), F16 (float16
// inputs and output), SG (subgroup shuffles for the row maxima and sums).
struct P {
  T: u32, S: u32, causal: u32, scale: f32,
  G: u32, q_off: u32, q_ts: u32, q_hs: u32,
  k_off: u32, k_ts: u32, k_hs: u32, v_off: u32,
  v_ts: u32, v_hs: u32, o_ts: u32, o_hs: u32,
}
@group(0) @binding(0) var<uniform> p: P;
// #if F16
alias QV = vec2<u32>;  // four float16 values as two u32 words
fn f4(x: QV) -> vec4<f32> { return vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y)); }
alias OV = vec2<u32>;
fn o4(x: vec4<f32>) -> OV { return OV(pack2x16float(x.xy), pack2x16float(x.zw)); }
// #else
alias QV = vec4<f32>;
fn f4(x: QV) -> vec4<f32> { return x; }
alias OV = vec4<f32>;
fn o4(x: vec4<f32>) -> OV { return x; }
// #endif
alias KV = QV;
fn fk(x: KV) -> vec4<f32> { return f4(x); }
@group(0) @binding(1) var<storage, read> q: array<QV>;
@group(0) @binding(2) var<storage, read> k: array<QV>;
@group(0) @binding(3) var<storage, read> v: array<QV>;
@group(0) @binding(4) var<storage, read_write> o: array<OV>;

fn sequence() -> u32 { return 0u; }
fn tile_keys(sq: u32, j0: u32, n: u32, li: u32) {}  // (keys are rows of k and v: nothing to look up)
fn k_at(sq: u32, j: u32, kvh: u32, d4: u32) -> KV { return k[p.k_off + j * p.k_ts + kvh * p.k_hs + d4]; }
fn v_at(sq: u32, j: u32, kvh: u32, d4: u32) -> KV { return v[p.v_off + j * p.v_ts + kvh * p.v_hs + d4]; }

// rows t0 .. t0 + 3 see keys j < lim: all S, or (causal) up to their own position t + S - T
fn row_limits(t0: u32) -> vec4<u32> {
  if (p.causal == 0u) { return vec4<u32>(p.S); }
  return min(vec4<u32>(p.S), vec4<u32>(t0 + (p.S - p.T) + 1u) + vec4<u32>(0u, 1u, 2u, 3u));
}

// the keys block qblock reads: all S, or (causal) up to its last query's limit
fn block_keys(qblock: u32, li: u32) -> u32 {
  if (p.causal == 0u) { return p.S; }
  return min(p.S, min(p.T, qblock * 64u + 64u) + (p.S - p.T));
}
// #include attention_tiled_main.wgsl
