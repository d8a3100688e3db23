// Q6_K (quant_dequant.wgsl): a 256-value block's first 192 bytes as stored are its twelve vec4 of
// quants: ql[128] (vec4s 0 .. 7), qh[64] (8 .. 11); its 16 int8 scales (one per 16 values) are head
// section 0 (four words a block), its float16 d head section 1 (two a word, from word 4 nb; d_ld =
// 4 nb + ceil(nb / 2), nb = K / 256). Value 128 h + 32 t + l (half h, quarter t, l < 32): the low four
// bits are nibble t / 2 of ql[64 h + 32 (t % 2) + l], the high two bits 2t .. 2t + 1 of qh[32 h + l];
// x = (d sc) (q - 32) with sc the int8 scale of its 16 values (d sc exact: one rounding, as the
// reference's). Unit u: block u / 8, its ql vec4 j = u % 8 (half j / 4, bytes 16 (j % 4) .. of it):
// run 0 the low nibbles, run 1 the high ones, the high bits from qh vec4 2 (j / 4) + j % 2. Bounds:
// u < K / 32, so the block b = u / 8 < nb: quant vec4s row_vec4(n) + 12b + 0 .. 11, head words n d_ld
// + 4b + 0 .. 3 and n d_ld + 4 nb + b / 2 (< (n + 1) d_ld) are row n's; wvec: i / 64 < nb, quant
// bytes < 192.
const QK: u32 = 256u;
const BV: u32 = 12u;
const ZP: u32 = 32u;
const SIGNED: bool = false;
const HAS_MIN: bool = false;

// d of block b of row n
fn k6_d(n: u32, b: u32) -> f32 { return head16(n, 4u * (p.K / 256u), b); }

// the int8 scale s % 4 of the scale word w (scales 4 (s / 4) .. of its block), as f32
fn k6_sc(w: u32, s: u32) -> f32 { return f32(bitcast<i32>(w << (24u - 8u * (s % 4u))) >> 24u); }

// d sc of 16-value group s (0 .. 15) of block b of row n (sc an int8)
fn k6_scale(n: u32, b: u32, s: u32) -> f32 { return k6_d(n, b) * k6_sc(scales[n * p.d_ld + 4u * b + s / 4u], s); }

// the 6-bit values of four bytes: low nibble from ql (shifted by `ls`), two high bits from qh (by `hs`)
fn q6x4(ql: u32, qh: u32, ls: u32, hs: u32) -> vec4<u32> {
  return fields4(ql, ls, 0xFu) | (fields4(qh, hs, 3u) << vec4<u32>(4u));
}

fn unit_k4(u: u32, r: u32) -> u32 {
  let j = u % 8u;  // values 128 (j / 4) + 16 (j % 4) .. (+ 64 for run 1)
  return (u / 8u) * 64u + (j / 4u) * 32u + (j % 4u) * 4u + r * 16u;
}

fn unit_w(n: u32, u: u32) -> WUnit {
  let b = u / 8u;
  let base = row_vec4(n) + b * 12u;
  let j = u % 8u;
  let h = j / 4u;
  let jj = j % 4u;
  let ql = qs[base + j];
  let qh = qs[base + 8u + 2u * h + jj % 2u];
  let t = jj / 2u;  // run 0: quarter t, run 1: quarter t + 2
  let m2 = vec4<u32>(0x03030303u);
  let lo = nib_lo(ql) | (((qh >> vec4<u32>(2u * t)) & m2) << vec4<u32>(4u));
  let hi = nib_hi(ql) | (((qh >> vec4<u32>(2u * t + 4u)) & m2) << vec4<u32>(4u));
  let d = k6_d(n, b);
  let sw = n * p.d_ld + 4u * b + 2u * h;  // the scale words of the two runs: scales 8h + jj and 8h + 4 + jj
  return WUnit(lo, hi, vec4<f32>(d * k6_sc(scales[sw], jj), 0.0, d * k6_sc(scales[sw + 1u], jj), 0.0));
}

fn wvec(n: u32, i: u32) -> vec4<f32> {
  let b = i / 64u;
  let base = row_vec4(n) + b * 12u;
  let v = 4u * (i % 64u);
  let h = v / 128u;
  let t = (v % 128u) / 32u;
  let l = v % 32u;
  let q = q6x4(body_word(base, 64u * h + 32u * (t % 2u) + l), body_word(base, 128u + 32u * h + l), 4u * (t / 2u), 2u * t);
  return ufloat4(q, 32.0) * k6_scale(n, b, v / 16u);
}
