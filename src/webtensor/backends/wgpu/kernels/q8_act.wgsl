// int8 activations (included where gemv_quant_dot4.wgsl and quantize_q8.wgsl say `// #include
// q8_act.wgsl`): a block of 32 values of a row of A' (through gemv_norm.wgsl's arow: the fused norm or
// SwiGLU) quantized as quant/q8.py's reference does: amax = max |x|, d = amax * f32(1 / 127), q =
// round_half_even(x * (1 / d)) clamped to [-127, 127] (0 where amax = 0); a block holding a NaN or an
// infinity gets d = NaN. Its 32 int8 as two vec4<u32> (16 a vec4, four a word, little-endian) and `ds`
// = (d's bits, the sums of q over values 0 .. 15 and 16 .. 31 as a float16 pair: integers of at most
// 16 x 127 = 2,032, exact in float16), both u32 so that no float move can flush or quiet them; `q8_d` and
// `run_sum` read them. Bounds: arow's, for the block's vec4s k4 .. k4 + 7.
const INV127: f32 = 0.007874015748031496;  // f32(1 / 127)

struct Q8Block { lo: vec4<u32>, hi: vec4<u32>, ds: vec2<u32> }

// the scale d of the block whose ds is `ds`
fn q8_d(ds: vec2<u32>) -> f32 { return bitcast<f32>(ds.x); }

// the sum of q over run `half` (0, 1) of the block whose ds is `ds`
fn run_sum(ds: vec2<u32>, half: u32) -> f32 {
  let s = unpack2x16float(ds.y);
  return select(s.x, s.y, half == 1u);
}

// |x| as bits: a value >= 0x7F800000 is an infinity or a NaN
fn abs_bits(x: vec4<f32>) -> vec4<u32> { return bitcast<vec4<u32>>(x) & vec4<u32>(0x7FFFFFFFu); }

// the block of 32 values at vec4 k4 of row m0 + m of A'
fn q8_block(m0: u32, m: u32, k4: u32) -> Q8Block {
  var v: array<vec4<f32>, 8>;
  var amax = 0.0;
  var bad = false;
  for (var j = 0u; j < 8u; j = j + 1u) {
    v[j] = arow(m0, m, k4 + j);
    let ab = abs_bits(v[j]);
    bad = bad || any(ab >= vec4<u32>(0x7F800000u));
    let ax = bitcast<vec4<f32>>(ab);
    amax = max(amax, max(max(ax.x, ax.y), max(ax.z, ax.w)));
  }
  let d = amax * INV127;
  let inv = select(0.0, 1.0 / d, amax > 0.0 && !bad);
  var words: array<u32, 8>;
  var sums = vec2<i32>();
  for (var j = 0u; j < 8u; j = j + 1u) {
    let q = vec4<i32>(clamp(round(v[j] * inv), vec4<f32>(-127.0), vec4<f32>(127.0)));
    words[j] = pack4xI8(q);
    let s = q.x + q.y + q.z + q.w;
    if (j < 4u) { sums.x = sums.x + s; } else { sums.y = sums.y + s; }
  }
  return Q8Block(vec4<u32>(words[0], words[1], words[2], words[3]), vec4<u32>(words[4], words[5], words[6], words[7]),
                 vec2<u32>(select(bitcast<u32>(d), 0x7FC00000u, bad), pack2x16float(vec2<f32>(sums))));
}
