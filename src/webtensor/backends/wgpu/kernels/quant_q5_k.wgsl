// Q5_K (quant_dequant.wgsl): a 256-value block's last 160 bytes as stored are its ten vec4 of quants: qh[32]
// (vec4s 0, 1: bit s of qh[l] is the fifth bit of value 32 s + l) and qs[128] (vec4s 2 .. 9, nibbles as
// Q4_K's: 64-value chunk c is bytes 32c .. 32c + 31, low nibbles sub-block 2c, high nibbles 2c + 1); its
// first 16 bytes are one head section as Q4_K's (quant_k4_scales.wgsl). x = (d sc) q - dmin mn, q < 32
// (d sc, dmin mn and (d sc) q exact: one rounding, as the reference's). Unit u: block u / 8, its qs vec4
// j = u % 8 (16 bytes of chunk j / 2), run 0 the low nibbles, run 1 the high ones, their fifth bits bits
// j / 2 * 2 (+ 1) of qh vec4 j % 2 (the same 16 positions l). Bounds: u < K / 32, so the block b = u / 8
// < K / 256: quant vec4s row_vec4(n) + 10b + 0 .. 9 and head words n d_ld + 4b + 0 .. 3 are row n's;
// wvec: i / 64 < K / 256, quant bytes 32 + 32c + v % 32 < 160 and v % 32 < 32.
const QK: u32 = 256u;
const BV: u32 = 10u;
const ZP: u32 = 0u;
const SIGNED: bool = false;
const HAS_MIN: bool = true;

// #include quant_k4_scales.wgsl

fn unit_w(n: u32, u: u32) -> WUnit {
  let b = u / 8u;
  let j = u % 8u;
  let h = k_head(n, b);
  let base = row_vec4(n) + b * 10u;
  let q = qs[base + 2u + j];
  let qh = qs[base + j % 2u];
  let c = j / 2u;
  let one = vec4<u32>(0x01010101u);
  let lo = nib_lo(q) | (((qh >> vec4<u32>(2u * c)) & one) << vec4<u32>(4u));
  let hi = nib_hi(q) | (((qh >> vec4<u32>(2u * c + 1u)) & one) << vec4<u32>(4u));
  let s0 = k_scale_min(h, 2u * c);
  let s1 = k_scale_min(h, 2u * c + 1u);
  return WUnit(lo, hi, vec4<f32>(s0.x, -s0.y, s1.x, -s1.y));
}

fn wvec(n: u32, i: u32) -> vec4<f32> {
  let b = i / 64u;
  let base = row_vec4(n) + b * 10u;
  let v = 4u * (i % 64u);  // the first of the four values within the block
  let c = v / 64u;
  let hi = (v % 64u) / 32u;
  let l = v % 32u;
  let s = k_scale_min(k_head(n, b), 2u * c + hi);
  let q = fields4(body_word(base, 32u + 32u * c + l), 4u * hi, 0xFu) | (fields4(body_word(base, l), 2u * c + hi, 1u)
    << vec4<u32>(4u));
  return ufloat4(q, 0.0) * s.x - s.y;
}
