// Unary ops over a strided (up to 4-d) input into a contiguous output; also the strided copy
// behind transpose / contiguous / slicing / cast, and copy-into-a-slice (strided output).
// Header supplies: alias TI, TO; const OP (0 copy/cast, 1 gelu-tanh, 2 scale by p.alpha, 3 soft-cap at
// p.alpha: alpha tanh(v / alpha), Gemma 2's final logits).
// Bounds (the kernels run without the compiler's runtime checks): i < n, the element count:
// unflatten4 gives idx < shape componentwise, so i_off + dot(idx, si) is an element of x's view and
// o_off + dot(idx, so) of out's (both inside their buffers). Loops end: each runs to a uniform or
// constant bound in steps that cannot wrap (sizes stay under 2^31).
struct P {
  shape: vec4<u32>,
  si: vec4<u32>,         // input strides (elements)
  so: vec4<u32>,         // output strides (elements)
  i_off: u32, o_off: u32, n: u32, alpha: f32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<TI>;
@group(0) @binding(2) var<storage, read_write> o: array<TO>;


@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let i = (wg.y * nwg.x + wg.x) * 256u + li;
  if (i >= p.n) { return; }
  let idx = unflatten4(i, p.shape);
  let v = f32(x[p.i_off + dot(idx, p.si)]);
  var z = v;
  if (OP == 1u) { z = gelu_tanh(v); } else if (OP == 2u) { z = v * p.alpha; }
  else if (OP == 3u) { z = tanh_f32(v / p.alpha) * p.alpha; }
  o[p.o_off + dot(idx, p.so)] = TO(z);
}
