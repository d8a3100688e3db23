// The normalising prologue of a GEMV (included where gemv_quant.wgsl says `// #include
// gemv_norm.wgsl`): with const NORM = 1 the rows of A are layer-normalised, A' = (A - mean) rstd lnw
// + lnb (rstd = 1 / sqrt(var + eps)); with NORM = 2 RMS-normalised, A' = A rstd lnw (rstd = 1 /
// sqrt(mean(A^2) + eps)); NORM = 0 reads A as it is. With const GLU > 0 (NORM = 0; any LANES) A's rows
// are 2K wide, [gate | up], and A' = glu4 (common.wgsl) of the halves: silu(gate) * up (GLU 1) or
// gelu_tanh(gate) * up (GLU 2). `norm_stats` computes each of the workgroup's
// rows' statistics with all 256 threads (one pass; the layer norm's shifted by the row's first value
// against cancellation, as gemv.wgsl) into workgroup memory; `arow` reads a vec4 of a row through
// it. Uses the including kernel's p (a_off4, lda4, K, eps), a, lnw, lnb, and SG (the subgroup
// reduction where > 0), GLU. Bounds: rows m0 + m < p.M (m < rows), vec4s i < K / 4 of A's rows and
// of lnw / lnb (K values each); with GLU also K / 4 + i < K / 2 of A's rows (2K values each).
var<workgroup> red2: array<vec2<f32>, 256>;
var<workgroup> stats: array<vec2<f32>, 8>;  // (mean, rstd) of each row of the group (RMS: mean 0)

// the sum of v over the workgroup, to every thread (call from uniform control flow)
fn block_sum2(li: u32, v: vec2<f32>) -> vec2<f32> {
// #if SG
  red2[li] = subgroupAdd(v);
  workgroupBarrier();
  var t = vec2<f32>();
  for (var k = 0u; k < 256u; k = k + SG) { t = t + red2[k]; }
  workgroupBarrier();
  return t;
// #else
  red2[li] = v;
  workgroupBarrier();
  for (var st = 128u; st > 0u; st = st >> 1u) {
    if (li < st) { red2[li] = red2[li] + red2[li + st]; }
    workgroupBarrier();
  }
  let t = red2[0];
  workgroupBarrier();
  return t;
// #endif
}

// the statistics of rows m0 .. m0 + rows - 1 into stats[0 .. rows - 1] (uniform control flow)
fn norm_stats(li: u32, m0: u32, rows: u32) {
  if (NORM == 0u) { return; }
  let k4 = p.K / 4u;
  for (var m = 0u; m < rows; m = m + 1u) {
    let ab = p.a_off4 + (m0 + m) * p.lda4;
    let x0 = select(0.0, a[ab].x, NORM == 1u);
    var acc = vec2<f32>();
    for (var k = li; k < k4; k = k + 256u) {
      let dd = a[ab + k] - x0;
      acc = acc + vec2<f32>(dd.x + dd.y + dd.z + dd.w, dot(dd, dd));
    }
    let tot = block_sum2(li, acc) / f32(p.K);
    if (li == 0u) {
      if (NORM == 1u) {
        stats[m] = vec2<f32>(x0 + tot.x, inverseSqrt(max(tot.y - tot.x * tot.x, 0.0) + p.eps));
      } else {
        stats[m] = vec2<f32>(0.0, inverseSqrt(tot.y + p.eps));
      }
    }
    workgroupBarrier();
  }
}

// vec4 i of row m0 + m of A (m: the row within the group), normalised when NORM
fn arow(m0: u32, m: u32, i: u32) -> vec4<f32> {
  let ab = p.a_off4 + (m0 + m) * p.lda4;
  let x = a[ab + i];
  if (GLU != 0u) { return glu4(GLU, x, a[ab + p.K / 4u + i]); }
  if (NORM == 0u) { return x; }
  let st = stats[m];
  if (NORM == 1u) { return (x - st.x) * st.y * lnw[i] + lnb[i]; }
  return x * st.y * lnw[i];
}
