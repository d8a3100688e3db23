// KV-cache store: cache[slot[t], pos[t], h, :] = src[t, h, :] for every row t and head h. The cache
// is (n_slots, n_ctx, H, D) float32, contiguous; src is a strided (T, H, D) view with unit stride
// along D (a third of the fused qkv rows). Positions and slots come from GPU tensors, so a replayed
// decode step writes where the step state says. Rows whose position is past the context are
// skipped, and so are rows whose slot is outside 0 .. n_slots-1 (slots are not checked on the
// device). One thread an element (the cache write is a sliver of a step's traffic). H is the
// cache's head count (KVH of a grouped-query model).
// With const ROPE (1 rotate_half, 2 interleaved; 0 none) src is stored rotated, rope.wgsl's arithmetic
// (common.wgsl's rope_pair / rope_rot): dims d < 2 p.half by the angle of row pos[t] of the tables
// cos_t, sin_t (P, half) at tc_off, ts_off (the position clamped into 0 .. P - 1 as rope.wgsl does).
// Bounds: a thread returns unless i < T H D (so t < T, r < H D) and unless pos[t] < n_ctx and
// slot[t] < n_slots as u32 (negative values are huge): the store index c_off + slot * slot_stride +
// pos * H D + r is inside the contiguous (n_slots, n_ctx, H, D) cache view starting at c_off; src's
// index is an element of its view (its partner's too: d's partner < 2 half <= D); the tables' index
// tc_off (ts_off) + row * half + i with row <= P - 1 and i < half (rope_pair's column) is in the table.
// These bounds are what the kernel relies on: it runs without the shader compiler's runtime
// checks. Loops end: each runs to a uniform or constant bound in steps that cannot wrap.
// Header: alias TS (src's element type); const ROPE.
struct P {
  T: u32, H: u32, D: u32, src_off: u32,
  src_ts: u32, src_hs: u32, n_ctx: u32, slot_stride: u32,
  n_slots: u32, c_off: u32, half: u32, P: u32,
  tc_off: u32, ts_off: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> src: array<TS>;
@group(0) @binding(2) var<storage, read> pos: array<i32>;
@group(0) @binding(3) var<storage, read> slot: array<i32>;
@group(0) @binding(4) var<storage, read> cos_t: array<f32>;
@group(0) @binding(5) var<storage, read> sin_t: array<f32>;
@group(0) @binding(6) var<storage, read_write> cache: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let i = (wg.y * nwg.x + wg.x) * 256u + li;  // flat (t, h, d)
  let per_t = p.H * p.D;
  if (i >= p.T * per_t) { return; }
  let t = i / per_t;
  let r = i % per_t;
  let ps = u32(pos[t]);
  let sl = u32(slot[t]);
  if (ps >= p.n_ctx || sl >= p.n_slots) { return; }
  let dst = p.c_off + sl * p.slot_stride + ps * per_t + r;
  let sb = p.src_off + t * p.src_ts + (r / p.D) * p.src_hs;
  let d = r % p.D;
  var x = f32(src[sb + d]);
  if (ROPE != 0u && d < 2u * p.half) {
    let pr = rope_pair(d, p.half, ROPE == 2u);
    let row = u32(clamp(pos[t], 0, i32(p.P - 1u)));
    x = rope_rot(x, f32(src[sb + pr.x]), cos_t[p.tc_off + row * p.half + pr.y], sin_t[p.ts_off + row * p.half + pr.y],
                 pr.z == 1u);
  }
  cache[dst] = x;
}
