// Matmul without workgroup memory or barriers, for CPU-backed adapters (lavapipe, SwiftShader),
// where barriers are costly and "GPU" registers are plain memory: each thread computes a 4x4 block
// of C = A @ W^T from four rows of A and four rows of a k-major W (N, K), read as vec4 along K.
// Same epilogue as matmul.wgsl (bias, GELU, residual). Needs K % 4 == 0 and 4-aligned offsets.
// Header: alias TA, TB, TC, TBIAS.
// Bounds (the kernels run without the compiler's runtime checks): the planner builds it only for K
// % 4 == 0 and 4-aligned rows: row_a / row_w read only m < M, n < N, k < K4; store4 writes only m <
// M, n < N. Loops end: each runs to a uniform or constant bound in steps that cannot wrap (sizes
// stay under 2^31).
// #include epilogue.wgsl
struct P {
  M: u32, N: u32, K4: u32, acc: u32,
  a_off4: u32, lda4: u32, b_off4: u32, c_off: u32,
  ldc: u32, epi: u32, bias_off: u32, r_off: u32,
  r_ld: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> a: array<vec4<TA>>;
@group(0) @binding(2) var<storage, read> w: array<vec4<TB>>;
@group(0) @binding(3) var<storage, read> bias: array<TBIAS>;
@group(0) @binding(4) var<storage, read> res: array<TC>;
@group(0) @binding(5) var<storage, read_write> c: array<TC>;

fn row_a(m: u32, k: u32) -> vec4<f32> {
  if (m < p.M) { return vec4<f32>(a[p.a_off4 + m * p.lda4 + k]); }
  return vec4<f32>();
}

fn row_w(n: u32, k: u32) -> vec4<f32> {
  if (n < p.N) { return vec4<f32>(w[p.b_off4 + n * p.K4 + k]); }
  return vec4<f32>();
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let n0 = gid.x * 4u;
  let m0 = gid.y * 4u;
  if (n0 >= p.N || m0 >= p.M) { return; }
  var c0 = vec4<f32>(); var c1 = vec4<f32>(); var c2 = vec4<f32>(); var c3 = vec4<f32>();
  for (var k = 0u; k < p.K4; k = k + 1u) {
    let w0 = row_w(n0, k); let w1 = row_w(n0 + 1u, k); let w2 = row_w(n0 + 2u, k); let w3 = row_w(n0 + 3u, k);
    let a0 = row_a(m0, k);
    c0 = c0 + vec4<f32>(dot(a0, w0), dot(a0, w1), dot(a0, w2), dot(a0, w3));
    let a1 = row_a(m0 + 1u, k);
    c1 = c1 + vec4<f32>(dot(a1, w0), dot(a1, w1), dot(a1, w2), dot(a1, w3));
    let a2 = row_a(m0 + 2u, k);
    c2 = c2 + vec4<f32>(dot(a2, w0), dot(a2, w1), dot(a2, w2), dot(a2, w3));
    let a3 = row_a(m0 + 3u, k);
    c3 = c3 + vec4<f32>(dot(a3, w0), dot(a3, w1), dot(a3, w2), dot(a3, w3));
  }
  store4(m0, n0, c0);
  store4(m0 + 1u, n0, c1);
  store4(m0 + 2u, n0, c2);
  store4(m0 + 3u, n0, c3);
}
