// Q5_0 (quant_dequant.wgsl): a block is 16 bytes of nibbles (one vec4 of quants; byte j holds value j's
// low four bits in its low nibble, value j + 16's in its high one) and two heads: the float16 scale d
// (section 0: two a word, ceil(nb / 2) words) and qh, a u32 whose bit j is value j's fifth bit
// (section 1: one word a block); x = d (q - 16). A unit is one block: run 0 the low nibbles, run 1
// the high ones. Bounds: u < nb = K / 32 blocks: quant vec4 row_vec4(n) + u; head words n * d_ld +
// u / 2 and n * d_ld + ceil(nb / 2) + u, both < (n + 1) d_ld (d_ld = ceil(nb / 2) + nb); wvec: i / 8 < nb.
const QK: u32 = 32u;
const BV: u32 = 1u;
const ZP: u32 = 16u;
const SIGNED: bool = false;
const HAS_MIN: bool = false;

fn q5_high(n: u32, b: u32) -> u32 { return scales[n * p.d_ld + (p.K / 32u + 1u) / 2u + b]; }

fn unit_k4(u: u32, r: u32) -> u32 { return u * 8u + r * 4u; }

fn unit_w(n: u32, u: u32) -> WUnit {
  let q = qs[row_vec4(n) + u];
  let qh = q5_high(n, u);
  let d = head16(n, 0u, u);
  let b = vec4<u32>(0u, 4u, 8u, 12u);
  return WUnit(nib_lo(q) | fifth4(qh, b), nib_hi(q) | fifth4(qh, b + vec4<u32>(16u)), vec4<f32>(d, 0.0, d, 0.0));
}

fn wvec(n: u32, i: u32) -> vec4<f32> {
  let b = i / 8u;
  let j = i % 8u;  // values 4j .. 4j + 3 of the block: word j % 4, low nibbles for j < 4; fifth bits 4j ..
  let q = q5x4(qs[row_vec4(n) + b][j % 4u], (j / 4u) * 4u, q5_high(n, b), 4u * j);
  return ufloat4(q, 16.0) * head16(n, 0u, b);
}
