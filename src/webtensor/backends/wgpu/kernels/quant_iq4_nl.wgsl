// IQ4_NL (quant_dequant.wgsl): a block is 16 bytes of nibbles (one vec4 of quants; byte j holds value j in
// its low nibble, value j + 16 in its high one, as Q4_0's) and one float16 scale d (heads: two a word,
// d_ld = ceil(K / 64)); x = d KV[q], KV the sixteen int8 levels (`iq4_levels`). A unit is one block: run 0
// the low nibbles' levels, run 1 the high ones', as int8 bytes. Bounds: u < K / 32 blocks (quant vec4
// row_vec4(n) + u, head j = u); wvec: i / 8 < K / 32; iq4_levels indexes nothing (selects).
const QK: u32 = 32u;
const BV: u32 = 1u;
const ZP: u32 = 0u;
const SIGNED: bool = true;
const HAS_MIN: bool = false;

fn unit_k4(u: u32, r: u32) -> u32 { return u * 8u + r * 4u; }

fn unit_w(n: u32, u: u32) -> WUnit {
  let q = qs[row_vec4(n) + u];
  let d = head16(n, 0u, u);
  return WUnit(iq4_levels(nib_lo(q)), iq4_levels(nib_hi(q)), vec4<f32>(d, 0.0, d, 0.0));
}

fn wvec(n: u32, i: u32) -> vec4<f32> {
  let b = i / 8u;
  let j = i % 8u;  // values 4j .. 4j + 3 of the block: word j % 4, low nibbles for j < 4
  return bytes4f(iq4_level4(qs[row_vec4(n) + b][j % 4u], (j / 4u) * 4u)) * head16(n, 0u, b);
}
