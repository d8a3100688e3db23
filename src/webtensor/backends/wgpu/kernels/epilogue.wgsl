// The fused `linear` epilogue of matmul.wgsl, matmul_regs.wgsl and gemv.wgsl, included where they
// say `// #include epilogue.wgsl`: c[ci] = (c[ci] when p.acc) + v, then + bias[n] (bit 1 of p.epi),
// the activation whose code is p.epi >> 8 (0: none; codes as in webtensor/activations.py), then
// + residual[m, n] (bit 4); store4 writes four outputs of a row through it. Uses the including
// kernel's p (M, N, c_off, ldc, acc, epi, bias_off, r_off, r_ld), c, bias, res, TC.
// With CPACK (matmul_engine only) c and res are float16 held as u32 words (two values a word, no
// 16-bit storage access) and store4 writes whole words: c_off and ldc must be even, so a thread's
// four outputs are two words of one row. The last word of a row with N odd is half in range: its
// other half (column N < ldc) belongs to no invocation of the launch and is kept bit for bit.
// Bounds (the kernels run without the compiler's runtime checks): bias[bias_off + n] and res[r_off
// + m r_ld + n] are read, and c written, only for m < M and n < N (the callers check; the planners
// bind bias (N,) and residual (M, N) views); with CPACK the planners pass c_off, ldc and N even,
// and word w + 1 is touched only when column n0 + 2 < N, so both words lie in row m. Loops end:
// each runs to a uniform or constant bound in steps that cannot wrap (sizes stay under 2^31).

// erfc(x) to ~1.2e-7 relative (a Chebyshev fit, t = 1 / (1 + |x| / 2)); relative accuracy in the
// tail x > 0, so 0.5 x erfc(-x / sqrt 2) is an accurate GELU for negative x too.
fn erfc_fit(x: f32) -> f32 {
  let z = abs(x);
  let t = 1.0 / (1.0 + 0.5 * z);
  let poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
    + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
  let r = t * exp(-z * z + poly);
  if (x >= 0.0) { return r; }
  return 2.0 - r;
}

fn gelu_erf(x: f32) -> f32 { return 0.5 * x * erfc_fit(-0.7071067811865476 * x); }

fn sigmoid(x: f32) -> f32 { return 1.0 / (1.0 + exp(-x)); }

// log(1 + u), u >= 0: a series below 0.1 (relative error < 2e-7; WebGPU's log is only accurate to
// 2^-21 absolute near 1, which would lose a small u), log above
fn log1p_(u: f32) -> f32 {
  if (u < 0.1) { return u * (1.0 - u * (0.5 - u * (0.33333333 - u * (0.25 - u * (0.2 - u * 0.16666667))))); }
  return log(1.0 + u);
}

// torch's softplus: x above 20, else log(1 + e^x)
fn softplus(x: f32) -> f32 {
  if (x > 20.0) { return x; }
  return log1p_(exp(x));
}

// tanh to a few ulp, not the driver's (WebGPU lets it be inaccurate near 0 and NaN for large |x|
// where formed from exp): a series below |x| = 0.1, else 1 - 2 / (e^2|x| + 1), which is 1 once e^2|x|
// overflows
fn tanh_(x: f32) -> f32 {
  let z = abs(x);
  if (z < 0.1) { let z2 = x * x; return x * (1.0 - z2 * (0.33333333 - z2 * 0.13333333)); }
  return sign(x) * (1.0 - 2.0 / (exp(2.0 * z) + 1.0));
}

fn activate(a: u32, x: f32) -> f32 {
  switch a {
    case 1u: { return gelu_tanh(x); }
    case 2u: { return gelu_erf(x); }
    case 3u: { return clamp(gelu_erf(x), -10.0, 10.0); }
    case 4u: { return x * sigmoid(1.702 * x); }
    case 5u: { return max(x, 0.0); }
    case 6u: { let r = max(x, 0.0); return r * r; }
    case 7u: { return clamp(x, 0.0, 6.0); }
    case 8u: { return select(0.01 * x, x, x >= 0.0); }
    case 9u: { return sigmoid(x); }
    case 10u: { return tanh_(x); }
    case 11u: { return x * sigmoid(x); }
    case 12u: { return x * clamp(x + 3.0, 0.0, 6.0) / 6.0; }
    case 13u: { return x * tanh_(softplus(x)); }
    case 14u: { return 0.5 * erfc_fit(-(x - 0.707107) / (0.282095 * 1.4142135623730951)); }
    case 15u: { return sqrt(softplus(x)); }
    default: { return x; }
  }
}

// the final value of output ci = (m, n): v, + c[ci] when p.acc, + bias, activation, + residual
fn out_value(ci: u32, m: u32, n: u32, v: f32) -> f32 {
  var x = v;
  if (p.acc != 0u) { x = x + c_at(ci); }
  if ((p.epi & 1u) != 0u) { x = x + f32(bias[p.bias_off + n]); }
  let a = p.epi >> 8u;
  if (a != 0u) { x = activate(a, x); }
  if ((p.epi & 4u) != 0u) { x = x + res_at(p.r_off + m * p.r_ld + n); }
  return x;
}

// #if CPACK
fn half_of(w: u32, i: u32) -> f32 {
  let h = unpack2x16float(w);
  return select(h.x, h.y, (i & 1u) != 0u);
}
fn c_at(ci: u32) -> f32 { return half_of(c[ci / 2u], ci); }
fn res_at(i: u32) -> f32 { return half_of(res[i / 2u], i); }

fn store4(m: u32, n0: u32, v: vec4<f32>) {
  if (m >= p.M) { return; }
  let ci = p.c_off + m * p.ldc + n0;  // even
  var o = v;
  for (var j = 0u; j < 4u; j = j + 1u) {  // (one out_value call site: it holds the activation switch)
    if (n0 + j < p.N) { o[j] = out_value(ci + j, m, n0 + j, v[j]); }
  }
  let w = ci / 2u;
  if (n0 + 3u < p.N) {
    c[w] = pack2x16float(o.xy);
    c[w + 1u] = pack2x16float(o.zw);
  } else if (n0 + 1u < p.N) {  // 2 or 3 in range
    c[w] = pack2x16float(o.xy);
    if (n0 + 2u < p.N) { c[w + 1u] = (pack2x16float(o.zw) & 0xffffu) | (c[w + 1u] & 0xffff0000u); }
  } else if (n0 < p.N) {
    c[w] = (pack2x16float(o.xy) & 0xffffu) | (c[w] & 0xffff0000u);
  }
}
// #else
fn c_at(ci: u32) -> f32 { return f32(c[ci]); }
fn res_at(i: u32) -> f32 { return f32(res[i]); }

fn write_out(ci: u32, m: u32, n: u32, v: f32) {
  c[ci] = TC(out_value(ci, m, n, v));
}

// four outputs of row m from column n0 on (a register-tiled kernel's vec4), each through write_out;
// columns at or past p.N and rows at or past p.M are skipped
fn store4(m: u32, n0: u32, v: vec4<f32>) {
  if (m >= p.M) { return; }
  for (var j = 0u; j < 4u; j = j + 1u) {
    let n = n0 + j;
    if (n >= p.N) { return; }
    write_out(p.c_off + m * p.ldc + n, m, n, v[j]);
  }
}
// #endif
