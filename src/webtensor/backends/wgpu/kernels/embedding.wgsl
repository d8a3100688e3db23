// Row gather: out[t, :] = table[ids[t], :] for the ids that fall in this chunk of the table
// (rows row0 .. row0+rows); other rows are left for the dispatch of their own chunk.
// Header: alias TT, TO.
// Bounds (the kernels run without the compiler's runtime checks): t < n_ids reads ids at ids_off +
// t (the ids tensor's own elements); a row is read only when row0 <= id < row0 + rows (ids are GPU
// data: negative or too large ids are skipped), at (id - row0) cols + c with c < cols: inside this
// chunk of the table; o[t cols + c] inside the (n_ids, cols) output. Loops end: each runs to a
// uniform or constant bound in steps that cannot wrap (sizes stay under 2^31).
struct P { n_ids: u32, cols: u32, row0: u32, rows: u32, ids_off: u32, o_off: u32, t_off: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> table: array<TT>;
@group(0) @binding(2) var<storage, read> ids: array<i32>;
@group(0) @binding(3) var<storage, read_write> o: array<TO>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let t = wg.y * nwg.x + wg.x;
  if (t >= p.n_ids) { return; }
  let id = u32(ids[p.ids_off + t]);
  if (id < p.row0 || id >= p.row0 + p.rows) { return; }
  let src = p.t_off + (id - p.row0) * p.cols;
  let dst = p.o_off + t * p.cols;
  for (var c = li; c < p.cols; c = c + 256u) { o[dst + c] = TO(table[src + c]); }
}
