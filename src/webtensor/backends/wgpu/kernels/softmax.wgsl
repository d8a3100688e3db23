// Softmax over the last axis: one workgroup per row; max-subtracted for stability.
// Header: alias TX, TO.
// Bounds (the kernels run without the compiler's runtime checks): row < rows and c < cols: x inside
// the planner's (rows, cols) view, o inside the new (rows, cols) output. Loops end: each runs to a
// uniform or constant bound in steps that cannot wrap (sizes stay under 2^31).
struct P { rows: u32, cols: u32, x_off: u32, x_ld: u32, o_off: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<TX>;
@group(0) @binding(2) var<storage, read_write> o: array<TO>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let row = wg.y * nwg.x + wg.x;
  if (row >= p.rows) { return; }
  let base = p.x_off + row * p.x_ld;
  var m = -3.4028234663852886e38;
  for (var c = li; c < p.cols; c = c + 256u) { m = max(m, f32(x[base + c])); }
  m = wg_max(li, m);
  var t = 0.0;
  for (var c = li; c < p.cols; c = c + 256u) { t = t + exp(f32(x[base + c]) - m); }
  let inv = 1.0 / wg_sum(li, t);
  let ob = p.o_off + row * p.cols;
  for (var c = li; c < p.cols; c = c + 256u) { o[ob + c] = TO(exp(f32(x[base + c]) - m) * inv); }
}
