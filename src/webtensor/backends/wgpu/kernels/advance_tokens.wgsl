// The end of a replayed decode step: the B new tokens become the next step's input ids, every
// row's position moves on by one, and the tokens are appended to a ring of `ring` steps that the
// host reads back in batches (tokens[count * B + b]); count counts steps. One workgroup.
// Bounds (the kernels run without the compiler's runtime checks): b < B indexes next_ids, ids and
// pos (B each); tokens[n B + b] only while n < ring, tokens being (ring, B) (the planner passes
// ring = its size / B); count[0]. Loops end: each runs to a uniform or constant bound in steps that
// cannot wrap (sizes stay under 2^31).
struct P { B: u32, ring: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> next_ids: array<i32>;
@group(0) @binding(2) var<storage, read_write> ids: array<i32>;
@group(0) @binding(3) var<storage, read_write> pos: array<i32>;
@group(0) @binding(4) var<storage, read_write> tokens: array<i32>;
@group(0) @binding(5) var<storage, read_write> count: array<i32>;
var<workgroup> n_sh: i32;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32) {
  if (li == 0u) { n_sh = count[0]; }
  let n = u32(workgroupUniformLoad(&n_sh));
  for (var b = li; b < p.B; b = b + 256u) {
    let v = next_ids[b];
    ids[b] = v;
    pos[b] = pos[b] + 1;
    if (n < p.ring) { tokens[n * p.B + b] = v; }
  }
  if (li == 0u) { count[0] = i32(n) + 1; }
}
