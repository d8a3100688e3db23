// Binary elementwise ops with numpy broadcasting over up to 4 dims (a broadcast dim has stride 0),
// in f32: o = a + b, a * b, a - b, a / b, swiglu's silu(a) * b = a * sigmoid(a) * b (sigmoid as
// 1 / (1 + exp(-a)): exp overflowing to inf gives 0, so silu(-large) = -0), or geglu's gelu_tanh(a) * b.
// Bounds: a thread returns unless i < n (o's size); its index (i0, i1, i2, i3) < shape, so
// a_off + dot(idx, sa) is an element of a's view (the planner gives the view's offset and strides,
// 0 along a broadcast dim), likewise b's; o's index o_off + i is inside o.
// These bounds are what the kernel relies on: it runs without the shader compiler's runtime
// checks. Loops end: each runs to a uniform or constant bound in steps that cannot wrap.
// Header supplies: alias TA, TB, TO (storage types); const OP (0 add, 1 mul, 2 sub, 3 div, 4 swiglu,
// 5 geglu).
struct P {
  shape: vec4<u32>,      // output shape, padded on the left with 1s
  sa: vec4<u32>,         // element strides of a per output dim (0 = broadcast)
  sb: vec4<u32>,
  a_off: u32, b_off: u32, o_off: u32, n: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> a: array<TA>;
@group(0) @binding(2) var<storage, read> b: array<TB>;
@group(0) @binding(3) var<storage, read_write> o: array<TO>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let i = (wg.y * nwg.x + wg.x) * 256u + li;
  if (i >= p.n) { return; }
  let idx = unflatten4(i, p.shape);
  let x = f32(a[p.a_off + dot(idx, p.sa)]);
  let y = f32(b[p.b_off + dot(idx, p.sb)]);
  var z: f32;
  if (OP == 0u) { z = x + y; } else if (OP == 1u) { z = x * y; } else if (OP == 2u) { z = x - y; }
  else if (OP == 3u) { z = x / y; } else if (OP == 4u) { z = x * (1.0 / (1.0 + exp(-x))) * y; }
  else { z = gelu_tanh(x) * y; }
  o[p.o_off + i] = TO(z);
}
