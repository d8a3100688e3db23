// Decode step, first kernel: x = wte[token] + wpe[pos], token and pos read from the GPU-resident
// step state (so the sampled token never visits the CPU). A row-chunked wte is covered by one
// dispatch per chunk (rows row0 .. row0+rows); only the chunk holding the token writes.
// Header: alias TT (wte), TP (wpe).
struct P { C: u32, row0: u32, rows: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> state: array<u32>;  // [pos, token, n_out]
@group(0) @binding(2) var<storage, read_write> wte: array<TT>;
@group(0) @binding(3) var<storage, read_write> wpe: array<TP>;
@group(0) @binding(4) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let c = gid.x;
  let tok = state[1];
  if (c >= p.C || tok < p.row0 || tok >= p.row0 + p.rows) { return; }
  x[c] = f32(wte[(tok - p.row0) * p.C + c]) + f32(wpe[state[0] * p.C + c]);
}
