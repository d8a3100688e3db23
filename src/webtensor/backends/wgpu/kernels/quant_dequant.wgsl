// Reading webtensor's GPU layout of ggml's block types (see backends/wgpu/quant_ops.py), included
// where gemv_quant.wgsl, gemv_quant_dot4.wgsl, matmul_engine_quant.wgsl (the matrix engine: wvec fills
// its tiles), matmul_quant.wgsl, matmul_quant_regs.wgsl and embedding_quant.wgsl say
// `// #include quant_dequant.wgsl`. The including kernel binds `qs` (array<vec4<u32>>: each row's quant
// planes, BV vec4 a block, rows one after the other) and `scales` (array<u32>: each row's block heads
// (float16 scales / minimums, Q5's high bits, the K-quants' packed sub-block scales), p.d_ld words a
// row), and its struct P has K (values a row, a multiple of QK) and d_ld.
//
// The block type is chosen by a define naming it (exactly one of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K,
// Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS), whose file supplies
//   const QK (values a block), BV (vec4<u32> of quants a block);
//   const ZP (an integer subtracted from every stored value), SIGNED (the stored bytes are int8,
//         two's complement; else small unsigned integers < 128), HAS_MIN (values carry an offset):
//         value = scale (q - ZP) + min, min = 0 unless HAS_MIN;
//   fn unit_k4(u, r) -> u32: the first activation vec4 (k / 4) of run r (0, 1) of unit u;
//   fn unit_w(n, u) -> WUnit: unit u of row n: its two runs of 16 values as 16 bytes each (byte i
//                             of `lo` / `hi` is value i of run 0 / 1: q, an int8 if SIGNED) and
//                             s = (scale0, min0, scale1, min1), each run's scale and offset;
//   fn wvec(n, i) -> vec4<f32>: values 4i .. 4i + 3 of row n, dequantized (tiles, embedding rows).
// A unit is 32 values of a row in two runs of 16 (the two nibbles of the same bytes, for the 4-bit
// types), read with whole-vec4 loads, its scales once; units 0 .. K / 32 - 1 cover the row once,
// and consecutive units of a row lie in consecutive vec4s of its quants (so a warp's lanes on
// consecutive units read one contiguous stretch). A run's bytes are what both GEMVs take: the
// float one (gemv_quant.wgsl) widens them to f32 and scales each run's sum once (scale sum(x (q -
// ZP)) + min sum(x)), the integer one (gemv_quant_dot4.wgsl) dots them with int8 activations
// (dot4I8Packed). wvec's values are exactly the numpy reference's (quant/dequant.py): the same
// exact products and the same single rounding.
//
// Bounds (no index leaves its buffer, for n < the rows bound in qs / scales, u < K / 32, i < K / 4):
// row n's quants are vec4s row_vec4(n) .. row_vec4(n) + K / QK * BV - 1 and its heads words
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
// #if Q5_K
// #include quant_q5_k.wgsl
// #endif
// #if Q3_K
// #include quant_q3_k.wgsl
// #endif
// #if Q2_K
// #include quant_q2_k.wgsl
// #endif
// #if IQ4_NL
// #include quant_iq4_nl.wgsl
// #endif
// #if IQ4_XS
// #include quant_iq4_xs.wgsl
// #endif

// a GEMV unit: run 0 / run 1 as 16 bytes each, and (scale, min) of each run
struct WUnit { lo: vec4<u32>, hi: vec4<u32>, s: vec4<f32> }

// row n's first vec4 of qs
fn row_vec4(n: u32) -> u32 { return n * (p.K / QK) * BV; }

// float16 number j of the head section that starts at word `sec` of row n's heads (two a word,
// the low half first)
fn head16(n: u32, sec: u32, j: u32) -> f32 {
  let h = unpack2x16float(scales[n * p.d_ld + sec + j / 2u]);
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

// q - ZP of the four bytes of w as f32 (an int8 byte b is (b ^ 0x80) - 128)
fn bytes4f(w: u32) -> vec4<f32> {
  if (SIGNED) { return ufloat4(fields4(w ^ 0x80808080u, 0u, 0xFFu), 128.0); }
  return ufloat4(fields4(w, 0u, 0xFFu), f32(ZP));
}

// the low / high nibbles of 16 bytes, one a byte
fn nib_lo(q: vec4<u32>) -> vec4<u32> { return q & vec4<u32>(0x0F0F0F0Fu); }
fn nib_hi(q: vec4<u32>) -> vec4<u32> { return (q >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu); }

// bits b .. b + 3 of h (b = 0, 4, 8, 12 for the four words) moved to bit 4 of each byte: Q5's fifth
// bits (each nibble times 0x00204081 puts its bits at 0, 8, 16, 24 without carries)
fn fifth4(h: u32, b: vec4<u32>) -> vec4<u32> {
  return ((((vec4<u32>(h) >> b) & vec4<u32>(0xFu)) * vec4<u32>(0x00204081u)) & vec4<u32>(0x01010101u)) << vec4<u32>(4u);
}

// Q5_0 / Q5_1: the 5-bit values of the four bytes of w (nibbles from bit `shift`) whose fifth bits are bits
// hb .. hb + 3 of qh
fn q5x4(w: u32, shift: u32, qh: u32, hb: u32) -> vec4<u32> {
  return fields4(w, shift, 0xFu) | (((vec4<u32>(qh) >> (vec4<u32>(hb) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u))
    << vec4<u32>(4u));
}

// the u32 at byte `byte` (a multiple of 4) of the quants that start at vec4 `base`
fn body_word(base: u32, byte: u32) -> u32 { return qs[base + byte / 16u][(byte / 4u) % 4u]; }

// IQ4_NL / IQ4_XS: the int8 levels (quant.types.IQ4_VALUES, packed four a word, as bytes) of the four nibbles
// of w from bit `shift` of each byte, as four int8 bytes: each level picked by selects, no table in memory
fn iq4_level4(w: u32, shift: u32) -> u32 {
  let q = fields4(w, shift, 0xFu);
  let quarter = q >> vec4<u32>(2u);
  let lo = select(vec4<u32>(0xBFAD9881u), vec4<u32>(0xF6EADDCFu), quarter == vec4<u32>(1u));  // levels 0 .. 7
  let hi = select(vec4<u32>(0x26190D01u), vec4<u32>(0x71594535u), quarter == vec4<u32>(3u));  // levels 8 .. 15
  let b = (select(lo, hi, q >= vec4<u32>(8u)) >> ((q & vec4<u32>(3u)) * vec4<u32>(8u))) & vec4<u32>(0xFFu);
  return b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}

// the levels of 16 bytes that each hold one nibble (nib_lo / nib_hi's output): 16 int8 bytes
fn iq4_levels(q: vec4<u32>) -> vec4<u32> {
  return vec4<u32>(iq4_level4(q.x, 0u), iq4_level4(q.y, 0u), iq4_level4(q.z, 0u), iq4_level4(q.w, 0u));
}
