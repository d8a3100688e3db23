// What the cache variants of the prefill attention kernels (attention_tiled_cache.wgsl, attention_flash_cache.wgsl:
// included where they say `// #include attention_cache_rows.wgsl`) know of their rows: one sequence's rows, at
// positions pos[t] of slot slot[0] (device tensors: never trusted as indices). Row t sees keys j < row_limit(t) =
// pos[t] + 1 (at most the context's n_ctx), none at a negative position or when the slot is outside the cache;
// block_keys is the largest limit among a block's 64 rows (found by one thread, read uniformly). The includer
// declares p (with T, n_ctx, n_slots), pos and slot.
// Bounds: pos is read at rows clamped to T - 1 and slot at 0 (the planner binds tensors of T rows from element 0);
// a limit is at most n_ctx and nonzero only for a slot < n_slots, so a caller reading keys j < block_keys of
// slot sequence() stays inside the slot. Loops end: block_keys runs over at most 64 rows.

// the sequence's slot (n_slots where it is out of range: every limit is then 0, no key is read)
fn sequence() -> u32 { return min(u32(slot[0]), p.n_slots); }

fn row_limit(t: u32) -> u32 {
  let ps = pos[min(t, p.T - 1u)];
  if (ps < 0 || u32(slot[0]) >= p.n_slots) { return 0u; }
  return min(u32(ps) + 1u, p.n_ctx);
}

var<workgroup> n_keys_sh: u32;

fn block_keys(b: u32, li: u32) -> u32 {
  if (li == 0u) {
    var n = 0u;
    let t_end = min(p.T, b * 64u + 64u);
    for (var t = b * 64u; t < t_end; t = t + 1u) { n = max(n, row_limit(t)); }
    n_keys_sh = n;
  }
  return workgroupUniformLoad(&n_keys_sh);
}
