// Where a KV cache keeps a sequence's positions (included where a kernel says `// #include
// kv_cache.wgsl`): the cache is (n_slots, n_ctx, KVH, D) per layer, a sequence a slot, so position j
// of slot s is row s n_ctx + j (a row: one position's KVH D values). Kernels that read the cache
// through positions and slots held on the device address it through kv_row only, so a different
// layout (a paged cache: blocks through a block table) changes this function and its callers'
// parameters, not their loops. Bounds: the caller passes s < n_slots and j < n_ctx (checked against
// its uniforms, never trusted from device data), so the row is < n_slots n_ctx.
fn kv_row(s: u32, j: u32, n_ctx: u32) -> u32 { return s * n_ctx + j; }
