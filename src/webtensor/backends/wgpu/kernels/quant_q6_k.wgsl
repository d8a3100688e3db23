// Q6_K (quant_dequant.wgsl): the first 208 bytes of the block as stored, 13 vec4 of body: ql[128]
// (vec4s 0 .. 7), qh[64] (8 .. 11), 16 int8 scales (12); its float16 d in the heads (two a word,
// d_ld = ceil(K / 512)). Value 128 h + 32 t + l (half h, quarter t, l < 32): the low four bits are
// nibble t / 2 of ql[64 h + 32 (t % 2) + l], the high two bits 2t .. 2t + 1 of qh[32 h + l]; x =
// (d sc) (q - 32) with sc the int8 scale of its 16 values (d sc exact: one rounding, as the
// reference's). Unit u: block u / 8, its ql vec4 j = u % 8 (half j / 4, bytes 16 (j % 4) .. of it):
// run 0 the low nibbles, run 1 the high ones, the high bits from qh vec4 2 (j / 4) + j % 2. Bounds:
// u < K / 32, so the block u / 8 < K / 256 and its vec4s row_vec4(n) + 13 (u / 8) + 0 .. 12 are row
// n's; its head u / 8 < K / 256; wvec: i / 64 < K / 256, body bytes < 208.
const QK: u32 = 256u;
const BV: u32 = 13u;
const HAS_MIN: bool = false;

// int8 scale s (0 .. 15) of the block (sv: its vec4 12)
fn k6_scale(sv: vec4<u32>, s: u32) -> f32 { return f32(bitcast<i32>(sv[s / 4u] << (24u - 8u * (s % 4u))) >> 24u); }

// the 6-bit values of four bytes: low nibble from ql (shifted by `ls`), two high bits from qh (by `hs`)
fn q6x4(ql: u32, qh: u32, ls: u32, hs: u32) -> vec4<u32> {
  return fields4(ql, ls, 0xFu) | (fields4(qh, hs, 3u) << vec4<u32>(4u));
}

// q - 32 of 16 values
fn q6x16(ql: vec4<u32>, qh: vec4<u32>, ls: u32, hs: u32) -> mat4x4<f32> {
  return mat4x4<f32>(ufloat4(q6x4(ql.x, qh.x, ls, hs), 32.0), ufloat4(q6x4(ql.y, qh.y, ls, hs), 32.0),
                     ufloat4(q6x4(ql.z, qh.z, ls, hs), 32.0), ufloat4(q6x4(ql.w, qh.w, ls, hs), 32.0));
}

fn unit_k4(u: u32, r: u32) -> u32 {
  let j = u % 8u;  // values 128 (j / 4) + 16 (j % 4) .. (+ 64 for run 1)
  return (u / 8u) * 64u + (j / 4u) * 32u + (j % 4u) * 4u + r * 16u;
}

fn unit_q(n: u32, u: u32) -> Unit {
  let blk = u / 8u;
  let base = row_vec4(n) + blk * 13u;
  let j = u % 8u;
  let h = j / 4u;
  let jj = j % 4u;
  let ql = qs[base + j];
  let qh = qs[base + 8u + 2u * h + jj % 2u];
  let sv = qs[base + 12u];
  let d = head16(n, blk);
  let t = jj / 2u;  // run 0: quarter t, run 1: quarter t + 2
  return Unit(Span(q6x16(ql, qh, 0u, 2u * t), q6x16(ql, qh, 4u, 2u * t + 4u)),
              vec4<f32>(d * k6_scale(sv, 8u * h + jj), 0.0, d * k6_scale(sv, 8u * h + 4u + jj), 0.0));
}

fn wvec(n: u32, i: u32) -> vec4<f32> {
  let blk = i / 64u;
  let base = row_vec4(n) + blk * 13u;
  let v = 4u * (i % 64u);
  let h = v / 128u;
  let t = (v % 128u) / 32u;
  let l = v % 32u;
  let q = q6x4(body_word(base, 64u * h + 32u * (t % 2u) + l), body_word(base, 128u + 32u * h + l), 4u * (t / 2u), 2u * t);
  return ufloat4(q, 32.0) * (head16(n, blk) * k6_scale(qs[base + 12u], v / 16u));
}
