// Row gather from a quantized table (V, C) in webtensor's GPU layout of one of ggml's block types
// (quant_dequant.wgsl; the type by its define): out[t, :] = row ids[t], dequantized, for the ids in
// this chunk of the table (rows row0 .. row0 + rows - 1; the other ids are left to the other chunks'
// launches). One workgroup a row of the output, four values a thread and step. K = C, a multiple
// of the block.
// Bounds (runtime checks may be off): t < n_ids; ids outside the chunk (negative ones too, as u32)
// return before any read, so the table row r < rows; vec4s i < K / 4; the output's row t is
// o_off + t K .. o_off + t K + K - 1.
struct P { n_ids: u32, K: u32, row0: u32, rows: u32, ids_off: u32, o_off: u32, d_ld: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> qs: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
@group(0) @binding(3) var<storage, read> ids: array<i32>;
@group(0) @binding(4) var<storage, read_write> o: array<f32>;
// #include quant_dequant.wgsl

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let t = wg.y * nwg.x + wg.x;
  if (t >= p.n_ids) { return; }
  let id = u32(ids[p.ids_off + t]);
  if (id < p.row0 || id >= p.row0 + p.rows) { return; }
  let r = id - p.row0;
  let dst = p.o_off + t * p.K;
  for (var i = li; i < p.K / 4u; i = i + 256u) {
    let v = wvec(r, i);
    o[dst + 4u * i] = v.x;
    o[dst + 4u * i + 1u] = v.y;
    o[dst + 4u * i + 2u] = v.z;
    o[dst + 4u * i + 3u] = v.w;
  }
}
