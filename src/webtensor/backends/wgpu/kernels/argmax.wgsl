// Argmax over the last axis, stage 1: workgroup (part, row) reduces columns
// [part * per, (part + 1) * per) of its row to (value bits, index) in o[row * parts + part];
// argmax_parts.wgsl reduces a row's parts. Splitting a long row (GPT-2's 50,257 logits) over many
// workgroups keeps the scan off a single SM. First index among ties; NaN counts as largest (like
// numpy). Header: alias TX.
// Bounds (the kernels run without the compiler's runtime checks): row < rows and lo <= c < hi <=
// cols: x is read inside row `row` of the planner's (rows, cols) view; o[row parts + part] with
// part < parts (grid x) inside the (rows, parts) pair buffer; argreduce's arrays by li < 256. Loops
// end: each runs to a uniform or constant bound in steps that cannot wrap (sizes stay under 2^31).
// #include argreduce.wgsl
struct P { rows: u32, cols: u32, x_off: u32, x_ld: u32, parts: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<TX>;
@group(0) @binding(2) var<storage, read_write> o: array<vec2<u32>>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let part = wg.x;
  let row = wg.y * 65535u + wg.z;
  if (row >= p.rows) { return; }
  let per = (p.cols + p.parts - 1u) / p.parts;
  let lo = part * per;
  let hi = min(p.cols, lo + per);
  let base = p.x_off + row * p.x_ld;
  var bv = -3.4028234663852886e38;
  var bi = NO_INDEX;
  for (var c = lo + li; c < hi; c = c + 256u) {
    let v = f32(x[base + c]);
    if (arg_better(v, c, bv, bi)) { bv = v; bi = c; }
  }
  let r = arg_reduce(li, bv, bi);
  if (li == 0u) { o[row * p.parts + part] = vec2<u32>(bitcast<u32>(r.v), r.i); }
}
