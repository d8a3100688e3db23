// LayerNorm over the last axis: one workgroup of 256 threads per row; two-pass mean / variance of
// the row scaled by its largest magnitude (so no overflow).
// Header: alias TX, TW, TO.
// Bounds (the kernels run without the compiler's runtime checks): row < rows and c < cols: x inside
// the planner's (rows, cols) view, w and bias [c] inside their (cols,) views, o inside the new
// (rows, cols) output. Loops end: each runs to a uniform or constant bound in steps that cannot
// wrap (sizes stay under 2^31).
struct P { rows: u32, cols: u32, x_off: u32, x_ld: u32, o_off: u32, eps: f32, w_off: u32, b_off: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<TX>;
@group(0) @binding(2) var<storage, read> w: array<TW>;
@group(0) @binding(3) var<storage, read> bias: array<TW>;
@group(0) @binding(4) var<storage, read_write> o: array<TO>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let row = wg.y * nwg.x + wg.x;
  if (row >= p.rows) { return; }
  let base = p.x_off + row * p.x_ld;
  // the row's largest magnitude decides whether it must be scaled (the variance could overflow)
  var mx = 0.0;
  for (var c = li; c < p.cols; c = c + 256u) { mx = max(mx, abs(f32(x[base + c]))); }
  // rows whose largest |x| is over 1e18 are multiplied by 2^-100: exact (a power of two), never a
  // denormal for the values that matter, and no reciprocal (GPUs flush 1/3e38 to zero); their eps is
  // scaled with them (to a floor that keeps a constant row at exactly `bias`)
  let big = wg_max(li, mx);
  var f = 1.0;
  var eps = p.eps;
  if (big > 1e18 && big <= 3.4028234663852886e38) { f = 7.888609052210118e-31; eps = 1e-30; }
  var s = 0.0;
  for (var c = li; c < p.cols; c = c + 256u) { s = s + f32(x[base + c]) * f; }
  let mean = wg_sum(li, s) / f32(p.cols);
  var q = 0.0;
  for (var c = li; c < p.cols; c = c + 256u) { let d = f32(x[base + c]) * f - mean; q = q + d * d; }
  let rstd = inverseSqrt(wg_sum(li, q) / f32(p.cols) + eps);
  let ob = p.o_off + row * p.cols;
  for (var c = li; c < p.cols; c = c + 256u) {
    o[ob + c] = TO((f32(x[base + c]) * f - mean) * rstd * f32(w[p.w_off + c]) + f32(bias[p.b_off + c]));
  }
}
