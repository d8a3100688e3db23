// Q2_K (quant_dequant.wgsl): a 256-value block's 64 bytes of 2-bit values (qs, bytes 16 .. 79 as stored)
// are its four vec4 of quants; its 16 scale bytes (low nibble sc, high nibble mn, one byte per 16 values)
// are head section 0 (four words a block), its float16 (d, dmin) head section 1 (one word a block, from
// word 4 nb; d_ld = 5 nb, nb = K / 256). Value 128 h + 32 t + l (half h, quarter t, l < 32) is q = bits
// 2t .. 2t + 1 of qs[32 h + l], x = (d sc) q - dmin mn (d sc and dmin mn exact, one rounding, as the
// reference's). Unit u: block u / 8, j = u % 8: the vec4 2 (j / 4) + j % 2, run 0 quarter t = (j % 4) / 2,
// run 1 quarter t + 2 (as Q3_K's). Bounds: u < K / 32, so the block b = u / 8 < nb: quant vec4s
// row_vec4(n) + 4b + 0 .. 3, head words n d_ld + 4b + 0 .. 3 and n d_ld + 4 nb + b (< (n + 1) d_ld) are
// row n's; wvec: i / 64 < nb, quant bytes 32h + l < 64.
const QK: u32 = 256u;
const BV: u32 = 4u;
const ZP: u32 = 0u;
const SIGNED: bool = false;
const HAS_MIN: bool = true;

// #include quant_k2_units.wgsl

// (d sc, dmin mn) of 16-value group s (0 .. 15) of block b of row n
fn k2_scale_min(n: u32, b: u32, s: u32) -> vec2<f32> {
  let o = n * p.d_ld;
  let sc = (scales[o + 4u * b + s / 4u] >> (8u * (s % 4u))) & 0xFFu;
  let dd = unpack2x16float(scales[o + 4u * (p.K / 256u) + b]);
  return vec2<f32>(dd.x * f32(sc & 0xFu), dd.y * f32(sc >> 4u));
}

fn unit_w(n: u32, u: u32) -> WUnit {
  let b = u / 8u;
  let j = u % 8u;
  let h = j / 4u;
  let i = j % 2u;
  let t = (j % 4u) / 2u;
  let q = qs[row_vec4(n) + b * 4u + 2u * h + i];
  let m2 = vec4<u32>(0x03030303u);
  let s = 8u * h + 2u * t + i;  // run 0's 16-value group; run 1's is s + 4
  let s0 = k2_scale_min(n, b, s);
  let s1 = k2_scale_min(n, b, s + 4u);
  return WUnit((q >> vec4<u32>(2u * t)) & m2, (q >> vec4<u32>(2u * t + 4u)) & m2, vec4<f32>(s0.x, -s0.y, s1.x, -s1.y));
}

fn wvec(n: u32, i: u32) -> vec4<f32> {
  let b = i / 64u;
  let v = 4u * (i % 64u);
  let h = v / 128u;
  let t = (v % 128u) / 32u;
  let s = k2_scale_min(n, b, v / 16u);
  return ufloat4(fields4(body_word(row_vec4(n) + b * 4u, 32u * h + v % 32u), 2u * t, 3u), 0.0) * s.x - s.y;
}
