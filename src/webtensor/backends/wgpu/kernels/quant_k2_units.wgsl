// The unit map of Q2_K's and Q3_K's 2-bit quants (included by quant_q2_k.wgsl and quant_q3_k.wgsl; unit_k4 is
// the type files' function of quant_dequant.wgsl's interface: the activations' vec4, value index / 4, where run
// r of unit u starts). Both store value 128 h + 32 t + l as bits 2t .. 2t + 1 of byte 32 h + l of their qs, so
// unit u (block u / 8, j = u % 8) is half h = j / 4, bytes 16 (j % 2) .., run r quarter t = (j % 4) / 2 + 2r.
// Bounds: index arithmetic only; each type file's Bounds paragraph covers what it reads.
fn unit_k4(u: u32, r: u32) -> u32 {
  let j = u % 8u;  // values 128 (j / 4) + 32 ((j % 4) / 2 + 2r) + 16 (j % 2) ..
  return (u / 8u) * 64u + (j / 4u) * 32u + ((j % 4u) / 2u) * 8u + r * 16u + (j % 2u) * 4u;
}
