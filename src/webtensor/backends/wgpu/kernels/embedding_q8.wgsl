// Row gather from a q8_0 table (GPT-2's wte under dtype "int8"): out[t, c] = quant(id, c) * scale
// for the ids in this chunk of the table (rows row0 .. row0 + rows), dequantized on the way
// (webtensor's q8_0 GPU layout: quants four per u32 in rows of K / 4 words, two float16 scales a
// word; see backends/wgpu/q8_ops.py). One workgroup a row; cols = K, a multiple of 32.
// Bounds (the kernels run without the compiler's runtime checks): as embedding.wgsl: only ids with
// row0 <= id < row0 + rows are read, row r = id - row0 of this chunk: qs[r K / 4 + c / 4] and
// scales[r d_ld + j / 2] with c < cols = K and j < K / 32; o[t cols + c] inside the (n_ids, cols)
// output. Loops end: each runs to a uniform or constant bound in steps that cannot wrap (sizes stay
// under 2^31).
struct P { n_ids: u32, cols: u32, row0: u32, rows: u32, ids_off: u32, o_off: u32, d_ld: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> qs: array<u32>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
@group(0) @binding(3) var<storage, read> ids: array<i32>;
@group(0) @binding(4) var<storage, read_write> o: array<f32>;

// the int8 at byte b of word w, sign-extended
fn quant(w: u32, b: u32) -> f32 { return f32(bitcast<i32>(w << (24u - 8u * b)) >> 24u); }

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let t = wg.y * nwg.x + wg.x;
  if (t >= p.n_ids) { return; }
  let id = u32(ids[p.ids_off + t]);
  if (id < p.row0 || id >= p.row0 + p.rows) { return; }
  let r = id - p.row0;
  let dst = p.o_off + t * p.cols;
  for (var c = li; c < p.cols; c = c + 256u) {
    let j = c / 32u;  // the block
    let s = unpack2x16float(scales[r * p.d_ld + j / 2u]);
    let d = select(s.x, s.y, (j & 1u) == 1u);
    o[dst + c] = quant(qs[r * (p.cols / 4u) + c / 4u], c % 4u) * d;
  }
}
