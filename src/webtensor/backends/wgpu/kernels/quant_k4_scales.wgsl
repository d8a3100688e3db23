// The packed sub-block scales of Q4_K and Q5_K, and the unit map of their nibbles (included by quant_q4_k.wgsl
// and quant_q5_k.wgsl; unit_k4 is the type files' function of quant_dequant.wgsl's interface): a block's
// head is one section of four words (d_ld = 4 K / 256): (d, dmin) as a float16 pair, then the 12 bytes of
// eight 6-bit (scale, min) pairs, one pair per 32-value sub-block. Bounds: b < K / 256, so the head words
// n d_ld + 4b + 0 .. 3 are row n's; k_byte reads words 1 .. 3 of that head (i < 12).
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

// unit_k4: the activations' vec4 (value index / 4) where run r of unit u starts (both types order their low
// nibbles alike)
fn unit_k4(u: u32, r: u32) -> u32 {
  let j = u % 8u;  // chunk j / 2, bytes 16 (j % 2) ..: values 64 (j / 2) + 16 (j % 2) .. (+ 32 for run 1)
  return (u / 8u) * 64u + (j / 2u) * 16u + (j % 2u) * 4u + r * 8u;
}
