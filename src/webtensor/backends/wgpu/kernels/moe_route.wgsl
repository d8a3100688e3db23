// A mixture-of-experts router: row r of the logits (rows, E) -> its k experts of the largest logits in
// descending order (the lower id first among equal logits: the order of (-logit, id)) in ids[r k ..
// r k + k - 1], and their softmax probabilities over all E in w, divided by their sum where p.norm is 1.
// One thread a row: a router row is short (E <= a few hundred) and k small, so the k selection passes
// over the row (each pick the best of those ordered after the previous pick) cost less than a sort
// would; the row's sums run in a fixed order, so a row's result does not depend on the rows beside it.
// NaN logits are never picked after the first pick (undefined order).
// Header: alias TX.
// Bounds (the kernels run without the compiler's runtime checks): row < rows; columns e < E inside
// row `row` of the planner's (rows, E) view of x; the chosen id bi starts at 0 and is only set to
// some e < E, so each write ids[row k + j], w[row k + j] has j < k, inside the new (rows, k) outputs.
// Loops end: each runs to a uniform bound in steps of 1 (sizes stay under 2^31).
struct P { rows: u32, E: u32, k: u32, norm: u32, x_off: u32, x_ld: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<TX>;
@group(0) @binding(2) var<storage, read_write> ids: array<i32>;
@group(0) @binding(3) var<storage, read_write> w: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let row = (wg.y * nwg.x + wg.x) * 64u + li;
  if (row >= p.rows) { return; }
  let base = p.x_off + row * p.x_ld;
  var mx = -3.4028234663852886e38;
  for (var e = 0u; e < p.E; e = e + 1u) { mx = max(mx, f32(x[base + e])); }
  var total = 0.0;
  for (var e = 0u; e < p.E; e = e + 1u) { total = total + exp(f32(x[base + e]) - mx); }
  var pv = 0.0;  // the previous pick's logit and id
  var pi = 0u;
  var picked = 0.0;  // the sum of the picks' probabilities
  for (var j = 0u; j < p.k; j = j + 1u) {
    var bv = 0.0;
    var bi = 0u;
    var found = false;
    for (var e = 0u; e < p.E; e = e + 1u) {
      let v = f32(x[base + e]);
      let after = j == 0u || v < pv || (v == pv && e > pi);
      if (after && (!found || v > bv)) { bv = v; bi = e; found = true; }
    }
    let prob = exp(bv - mx) / total;
    ids[row * p.k + j] = i32(bi);
    w[row * p.k + j] = prob;
    picked = picked + prob;
    pv = bv;
    pi = bi;
  }
  if (p.norm == 1u) {
    for (var j = 0u; j < p.k; j = j + 1u) { w[row * p.k + j] = w[row * p.k + j] / picked; }
  }
}
