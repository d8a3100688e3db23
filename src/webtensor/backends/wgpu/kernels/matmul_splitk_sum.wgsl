// Split-K's second pass: C[M, N] = epilogue(sum over s < S of part[s]), where part (S, M, N) f32
// (slice s at s * ld_s, rows N apart) holds matmul_engine.wgsl's SPLIT partial products, summed
// in slice order s = 0, 1, .. in f32. A thread sums four adjacent outputs of one row and writes
// them through the engine's epilogue (epilogue.wgsl: + C when acc, bias, activation, residual;
// float16 C as u32 words with CPACK: c_off and ldc even). Grid: (ceil(ceil(N / 4) / 64), M, 1).
// Header: alias TC, TBIAS; const CPACK.
// Bounds (the kernels run without the compiler's runtime checks): m < M and n0 + j < N: part[s ld_s
// + m N + n0 + j] with s < S inside the (S, M, N) scratch; store4 writes only m < M, n < N. Loops
// end: each runs to a uniform or constant bound in steps that cannot wrap (sizes stay under 2^31).
// #include epilogue.wgsl
struct P {
  M: u32, N: u32, S: u32, ld_s: u32,
  acc: u32, c_off: u32, ldc: u32, epi: u32,
  bias_off: u32, r_off: u32, r_ld: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<TBIAS>;
// #if CPACK
@group(0) @binding(3) var<storage, read> res: array<u32>;  // float16 C and residual as u32 words
@group(0) @binding(4) var<storage, read_write> c: array<u32>;
// #else
@group(0) @binding(3) var<storage, read> res: array<TC>;
@group(0) @binding(4) var<storage, read_write> c: array<TC>;
// #endif

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let m = gid.y;
  let n0 = 4u * gid.x;
  if (m >= p.M || n0 >= p.N) { return; }
  var v = vec4<f32>();
  for (var s = 0u; s < p.S; s = s + 1u) {
    let i = s * p.ld_s + m * p.N + n0;
    for (var j = 0u; j < 4u; j = j + 1u) {
      if (n0 + j < p.N) { v[j] = v[j] + part[i + j]; }
    }
  }
  store4(m, n0, v);
}
