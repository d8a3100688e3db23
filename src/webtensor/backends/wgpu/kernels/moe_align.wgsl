// The slots of a mixture-of-experts step grouped by expert, on the device (vLLM's moe_align_block_size): each
// expert's slots (s = t k + j with ids[s] = e) listed in `order` from off[e], a multiple of BM, the list padded
// to whole blocks of BM with NONE; block b of `order` is expert block_expert[b]'s; n_blocks[0] the blocks used.
// One workgroup: counts in workgroup atomics, the offsets by thread 0 (E <= 256: a short serial scan), the
// slots placed by atomic cursors (their order within an expert varies from run to run; each slot's product
// does not depend on it). Ids outside 0 .. E - 1 are left out (their slots are not computed).
// Header: const BM (slots a block).
// Bounds (runtime checks may be off): e < E <= 256 indexes cnt / cur / off; ids[ids_off + s] with s < slots;
// order[i] with i < cap = (slots / BM + E) BM, which bounds off[E] = sum_e ceil(cnt_e / BM) BM <= slots + E BM;
// block_expert[b] with b < cap / BM. Loops end: uniform bounds in steps of 1 or 256.
struct P { slots: u32, E: u32, ids_off: u32, cap: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> ids: array<i32>;
@group(0) @binding(2) var<storage, read_write> order: array<u32>;
@group(0) @binding(3) var<storage, read_write> block_expert: array<u32>;
@group(0) @binding(4) var<storage, read_write> n_blocks: array<u32>;
const NONE: u32 = 0xffffffffu;
var<workgroup> cnt: array<atomic<u32>, 256>;
var<workgroup> cur: array<atomic<u32>, 256>;
var<workgroup> off: array<u32, 257>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32) {
  atomicStore(&cnt[li], 0u);
  atomicStore(&cur[li], 0u);
  for (var i = li; i < p.cap; i = i + 256u) { order[i] = NONE; }
  workgroupBarrier();
  for (var s = li; s < p.slots; s = s + 256u) {
    let e = u32(ids[p.ids_off + s]);
    if (e < p.E) { atomicAdd(&cnt[e], 1u); }
  }
  workgroupBarrier();
  if (li == 0u) {
    var o = 0u;
    for (var e = 0u; e < p.E; e = e + 1u) {
      off[e] = o;
      let blocks = (atomicLoad(&cnt[e]) + BM - 1u) / BM;
      for (var b = 0u; b < blocks; b = b + 1u) { block_expert[o / BM + b] = e; }
      o = o + blocks * BM;
    }
    off[p.E] = o;
    n_blocks[0] = o / BM;
  }
  workgroupBarrier();
  storageBarrier();
  for (var s = li; s < p.slots; s = s + 256u) {
    let e = u32(ids[p.ids_off + s]);
    if (e < p.E) { order[off[e] + atomicAdd(&cur[e], 1u)] = s; }
  }
}
