// A grammar's mask on logits rows: o[r, c] = x[r, c] where bit c % 32 (least significant first) of
// bits[r * words + c / 32] is set, else -inf (ops.token_mask). One thread an element; workgroup
// (column block, row) with rows numbered wg.y * 65535 + wg.z. Header: alias TX.
// Bounds: c < cols and r < rows are checked before any access; x reads x_off + r * x_ld + c, inside
// x for the (rows, cols) view the planner passes; bits reads r * words + c / 32 < rows * words, its
// size (ops.token_mask checks the shape); o writes r * cols + c < rows * cols, its size. No data is
// used as an index.
struct P { rows: u32, cols: u32, words: u32, x_off: u32, x_ld: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<TX>;
@group(0) @binding(2) var<storage, read> bits: array<u32>;
@group(0) @binding(3) var<storage, read_write> o: array<TX>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let c = wg.x * 256u + li;
  let r = wg.y * 65535u + wg.z;
  if (c >= p.cols || r >= p.rows) { return; }
  let word = bits[r * p.words + c / 32u];
  let keep = ((word >> (c % 32u)) & 1u) == 1u;
  let neg_inf = TX(bitcast<f32>(0xff800000u | (p.rows & 0u)));  // (-inf, made at run time: not a constant)
  o[r * p.cols + c] = select(neg_inf, x[p.x_off + r * p.x_ld + c], keep);
}
