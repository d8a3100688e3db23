// Functions shared by several kernels; context.kernel() puts this file after each kernel's header.

// GPT-2's GELU (tanh form): 0.5 v (1 + tanh(u)), u = sqrt(2/pi) (v + 0.044715 v^3), written as the
// identical v * sigmoid(2u), which has no cancellation for v < 0. Below u = -40 the result is under
// 1e-33 in magnitude and is returned as -0.0 (also for v = -inf, where the formula gives NaN).
fn gelu_tanh(v: f32) -> f32 {
  let u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
  if (u < -40.0) { return -0.0; }
  return v / (1.0 + exp(-2.0 * u));
}
