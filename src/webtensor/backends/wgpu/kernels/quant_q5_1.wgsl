// Q5_1 (quant_dequant.wgsl): a block is 16 bytes of nibbles (one vec4 of quants, as Q5_0) and two heads:
// the float16 scale d and minimum m (section 0: one word a block, (d, m)) and qh, a u32 whose bit j
// is value j's fifth bit (section 1: one word a block); x = d q + m (d q is exact: one rounding, as
// the reference's). A unit is one block: run 0 the low nibbles, run 1 the high ones. Bounds:
// u < nb = K / 32 blocks: quant vec4 row_vec4(n) + u; head words n * d_ld + u and n * d_ld + nb + u,
// both < (n + 1) d_ld (d_ld = 2 nb); wvec: i / 8 < nb.
const QK: u32 = 32u;
const BV: u32 = 1u;
const ZP: u32 = 0u;
const SIGNED: bool = false;
const HAS_MIN: bool = true;

fn dm(n: u32, b: u32) -> vec2<f32> { return unpack2x16float(scales[n * p.d_ld + b]); }

fn q5_high(n: u32, b: u32) -> u32 { return scales[n * p.d_ld + p.K / 32u + b]; }

fn unit_k4(u: u32, r: u32) -> u32 { return u * 8u + r * 4u; }

fn unit_w(n: u32, u: u32) -> WUnit {
  let q = qs[row_vec4(n) + u];
  let qh = q5_high(n, u);
  let s = dm(n, u);
  let b = vec4<u32>(0u, 4u, 8u, 12u);
  return WUnit(nib_lo(q) | fifth4(qh, b), nib_hi(q) | fifth4(qh, b + vec4<u32>(16u)), vec4<f32>(s, s));
}

fn wvec(n: u32, i: u32) -> vec4<f32> {
  let b = i / 8u;
  let j = i % 8u;
  let s = dm(n, b);
  return ufloat4(q5x4(qs[row_vec4(n) + b][j % 4u], (j / 4u) * 4u, q5_high(n, b), 4u * j), 0.0) * s.x + s.y;
}
