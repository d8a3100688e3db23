// The main of expert_gemm.wgsl and expert_gemm_quant.wgsl: the grouped product of a mixture-of-experts step's
// slots (moe_align.wgsl's blocks of BM slots of one expert each). Workgroup (column tile, block b): 256
// threads, thread (ty, tx) = (li / 32, li % 32) computes output n = tile 32 + tx of the block's slots
// ty MS .. ty MS + MS - 1 (MS = BM / 8), each weight piece read once for its MS slots (and by the 8 ty threads
// of its column through the cache), where the GEMV reads it once a slot. A thread sums its outputs over K in
// order. The including file gives n_terms(), wterm(r, i) (piece i of the chunk's weight row r: a float, or a
// dequantized vec4), xterm(xb, i) (the same piece of x's row from xb) and tdot (their product, summed).
// Blocks past n_blocks, padding slots (NONE) and outputs whose weight row lies in another chunk of the stack
// compute nothing and write nothing.
// Bounds: b < n_blocks <= cap / BM indexes block_expert and order[b BM + m] (m < BM) inside moe_align's
// output; slot s < slots (order holds only slots and NONE), so xrow < T X and o[s N + n] with n < N lies in the
// (T k, N) output; the chunk's row r < rows (the row check) for wterm; acc[m] with m < MS.
const MS: u32 = BM / 8u;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let b = wg.y;
  if (b >= n_blocks[0]) { return; }
  let n = wg.x * 32u + li % 32u;
  let e = block_expert[b];
  let gr = e * p.N + n;
  if (n >= p.N || gr < p.row0 || gr >= p.row0 + p.rows) { return; }
  let r = gr - p.row0;
  var xb: array<u32, MS>;
  var slot: array<u32, MS>;
  for (var m = 0u; m < MS; m = m + 1u) {
    let s = order[b * BM + (li / 32u) * MS + m];
    slot[m] = s;
    var xrow = 0u;
    if (s != NONE) {
      xrow = s / p.k;
      if (p.X > 1u) { xrow = s; }
    }
    xb[m] = p.x_off + xrow * p.K;
  }
  var acc: array<f32, MS>;
  for (var i = 0u; i < n_terms(); i = i + 1u) {
    let w = wterm(r, i);
    for (var m = 0u; m < MS; m = m + 1u) { acc[m] = acc[m] + tdot(xterm(xb[m], i), w); }
  }
  for (var m = 0u; m < MS; m = m + 1u) {
    if (slot[m] != NONE) { o[slot[m] * p.N + n] = acc[m]; }
  }
}
