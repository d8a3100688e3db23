// KV-cache store: cache[slot[t], pos[t], h, :] = src[t, h, :] for every row t and head h. The cache
// is (n_slots, n_ctx, H, D) float32, contiguous; src is a strided (T, H, D) view with unit stride
// along D (a third of the fused qkv rows). Positions and slots come from GPU tensors, so a replayed
// decode step writes where the step state says. Rows whose position is past the context are
// skipped, and so are rows whose slot is not one of the cache's n_slots (GPU data: never trusted
// as an index). One thread an element (the cache write is a sliver of a step's traffic).
// Bounds (the kernels run without the compiler's runtime checks): i < T H D covers src's view
// exactly (its offset and strides keep it in its buffer); a destination is slot * slot_stride + pos
// * H D + r with slot < n_slots, pos < n_ctx (both as u32, so a negative one is huge and skipped)
// and r < H D: inside the (n_slots, n_ctx, H, D) cache. Loops end: each runs to a uniform or
// constant bound in steps that cannot wrap (sizes stay under 2^31).
// Header: alias TS (src's element type).
struct P { T: u32, H: u32, D: u32, src_off: u32, src_ts: u32, src_hs: u32, n_ctx: u32, slot_stride: u32, n_slots: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> src: array<TS>;
@group(0) @binding(2) var<storage, read> pos: array<i32>;
@group(0) @binding(3) var<storage, read> slot: array<i32>;
@group(0) @binding(4) var<storage, read_write> cache: array<f32>;

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
  let dst = sl * p.slot_stride + ps * per_t + r;
  cache[dst] = f32(src[p.src_off + t * p.src_ts + (r / p.D) * p.src_hs + r % p.D]);
}
