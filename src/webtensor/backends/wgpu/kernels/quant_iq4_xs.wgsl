// IQ4_XS (quant_dequant.wgsl): a 256-value block's 128 bytes of nibbles (qs, bytes 8 .. 135 as stored) are
// its eight vec4 of quants, vec4 s the 32-value sub-block s (byte j: value 32 s + j in its low nibble,
// 32 s + 16 + j in its high one); its first 8 bytes are one head section of two words a block (d_ld = 2 K /
// 256): d and scales_h as a u16 pair, then scales_l[4]. Sub-block s's scale is ls = nibble s % 2 of
// scales_l[s / 2] under bits 2s .. 2s + 1 of scales_h, x = (d (ls - 32)) KV[q] (KV: `iq4_levels`; the
// products exact: one rounding, as the reference's). Unit u: sub-block u % 8 of block u / 8, which is quant
// vec4 u of the row; run 0 the low nibbles' levels, run 1 the high ones'. Bounds: u < K / 32, so the block
// b = u / 8 < K / 256: quant vec4 row_vec4(n) + u and head words n d_ld + 2b + 0 .. 1 are row n's; wvec:
// i / 8 < K / 32.
const QK: u32 = 256u;
const BV: u32 = 8u;
const ZP: u32 = 0u;
const SIGNED: bool = true;
const HAS_MIN: bool = false;

// d (ls - 32) of sub-block s (0 .. 7) of block b of row n
fn xs_scale(n: u32, b: u32, s: u32) -> f32 {
  let o = n * p.d_ld + 2u * b;
  let head = scales[o];
  let ls = ((scales[o + 1u] >> (4u * s)) & 0xFu) | (((head >> (16u + 2u * s)) & 3u) << 4u);
  return unpack2x16float(head).x * f32(i32(ls) - 32);
}

fn unit_k4(u: u32, r: u32) -> u32 { return u * 8u + r * 4u; }

fn unit_w(n: u32, u: u32) -> WUnit {
  let q = qs[row_vec4(n) + u];
  let d = xs_scale(n, u / 8u, u % 8u);
  return WUnit(iq4_levels(nib_lo(q)), iq4_levels(nib_hi(q)), vec4<f32>(d, 0.0, d, 0.0));
}

fn wvec(n: u32, i: u32) -> vec4<f32> {
  let u = i / 8u;
  let j = i % 8u;  // values 4j .. 4j + 3 of the sub-block: word j % 4, low nibbles for j < 4
  return bytes4f(iq4_level4(qs[row_vec4(n) + u][j % 4u], (j / 4u) * 4u)) * xs_scale(n, u / 8u, u % 8u);
}
