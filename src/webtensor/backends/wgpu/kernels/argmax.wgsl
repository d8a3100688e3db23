// Argmax over the last axis (first index among ties, NaN counts as largest, like numpy):
// one workgroup per row. Header: alias TX.
struct P { rows: u32, cols: u32, x_off: u32, x_ld: u32, o_off: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<TX>;
@group(0) @binding(2) var<storage, read_write> o: array<i32>;
var<workgroup> best_v: array<f32, 256>;
var<workgroup> best_i: array<u32, 256>;

fn is_nan(x: f32) -> bool {
  return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;  // by the bits: compilers may fold `x != x`
}

fn better(v: f32, i: u32, w: f32, j: u32) -> bool {
  // is (v, i) preferred over (w, j)?
  let v_nan = is_nan(v);
  let w_nan = is_nan(w);
  if (v_nan != w_nan) { return v_nan; }
  if (v_nan || v == w) { return i < j; }
  return v > w;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let row = wg.y * nwg.x + wg.x;
  if (row >= p.rows) { return; }
  let base = p.x_off + row * p.x_ld;
  var bv = -3.4028234663852886e38;
  var bi = 0xffffffffu;
  for (var c = li; c < p.cols; c = c + 256u) {
    let v = f32(x[base + c]);
    if (bi == 0xffffffffu || better(v, c, bv, bi)) { bv = v; bi = c; }
  }
  best_v[li] = bv; best_i[li] = bi;
  workgroupBarrier();
  for (var s = 128u; s > 0u; s = s >> 1u) {
    if (li < s) {
      let j = best_i[li + s];
      if (j != 0xffffffffu && (best_i[li] == 0xffffffffu || better(best_v[li + s], j, best_v[li], best_i[li]))) {
        best_v[li] = best_v[li + s]; best_i[li] = j;
      }
    }
    workgroupBarrier();
  }
  if (li == 0u) { o[p.o_off + row] = i32(best_i[0]); }
}
