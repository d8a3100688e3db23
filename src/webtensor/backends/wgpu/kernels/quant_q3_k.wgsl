// Q3_K (quant_dequant.wgsl): a 256-value block's first 96 bytes as stored are its six vec4 of quants:
// hmask[32] (vec4s 0, 1) and qs[64] (vec4s 2 .. 5); its 12 bytes of sixteen 6-bit scales are head section
// 0 (three words a block), its float16 d head section 1 (two a word, from word 3 nb; d_ld = 3 nb +
// ceil(nb / 2), nb = K / 256). Value 128 h + 32 t + l (half h, quarter t, l < 32) is q = bits 2t .. 2t + 1
// of qs[32 h + l] with bit 4h + t of hmask[l] above them, x = (d (sc - 32)) (q - 4) with sc the scale of
// its 16 values (scale s: nibble s / 8 of byte s % 8 under bits 2 (s / 4) .. of byte 8 + s % 4). Unit u:
// block u / 8, j = u % 8: half h = j / 4, the qs vec4 2h + i (i = j % 2: bytes 16i .. of the half, and of
// hmask), run 0 quarter t = (j % 4) / 2, run 1 quarter t + 2. Bounds: u < K / 32, so the block b = u / 8
// < nb: quant vec4s row_vec4(n) + 6b + 0 .. 5, head words n d_ld + 3b + 0 .. 2 and n d_ld + 3 nb + b / 2
// (< (n + 1) d_ld) are row n's; wvec: i / 64 < nb, quant bytes 32 + 32h + l < 96 and l < 32.
const QK: u32 = 256u;
const BV: u32 = 6u;
const ZP: u32 = 4u;
const SIGNED: bool = false;
const HAS_MIN: bool = false;

// #include quant_k2_units.wgsl

// d (sc - 32) of 16-value group s (0 .. 15) of block b of row n
fn k3_scale(n: u32, b: u32, s: u32) -> f32 {
  let o = n * p.d_ld + 3u * b;
  let lo = (scales[o + (s % 8u) / 4u] >> (8u * (s % 4u) + 4u * (s / 8u))) & 0xFu;
  let hi = (scales[o + 2u] >> (8u * (s % 4u) + 2u * (s / 4u))) & 3u;
  return head16(n, 3u * (p.K / 256u), b) * f32(i32(lo | (hi << 4u)) - 32);
}

fn unit_w(n: u32, u: u32) -> WUnit {
  let b = u / 8u;
  let j = u % 8u;
  let h = j / 4u;
  let i = j % 2u;
  let t = (j % 4u) / 2u;
  let base = row_vec4(n) + b * 6u;
  let q = qs[base + 2u + 2u * h + i];
  let m = qs[base + i];
  let m2 = vec4<u32>(0x03030303u);
  let one = vec4<u32>(0x01010101u);
  let lo = ((q >> vec4<u32>(2u * t)) & m2) | (((m >> vec4<u32>(4u * h + t)) & one) << vec4<u32>(2u));
  let hi = ((q >> vec4<u32>(2u * t + 4u)) & m2) | (((m >> vec4<u32>(4u * h + t + 2u)) & one) << vec4<u32>(2u));
  let s = 8u * h + 2u * t + i;  // run 0's 16-value group; run 1's is s + 4
  return WUnit(lo, hi, vec4<f32>(k3_scale(n, b, s), 0.0, k3_scale(n, b, s + 4u), 0.0));
}

fn wvec(n: u32, i: u32) -> vec4<f32> {
  let b = i / 64u;
  let base = row_vec4(n) + b * 6u;
  let v = 4u * (i % 64u);
  let h = v / 128u;
  let t = (v % 128u) / 32u;
  let l = v % 32u;
  let q = fields4(body_word(base, 32u + 32u * h + l), 2u * t, 3u) | (fields4(body_word(base, l), 4u * h + t, 1u)
    << vec4<u32>(2u));
  return ufloat4(q, 4.0) * k3_scale(n, b, v / 16u);
}
