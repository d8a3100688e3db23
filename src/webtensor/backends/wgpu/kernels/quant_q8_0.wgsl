// Q8_0 (quant_dequant.wgsl): a block is 32 int8 (two vec4 of quants) and one float16 scale d (heads:
// two a word, d_ld = ceil(K / 64)); x = d q. A unit is one block: run 0 its first vec4, run 1 its
// second. Bounds: u < K / 32 blocks, so quant vec4s row_vec4(n) + 2u + 1 < row_vec4(n) + K / 16 and
// head j = u < K / 32 (word j / 2 < d_ld); wvec: i / 4 < K / 16, i / 8 < K / 32.
const QK: u32 = 32u;
const BV: u32 = 2u;
const ZP: u32 = 0u;
const SIGNED: bool = true;
const HAS_MIN: bool = false;

fn unit_k4(u: u32, r: u32) -> u32 { return u * 8u + r * 4u; }

fn unit_w(n: u32, u: u32) -> WUnit {
  let b = row_vec4(n) + u * 2u;
  let d = head16(n, 0u, u);
  return WUnit(qs[b], qs[b + 1u], vec4<f32>(d, 0.0, d, 0.0));
}

fn wvec(n: u32, i: u32) -> vec4<f32> { return bytes4f(qs[row_vec4(n) + i / 4u][i % 4u]) * head16(n, 0u, i / 8u); }
