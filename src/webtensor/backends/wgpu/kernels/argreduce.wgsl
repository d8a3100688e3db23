// Shared by argmax.wgsl and argmax_parts.wgsl (`// #include argreduce.wgsl`): the order of
// (value, index) candidates and a workgroup reduction under it.
// Bounds (the kernels run without the compiler's runtime checks): best_v / best_i are indexed by li
// < 256 and by li + s with li < s <= 128. Loops end: each runs to a uniform or constant bound in
// steps that cannot wrap (sizes stay under 2^31).
const NO_INDEX: u32 = 0xffffffffu;
var<workgroup> best_v: array<f32, 256>;
var<workgroup> best_i: array<u32, 256>;

fn arg_is_nan(x: f32) -> bool {
  return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;  // by the bits: compilers may fold `x != x`
}

// Is candidate (v, i) preferred over (w, j)? NaN beats numbers, then larger, then the lower index;
// NO_INDEX (no candidate) loses to everything.
fn arg_better(v: f32, i: u32, w: f32, j: u32) -> bool {
  if (i == NO_INDEX) { return false; }
  if (j == NO_INDEX) { return true; }
  let v_nan = arg_is_nan(v);
  let w_nan = arg_is_nan(w);
  if (v_nan != w_nan) { return v_nan; }
  if (v_nan || v == w) { return i < j; }
  return v > w;
}

struct ArgBest { v: f32, i: u32 }

// The best of the 256 threads' candidates; every thread gets it.
fn arg_reduce(li: u32, v: f32, i: u32) -> ArgBest {
  best_v[li] = v;
  best_i[li] = i;
  workgroupBarrier();
  for (var s = 128u; s > 0u; s = s >> 1u) {
    if (li < s && arg_better(best_v[li + s], best_i[li + s], best_v[li], best_i[li])) {
      best_v[li] = best_v[li + s];
      best_i[li] = best_i[li + s];
    }
    workgroupBarrier();
  }
  let r = ArgBest(best_v[0], best_i[0]);
  workgroupBarrier();
  return r;
}
