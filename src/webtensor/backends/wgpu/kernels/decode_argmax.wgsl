// Decode step, greedy: the argmax of the logits becomes the next token, in two stages so the scan
// of V logits spreads over many workgroups. Stage 1 (STAGE = 1u, PARTS workgroups): each reduces a
// slice to (value, index) in `part`. Stage 2 (STAGE = 2u, one workgroup): reduces the parts, writes
// the token to the step state and the output ring, advances pos. First index among ties.
// Header: const STAGE, PARTS.
struct P { V: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> state: array<u32>;  // [pos, token, n_out]
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> tokens: array<u32>;
@group(0) @binding(4) var<storage, read_write> part: array<vec2<u32>>;  // (bits of value, index)
var<workgroup> bv: array<f32, 256>;
var<workgroup> bi: array<u32, 256>;

const NONE: u32 = 0xffffffffu;

fn take(li: u32, v: f32, i: u32) {
  if (i != NONE && (bi[li] == NONE || v > bv[li] || (v == bv[li] && i < bi[li]))) { bv[li] = v; bi[li] = i; }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  bv[li] = -3.4028234663852886e38;
  bi[li] = NONE;
  if (STAGE == 1u) {
    let per = (p.V + PARTS - 1u) / PARTS;
    let lo = wg.x * per;
    let hi = min(p.V, lo + per);
    for (var i = lo + li; i < hi; i = i + 256u) { take(li, logits[i], i); }
  } else {
    for (var i = li; i < PARTS; i = i + 256u) { take(li, bitcast<f32>(part[i].x), part[i].y); }
  }
  workgroupBarrier();
  for (var s = 128u; s > 0u; s = s >> 1u) {
    if (li < s) { take(li, bv[li + s], bi[li + s]); }
    workgroupBarrier();
  }
  if (li == 0u) {
    if (STAGE == 1u) {
      part[wg.x] = vec2<u32>(bitcast<u32>(bv[0]), bi[0]);
    } else {
      let n = state[2];
      tokens[n] = bi[0];
      state[1] = bi[0];
      state[2] = n + 1u;
      state[0] = state[0] + 1u;
    }
  }
}
