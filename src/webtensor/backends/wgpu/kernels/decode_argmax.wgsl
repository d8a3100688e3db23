// Decode step, last kernel (greedy): the argmax of the logits becomes the next token, written to
// the step state and appended to the output ring; pos advances. One workgroup of 256 threads.
struct P { V: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> state: array<u32>;  // [pos, token, n_out]
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> tokens: array<u32>;
var<workgroup> bv: array<f32, 256>;
var<workgroup> bi: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32) {
  var best = -3.4028234663852886e38;
  var arg = 0xffffffffu;
  for (var i = li; i < p.V; i = i + 256u) {
    let v = logits[i];
    if (arg == 0xffffffffu || v > best) { best = v; arg = i; }  // first index among ties
  }
  bv[li] = best; bi[li] = arg;
  workgroupBarrier();
  for (var s = 128u; s > 0u; s = s >> 1u) {
    if (li < s) {
      let j = bi[li + s];
      if (j != 0xffffffffu && (bi[li] == 0xffffffffu || bv[li + s] > bv[li] || (bv[li + s] == bv[li] && j < bi[li]))) {
        bv[li] = bv[li + s]; bi[li] = j;
      }
    }
    workgroupBarrier();
  }
  if (li == 0u) {
    let n = state[2];
    tokens[n] = bi[0];
    state[1] = bi[0];
    state[2] = n + 1u;
    state[0] = state[0] + 1u;
  }
}
