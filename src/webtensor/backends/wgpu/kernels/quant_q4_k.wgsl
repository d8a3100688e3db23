// Q4_K (quant_dequant.wgsl): a 256-value block's 128 bytes of nibbles are its eight vec4 of quants
// (64-value chunk c: bytes 32c .. 32c + 31, low nibbles sub-block 2c = values 64c .., high nibbles
// sub-block 2c + 1 = values 64c + 32 ..); its other 16 bytes, as stored, are one head section of four
// words a block (d_ld = 4 K / 256): (d, dmin) as a float16 pair, then the 12 bytes of eight 6-bit
// (scale, min) pairs. x = (d sc) q - dmin mn (d sc, dmin mn and (d sc) q exact: one rounding, as the
// reference's). Unit u: block u / 8, its quant vec4 j = u % 8 (16 bytes of chunk j / 2): run 0 the
// low nibbles, run 1 the high ones. Bounds: u < K / 32, so the block b = u / 8 < K / 256: quant vec4s
// row_vec4(n) + 8b + 0 .. 7 and head words n d_ld + 4b + 0 .. 3 are row n's; wvec: i / 64 < K / 256,
// quant bytes 32c + v % 32 < 128.
const QK: u32 = 256u;
const BV: u32 = 8u;
const ZP: u32 = 0u;
const SIGNED: bool = false;
const HAS_MIN: bool = true;

// #include quant_k4_scales.wgsl

fn unit_w(n: u32, u: u32) -> WUnit {
  let b = u / 8u;
  let j = u % 8u;
  let h = k_head(n, b);
  let q = qs[row_vec4(n) + b * 8u + j];
  let c = j / 2u;
  let s0 = k_scale_min(h, 2u * c);
  let s1 = k_scale_min(h, 2u * c + 1u);
  return WUnit(nib_lo(q), nib_hi(q), vec4<f32>(s0.x, -s0.y, s1.x, -s1.y));
}

fn wvec(n: u32, i: u32) -> vec4<f32> {
  let b = i / 64u;
  let v = 4u * (i % 64u);  // the first of the four values within the block
  let c = v / 64u;
  let hi = (v % 64u) / 32u;
  let s = k_scale_min(k_head(n, b), 2u * c + hi);
  return ufloat4(fields4(body_word(row_vec4(n) + b * 8u, 32u * c + v % 32u), 4u * hi, 0xFu), 0.0) * s.x - s.y;
}
