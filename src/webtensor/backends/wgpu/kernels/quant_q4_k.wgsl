// Q4_K (quant_dequant.wgsl): the 144-byte block as stored, nine vec4 of body (no heads): vec4 0 is
// (d, dmin) (float16 pair), then the 12 bytes of eight 6-bit (scale, min) pairs; vec4s 1 .. 8 the 128
// bytes of nibbles (64-value chunk c: bytes 32c .. 32c + 31, low nibbles sub-block 2c = values
// 64c .., high nibbles sub-block 2c + 1 = values 64c + 32 ..); x = (d sc) q - dmin mn (d sc, dmin mn
// and (d sc) q exact: one rounding, as the reference's). Unit u: block u / 8, its quant vec4 j = u % 8
// (16 bytes of chunk j / 2): run 0 the low nibbles, run 1 the high ones. Bounds: u < K / 32, so the
// block u / 8 < K / 256 and its vec4s row_vec4(n) + 9 (u / 8) + 0 .. 8 are row n's; scale bytes
// 0 .. 11 are words 1 .. 3 of vec4 0; wvec: i / 64 < K / 256, body bytes 16 .. 143.
const QK: u32 = 256u;
const BV: u32 = 9u;
const HAS_MIN: bool = true;

// byte i (0 .. 11) of the packed scales (h: the block's vec4 0)
fn k_byte(h: vec4<u32>, i: u32) -> u32 { return (h[1u + i / 4u] >> (8u * (i % 4u))) & 0xFFu; }

// (d sc, dmin mn) of sub-block s (0 .. 7): s < 4, the low six bits of bytes s and s + 4; else the
// nibbles of byte s + 4 under the top two bits of bytes s - 4 (scale) and s (min)
fn k_scale_min(h: vec4<u32>, s: u32) -> vec2<f32> {
  var sc: u32;
  var mn: u32;
  if (s < 4u) {
    sc = k_byte(h, s) & 63u;
    mn = k_byte(h, s + 4u) & 63u;
  } else {
    sc = (k_byte(h, s + 4u) & 0xFu) | ((k_byte(h, s - 4u) >> 6u) << 4u);
    mn = (k_byte(h, s + 4u) >> 4u) | ((k_byte(h, s) >> 6u) << 4u);
  }
  let dd = unpack2x16float(h.x);
  return vec2<f32>(dd.x * f32(sc), dd.y * f32(mn));
}

// the 16 nibbles (the low ones for shift 0, the high ones for 4)
fn q4k16(q: vec4<u32>, shift: u32) -> mat4x4<f32> {
  return mat4x4<f32>(ufloat4(fields4(q.x, shift, 0xFu), 0.0), ufloat4(fields4(q.y, shift, 0xFu), 0.0),
                     ufloat4(fields4(q.z, shift, 0xFu), 0.0), ufloat4(fields4(q.w, shift, 0xFu), 0.0));
}

fn unit_k4(u: u32, r: u32) -> u32 {
  let j = u % 8u;  // chunk j / 2, bytes 16 (j % 2) ..: values 64 (j / 2) + 16 (j % 2) .. (+ 32 for run 1)
  return (u / 8u) * 64u + (j / 2u) * 16u + (j % 2u) * 4u + r * 8u;
}

fn unit_q(n: u32, u: u32) -> Unit {
  let base = row_vec4(n) + (u / 8u) * 9u;
  let j = u % 8u;
  let h = qs[base];
  let q = qs[base + 1u + j];
  let c = j / 2u;
  let s0 = k_scale_min(h, 2u * c);
  let s1 = k_scale_min(h, 2u * c + 1u);
  return Unit(Span(q4k16(q, 0u), q4k16(q, 4u)), vec4<f32>(s0.x, -s0.y, s1.x, -s1.y));
}

fn wvec(n: u32, i: u32) -> vec4<f32> {
  let base = row_vec4(n) + (i / 64u) * 9u;
  let v = 4u * (i % 64u);  // the first of the four values within the block
  let c = v / 64u;
  let hi = (v % 64u) / 32u;
  let s = k_scale_min(qs[base], 2u * c + hi);
  return ufloat4(fields4(body_word(base, 16u + 32u * c + v % 32u), 4u * hi, 0xFu), 0.0) * s.x - s.y;
}
