// Matmul with a quantized weight for M > 8 rows (prefill, batches) on GPUs whose kernel policy turns the
// matrix engine (matmul_engine_quant.wgsl) off: C = A @ W^T with A
// float32 (M, K) and W (N, K) in webtensor's GPU layout of one of ggml's block types
// (quant_dequant.wgsl; the type by its define). 64x64 output tiles per workgroup of 256 threads,
// 16-deep K steps staged through workgroup memory: each thread loads one vec4 of A and four values
// of W, which it dequantizes (wvec) before storing, so the inner loop is plain f32 FMAs on a 4x4
// block of outputs held in four vec4 registers, as in matmul.wgsl. No subgroup operations.
// Epilogue (epilogue.wgsl): + bias[n], the activation, + residual[m, n], chosen by p.epi.
// Same parameters as gemv_quant.wgsl.
// Bounds (the kernels run without the compiler's runtime checks): A rows am >= M and W rows wn >= N are not read (zeros
// instead); k0 + lk + 3 < K (K a multiple of 16), so A's vec4 and W's wvec(wn, i) have i < K / 4;
// the tiles' indices are < 256 by construction; store4 writes only rows < M and columns < N.
alias TC = f32;
// #include epilogue.wgsl
// #include quant_linear_io.wgsl
@group(0) @binding(6) var<storage, read_write> c: array<f32>;
var<workgroup> As: array<vec4<f32>, 256>;  // [k][m/4]: 16 x 16 vec4
var<workgroup> Bs: array<vec4<f32>, 256>;  // [k][n/4]

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let m0 = wg.y * 64u;
  let n0 = wg.x * 64u;
  let tx = li % 16u;  // output columns n0 + 4 tx ..
  let ty = li / 16u;  // output rows m0 + 4 ty ..
  // loaders: row m0 + lr of A and row n0 + lr of W, the 4 values k0 + lk .. k0 + lk + 3
  let lr = li / 4u;
  let lk = (li % 4u) * 4u;
  let am = m0 + lr;
  let wn = n0 + lr;
  var c0 = vec4<f32>(); var c1 = vec4<f32>(); var c2 = vec4<f32>(); var c3 = vec4<f32>();
  for (var k0 = 0u; k0 < p.K; k0 = k0 + 16u) {
    var av = vec4<f32>();
    if (am < p.M) { av = a[p.a_off4 + am * p.lda4 + (k0 + lk) / 4u]; }
    var bv = vec4<f32>();
    if (wn < p.N) { bv = wvec(wn, (k0 + lk) / 4u); }
    for (var j = 0u; j < 4u; j = j + 1u) {
      As[(lk + j) * 16u + lr / 4u][lr % 4u] = av[j];
      Bs[(lk + j) * 16u + lr / 4u][lr % 4u] = bv[j];
    }
    workgroupBarrier();
    for (var k = 0u; k < 16u; k = k + 1u) {
      let a4 = As[k * 16u + ty];
      let b4 = Bs[k * 16u + tx];
      c0 = c0 + a4.x * b4;
      c1 = c1 + a4.y * b4;
      c2 = c2 + a4.z * b4;
      c3 = c3 + a4.w * b4;
    }
    workgroupBarrier();
  }
  let m = m0 + ty * 4u;
  let n = n0 + tx * 4u;
  store4(m, n, c0);
  store4(m + 1u, n, c1);
  store4(m + 2u, n, c2);
  store4(m + 3u, n, c3);
}
