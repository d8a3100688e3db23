// Rows of A' quantized to int8 activations in global memory (q8_act.wgsl; A' through gemv_norm.wgsl's
// fused RMS / layer norm or SwiGLU: NORM, GLU), for gemv_quant_dot4.wgsl built with PREQ: row m of the
// output is K / 16 vec4<u32> of int8 (16 a vec4) then K / 32 vec4 of (d, S0, S1, 0) as f32 bits, o_ld4
// vec4s a row. Workgroup (x, y) = (256 blocks of 32 values, row y); every workgroup derives its row's
// norm statistics itself. Header: const NORM, SG, GLU.
// Bounds (runtime checks may be off): rows y < M (the grid's y is M); blocks b < K / 32, so A's vec4s
// 8b + 0 .. 7 < K / 4 (arow) and the output's vec4s y o_ld4 + 2b + 1 < y o_ld4 + K / 16 and y o_ld4 + K /
// 16 + b < (y + 1) o_ld4 (o_ld4 = 3 K / 32). Loops end: uniform bounds, positive steps.
struct P { M: u32, K: u32, a_off4: u32, lda4: u32, o_ld4: u32, eps: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> lnw: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> lnb: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> o: array<vec4<u32>>;
// #include gemv_norm.wgsl
// #include q8_act.wgsl

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let row = wg.y;
  norm_stats(li, row, 1u);
  let b = wg.x * 256u + li;
  if (b < p.K / 32u) {
    let q = q8_block(row, 0u, 8u * b);
    let base = row * p.o_ld4;
    o[base + 2u * b] = q.lo;
    o[base + 2u * b + 1u] = q.hi;
    o[base + p.K / 16u + b] = bitcast<vec4<u32>>(q.ds);
  }
}
