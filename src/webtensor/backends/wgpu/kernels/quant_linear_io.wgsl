// What gemv_quant.wgsl, matmul_quant.wgsl and matmul_quant_regs.wgsl share (included where they say
// `// #include quant_linear_io.wgsl`): their parameters, their bindings but the quants (binding 2,
// whose vector width each kernel picks) and the output (last, after any inputs of its own), and the
// dequantizer of the block type the kernel is built for (quant_dequant.wgsl).
struct P {
  M: u32,          // rows of A
  N: u32,          // outputs (W rows) in this dispatch: one row chunk of W
  K: u32,          // values per row (a multiple of the block: 32 or 256)
  acc: u32,        // epilogue.wgsl: add to C's old value (always 0 here)
  a_off4: u32,     // A's first element / 4
  lda4: u32,       // A's row stride / 4
  d_ld: u32,       // u32 words per row of the heads array `scales`
  c_off: u32,      // C's element of (m = 0, n = 0): the chunk's first column
  ldc: u32,        // C's row stride
  epi: u32,        // epilogue bits (see epilogue.wgsl)
  bias_off: u32,   // bias element of n = 0
  r_off: u32,      // residual element of (m = 0, n = 0)
  r_ld: u32,       // residual row stride
  eps: f32,        // gemv_quant with NORM: the norm's epsilon
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> qs: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> res: array<f32>;
// #include quant_dequant.wgsl
