// Grouped expert products (llama.cpp's MUL_MAT_ID for many rows) with a float stack of expert matrices
// (E x N, K): o[s, n] = x[xrow(s)] . W[ids[s] N + n] for the slots of moe_align.wgsl's blocks
// (expert_gemm_main.wgsl). One launch per row chunk of the stack.
// Header: alias TX, TW; const BM (slots a block, a multiple of 8).
// Bounds (the kernels run without the compiler's runtime checks): see expert_gemm_main.wgsl; a term i < K
// reads x[xb + i], xb = x_off + xrow K with xrow < T X, and w[w_off + r K + i] with r < rows of this chunk.
// Loops end: uniform bounds in steps of 1.
struct P { slots: u32, k: u32, X: u32, N: u32, K: u32, row0: u32, rows: u32, x_off: u32, w_off: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<TX>;
@group(0) @binding(2) var<storage, read> w: array<TW>;
@group(0) @binding(3) var<storage, read> order: array<u32>;
@group(0) @binding(4) var<storage, read> block_expert: array<u32>;
@group(0) @binding(5) var<storage, read> n_blocks: array<u32>;
@group(0) @binding(6) var<storage, read_write> o: array<f32>;
const NONE: u32 = 0xffffffffu;

// one value a term
fn n_terms() -> u32 { return p.K; }
fn wterm(r: u32, i: u32) -> f32 { return f32(w[p.w_off + r * p.K + i]); }
fn xterm(xb: u32, i: u32) -> f32 { return f32(x[xb + i]); }
fn tdot(a: f32, b: f32) -> f32 { return a * b; }
// #include expert_gemm_main.wgsl
