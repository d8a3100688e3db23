// KV-cache read: o[j, h, d] = the value at position j of sequence p.seq, head h, dim d, for j < n, as the
// pool stores it (float32 / float16: alias KV; q8_0: define Q8, quant * scale: kv_pages.wgsl), widened to
// float32: the contiguous (n, H, D) keys or values a prompt's attention reads (StepBatch.span). A position
// with no row (past the table, no block) reads as 0. One thread an element.
// Bounds: a thread returns unless i < n H D (so j < n, r < H D); kv_row gives a row < n_blocks block or
// NO_ROW (kv_pages.wgsl), and the pool is read at c_off + (row H + h) RW + e with h < H, e < RW (D, or
// q8_words(D) for Q8): inside the (n_blocks, block, H, RW) pool view at c_off; o's index is i < n H D.
// Loops: none.
// Header: alias KV (the pool's float type) or define Q8.
struct P {
  n: u32, H: u32, D: u32, seq: u32,
  block: u32, max_blocks: u32, n_seqs: u32, n_blocks: u32,
  table_off: u32, c_off: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> kv_table: array<i32>;
// #if Q8
@group(0) @binding(2) var<storage, read> cache: array<u32>;
// #else
@group(0) @binding(2) var<storage, read> cache: array<KV>;
// #endif
@group(0) @binding(3) var<storage, read_write> o: array<f32>;
// #include kv_pages.wgsl

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let i = (wg.y * nwg.x + wg.x) * 256u + li;
  let per_j = p.H * p.D;
  if (i >= p.n * per_j) { return; }
  let row = kv_row(p.seq, i / per_j);
  if (row == NO_ROW) {
    o[i] = 0.0;
    return;
  }
  let r = i % per_j;
// #if Q8
  let h = r / p.D;
  let d = r % p.D;
  let base = p.c_off + (row * p.H + h) * q8_words(p.D);
  o[i] = q8_lane(cache[base + d / 4u], q8_scale(cache[base + p.D / 4u + d / 64u], d / 32u))[d % 4u];
// #else
  o[i] = f32(cache[p.c_off + row * per_j + r]);
// #endif
}
