// Q4_K (quant_dequant.wgsl): a 256-value block's 128 bytes of nibbles are its eight vec4 of quants
// (64-value chunk c: bytes 32c .. 32c + 31, low nibbles sub-block 2c = values 64c .., high nibbles
// sub-block 2c + 1 = values 64c + 32 ..); its other 16 bytes, as stored, are one head section of four
// words a block (d_ld = 4 K / 256): (d, dmin) as a float16 pair, then the 12 bytes of eight 6-bit
// (scale, min) pairs. x = (d sc) q - dmin mn (d sc, dmin mn and (d sc) q exact: one rounding, as the
// reference's). Unit u: block u / 8, its quant vec4 j = u % 8 (16 bytes of chunk j / 2): run 0 the
// low nibbles, run 1 the high ones. Bounds: u < K / 32, so the block b = u / 8 < K / 256: quant vec4s
// row_vec4(n) + 8b + 0 .. 7 and head words n d_ld + 4b + 0 .. 3 are row n's; wvec: i / 64 < K / 256,
// quant bytes 32c + v % 32 < 128.
const QK: u32 = 256u;
const BV: u32 = 8u;
const ZP: u32 = 0u;
const SIGNED: bool = false;
const HAS_MIN: bool = true;

// the 16 head bytes of block b of row n
fn k_head(n: u32, b: u32) -> vec4<u32> {
  let o = n * p.d_ld + 4u * b;
  return vec4<u32>(scales[o], scales[o + 1u], scales[o + 2u], scales[o + 3u]);
}

// byte i (0 .. 11) of the packed scales (h: the block's head)
fn k_byte(h: vec4<u32>, i: u32) -> u32 { return (h[1u + i / 4u] >> (8u * (i % 4u))) & 0xFFu; }

// (d sc, dmin mn) of sub-block s (0 .. 7): s < 4, the low six bits of bytes s and s + 4; else the
// nibbles of byte s + 4 under the top two bits of bytes s - 4 (scale) and s (min). Without a branch
// (neighbouring lanes decode sub-blocks on both sides of 4): a, b, c are bytes s % 4, s % 4 + 4, s % 4 + 8.
fn k_scale_min(h: vec4<u32>, s: u32) -> vec2<f32> {
  let a = k_byte(h, s % 4u);
  let b = k_byte(h, s % 4u + 4u);
  let c = k_byte(h, s % 4u + 8u);
  let hi = s >= 4u;
  let sc = select(a & 63u, (c & 0xFu) | ((a >> 6u) << 4u), hi);
  let mn = select(b & 63u, (c >> 4u) | ((b >> 6u) << 4u), hi);
  let dd = unpack2x16float(h.x);
  return vec2<f32>(dd.x * f32(sc), dd.y * f32(mn));
}

fn unit_k4(u: u32, r: u32) -> u32 {
  let j = u % 8u;  // chunk j / 2, bytes 16 (j % 2) ..: values 64 (j / 2) + 16 (j % 2) .. (+ 32 for run 1)
  return (u / 8u) * 64u + (j / 2u) * 16u + (j % 2u) * 4u + r * 8u;
}

fn unit_w(n: u32, u: u32) -> WUnit {
  let b = u / 8u;
  let j = u % 8u;
  let h = k_head(n, b);
  let q = qs[row_vec4(n) + b * 8u + j];
  let c = j / 2u;
  let s0 = k_scale_min(h, 2u * c);
  let s1 = k_scale_min(h, 2u * c + 1u);
  return WUnit(nib_lo(q), nib_hi(q), vec4<f32>(s0.x, -s0.y, s1.x, -s1.y));
}

fn wvec(n: u32, i: u32) -> vec4<f32> {
  let b = i / 64u;
  let v = 4u * (i % 64u);  // the first of the four values within the block
  let c = v / 64u;
  let hi = (v % 64u) / 32u;
  let s = k_scale_min(k_head(n, b), 2u * c + hi);
  return ufloat4(fields4(body_word(row_vec4(n) + b * 8u, 32u * c + v % 32u), 4u * hi, 0xFu), 0.0) * s.x - s.y;
}
