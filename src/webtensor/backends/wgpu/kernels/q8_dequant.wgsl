// q8_0 dequantization in registers, for gemv_q8.wgsl, matmul_q8.wgsl and matmul_q8_regs.wgsl
// (included where they say `// #include q8_dequant.wgsl`). Uses the including kernel's `scales`
// binding (array<u32>: two float16 scales per word) and p.d_ld (words per W row).

// the four int8 of `w` (little-endian bytes), sign-extended, as f32
fn quants4(w: u32) -> vec4<f32> {
  let q = vec4<i32>(bitcast<i32>(w << 24u), bitcast<i32>(w << 16u), bitcast<i32>(w << 8u), bitcast<i32>(w))
    >> vec4<u32>(24u);
  return vec4<f32>(q);
}

// the same times the block's scale: q * d is exact in f32 (8 + 11 significant bits)
fn dq(w: u32, d: f32) -> vec4<f32> { return quants4(w) * d; }

// the scale of block j (values 32 j .. 32 j + 31) of W row n: word n * d_ld + j / 2, low half for even j
fn scale(n: u32, j: u32) -> f32 {
  let s = unpack2x16float(scales[n * p.d_ld + j / 2u]);
  return select(s.x, s.y, (j & 1u) == 1u);
}
