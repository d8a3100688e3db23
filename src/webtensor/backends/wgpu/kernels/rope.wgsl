// Rotary position embedding: o (T, H, D), a new contiguous tensor, from x (T, H, D), a strided view
// (row stride x_ts, head stride x_hs, unit stride along D: the q or k heads of a fused qkv output),
// rotated by the angles of row pos[t] of the tables cos, sin (P, R/2) (contiguous f32, HALF = R/2
// columns). For i < R/2 the pair (a, b) = (x[i], x[i + R/2]) (HF's rotate_half) or, with const
// INTERLEAVED, (x[2i], x[2i + 1]) becomes (a c - b s, b c + a s), c = cos[pos[t], i],
// s = sin[pos[t], i]; dims R .. D-1 are copied. f32 arithmetic. One thread per (t, h, e) with
// e < D - R/2: e < R/2 rotates pair e, any other e copies dim e + R/2.
// Positions come from a device tensor (one captured graph serves every step) and are not checked
// there: a position outside 0 .. P-1 is clamped into it (a negative one to row 0, one past the
// table to row P - 1), so the tables are never read out of bounds.
// Bounds: a thread returns unless i < T * H * (D - HALF), so t < T, h < H, e < D - HALF. x's index
// x_off + t x_ts + h x_hs + d with d < D is an element of x's view (the planner takes its offset and
// strides from the view, which lies inside the buffer); pos's index pos_off + t < pos_off + T (the
// planner's pos view, (T,) contiguous); the tables' index c_off (or s_off) + row * HALF + e with
// row <= P - 1 and e < HALF is inside the (P, HALF) table; o's index (t H + h) D + d < T H D.
// These bounds are what the kernel relies on: it runs without the shader compiler's runtime
// checks. Loops end: each runs to a uniform or constant bound in steps that cannot wrap.
// Header: alias TX (x), TO (o); const INTERLEAVED (bool).
struct P {
  T: u32, H: u32, D: u32, half: u32,
  x_off: u32, x_ts: u32, x_hs: u32, pos_off: u32,
  P: u32, c_off: u32, s_off: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<TX>;
@group(0) @binding(2) var<storage, read> pos: array<i32>;
@group(0) @binding(3) var<storage, read> cos_t: array<f32>;
@group(0) @binding(4) var<storage, read> sin_t: array<f32>;
@group(0) @binding(5) var<storage, read_write> o: array<TO>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let i = (wg.y * nwg.x + wg.x) * 256u + li;
  let per_head = p.D - p.half;
  if (i >= p.T * p.H * per_head) { return; }
  let e = i % per_head;
  let th = i / per_head;
  let h = th % p.H;
  let t = th / p.H;
  let xb = p.x_off + t * p.x_ts + h * p.x_hs;
  let ob = th * p.D;
  if (e >= p.half) {  // a dim past R: copied
    let d = e + p.half;
    o[ob + d] = TO(f32(x[xb + d]));
    return;
  }
  let row = u32(clamp(pos[p.pos_off + t], 0, i32(p.P - 1u)));
  let c = cos_t[p.c_off + row * p.half + e];
  let s = sin_t[p.s_off + row * p.half + e];
  var ia = e;
  var ib = e + p.half;
  if (INTERLEAVED) {
    ia = 2u * e;
    ib = 2u * e + 1u;
  }
  let a = f32(x[xb + ia]);
  let b = f32(x[xb + ib]);
  o[ob + ia] = TO(a * c - b * s);
  o[ob + ib] = TO(b * c + a * s);
}
