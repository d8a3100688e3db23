// The fused `linear` epilogue of matmul.wgsl, matmul_regs.wgsl and gemv.wgsl, included where they
// say `// #include epilogue.wgsl`: c[ci] = (c[ci] when p.acc) + v, then + bias[n], GELU and
// + residual[m, n] by the bits 1 / 2 / 4 of p.epi. Uses the including kernel's p, c, bias, res, TC.
fn write_out(ci: u32, m: u32, n: u32, v: f32) {
  var x = v;
  if (p.acc != 0u) { x = x + f32(c[ci]); }
  if ((p.epi & 1u) != 0u) { x = x + f32(bias[p.bias_off + n]); }
  if ((p.epi & 2u) != 0u) { x = gelu_tanh(x); }
  if ((p.epi & 4u) != 0u) { x = x + f32(res[p.r_off + m * p.r_ld + n]); }
  c[ci] = TC(x);
}
