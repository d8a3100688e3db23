// Q8_0 (quant_dequant.wgsl): a block is 32 int8 (two vec4 of body) and one float16 scale d (heads:
// two a word, d_ld = ceil(K / 64)); x = d q. A unit is one block: run 0 its first vec4, run 1 its
// second. Bounds: u < K / 32 blocks, so body vec4s row_vec4(n) + 2u + 1 < row_vec4(n) + K / 16 and
// head j = u < K / 32 (word j / 2 < d_ld); wvec: i / 4 < K / 16, i / 8 < K / 32.
const QK: u32 = 32u;
const BV: u32 = 2u;
const HAS_MIN: bool = false;

// four int8 (the bytes of w) as f32: byte ^ 0x80 is q + 128
fn q8x4(w: u32) -> vec4<f32> { return ufloat4(fields4(w ^ 0x80808080u, 0u, 0xFFu), 128.0); }

fn q8x16(q: vec4<u32>) -> mat4x4<f32> { return mat4x4<f32>(q8x4(q.x), q8x4(q.y), q8x4(q.z), q8x4(q.w)); }

fn unit_k4(u: u32, r: u32) -> u32 { return u * 8u + r * 4u; }

fn unit_q(n: u32, u: u32) -> Unit {
  let b = row_vec4(n) + u * 2u;
  let d = head16(n, u);
  return Unit(Span(q8x16(qs[b]), q8x16(qs[b + 1u])), vec4<f32>(d, 0.0, d, 0.0));
}

fn wvec(n: u32, i: u32) -> vec4<f32> { return q8x4(qs[row_vec4(n) + i / 4u][i % 4u]) * head16(n, i / 8u); }
