// The matmul engine's core, included where matmul_engine.wgsl (float B) and matmul_engine_quant.wgsl (B a
// quantized weight) say `// #include matmul_engine_core.wgsl`: register-tiled SIMT C[M, N] = A[M, K] @ B[K, N]
// + epilogue for GPUs (prefill, batches). A workgroup of 256 threads (16 x 16) computes a (64 MT) x (64 NT)
// tile of C; each thread holds a (4 MT) x (4 NT) block of outputs in named vec4 registers (no indexed private
// arrays). K advances in steps of BK through double-buffered workgroup tiles of A and B: the next step's
// vec4 global loads are issued into registers before the current step's FMAs, stored into the other buffer
// after them, and one barrier a step separates the two (2 BK (64 MT + 64 NT) values of workgroup memory:
// 16 KiB at most with f32 tiles at BK = 8 or f16 tiles at BK = 16; f32 tiles at BK = 16 take 16 to 32
// KiB, asked for only where the device has it: ops.engine_bk). A is read through (row stride lda, unit K
// stride), as vec4 along K: its rows and offset must be 4-aligned (in elements); M and K are arbitrary
// (tails masked). Arithmetic: products in CT (f32, or f16 for packed
// `vec4<f16>` FMAs). With CHUNKED, the CT accumulators cover one BK step only and are then added into f32
// accumulators, which bounds the f16 accumulation error to sums of BK terms. Epilogue: + bias, the
// activation, + residual (epilogue.wgsl). The accumulators, prefetch registers and loop state are
// function-scope `var`s of main, handed to the helpers by pointer (structs Acc, Tot) or by value (Pre); no
// module-scope var<private>.
// Split-K: the launch's grid z is the K slice, workgroup z sums k in [z ks, (z + 1) ks) (ks a multiple of
// BK; p.ks = 0: the whole of K). With SPLIT the raw sums (no epilogue, TC = f32, no CPACK) go to
// c[c_off + z c_zs + m ldc + n], and matmul_splitk_sum.wgsl adds the slices and applies the epilogue.
//
// What the including kernel supplies: its struct P with M, N, K, acc, a_off4, lda4, c_off, ldc, epi,
// bias_off, r_off, r_ld, ks, c_zs (plus what its B needs); the bindings a (array<AV>), bias, res and c;
// fn a_vec(AV) -> vec4<TS>; and fn fetch_b(e, n0, k0) -> vec4<TS>: vec4 e (< B_VEC, else 0) of the B tile of
// the step starting at k0 for columns n0 .., zero outside [0, K) x [0, N): with B_KMAJOR the four values
// k = k0 + 4 (e % KQ) .. of column n = n0 + e / KQ, else the four columns n0 + 4 (e % NV) .. of row
// k = k0 + e / NV.
// Header: alias TC, TBIAS, TS (workgroup tile type), CT; const MT, NT (1 or 2), BK (8 or 16), B_KMAJOR,
// CHUNKED, CPACK, SPLIT.
// Bounds (the kernels run without the compiler's runtime checks): load_a reads a vec4 only when its row
// m < M and its first element 4 kq < K are in range; with K not a multiple of 4 its last lanes may pass the
// tensor's end, but never its buffer: the planner requires 4-aligned offsets and row strides, and every pool
// buffer is a multiple of 16 bytes (context._bucket), so a vec4 whose first element is in the buffer is
// wholly in it (the lanes past the end are masked to 0). A_VEC and B_VEC are at most 4 (16 MT) (16 / 4) =
// 512, so a thread's two prefetch loads (li, li + 256) cover a tile. put_a / put_b: r < 64 MT (64 NT),
// k + 3 < BK, so As / Bs stay under 2 BK MV (NV); mma reads As[ar + ty (+ 16)] and Bs[br + tx (+ 16)] under the same
// bounds. Split-K: the planner makes S = ceil(K / ks), so every slice starts below K; out4 writes m < M,
// n < N of slice z < S of the (S, M, N) scratch. Loops end: each runs to a uniform or constant bound in
// steps that cannot wrap (sizes stay under 2^31).
// #include epilogue.wgsl

const MV = 16u * MT;            // the A tile's rows / 4 (vec4s along M in workgroup memory)
const NV = 16u * NT;            // the B tile's columns / 4
const KQ = BK / 4u;             // vec4s along K per tile row
const A_VEC = 4u * MV * KQ;     // vec4 global loads per A tile
const B_VEC = 4u * NV * KQ;
// workgroup tiles, [buffer][k][m / 4] and [buffer][k][n / 4]
var<workgroup> As: array<vec4<TS>, 2u * BK * MV>;
var<workgroup> Bs: array<vec4<TS>, 2u * BK * NV>;

// lanes of the vec4 starting at element i0 that lie below lim
fn lanes_below(i0: u32, lim: u32) -> vec4<bool> {
  return (vec4<u32>(i0) + vec4<u32>(0u, 1u, 2u, 3u)) < vec4<u32>(lim);
}

// vec4 kq (elements 4 kq ..) of row m of A, zero outside [0, M) x [0, K)
fn load_a(m: u32, kq: u32) -> vec4<TS> {
  if (m >= p.M || kq * 4u >= p.K) { return vec4<TS>(); }
  let v = a_vec(a[p.a_off4 + m * p.lda4 + kq]);
  return select(vec4<TS>(), v, lanes_below(kq * 4u, p.K));
}

fn fetch_a(e: u32, m0: u32, k0: u32) -> vec4<TS> {
  if (e >= A_VEC) { return vec4<TS>(); }
  return load_a(m0 + e / KQ, k0 / 4u + e % KQ);
}

// A vec4 (row r, k = 4 kq ..) goes to As[buf][k][r / 4] component r % 4 (transposed)
fn put_a(e: u32, buf: u32, v: vec4<TS>) {
  if (e >= A_VEC) { return; }
  let r = e / KQ;
  let k = (e % KQ) * 4u;
  let base = (buf * BK + k) * MV + r / 4u;
  As[base][r % 4u] = v.x;
  As[base + MV][r % 4u] = v.y;
  As[base + 2u * MV][r % 4u] = v.z;
  As[base + 3u * MV][r % 4u] = v.w;
}

fn put_b(e: u32, buf: u32, v: vec4<TS>) {
  if (e >= B_VEC) { return; }
  if (B_KMAJOR) {
    let r = e / KQ;
    let k = (e % KQ) * 4u;
    let base = (buf * BK + k) * NV + r / 4u;
    Bs[base][r % 4u] = v.x;
    Bs[base + NV][r % 4u] = v.y;
    Bs[base + 2u * NV][r % 4u] = v.z;
    Bs[base + 3u * NV][r % 4u] = v.w;
  } else {
    Bs[(buf * BK + e / NV) * NV + e % NV] = v;
  }
}

fn total(cv: vec4<CT>, ov: vec4<f32>) -> vec4<f32> {
  if (CHUNKED) { return ov; }
  return vec4<f32>(cv);
}

// the function-scope form: main's own vars, handed to the helpers
// accumulators: row r of the thread's block (0..3: from a0, 4..7: from a1), column half h
struct Acc {
  c00: vec4<CT>, c01: vec4<CT>, c10: vec4<CT>, c11: vec4<CT>, c20: vec4<CT>, c21: vec4<CT>, c30: vec4<CT>, c31: vec4<CT>,
  c40: vec4<CT>, c41: vec4<CT>, c50: vec4<CT>, c51: vec4<CT>, c60: vec4<CT>, c61: vec4<CT>, c70: vec4<CT>, c71: vec4<CT>,
}
// f32 totals of the CT accumulators (CHUNKED only)
struct Tot {
  o00: vec4<f32>, o01: vec4<f32>, o10: vec4<f32>, o11: vec4<f32>, o20: vec4<f32>, o21: vec4<f32>, o30: vec4<f32>,
  o31: vec4<f32>, o40: vec4<f32>, o41: vec4<f32>, o50: vec4<f32>, o51: vec4<f32>, o60: vec4<f32>, o61: vec4<f32>,
  o70: vec4<f32>, o71: vec4<f32>,
}
// this thread's prefetch registers (at most two vec4 loads per operand per step)
struct Pre { a0: vec4<TS>, a1: vec4<TS>, b0: vec4<TS>, b1: vec4<TS>, }

// global -> registers for the step starting at k0
fn fetch(li: u32, m0: u32, n0: u32, k0: u32) -> Pre {
  var r = Pre();
  r.a0 = fetch_a(li, m0, k0);
  r.b0 = fetch_b(li, n0, k0);
  if (A_VEC > 256u) { r.a1 = fetch_a(li + 256u, m0, k0); }
  if (B_VEC > 256u) { r.b1 = fetch_b(li + 256u, n0, k0); }
  return r;
}

// registers -> workgroup buffer `buf`
fn put(li: u32, buf: u32, r: Pre) {
  put_a(li, buf, r.a0);
  put_b(li, buf, r.b0);
  if (A_VEC > 256u) { put_a(li + 256u, buf, r.a1); }
  if (B_VEC > 256u) { put_b(li + 256u, buf, r.b1); }
}

// the FMAs of one BK step from workgroup buffer `buf` into *acc
fn mma(buf: u32, tx: u32, ty: u32, acc: ptr<function, Acc>) {
  for (var k = 0u; k < BK; k = k + 1u) {
    let ar = (buf * BK + k) * MV;
    let br = (buf * BK + k) * NV;
    let a0 = vec4<CT>(As[ar + ty]);
    let b0 = vec4<CT>(Bs[br + tx]);
    var b1 = vec4<CT>();
    if (NT == 2u) { b1 = vec4<CT>(Bs[br + 16u + tx]); }
    (*acc).c00 = fma(vec4<CT>(a0.x), b0, (*acc).c00);
    (*acc).c10 = fma(vec4<CT>(a0.y), b0, (*acc).c10);
    (*acc).c20 = fma(vec4<CT>(a0.z), b0, (*acc).c20);
    (*acc).c30 = fma(vec4<CT>(a0.w), b0, (*acc).c30);
    if (NT == 2u) {
      (*acc).c01 = fma(vec4<CT>(a0.x), b1, (*acc).c01);
      (*acc).c11 = fma(vec4<CT>(a0.y), b1, (*acc).c11);
      (*acc).c21 = fma(vec4<CT>(a0.z), b1, (*acc).c21);
      (*acc).c31 = fma(vec4<CT>(a0.w), b1, (*acc).c31);
    }
    if (MT == 2u) {
      let a1 = vec4<CT>(As[ar + 16u + ty]);
      (*acc).c40 = fma(vec4<CT>(a1.x), b0, (*acc).c40);
      (*acc).c50 = fma(vec4<CT>(a1.y), b0, (*acc).c50);
      (*acc).c60 = fma(vec4<CT>(a1.z), b0, (*acc).c60);
      (*acc).c70 = fma(vec4<CT>(a1.w), b0, (*acc).c70);
      if (NT == 2u) {
        (*acc).c41 = fma(vec4<CT>(a1.x), b1, (*acc).c41);
        (*acc).c51 = fma(vec4<CT>(a1.y), b1, (*acc).c51);
        (*acc).c61 = fma(vec4<CT>(a1.z), b1, (*acc).c61);
        (*acc).c71 = fma(vec4<CT>(a1.w), b1, (*acc).c71);
      }
    }
  }
}

// CHUNKED: add the step's CT sums into the f32 totals *tot and restart them (*acc = 0)
fn flush(acc: ptr<function, Acc>, tot: ptr<function, Tot>) {
  (*tot).o00 += vec4<f32>((*acc).c00); (*tot).o10 += vec4<f32>((*acc).c10);
  (*tot).o20 += vec4<f32>((*acc).c20); (*tot).o30 += vec4<f32>((*acc).c30);
  if (NT == 2u) {
    (*tot).o01 += vec4<f32>((*acc).c01); (*tot).o11 += vec4<f32>((*acc).c11);
    (*tot).o21 += vec4<f32>((*acc).c21); (*tot).o31 += vec4<f32>((*acc).c31);
  }
  if (MT == 2u) {
    (*tot).o40 += vec4<f32>((*acc).c40); (*tot).o50 += vec4<f32>((*acc).c50);
    (*tot).o60 += vec4<f32>((*acc).c60); (*tot).o70 += vec4<f32>((*acc).c70);
    if (NT == 2u) {
      (*tot).o41 += vec4<f32>((*acc).c41); (*tot).o51 += vec4<f32>((*acc).c51);
      (*tot).o61 += vec4<f32>((*acc).c61); (*tot).o71 += vec4<f32>((*acc).c71);
    }
  }
  *acc = Acc();
}

// four results of row m from column n0 on, of K slice z
// #if SPLIT
fn out4(m: u32, n0: u32, z: u32, v: vec4<f32>) {  // raw partial sums (TC = f32) into slice z
  if (m >= p.M) { return; }
  let ci = p.c_off + z * p.c_zs + m * p.ldc + n0;
  for (var j = 0u; j < 4u; j = j + 1u) {
    if (n0 + j < p.N) { c[ci + j] = TC(v[j]); }
  }
}
// #else
fn out4(m: u32, n0: u32, z: u32, v: vec4<f32>) { store4(m, n0, v); }  // through the epilogue
// #endif

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let tx = li % 16u;  // columns n0 + 4 tx .. (+ 64 when NT == 2)
  let ty = li / 16u;  // rows m0 + 4 ty .. (+ 64 when MT == 2)
  let m0 = wg.y * 64u * MT;
  let n0 = wg.x * 64u * NT;
  let ks = select(p.K, p.ks, p.ks != 0u);
  let kb = wg.z * ks;  // this slice: k in [kb, min(K, kb + ks))
  let steps = (min(p.K, kb + ks) - kb + BK - 1u) / BK;
  var acc = Acc();
  var tot = Tot();
  var r = fetch(li, m0, n0, kb);
  put(li, 0u, r);
  workgroupBarrier();
  for (var s = 0u; s < steps; s = s + 1u) {
    let more = s + 1u < steps;
    if (more) { r = fetch(li, m0, n0, kb + (s + 1u) * BK); }
    mma(s % 2u, tx, ty, &acc);
    if (CHUNKED) { flush(&acc, &tot); }
    if (more) { put(li, (s + 1u) % 2u, r); }
    workgroupBarrier();
  }
  let m = m0 + 4u * ty;
  let n = n0 + 4u * tx;
  let z = wg.z;
  out4(m, n, z, total(acc.c00, tot.o00));
  out4(m + 1u, n, z, total(acc.c10, tot.o10));
  out4(m + 2u, n, z, total(acc.c20, tot.o20));
  out4(m + 3u, n, z, total(acc.c30, tot.o30));
  if (NT == 2u) {
    out4(m, n + 64u, z, total(acc.c01, tot.o01));
    out4(m + 1u, n + 64u, z, total(acc.c11, tot.o11));
    out4(m + 2u, n + 64u, z, total(acc.c21, tot.o21));
    out4(m + 3u, n + 64u, z, total(acc.c31, tot.o31));
  }
  if (MT == 2u) {
    out4(m + 64u, n, z, total(acc.c40, tot.o40));
    out4(m + 65u, n, z, total(acc.c50, tot.o50));
    out4(m + 66u, n, z, total(acc.c60, tot.o60));
    out4(m + 67u, n, z, total(acc.c70, tot.o70));
    if (NT == 2u) {
      out4(m + 64u, n + 64u, z, total(acc.c41, tot.o41));
      out4(m + 65u, n + 64u, z, total(acc.c51, tot.o51));
      out4(m + 66u, n + 64u, z, total(acc.c61, tot.o61));
      out4(m + 67u, n + 64u, z, total(acc.c71, tot.o71));
    }
  }
}
