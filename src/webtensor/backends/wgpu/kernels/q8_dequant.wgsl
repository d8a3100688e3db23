// What gemv_q8.wgsl, matmul_q8.wgsl and matmul_q8_regs.wgsl share (included where they say
// `// #include q8_dequant.wgsl`): their parameters, their bindings but the quants (binding 2, whose
// vector width each kernel picks) and the output (last, after any inputs of its own), and q8_0 dequantization in registers. `scales` holds two
// float16 scales per u32 word, p.d_ld words per W row.
// Bounds (the kernels run without the compiler's runtime checks): scale(n, j) reads word n d_ld + j
// / 2: its callers pass n < N (a row of this chunk) and j < K / 32, so inside the (N, d_ld) scales.
// Loops end: each runs to a uniform or constant bound in steps that cannot wrap (sizes stay under
// 2^31).
struct P {
  M: u32,          // rows of A
  N: u32,          // outputs (W rows) in this dispatch: one row chunk of W
  K: u32,          // values per row (a multiple of 32)
  acc: u32,        // epilogue.wgsl: add to C's old value (always 0 here)
  a_off4: u32,     // A's first element / 4
  lda4: u32,       // A's row stride / 4
  d_ld: u32,       // u32 words per row of the scale array: ceil(K / 64)
  c_off: u32,      // C's element of (m = 0, n = 0): the chunk's first column
  ldc: u32,        // C's row stride
  epi: u32,        // epilogue bits (see epilogue.wgsl)
  bias_off: u32,   // bias element of n = 0
  r_off: u32,      // residual element of (m = 0, n = 0)
  r_ld: u32,       // residual row stride
  eps: f32,        // gemv_q8 with LN: the layer norm's epsilon
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> res: array<f32>;

// the four int8 of `w` (little-endian bytes), sign-extended, as f32
fn quants4(w: u32) -> vec4<f32> {
  let q = vec4<i32>(bitcast<i32>(w << 24u), bitcast<i32>(w << 16u), bitcast<i32>(w << 8u), bitcast<i32>(w))
    >> vec4<u32>(24u);
  return vec4<f32>(q);
}

// the same times the block's scale: q * d is exact in f32 (8 + 11 significant bits)
fn dq(w: u32, d: f32) -> vec4<f32> { return quants4(w) * d; }

// the scale of block j (values 32 j .. 32 j + 31) of W row n: word n * d_ld + j / 2, low half for even j
fn scale(n: u32, j: u32) -> f32 {
  let s = unpack2x16float(scales[n * p.d_ld + j / 2u]);
  return select(s.x, s.y, (j & 1u) == 1u);
}
