// KV-cache store: position pos[t] of sequence slot[t] gets src[t, h, :] for every row t and head h, through
// the block table (kv_pages.wgsl's kv_row: a paged pool of (n_blocks, block, H, D) rows, or a contiguous
// cache (n_slots, n_ctx, H, D) without one). src is a strided (T, H, D) view with unit stride along D (a
// third of the fused qkv rows); positions and slots come from one int32 buffer `ps` (at pos_off, slot_off),
// so a replayed step writes where the step state says. Rows whose position is negative or has no row
// (past the table, no block, a slot outside it) are skipped: nothing is stored. H is the cache's head count
// (KVH of a grouped-query model).
// float32 / float16 pools (alias KV): one thread an element, stored as KV. q8_0 pools (define Q8): one thread
// a (row, head, scale word): the (up to) two 32-dim blocks of that word, quantized as llama.cpp's q8_0
// (kv_pages.wgsl) and stored as 16 quant words and the scale word, so no two threads write one word.
// With const ROPE (1 rotate_half, 2 interleaved; 0 none) src is stored rotated, rope.wgsl's arithmetic
// (common.wgsl's rope_pair / rope_rot): dims d < 2 p.half by the angle of row pos[t] of the tables
// cos_t, sin_t (P, half) at tc_off, ts_off (the position clamped into 0 .. P - 1 as rope.wgsl does).
// Bounds: a thread returns unless i < T H D (Q8: i < T H SW, SW = ceil(D / 64)) so t < T, and unless
// kv_row gives a row (< n_blocks block: kv_pages.wgsl); the store index c_off + (row H + h) RW + e with
// h < H and e < RW (RW = D, or q8_words(D) for Q8) is inside the (n_blocks, block, H, RW) pool view at c_off;
// src's index is an element of its view (its partner's too: d's partner < 2 half <= D); ps at pos_off + t and
// slot_off + t < T past them, inside the view the planner binds; the tables' index tc_off (ts_off) + row *
// half + i with row <= P - 1 and i < half (rope_pair's column) is in the table; xs[k] with k < 64.
// These bounds are what the kernel relies on: it runs without the shader compiler's runtime checks. Loops
// end: each runs to a constant bound (64) or a uniform one in steps that cannot wrap.
// Header: alias TS (src's element type); alias KV (the pool's float type, KV16 for float16) or define Q8;
// const ROPE.
struct P {
  T: u32, H: u32, D: u32, src_off: u32,
  src_ts: u32, src_hs: u32, pos_off: u32, slot_off: u32,
  block: u32, max_blocks: u32, n_seqs: u32, n_blocks: u32,
  table_off: u32, c_off: u32, half: u32, P: u32,
  tc_off: u32, ts_off: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> src: array<TS>;
@group(0) @binding(2) var<storage, read> ps: array<i32>;
@group(0) @binding(3) var<storage, read> cos_t: array<f32>;
@group(0) @binding(4) var<storage, read> sin_t: array<f32>;
@group(0) @binding(5) var<storage, read> kv_table: array<i32>;
// #if Q8
@group(0) @binding(6) var<storage, read_write> cache: array<u32>;
// #else
@group(0) @binding(6) var<storage, read_write> cache: array<KV>;
// #endif
// #include kv_pages.wgsl

// dim d of row t's head h (src's element at base sb), rotated where ROPE says
fn value(t: u32, sb: u32, d: u32) -> f32 {
  var x = f32(src[sb + d]);
  if (ROPE != 0u && d < 2u * p.half) {
    let pr = rope_pair(d, p.half, ROPE == 2u);
    let row = u32(clamp(ps[p.pos_off + t], 0, i32(p.P - 1u)));
    x = rope_rot(x, f32(src[sb + pr.x]), cos_t[p.tc_off + row * p.half + pr.y], sin_t[p.ts_off + row * p.half + pr.y],
                 pr.z == 1u);
  }
  return x;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let i = (wg.y * nwg.x + wg.x) * 256u + li;
// #if Q8
  let SW = (p.D + 63u) / 64u;  // scale words (pairs of 32-dim blocks) a head
  let per_t = p.H * SW;
// #else
  let per_t = p.H * p.D;
// #endif
  if (i >= p.T * per_t) { return; }
  let t = i / per_t;
  let r = i % per_t;
  let pos = ps[p.pos_off + t];
  if (pos < 0) { return; }
  let row = kv_row(u32(ps[p.slot_off + t]), u32(pos));
  if (row == NO_ROW) { return; }
// #if Q8
  let h = r / SW;
  let m = r % SW;
  let sb = p.src_off + t * p.src_ts + h * p.src_hs;
  let RW = q8_words(p.D);
  let dst = p.c_off + (row * p.H + h) * RW;
  var xs: array<f32, 64>;
  var amax = vec2<f32>(0.0, 0.0);
  let nb = min(2u, p.D / 32u - 2u * m);  // blocks in this word: 2, or 1 (the last of an odd count)
  for (var k = 0u; k < 64u; k = k + 1u) {
    if (k < 32u * nb) {
      xs[k] = value(t, sb, 64u * m + k);
      amax[k / 32u] = max(amax[k / 32u], abs(xs[k]));
    }
  }
  let s0 = q8_scale_of(amax.x);
  let s1 = q8_scale_of(amax.y);
  for (var k = 0u; k < 16u; k = k + 1u) {
    if (k < 8u * nb) {
      let id = select(s0.y, s1.y, k >= 8u);
      cache[dst + 16u * m + k] = q8_pack(q8_quant(xs[4u * k], id), q8_quant(xs[4u * k + 1u], id),
                                         q8_quant(xs[4u * k + 2u], id), q8_quant(xs[4u * k + 3u], id));
    }
  }
  cache[dst + p.D / 4u + m] = pack2x16float(vec2<f32>(s0.x, select(0.0, s1.x, nb == 2u)));
// #else
  let sb = p.src_off + t * p.src_ts + (r / p.D) * p.src_hs;
  cache[p.c_off + row * per_t + r] = kv_of(value(t, sb, r % p.D));
// #endif
}
