// The main of expert_gemv.wgsl and expert_gemv_quant.wgsl (each row through its own experts): a workgroup of
// 256 threads computes ROWS = 256 / LANES outputs n of one slot s = t k + j, LANES threads an output striding
// over its terms (consecutive lanes read consecutive pieces of the weight row: coalesced), each lane's partial
// sum in order, then a tree over the lanes in workgroup memory. The including file gives n_terms() (pieces a
// row: K values, or K / 4 vec4s) and term(xb, r, i) (piece i of x's row from xb dotted with piece i of the
// chunk's weight row r). An output's sum runs in an order fixed by LANES (a device constant for a given K), so
// a slot's numbers are those of the slot alone. Outputs whose weight row lies in another chunk of the stack (or
// whose id is outside 0 .. E - 1) compute nothing and write nothing: the launch of their chunk does.
// Bounds: s < slots returns (uniformly) before anything; `live` outputs only (n < N, e < E, row in the chunk)
// call term(), so the chunk's row r < rows; xrow < T X; red[li], li < 256, red[li + stride] with lane + stride
// < LANES, inside the lane's own group of LANES; o[s N + n] with n < N inside the (T k, N) output.
const ROWS: u32 = 256u / LANES;
var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let s = wg.y * 65535u + wg.z;
  if (s >= p.slots) { return; }
  let lane = li % LANES;
  let n = wg.x * ROWS + li / LANES;
  var live = n < p.N;
  var r = 0u;
  if (live) {
    let e = u32(ids[p.ids_off + s]);
    let gr = e * p.N + n;
    live = e < p.E && gr >= p.row0 && gr < p.row0 + p.rows;
    r = gr - p.row0;
  }
  var xrow = s / p.k;
  if (p.X > 1u) { xrow = s; }
  let xb = p.x_off + xrow * p.K;
  var acc = 0.0;
  if (live) {
    for (var i = lane; i < n_terms(); i = i + LANES) { acc = acc + term(xb, r, i); }
  }
  if (LANES > 1u) {
    red[li] = acc;
    workgroupBarrier();
    for (var stride = LANES / 2u; stride > 0u; stride = stride / 2u) {
      if (lane < stride) { red[li] = red[li] + red[li + stride]; }
      workgroupBarrier();
    }
    acc = red[li];
  }
  if (live && lane == 0u) { o[s * p.N + n] = acc; }
}
