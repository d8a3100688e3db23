// Argmax stage 2: one workgroup per row reduces the row's `parts` (value bits, index) pairs from
// argmax.wgsl to the index (int32), with the same order: first index among ties, NaN largest.
// Bounds (the kernels run without the compiler's runtime checks): row < rows and k < parts:
// part[row parts + k] inside the (rows, parts) pairs; o[row] inside the (rows,) result; argreduce's
// arrays by li < 256. Loops end: each runs to a uniform or constant bound in steps that cannot wrap
// (sizes stay under 2^31).
// #include argreduce.wgsl
struct P { rows: u32, parts: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> part: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read_write> o: array<i32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let row = wg.y * 65535u + wg.x;
  if (row >= p.rows) { return; }
  var bv = -3.4028234663852886e38;
  var bi = NO_INDEX;
  for (var k = li; k < p.parts; k = k + 256u) {
    let e = part[row * p.parts + k];
    let v = bitcast<f32>(e.x);
    if (arg_better(v, e.y, bv, bi)) { bv = v; bi = e.y; }
  }
  let r = arg_reduce(li, bv, bi);
  if (li == 0u) { o[row] = i32(r.i); }
}
