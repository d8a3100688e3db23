// Each row through its own experts (llama.cpp's MUL_MAT_ID), a float stack of expert matrices:
// o[s, n] = sum_k x[xrow(s), k] W[ids[s] N + n, k] for slot s = t k + j of row t (k slots a row), xrow(s)
// = t X + (j if X > 1 else 0), W the E experts' (N, K) matrices stacked along the rows (E N, K). The
// planner launches once per row chunk of the stack (rows row0 .. row0 + rows - 1 of W in this binding: a
// stack over the binding limit); a launch computes the outputs whose weight row falls in its chunk and
// leaves the others to the other launches. One thread an output: its dot product over K in a fixed
// order, so a slot's numbers are those of the slot alone.
// Header: alias TX, TW.
// Bounds (the kernels run without the compiler's runtime checks): slot s < slots (= T k) and n < N
// return before any read; an id outside 0 .. E - 1 (a negative one too, as u32) or a weight row outside
// the chunk returns before any read, so the chunk's row r < rows and w[w_off + r K + c], c < K, lies in
// this chunk's binding; x[x_off + xrow K + c] with xrow < T X; o[s N + n] inside the new (T k, N) output.
// Loops end: each runs to a uniform bound in steps of 1 (sizes stay under 2^31).
struct P { slots: u32, k: u32, X: u32, E: u32, N: u32, K: u32, row0: u32, rows: u32, x_off: u32, ids_off: u32,
           w_off: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<TX>;
@group(0) @binding(2) var<storage, read> w: array<TW>;
@group(0) @binding(3) var<storage, read> ids: array<i32>;
@group(0) @binding(4) var<storage, read_write> o: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let s = wg.y * 65535u + wg.z;
  let n = wg.x * 64u + li;
  if (s >= p.slots || n >= p.N) { return; }
  let e = u32(ids[p.ids_off + s]);
  if (e >= p.E) { return; }
  let gr = e * p.N + n;
  if (gr < p.row0 || gr >= p.row0 + p.rows) { return; }
  let t = s / p.k;
  var xrow = t;
  if (p.X > 1u) { xrow = s; }
  let xb = p.x_off + xrow * p.K;
  let wb = p.w_off + (gr - p.row0) * p.K;
  var acc = 0.0;
  for (var c = 0u; c < p.K; c = c + 1u) { acc = acc + f32(x[xb + c]) * f32(w[wb + c]); }
  o[s * p.N + n] = acc;
}
