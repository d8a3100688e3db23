// Issue 28 item 5: does a WebGPU implementation installable here expose tensor cores on the H200?
// Dawn (the npm package `webgpu`, Dawn for Node) has the experimental `chromium-experimental-subgroup-matrix`
// feature, lowered on Vulkan to VK_KHR_cooperative_matrix. This probe lists the adapter's features and its
// subgroup-matrix configurations, checks a small f16 x f16 -> f32 product against the CPU, and times a
// square product through 16x16 subgroup-matrix tiles read straight from storage buffers (no workgroup
// memory: a lower bound of what a tuned kernel gives) beside a plain SIMT f32 FMA kernel of the same
// shape, in TFLOP/s. Usage: node subgroup_matrix_probe.mjs <path to the webgpu package's index.js> [N]
const [, , pkg, nArg] = process.argv;
const { create, globals } = await import(pkg);
Object.assign(globalThis, globals);
const gpu = create(['enable-dawn-features=allow_unsafe_apis']);
const adapter = await gpu.requestAdapter({ powerPreference: 'high-performance' });
if (!adapter) { console.log('no adapter'); process.exit(1); }
const info = adapter.info;
console.log('adapter:', info.vendor, info.architecture, info.device, info.description);
const feats = [...adapter.features].sort();
console.log('features:', feats.join(' '));
const SGM = 'chromium-experimental-subgroup-matrix';
const configs = info.subgroupMatrixConfigs ? [...info.subgroupMatrixConfigs] : [];
console.log('subgroup matrix configs:', JSON.stringify(configs.map(c => ({
  component: c.componentType, result: c.resultComponentType, M: c.M, N: c.N, K: c.K }))));
console.log('subgroup sizes:', info.subgroupMinSize, info.subgroupMaxSize);
const want = ['shader-f16', 'subgroups', 'timestamp-query'].filter(f => adapter.features.has(f));
const hasSgm = adapter.features.has(SGM);
if (hasSgm) want.push(SGM);
const device = await adapter.requestDevice({
  requiredFeatures: want,
  requiredLimits: { maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize,
                    maxBufferSize: adapter.limits.maxBufferSize } });
device.addEventListener?.('uncapturederror', e => console.log('GPU error:', e.error.message));

const N = Number(nArg ?? 4096);
function f16bits(x) {  // round-to-nearest float16 bits of a float32 (no denormal care: |x| in [2^-14, 2))
  const f = new Float32Array([x]); const u = new Uint32Array(f.buffer)[0];
  const sign = (u >>> 16) & 0x8000; let exp = ((u >>> 23) & 0xff) - 127 + 15; let man = u & 0x7fffff;
  if (exp <= 0) return sign;
  let h = sign | (exp << 10) | (man >>> 13);
  if ((man & 0x1fff) > 0x1000 || ((man & 0x1fff) === 0x1000 && (h & 1))) h += 1;
  return h;
}
function f16val(h) {
  const e = (h >>> 10) & 0x1f, m = h & 0x3ff, s = h & 0x8000 ? -1 : 1;
  return e === 0 ? s * m * 2 ** -24 : s * (1 + m / 1024) * 2 ** (e - 15);
}
function buffer(bytes, data) {
  const b = device.createBuffer({ size: bytes, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
  if (data) device.queue.writeBuffer(b, 0, data);
  return b;
}
async function read(b, bytes) {
  const r = device.createBuffer({ size: bytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const e = device.createCommandEncoder(); e.copyBufferToBuffer(b, 0, r, 0, bytes); device.queue.submit([e.finish()]);
  await r.mapAsync(GPUMapMode.READ); const out = new Float32Array(r.getMappedRange().slice(0)); r.unmap(); return out;
}
// A (n x n) and B (n x n) f16 row-major, C = A B f32 row-major
function inputs(n, seed) {
  let s = seed; const rnd = () => { s = (s * 1103515245 + 12345) & 0x7fffffff; return s / 0x7fffffff - 0.5; };
  const a = new Uint16Array(n * n), b = new Uint16Array(n * n);
  for (let i = 0; i < n * n; i++) { a[i] = f16bits(0.5 + rnd()); b[i] = f16bits(0.5 + rnd()); }
  return [a, b];
}
// each subgroup: a 32 x 64 block of C (2 x 4 tiles of 16 x 16); 4 subgroups a workgroup (128 threads on a
// subgroup of 32): a 64 x 128 block
const SGM_WGSL = (n) => `
enable f16;
enable chromium_experimental_subgroup_matrix;
@group(0) @binding(0) var<storage, read> a: array<f16>;
@group(0) @binding(1) var<storage, read> b: array<f16>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
const N: u32 = ${n}u;
@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_invocation_id) sid: u32,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_size) sgs: u32) {
  let sg = li / sgs;
  let r0 = wg.y * 64u + (sg / 2u) * 32u;
  let c0 = wg.x * 128u + (sg % 2u) * 64u;
  var acc: array<subgroup_matrix_result<f32, 16, 16>, 8>;
  for (var k = 0u; k < N; k = k + 16u) {
    let l0 = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&a, r0 * N + k, false, N);
    let l1 = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&a, (r0 + 16u) * N + k, false, N);
    for (var j = 0u; j < 4u; j = j + 1u) {
      let rt = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&b, k * N + c0 + 16u * j, false, N);
      acc[j] = subgroupMatrixMultiplyAccumulate(l0, rt, acc[j]);
      acc[4u + j] = subgroupMatrixMultiplyAccumulate(l1, rt, acc[4u + j]);
    }
  }
  for (var j = 0u; j < 4u; j = j + 1u) {
    subgroupMatrixStore(&c, r0 * N + c0 + 16u * j, acc[j], false, N);
    subgroupMatrixStore(&c, (r0 + 16u) * N + c0 + 16u * j, acc[4u + j], false, N);
  }
}`;
// plain SIMT: 8 x 8 outputs a thread, 16 x 16 threads: a 128 x 128 block, f32 FMAs on f16 inputs widened
const SIMT_WGSL = (n) => `
enable f16;
@group(0) @binding(0) var<storage, read> a: array<f16>;
@group(0) @binding(1) var<storage, read> b: array<f16>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
const N: u32 = ${n}u;
var<workgroup> as_: array<f32, 2048>;  // 128 rows x 16 k
var<workgroup> bs: array<f32, 2048>;   // 16 k x 128 cols
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  var acc: array<f32, 64>;
  let r0 = wg.y * 128u; let c0 = wg.x * 128u;
  for (var k = 0u; k < N; k = k + 16u) {
    for (var i = li; i < 2048u; i = i + 256u) {
      as_[i] = f32(a[(r0 + i / 16u) * N + k + i % 16u]);
      bs[i] = f32(b[(k + i / 128u) * N + c0 + i % 128u]);
    }
    workgroupBarrier();
    for (var kk = 0u; kk < 16u; kk = kk + 1u) {
      var av: array<f32, 8>; var bv: array<f32, 8>;
      for (var i = 0u; i < 8u; i = i + 1u) { av[i] = as_[(lid.y * 8u + i) * 16u + kk]; bv[i] = bs[kk * 128u + lid.x * 8u + i]; }
      for (var i = 0u; i < 8u; i = i + 1u) { for (var j = 0u; j < 8u; j = j + 1u) { acc[i * 8u + j] = fma(av[i], bv[j], acc[i * 8u + j]); } }
    }
    workgroupBarrier();
  }
  for (var i = 0u; i < 8u; i = i + 1u) { for (var j = 0u; j < 8u; j = j + 1u) {
    c[(r0 + lid.y * 8u + i) * N + c0 + lid.x * 8u + j] = acc[i * 8u + j]; } }
}`;
async function run(name, wgsl, grid, n, reps) {
  const [a, b] = inputs(n, 7);
  const ba = buffer(n * n * 2, a), bb = buffer(n * n * 2, b), bc = buffer(n * n * 4);
  device.pushErrorScope('validation');
  const mod = device.createShaderModule({ code: wgsl(n) });
  const pipe = device.createComputePipeline({ layout: 'auto', compute: { module: mod, entryPoint: 'main' } });
  const err = await device.popErrorScope();
  if (err) { console.log(`${name}: pipeline error: ${err.message}`); return; }
  const bg = device.createBindGroup({ layout: pipe.getBindGroupLayout(0), entries: [ba, bb, bc].map((buf, i) => ({ binding: i, resource: { buffer: buf } })) });
  const go = (k) => { const e = device.createCommandEncoder(); const p = e.beginComputePass(); p.setPipeline(pipe); p.setBindGroup(0, bg);
    for (let i = 0; i < k; i++) p.dispatchWorkgroups(...grid); p.end(); device.queue.submit([e.finish()]); };
  go(1);
  const c = await read(bc, n * n * 4);
  let worst = 0;  // spot-check 256 entries against the CPU in f64
  for (let t = 0; t < 256; t++) {
    const i = (t * 7919) % n, j = (t * 104729) % n; let s = 0;
    for (let k = 0; k < n; k++) s += f16val(a[i * n + k]) * f16val(b[k * n + j]);
    worst = Math.max(worst, Math.abs(c[i * n + j] - s) / Math.abs(s));
  }
  go(Math.max(1, reps >> 2)); await read(bc, 4);  // warm the clocks
  const t0 = performance.now(); go(reps); await read(bc, 4); const dt = (performance.now() - t0) / reps;
  console.log(`${name}: ${n}^3 ${dt.toFixed(3)} ms, ${(2 * n ** 3 / dt / 1e9).toFixed(1)} TFLOP/s, max rel err ${worst.toExponential(2)}`);
}
if (hasSgm) await run('subgroup-matrix f16->f32 16x16x16', SGM_WGSL, [N / 128, N / 64, 1], N, 20);
else console.log(`${SGM}: not offered by this adapter`);
await run('SIMT f32 FMA (f16 inputs)', SIMT_WGSL, [N / 128, N / 128, 1], N, 20);
process.exit(0);
