// Rows of A' quantized to int8 activations in global memory (q8_act.wgsl; A' through gemv_norm.wgsl's
// fused RMS / layer norm or SwiGLU / GeGLU: NORM, GLU), for gemv_quant_dot4.wgsl built with PREQ: row m of the
// output is K / 4 words of int8 (four a word) then K / 32 pairs of words (q8_act.wgsl's ds: d and the two
// run sums), o_ld words a row (K / 4 + 4 ceil(K / 64): whole vec4s). Workgroup (x, y) = (256 blocks of 32
// values, row y); every workgroup derives its row's norm statistics itself. Header: const NORM, SG, GLU.
// Bounds (runtime checks may be off): rows y < M (the grid's y is M); blocks b < K / 32, so A's vec4s
// 8b + 0 .. 7 < K / 4 (arow) and the output's words y o_ld + 8b + 7 < y o_ld + K / 4 and y o_ld + K / 4 +
// 2b + 1 < y o_ld + K / 4 + K / 16 <= (y + 1) o_ld. Loops end: uniform bounds, positive steps.
struct P { M: u32, K: u32, a_off4: u32, lda4: u32, o_ld: u32, eps: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> lnw: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> lnb: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> o: array<u32>;
// #include gemv_norm.wgsl
// #include q8_act.wgsl

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let row = wg.y;
  norm_stats(li, row, 1u);
  let b = wg.x * 256u + li;
  if (b < p.K / 32u) {
    let q = q8_block(row, 0u, 8u * b);
    let base = row * p.o_ld;
    for (var j = 0u; j < 4u; j = j + 1u) {
      o[base + 8u * b + j] = q.lo[j];
      o[base + 8u * b + 4u + j] = q.hi[j];
    }
    o[base + p.K / 4u + 2u * b] = q.ds.x;
    o[base + p.K / 4u + 2u * b + 1u] = q.ds.y;
  }
}
