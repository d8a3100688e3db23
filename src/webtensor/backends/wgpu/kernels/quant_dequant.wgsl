// Dequantization in registers of webtensor's GPU layout of ggml's block types (see
// backends/wgpu/quant_ops.py), included where gemv_quant.wgsl, matmul_engine_quant.wgsl (the matrix
// engine: wvec fills its tiles), matmul_quant.wgsl, matmul_quant_regs.wgsl and embedding_quant.wgsl say
// `// #include quant_dequant.wgsl`. The including
// kernel binds `qs` (array<vec4<u32>>: each row's block bodies, BV vec4 a block, rows one after the
// other) and `scales` (array<u32>: each row's block heads (float16 scales / minimums, Q5's high bits),
// p.d_ld words a row), and its struct P has K (values a row, a multiple of QK) and d_ld.
//
// The block type is chosen by a define naming it (exactly one of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
// Q6_K), whose file supplies
//   const QK (values a block), BV (vec4<u32> of body a block);
//   const HAS_MIN: whether values carry an offset (x = s q + m: Q4_1, Q5_1, Q4_K);
//   fn unit_k4(u, r) -> u32: the first activation vec4 (k / 4) of run r (0, 1) of GEMV unit u;
//   fn unit_q(n, u) -> Unit:  unit u of row n: its integers q as f32 (lo: run 0, hi: run 1; column
//                             i of each is values 4i .. 4i + 3 of its run of 16) and each run's
//                             scale and offset, s = (s0, m0, s1, m1): value = s q + m;
//   fn wvec(n, i) -> vec4<f32>: values 4i .. 4i + 3 of row n, dequantized (tiles, embedding rows).
// A GEMV unit is 32 values of a row in two runs of 16 (the two nibbles of the same bytes, for the
// 4-bit types), read with whole-vec4 loads, its scales once; units 0 .. K / 32 - 1 cover the row
// once. The GEMV sums x q over a run and scales the sum once (s sum(x q) + m sum(x)), as llama.cpp
// does: one multiply a value fewer than dequantizing first. wvec's values are exactly the numpy
// reference's (quant/dequant.py): the same exact products and the same single rounding.
//
// Bounds (no index leaves its buffer, for n < the rows bound in qs / scales, u < K / 32, i < K / 4):
// row n's body is vec4s row_vec4(n) .. row_vec4(n) + K / QK * BV - 1 and its heads words
// n * d_ld .. n * d_ld + d_ld - 1; each type file says why its indices stay inside those.
//
// Integers become f32 by the exponent trick: bitcast<f32>(v | 0x4B000000) is 2^23 + v exactly for
// v < 2^23, so subtracting 2^23 (plus an offset) is exact: an OR and an FADD instead of an
// int-to-float conversion, which NVIDIA GPUs run at 1/8 of the FP32 rate.
// #if Q8_0
// #include quant_q8_0.wgsl
// #endif
// #if Q4_0
// #include quant_q4_0.wgsl
// #endif
// #if Q4_1
// #include quant_q4_1.wgsl
// #endif
// #if Q5_0
// #include quant_q5_0.wgsl
// #endif
// #if Q5_1
// #include quant_q5_1.wgsl
// #endif
// #if Q4_K
// #include quant_q4_k.wgsl
// #endif
// #if Q6_K
// #include quant_q6_k.wgsl
// #endif

struct Span { lo: mat4x4<f32>, hi: mat4x4<f32> }  // 32 values: two runs of 16, four vec4 each
struct Unit { q: Span, s: vec4<f32> }  // a GEMV unit: integers q, and (scale, offset) of each run

// row n's first vec4 of qs
fn row_vec4(n: u32) -> u32 { return n * (p.K / QK) * BV; }

// float16 number j of row n's heads (two a word, the low half first)
fn head16(n: u32, j: u32) -> f32 {
  let h = unpack2x16float(scales[n * p.d_ld + j / 2u]);
  return select(h.x, h.y, (j & 1u) == 1u);
}

// the four bytes of w, each shifted right by `shift` and masked: four small unsigned integers
fn fields4(w: u32, shift: u32, mask: u32) -> vec4<u32> {
  return (vec4<u32>(w) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(shift))) & vec4<u32>(mask);
}

// v - bias as f32, exactly (v < 2^23; the exponent trick above)
fn ufloat4(v: vec4<u32>, bias: f32) -> vec4<f32> {
  return bitcast<vec4<f32>>(v | vec4<u32>(0x4B000000u)) - vec4<f32>(8388608.0 + bias);
}

// the u32 at byte `byte` (a multiple of 4) of the body that starts at vec4 `base`
fn body_word(base: u32, byte: u32) -> u32 { return qs[base + byte / 16u][(byte / 4u) % 4u]; }
