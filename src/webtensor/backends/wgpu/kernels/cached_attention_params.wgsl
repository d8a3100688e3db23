// The parameters of cached_attention.wgsl and cached_attention_rope.wgsl (included where they say
// `// #include cached_attention_params.wgsl`): the rope fields (half, P, tc_off, ts_off) are read by
// cached_attention_rope.wgsl only; both kernels are planned with one parameter block (ops.cached_attention).
// block .. table_off: the block table's geometry (kv_pages.wgsl); kc_off4, vc_off4: where the pool views
// start, in lanes (VEC4: vec4s of the float pool; a q8_0 pool: u32 words).
struct P {
  T: u32, H: u32, D4: u32, q_off4: u32,
  q_ts4: u32, q_hs4: u32, k_off4: u32, k_ts4: u32,
  k_hs4: u32, v_off4: u32, v_ts4: u32, v_hs4: u32,
  n_ctx: u32, write: u32, scale: f32, group: u32,
  pos_off: u32, slot_off: u32, block: u32, max_blocks: u32,
  n_seqs: u32, n_blocks: u32, table_off: u32, kc_off4: u32,
  vc_off4: u32, half: u32, P: u32, tc_off: u32,
  ts_off: u32,
}
