// webtensor's WebGPU helper for the browser: the JavaScript half of `webtensor.backends.wgpu.browser_gpu`.
//
// Python (in Pyodide) never builds WebGPU descriptors itself: converting a dict through the FFI
// costs ~100 us, a plain call with numbers ~1-4 us. So every GPU object lives in a handle table
// here and Python holds small integers; descriptors are built on this side, and a whole command
// list crosses the FFI once per submit as a Uint32Array of
//     [0, pipeline, bindGroup, uniformOffset, x, y, z]      a dispatch
//     [1, src, srcOffset, dst, dstOffset, nbytes]           a buffer-to-buffer copy
// Validation errors reach Python through popError(): uncaptured errors are queued as they arrive,
// pipeline creation is checked with an error scope (its promise awaited by Python via run_sync).
"use strict";

(function () {
  const LIMITS = [  // hyphenated (webtensor's names) -> camelCase (the JavaScript API's)
    ["max-storage-buffer-binding-size", "maxStorageBufferBindingSize"],
    ["max-buffer-size", "maxBufferSize"],
    ["max-storage-buffers-per-shader-stage", "maxStorageBuffersPerShaderStage"],
    ["max-compute-workgroup-storage-size", "maxComputeWorkgroupStorageSize"],
    ["max-compute-invocations-per-workgroup", "maxComputeInvocationsPerWorkgroup"],
    ["max-compute-workgroup-size-x", "maxComputeWorkgroupSizeX"],
    ["max-compute-workgroups-per-dimension", "maxComputeWorkgroupsPerDimension"],
    ["max-dynamic-uniform-buffers-per-pipeline-layout", "maxDynamicUniformBuffersPerPipelineLayout"],
  ];
  const INFO_ONLY_LIMITS = [
    ["min-uniform-buffer-offset-alignment", "minUniformBufferOffsetAlignment"],
    ["min-storage-buffer-offset-alignment", "minStorageBufferOffsetAlignment"],
  ];
  const WANTED_FEATURES = ["shader-f16", "subgroups"];
  const STORAGE = 0x80, COPY_DST = 0x08, MAP_READ = 0x01;

  function adapterName(info) {
    const parts = [info.description, [info.vendor, info.architecture].filter(Boolean).join(" "), info.device];
    const name = parts.find((s) => s && s.length) || "unknown adapter";
    return name + (info.isFallbackAdapter ? " (fallback adapter)" : "");
  }

  class GpuContext {
    constructor(adapter, device, requested) {
      this.adapter = adapter;
      this.device = device;
      this.queue = device.queue;
      this.requested = requested;
      this.objects = [null];  // handle -> GPUBuffer | pipeline record | GPUBindGroup
      this.freeIds = [];
      this.layouts = new Map();  // "nStorage/uniformSize" -> {bgl, layout}
      this.staging = new Map();  // size -> free MAP_READ buffers (a readback in flight holds one)
      this.errors = [];
      device.addEventListener("uncapturederror", (ev) => {
        this.errors.push(ev.error && ev.error.message ? ev.error.message : String(ev.error));
      });
      device.lost.then((info) => {
        if (info.reason !== "destroyed") this.errors.push(`WebGPU device lost: ${info.message}`);
      });
    }

    put(obj) {
      const id = this.freeIds.length ? this.freeIds.pop() : this.objects.length;
      this.objects[id] = obj;
      return id;
    }

    release(id) {
      if (id > 0 && this.objects[id] !== null) {
        this.objects[id] = null;
        this.freeIds.push(id);
      }
    }

    describe() {  // a JSON string: Python parses it in one go instead of walking proxies
      const info = this.adapter.info || {};
      const adapterLimits = {};
      for (const [hy, cc] of LIMITS.concat(INFO_ONLY_LIMITS)) adapterLimits[hy] = Number(this.adapter.limits[cc]);
      const features = [];
      for (const f of this.device.features) features.push(f === "subgroups" ? "subgroup" : f);
      return JSON.stringify({
        name: adapterName(info), vendor: info.vendor || "", architecture: info.architecture || "",
        description: info.description || "", isFallbackAdapter: !!info.isFallbackAdapter,
        adapterLimits, limits: this.requested, features,
        adapterFeatures: Array.from(this.adapter.features),
      });
    }

    createBuffer(size, usage, label) {
      return this.put(this.device.createBuffer({ size, usage, label }));
    }

    destroyBuffer(id) {
      const buf = this.objects[id];
      if (buf) buf.destroy();
      this.release(id);
    }

    // `data` is a PyProxy of a Python buffer: its bytes are viewed in place (no copy) while
    // writeBuffer copies them into the queue's staging memory.
    writeBuffer(id, offset, data) {
      const view = data.getBuffer("u8");
      try {
        this.queue.writeBuffer(this.objects[id], offset, view.data, 0, view.data.byteLength);
      } finally {
        view.release();
      }
    }

    // Bit i of readOnlyMask: storage binding i + 1 is never written by the shader ("read-only-storage";
    // read-only bindings may alias each other, writable ones may alias nothing).
    layout(nStorage, uniformSize, readOnlyMask) {
      const key = `${nStorage}/${uniformSize}/${readOnlyMask}`;
      let l = this.layouts.get(key);
      if (!l) {
        const entries = [{
          binding: 0, visibility: GPUShaderStage.COMPUTE,
          buffer: { type: "uniform", hasDynamicOffset: true, minBindingSize: uniformSize },
        }];
        for (let i = 1; i <= nStorage; i++) {
          const ro = (readOnlyMask >> (i - 1)) & 1;
          entries.push({ binding: i, visibility: GPUShaderStage.COMPUTE, buffer: { type: ro ? "read-only-storage" : "storage" } });
        }
        const bgl = this.device.createBindGroupLayout({ entries });
        l = { bgl, layout: this.device.createPipelineLayout({ bindGroupLayouts: [bgl] }) };
        this.layouts.set(key, l);
      }
      return l;
    }

    // Resolves to the pipeline's handle, or rejects with the compiler's messages.
    async createPipeline(wgsl, nStorage, label, uniformSize, readOnlyMask) {
      const { bgl, layout } = this.layout(nStorage, uniformSize, readOnlyMask);
      this.device.pushErrorScope("validation");
      const module = this.device.createShaderModule({ code: wgsl, label });
      const pipeline = this.device.createComputePipeline({ layout, compute: { module, entryPoint: "main" }, label });
      const err = await this.device.popErrorScope();
      if (err) {
        let detail = "";
        try {
          const info = await module.getCompilationInfo();
          detail = info.messages.map((m) => `${m.type} at line ${m.lineNum}:${m.linePos}: ${m.message}`).join("\n");
        } catch (e) { /* the error itself is enough */ }
        throw new Error(`pipeline ${label}: ${err.message}${detail ? "\n" + detail : ""}`);
      }
      return this.put({ pipeline, bgl, uniformSize });
    }

    // Compiles each {label, code} of the JSON list `shadersJson` to a shader module (no pipeline); resolves to a
    // JSON list of each module's errors: getCompilationInfo's error messages, else its validation error (each
    // module in an error scope of its own, which also keeps the errors from the device's uncaptured ones), "" where
    // it compiled.
    async checkShaders(shadersJson) {
      const checks = JSON.parse(shadersJson).map((s) => {
        this.device.pushErrorScope("validation");
        const module = this.device.createShaderModule({ code: s.code, label: s.label });
        return Promise.all([module.getCompilationInfo(), this.device.popErrorScope()]);
      });
      const found = (await Promise.all(checks)).map(([info, err]) => {
        const lines = info.messages.filter((m) => m.type === "error")
          .map((m) => `line ${m.lineNum}:${m.linePos}: ${m.message}`);
        return lines.length ? lines.join("\n") : err ? err.message : "";
      });
      return JSON.stringify(found);
    }

    createBindGroup(pipelineId, uniformId, ...storageIds) {
      const p = this.objects[pipelineId];
      const entries = [{ binding: 0, resource: { buffer: this.objects[uniformId], offset: 0, size: p.uniformSize } }];
      for (let i = 0; i < storageIds.length; i++) {
        entries.push({ binding: i + 1, resource: { buffer: this.objects[storageIds[i]] } });
      }
      return this.put(this.device.createBindGroup({ layout: p.bgl, entries }));
    }

    takeStaging(nbytes) {
      let size = 256;
      while (size < nbytes) size *= 2;
      const free = this.staging.get(size);
      if (free && free.length) return free.pop();
      return this.device.createBuffer({ size, usage: MAP_READ | COPY_DST, label: "webtensor-staging" });
    }

    giveStaging(buf) {
      if (!this.staging.has(buf.size)) this.staging.set(buf.size, []);
      this.staging.get(buf.size).push(buf);
    }

    // Encode the command list (a PyProxy of a Python uint32 buffer, `n` words) into one command
    // buffer and submit it. With readN > 0, also copy buffer readId[readOff:readOff+readN] out
    // and return a promise of its bytes (Uint8Array); else return 0.
    submit(cmds, n, readId, readOff, readN) {
      const view = cmds.getBuffer("u32");
      const enc = this.device.createCommandEncoder();
      let pass = null;
      try {
        const c = view.data, objs = this.objects;
        let i = 0;
        while (i < n) {
          if (c[i] === 0) {
            if (pass === null) pass = enc.beginComputePass();
            pass.setPipeline(objs[c[i + 1]].pipeline);
            pass.setBindGroup(0, objs[c[i + 2]], [c[i + 3]]);
            pass.dispatchWorkgroups(c[i + 4], c[i + 5], c[i + 6]);
            i += 7;
          } else if (c[i] === 1) {
            if (pass !== null) { pass.end(); pass = null; }
            enc.copyBufferToBuffer(objs[c[i + 1]], c[i + 2], objs[c[i + 3]], c[i + 4], c[i + 5]);
            i += 6;
          } else {
            throw new Error(`webtensor: unknown command code ${c[i]} at word ${i}`);
          }
        }
      } finally {
        view.release();
      }
      if (pass !== null) pass.end();
      if (!(readN > 0)) {
        this.queue.submit([enc.finish()]);
        return 0;
      }
      const padded = (readN + 3) & ~3;
      const staging = this.takeStaging(padded);
      enc.copyBufferToBuffer(this.objects[readId], readOff, staging, 0, padded);
      this.queue.submit([enc.finish()]);
      return staging.mapAsync(GPUMapMode.READ, 0, padded).then(() => {
        const out = new Uint8Array(staging.getMappedRange(0, padded).slice(0, readN));
        staging.unmap();
        this.giveStaging(staging);
        return out;
      }, (e) => {
        this.giveStaging(staging);
        throw e;
      });
    }

    popError() {
      return this.errors.length ? this.errors.shift() : "";
    }

    destroy() {
      this.device.destroy();
    }
  }

  // Resolves to a GpuContext, or to a string saying why there is none. `features`: a comma-separated
  // subset of WANTED_FEATURES to request (tests withhold the others; "" requests none), or "*" for all.
  async function createContext(maxBinding, features) {
    if (!navigator.gpu) return "this browser has no WebGPU (navigator.gpu is missing)";
    const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
    if (!adapter) return "this browser has WebGPU, but navigator.gpu.requestAdapter() found no adapter";
    const requiredLimits = {}, requested = {};
    for (const [hy, cc] of LIMITS) {
      let v = Number(adapter.limits[cc]);
      if (hy === "max-storage-buffer-binding-size" && maxBinding > 0) v = Math.min(v, maxBinding);
      requiredLimits[cc] = v;
      requested[hy] = v;
    }
    const wanted = features === "*" ? WANTED_FEATURES : features.split(",").filter(Boolean);
    const requiredFeatures = wanted.filter((f) => WANTED_FEATURES.includes(f) && adapter.features.has(f));
    const device = await adapter.requestDevice({ requiredLimits, requiredFeatures, label: "webtensor" });
    return new GpuContext(adapter, device, requested);
  }

  globalThis.webtensorGpu = { createContext, version: 1 };
})();
