// Matmul with a quantized weight for M > 8 rows on CPU-backed adapters (lavapipe, SwiftShader),
// where barriers are costly: no workgroup memory, no barriers, as matmul_regs.wgsl. Each thread
// computes a 4x4 block of C = A @ W^T from four rows of A (float32, read as vec4 along K) and four
// rows of W in webtensor's GPU layout of one of ggml's block types (quant_dequant.wgsl; the type by
// its define), four values of each dequantized per step (wvec).
// Epilogue (epilogue.wgsl): + bias[n], the activation, + residual[m, n], chosen by p.epi.
// Same parameters as gemv_quant.wgsl.
// Bounds (runtime checks may be off): threads whose first row or column is past M or N return;
// rows of A past M read as zeros, rows of W past N read row N - 1 (their columns are never
// stored); k4 < K / 4; store4 writes only rows < M and columns < N.
alias TC = f32;
// #include epilogue.wgsl
// #include quant_linear_io.wgsl
@group(0) @binding(6) var<storage, read_write> c: array<f32>;

fn row_a(m: u32, k4: u32) -> vec4<f32> {
  if (m < p.M) { return a[p.a_off4 + m * p.lda4 + k4]; }
  return vec4<f32>();
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let n0 = gid.x * 4u;
  let m0 = gid.y * 4u;
  if (n0 >= p.N || m0 >= p.M) { return; }
  let last = p.N - 1u;
  let n1 = min(n0 + 1u, last);
  let n2 = min(n0 + 2u, last);
  let n3 = min(n0 + 3u, last);
  var c0 = vec4<f32>(); var c1 = vec4<f32>(); var c2 = vec4<f32>(); var c3 = vec4<f32>();
  for (var k4 = 0u; k4 < p.K / 4u; k4 = k4 + 1u) {
    let w0 = wvec(n0, k4); let w1 = wvec(n1, k4); let w2 = wvec(n2, k4); let w3 = wvec(n3, k4);
    let a0 = row_a(m0, k4);
    c0 = c0 + vec4<f32>(dot(a0, w0), dot(a0, w1), dot(a0, w2), dot(a0, w3));
    let a1 = row_a(m0 + 1u, k4);
    c1 = c1 + vec4<f32>(dot(a1, w0), dot(a1, w1), dot(a1, w2), dot(a1, w3));
    let a2 = row_a(m0 + 2u, k4);
    c2 = c2 + vec4<f32>(dot(a2, w0), dot(a2, w1), dot(a2, w2), dot(a2, w3));
    let a3 = row_a(m0 + 3u, k4);
    c3 = c3 + vec4<f32>(dot(a3, w0), dot(a3, w1), dot(a3, w2), dot(a3, w3));
  }
  store4(m0, n0, c0);
  store4(m0 + 1u, n0, c1);
  store4(m0 + 2u, n0, c2);
  store4(m0 + 3u, n0, c3);
}
