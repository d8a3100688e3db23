// Each row through its own experts (llama.cpp's MUL_MAT_ID), a float stack of expert matrices:
// o[s, n] = sum_k x[xrow(s), k] W[ids[s] N + n, k] for slot s = t k + j of row t (k slots a row), xrow(s)
// = t X + (j if X > 1 else 0), W the E experts' (N, K) matrices stacked along the rows (E N, K). The
// planner launches once per row chunk of the stack (rows row0 .. row0 + rows - 1 of W in this binding: a
// stack over the binding limit); a launch computes the outputs whose weight row falls in its chunk and
// leaves the others to the other launches. LANES threads an output, one value a term (expert_gemv_main.wgsl).
// Header: alias TX, TW; const LANES (a power of two, 1 .. 256).
// Bounds (the kernels run without the compiler's runtime checks): see expert_gemv_main.wgsl (a term is read
// only for a live output: its id < E and its weight row r < rows of this chunk); term i < K reads
// x[xb + i] with xb = x_off + xrow K, xrow < T X, and w[w_off + r K + i] inside this chunk's binding.
// Loops end: a uniform bound in steps of LANES >= 1 (sizes stay under 2^31).
struct P { slots: u32, k: u32, X: u32, E: u32, N: u32, K: u32, row0: u32, rows: u32, x_off: u32, ids_off: u32,
           w_off: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<TX>;
@group(0) @binding(2) var<storage, read> w: array<TW>;
@group(0) @binding(3) var<storage, read> ids: array<i32>;
@group(0) @binding(4) var<storage, read_write> o: array<f32>;

// x's K values of a row, one a term
fn n_terms() -> u32 { return p.K; }
fn term(xb: u32, r: u32, i: u32) -> f32 { return f32(x[xb + i]) * f32(w[p.w_off + r * p.K + i]); }
// #include expert_gemv_main.wgsl
