// Q4_1 (quant_dequant.wgsl): a block is 16 bytes of nibbles (one vec4 of quants, nibbles as Q4_0) and
// a float16 scale d and minimum m (heads: one word a block, (d, m), d_ld = K / 32); x = d q + m (d q
// is exact: one rounding, as the reference's). A unit is one block: run 0 the low nibbles, run 1 the
// high ones. Bounds: u < K / 32 blocks (quant vec4 row_vec4(n) + u, head word n * d_ld + u); wvec:
// i / 8 < K / 32.
const QK: u32 = 32u;
const BV: u32 = 1u;
const ZP: u32 = 0u;
const SIGNED: bool = false;
const HAS_MIN: bool = true;

fn dm(n: u32, b: u32) -> vec2<f32> { return unpack2x16float(scales[n * p.d_ld + b]); }

fn unit_k4(u: u32, r: u32) -> u32 { return u * 8u + r * 4u; }

fn unit_w(n: u32, u: u32) -> WUnit {
  let q = qs[row_vec4(n) + u];
  let s = dm(n, u);
  return WUnit(nib_lo(q), nib_hi(q), vec4<f32>(s, s));
}

fn wvec(n: u32, i: u32) -> vec4<f32> {
  let b = i / 8u;
  let j = i % 8u;
  let s = dm(n, b);
  return ufloat4(fields4(qs[row_vec4(n) + b][j % 4u], (j / 4u) * 4u, 0xFu), 0.0) * s.x + s.y;
}
