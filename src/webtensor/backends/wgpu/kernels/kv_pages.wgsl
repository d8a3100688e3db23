// The paged KV cache's addressing and element types, shared by every kernel that reads or writes a KV
// cache (cache_write.wgsl, cache_gather.wgsl, cached_attention_main.wgsl; docs/design-kv.md): included
// where they say `// #include kv_pages.wgsl`.
// The includer declares the uniform `p` with the fields block (positions a block), max_blocks (entries a
// table row; 0: no table), n_seqs (table rows), n_blocks (the pool's blocks) and table_off (the table
// view's first element), and the binding `kv_table: array<i32>` (the block table, (n_seqs, max_blocks);
// never read when max_blocks is 0).
// Position ps of sequence seq is pool row kv_row(seq, ps) = table[seq, ps / block] * block + ps % block.
// Without a table (max_blocks 0) the cache is contiguous, (n_blocks, block, ...): sequence s is block s.
// Element types of the pool (the includer's defines): float32 or float16 (`alias KV`; KV16 for float16), or
// q8_0 (`Q8`). kv_of / kv_of4: a value as a float pool stores it; kv_round / kv_round4: that value widened
// again (float16: rounded in integer steps, which no compiler folds away, where f32(f16(x)) may be folded
// to x: lavapipe does; the store converts the rounded value, exactly), so a kernel that attends to a value it
// stores sees exactly the stored one.
// q8_0:
// a (row, head) of a q8_0 pool is D / 4 u32 words of int8 quants (dim d in byte d % 4 of word d / 4:
// four dims a word, one vec4 lane), then ceil(D / 64) words of float16 scales (block j = d / 32 in half
// j % 2 of word j / 2): q8_words(D) words in all; a value is quant * scale (llama.cpp's q8_0 per 32 dims).
// Bounds: kv_row returns NO_ROW unless seq < n_seqs (unpaged: < n_blocks), ps / block < max_blocks
// (unpaged: ps < block) and the table's entry is a block of the pool (< n_blocks as u32: negative entries
// are huge), so a row it returns is < n_blocks * block; the table is read at table_off + seq * max_blocks
// + ps / block < table_off + n_seqs * max_blocks, inside the table view the planner binds. The decoders
// index nothing. Loops: none.
const NO_ROW: u32 = 0xffffffffu;

// x rounded to the nearest float16 (ties to even), in integer steps: the mantissa cut to 10 bits where
// float16 is normal, steps of 2^-24 below 2^-14 (its subnormals), +-inf past 65,504 + 16, NaN kept
fn f16_round(x: f32) -> f32 {
  let b = bitcast<u32>(x);
  let a = b & 0x7fffffffu;
  if (a >= 0x7f800000u) { return x; }  // inf, NaN
  if (a < 0x38800000u) { return round(x * 16777216.0) * 5.9604644775390625e-8; }  // |x| < 2^-14
  let r = bitcast<f32>((b + 0xfffu + ((b >> 13u) & 1u)) & 0xffffe000u);
  if (abs(r) > 65504.0) { return bitcast<f32>((b & 0x80000000u) | 0x7f800000u); }
  return r;
}

// #if KV16
fn kv_of(x: f32) -> KV { return KV(kv_round(x)); }
fn kv_of4(x: vec4<f32>) -> vec4<KV> { return vec4<KV>(kv_round4(x)); }
fn kv_round4(x: vec4<f32>) -> vec4<f32> { return vec4<f32>(kv_round(x.x), kv_round(x.y), kv_round(x.z), kv_round(x.w)); }
fn kv_round(x: f32) -> f32 { return f16_round(x); }
// #else
// #if Q8
// #else
fn kv_of(x: f32) -> KV { return KV(x); }
fn kv_of4(x: vec4<f32>) -> vec4<KV> { return vec4<KV>(x); }
fn kv_round(x: f32) -> f32 { return x; }
fn kv_round4(x: vec4<f32>) -> vec4<f32> { return x; }
// #endif
// #endif

fn kv_row(seq: u32, ps: u32) -> u32 {
  if (p.max_blocks == 0u) {  // contiguous: sequence s is block s
    if (seq >= p.n_blocks || ps >= p.block) { return NO_ROW; }
    return seq * p.block + ps;
  }
  let j = ps / p.block;
  if (seq >= p.n_seqs || j >= p.max_blocks) { return NO_ROW; }
  let b = u32(kv_table[p.table_off + seq * p.max_blocks + j]);
  if (b >= p.n_blocks) { return NO_ROW; }
  return b * p.block + ps % p.block;
}

// the u32 words of one (row, head) of a q8_0 pool with head dim D (a multiple of 32)
fn q8_words(D: u32) -> u32 { return D / 4u + (D + 63u) / 64u; }

// the four dims of a quant word (signed bytes, low byte first) times their block's scale
fn q8_lane(qw: u32, scale: f32) -> vec4<f32> {
  let w = i32(qw);
  return vec4<f32>(f32(extractBits(w, 0u, 8u)), f32(extractBits(w, 8u, 8u)), f32(extractBits(w, 16u, 8u)),
                   f32(extractBits(w, 24u, 8u))) * scale;
}

// block j's scale from the scale word that holds it (blocks 2i and 2i + 1 in word i, low half first)
fn q8_scale(sw: u32, j: u32) -> f32 { return unpack2x16float(sw)[j % 2u]; }

// llama.cpp's q8_0 of one value x of a block whose inverse scale is id (1 / d, or 0 for an all-zero block):
// roundf(x id) (half away from zero, as C's roundf), in -127 .. 127
fn q8_quant(x: f32, id: f32) -> i32 {
  let v = x * id;
  let a = abs(v);
  let r = floor(a) + select(0.0, 1.0, a - floor(a) >= 0.5);
  return i32(clamp(select(r, -r, v < 0.0), -127.0, 127.0));
}

// four quants (-127 .. 127) as one word, the first in the low byte
fn q8_pack(a: i32, b: i32, c: i32, d: i32) -> u32 {
  return (u32(a) & 0xffu) | ((u32(b) & 0xffu) << 8u) | ((u32(c) & 0xffu) << 16u) | ((u32(d) & 0xffu) << 24u);
}

// a block's scale d = max|x| / 127 as the pool stores it (float16), and the inverse the quants are made with
// (from the float32 d, as quantize_row_q8_0_ref: 0 for an all-zero block)
fn q8_scale_of(amax: f32) -> vec2<f32> {
  let d = amax / 127.0;
  return vec2<f32>(f16_round(d), select(0.0, 1.0 / d, d != 0.0));
}
