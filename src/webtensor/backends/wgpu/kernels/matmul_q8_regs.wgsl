// Matmul with a q8_0 weight for M > 8 rows on CPU-backed adapters (lavapipe, SwiftShader), where
// barriers are costly: no workgroup memory, no barriers, as matmul_regs.wgsl. Each thread computes
// a 4x4 block of C = A @ W^T from four rows of A (float32, read as vec4 along K) and four rows of W
// in webtensor's q8_0 GPU layout (see gemv_q8.wgsl and backends/wgpu/q8_ops.py): per 32-block it
// reads the four rows' scales once, then dequantizes one u32 (4 quants) per row and step.
// Epilogue (epilogue.wgsl): + bias[n], the activation, + residual[m, n], chosen by p.epi.
// Needs K % 32 == 0 and A rows 4-aligned. Same parameters as gemv_q8.wgsl.
// Bounds (the kernels run without the compiler's runtime checks): K % 32 == 0: row_a reads only m <
// M; row_w clamps n to N - 1 (those columns are never stored) and k4 < K / 4; scales of rows
// clamped likewise; store4 writes only m < M, n < N. Loops end: each runs to a uniform or constant
// bound in steps that cannot wrap (sizes stay under 2^31).
alias TC = f32;
// #include epilogue.wgsl
@group(0) @binding(2) var<storage, read> qs: array<u32>;
@group(0) @binding(6) var<storage, read_write> c: array<f32>;
// #include q8_dequant.wgsl

fn row_a(m: u32, k4: u32) -> vec4<f32> {
  if (m < p.M) { return a[p.a_off4 + m * p.lda4 + k4]; }
  return vec4<f32>();
}

// row n of W (clamped to the last row: the extra columns are never stored) at word k4, dequantized
fn row_w(n: u32, k4: u32, d: f32) -> vec4<f32> {
  return dq(qs[min(n, p.N - 1u) * (p.K / 4u) + k4], d);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let n0 = gid.x * 4u;
  let m0 = gid.y * 4u;
  if (n0 >= p.N || m0 >= p.M) { return; }
  let last = p.N - 1u;
  var c0 = vec4<f32>(); var c1 = vec4<f32>(); var c2 = vec4<f32>(); var c3 = vec4<f32>();
  for (var j = 0u; j < p.K / 32u; j = j + 1u) {
    let d0 = scale(n0, j);
    let d1 = scale(min(n0 + 1u, last), j);
    let d2 = scale(min(n0 + 2u, last), j);
    let d3 = scale(min(n0 + 3u, last), j);
    for (var k4 = j * 8u; k4 < j * 8u + 8u; k4 = k4 + 1u) {
      let w0 = row_w(n0, k4, d0); let w1 = row_w(n0 + 1u, k4, d1);
      let w2 = row_w(n0 + 2u, k4, d2); let w3 = row_w(n0 + 3u, k4, d3);
      let a0 = row_a(m0, k4);
      c0 = c0 + vec4<f32>(dot(a0, w0), dot(a0, w1), dot(a0, w2), dot(a0, w3));
      let a1 = row_a(m0 + 1u, k4);
      c1 = c1 + vec4<f32>(dot(a1, w0), dot(a1, w1), dot(a1, w2), dot(a1, w3));
      let a2 = row_a(m0 + 2u, k4);
      c2 = c2 + vec4<f32>(dot(a2, w0), dot(a2, w1), dot(a2, w2), dot(a2, w3));
      let a3 = row_a(m0 + 3u, k4);
      c3 = c3 + vec4<f32>(dot(a3, w0), dot(a3, w1), dot(a3, w2), dot(a3, w3));
    }
  }
  store4(m0, n0, c0);
  store4(m0 + 1u, n0, c1);
  store4(m0 + 2u, n0, c2);
  store4(m0 + 3u, n0, c3);
}
