// The HTML report of a plan: reads the plan JSON embedded in the page (the same
// data `--format json` prints) and draws it with the vendored d3 modules
// (d3-hierarchy lays out the treemap, d3-shape stacks the memory series,
// d3-scale maps them). Text from the plan only ever goes in as textContent.
"use strict";
(function () {
  const started = performance.now();
  const plan = JSON.parse(document.getElementById("plan-data").textContent);
  performance.mark("fsdp-plan:parsed");
  const units = plan.units || [];
  const mem = plan.memory || {};
  const warnings = plan.warnings || [];
  const SVG = "http://www.w3.org/2000/svg";
  // Widths first: reading one after 10,000 rectangles are in would force a layout.
  const treemapWidth = Math.max(600, document.getElementById("treemap").clientWidth || 1000);
  const chartWidth = Math.max(600, document.getElementById("memory-chart").clientWidth || 1000);

  // --- small helpers -------------------------------------------------------
  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function svgEl(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  // As the text plan prints them (lib/string_util.cpp: printf's %.1f rounds ties to even).
  function scaled(n, base, names, decimals) {
    let v = n, u = 0;
    while (v >= base && u + 1 < names.length) { v /= base; ++u; }
    if (u === 0) return String(n) + names[0];
    const m = v * Math.pow(10, decimals);
    if (m % 1 === 0.5 && Math.floor(m) % 2 === 0) return (Math.floor(m) / Math.pow(10, decimals)).toFixed(decimals) + names[u];
    return v.toFixed(decimals) + names[u];
  }
  const fmtBytes = (n) => scaled(n, 1024, [" B", " KiB", " MiB", " GiB", " TiB", " PiB"], 1);
  const fmtCount = (n) => scaled(n, 1000, ["", "K", "M", "B", "T"], 2);
  // As the text plan prints seconds (lib/report/time_text.cpp format_seconds).
  function fmtSeconds(s) {
    if (!(s > 0)) return "0 s";
    const [v, u] = s < 1e-3 ? [s * 1e6, " us"] : s < 1 ? [s * 1e3, " ms"] : [s, " s"];
    return v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0) + u;
  }
  // A unit's bytes per step in every collective (exact) and the part compute leaves exposed (estimate).
  const unitCommBytes = (u) => (u.comm ? u.comm.all_gather_forward_bytes + u.comm.all_gather_backward_bytes +
                                         u.comm.reduce_scatter_bytes + u.comm.all_reduce_bytes : null);
  const unitExposed = (u) => u.time.exposed_forward_s + u.time.exposed_backward_s + u.time.exposed_tail_s;
  // A unit as the text plan names it: an FSDP2 call on several modules is "[a, b]".
  const unitName = (u) => (u.modules && u.modules.length > 1 ? "[" + u.modules.join(", ") + "]"
                                                               : u.path === "" ? "(root)" : u.path);
  // Paths in natural order: digit runs compare as numbers (layers.2 before layers.10).
  const chunks = (s) => s.split(/(\d+)/).map((p, i) => (i % 2 ? Number(p) : p));
  function naturalCompare(a, b) {
    return compareChunks(chunks(a), chunks(b));
  }
  function compareChunks(x, y) {
    for (let i = 0; i < Math.min(x.length, y.length); ++i)
      if (x[i] !== y[i]) return x[i] < y[i] ? -1 : 1;
    return x.length - y.length;
  }
  const fsdp2 = plan.fsdp_version === 2;
  const kv = (table, key, value) => {
    const tr = el("tr");
    tr.append(el("th", {}, key), el("td", {}, value));
    table.append(tr);
  };

  // --- what the plan says about each unit ---------------------------------
  const indexByPath = new Map(units.map((u, i) => [u.path, i]));
  // The unit a module belongs to: the unit at its longest enclosing path.
  function unitOfModule(path) {
    for (let p = path; ; ) {
      if (indexByPath.has(p)) return indexByPath.get(p);
      if (p === "") return -1;
      const dot = p.lastIndexOf(".");
      p = dot < 0 ? "" : p.slice(0, dot);
    }
  }
  const unitWarnings = units.map(() => []);
  for (const w of warnings) {
    const touched = new Set();
    for (const m of w.modules || []) touched.add(unitOfModule(m));
    for (const p of w.params || []) touched.add(unitOfModule(p.slice(0, Math.max(0, p.lastIndexOf(".")))));
    touched.forEach((i) => { if (i >= 0) unitWarnings[i].push(w); });
  }
  function frozenState(u) {
    const ps = u.params || [];
    const frozen = ps.filter((p) => p.requires_grad === false).length;
    return ps.length && frozen === ps.length ? "frozen" : frozen ? "partly frozen" : "";
  }
  const STATUS = [
    ["error", "FSDP refuses (error)"],
    ["warning", "has a warning"],
    ["mp-off", "mixed precision off"],
    ["frozen", "frozen (no gradients)"],
    ["ok", "unit"],
  ];
  function status(i) {
    // mixed_precision_override is what "mixed precision off" already shows.
    const sev = unitWarnings[i].filter((w) => w.kind !== "mixed_precision_override").map((w) => w.severity);
    if (sev.includes("error")) return "error";
    if (sev.includes("warning")) return "warning";
    if (units[i].mixed_precision === false) return "mp-off";
    if (frozenState(units[i]) === "frozen") return "frozen";
    return "ok";
  }

  // --- header and summary --------------------------------------------------
  const model = plan.model || {};
  document.title = "fsdp-plan: " + (model.path || "plan");
  document.getElementById("model-name").textContent = (model.path || "?") + " (" + (model.root_class || "?") + ")";
  const totalUnitParams = units.reduce((s, u) => s + u.param_numel, 0);
  let largest = -1;
  units.forEach((u, i) => { if (largest < 0 || u.param_numel > units[largest].param_numel) largest = i; });
  const share = (n) => (totalUnitParams ? ((100 * n) / totalUnitParams).toFixed(1) + "%" : "-");
  document.getElementById("headline").textContent =
    units.length + " units, " + fmtCount(totalUnitParams) + " params sharded" +
    (largest >= 0 ? "; largest unit " + unitName(units[largest]) + " " + share(units[largest].param_numel) : "") +
    (units.length && units[0].path === "" ? "; root unit " + share(units[0].param_numel) : "") +
    (mem.per_rank ? "; peak " + fmtBytes(mem.per_rank.peak_bytes) + " per rank" : "");

  const summary = document.getElementById("model-summary");
  kv(summary, "file", model.path || "");
  kv(summary, "root class", model.root_class || "");
  kv(summary, "modules", String(model.num_modules));
  kv(summary, "parameters", fmtCount(model.param_numel) + " (" + fmtBytes(model.param_bytes) + ")");
  kv(summary, "buffers", fmtCount(model.buffer_numel) + " (" + fmtBytes(model.buffer_bytes) + ")");
  kv(summary, "units", String(units.length));

  const settings = document.getElementById("memory-settings");
  if (mem.per_rank) {
    kv(settings, "world size", String(mem.world_size));
    kv(settings, "sharding", mem.sharding_strategy +
       (mem.requested_sharding_strategy !== mem.sharding_strategy ? " (requested " + mem.requested_sharding_strategy + ")" : ""));
    kv(settings, "shard group", String(mem.shard_group_size) + " ranks");
    const fsdpPolicy = (plan.policy || {}).fsdp || {};
    if (fsdp2) {  // FSDP2 has no use_orig_params; each call has its reshard_after_forward (units table)
      kv(settings, "reshard_after_forward", String(fsdpPolicy.reshard_after_forward) + " (each call's: units table)");
      kv(settings, "CPU offload", String(!!fsdpPolicy.cpu_offload));
    } else {
      kv(settings, "use_orig_params", String(mem.use_orig_params));
    }
    kv(settings, "optimizer", mem.optimizer);
    // 2-D plans (docs/tensor-parallel.md): the device mesh, what TP split, and TP's own collectives.
    const tpPlan = plan.tensor_parallel;
    if (tpPlan && tpPlan.mesh) {
      kv(settings, "device mesh", "(" + tpPlan.mesh.dim_names.map((d, i) => d + " " + tpPlan.mesh.shape[i]).join(", ") +
         "): init_device_mesh, fully_shard on the dp dimension" + (tpPlan.mesh.dim_names.length > 2 ? "s" : "") +
         ", the tensor-parallel plan on tp");
      const params = tpPlan.params || [];
      const split = params.filter((p) => p.tp_placement && /^(_Strided)?Shard\(/.test(p.tp_placement)).length;
      const repl = params.filter((p) => p.tp_placement === "Replicate()").length;
      kv(settings, "tensor parallel", (tpPlan.modules || []).length + " modules styled; " + split +
         " parameters split on tp, " + repl + " replicated, " + (params.length - split - repl) + " untouched");
      const tc = (plan.comm || {}).tensor_parallel;
      if (tc) {
        kv(settings, "tp communication", tc.sizes_known
          ? fmtBytes(tc.bytes) + " per rank per step (exact), " + tc.calls + " collectives on the tp group (" +
            tc.group_size + " ranks), blocking" + (plan.time && plan.time.tensor_parallel
              ? ": " + fmtSeconds(plan.time.tensor_parallel.comm_s) + " (estimate)" : "")
          : "sizes unknown: " + tc.unknown_reason);
      }
    }
    const r = mem.per_rank;
    kv(settings, "steady per rank", "params " + fmtBytes(r.params_bytes) + " + grads " + fmtBytes(r.grads_bytes) +
       " + optimizer " + fmtBytes(r.optimizer_bytes) + " + buffers " + fmtBytes(r.buffers_bytes) +
       " = " + fmtBytes(r.steady_bytes));
    kv(settings, "peak per rank", fmtBytes(r.peak_bytes));
    // The verdict against --hardware's memory, with the headroom it ASSUMES (plan/memory_fit.h).
    const fit = mem.fit;
    if (fit) {
      kv(settings, fit.verdict, "peak " + fmtBytes(r.peak_bytes) + " against " + fmtBytes(fit.usable_bytes) +
         " usable on the --hardware " + fit.hardware + " GPU: its " + fmtBytes(fit.device_bytes) + " less " +
         fmtBytes(fit.assumed_headroom_bytes) + " ASSUMED for the CUDA context, NCCL buffers and allocator fragmentation" +
         (fit.activations_known ? "" : "; the peak has no activations: a lower bound") +
         (fit.max_peak_bytes === null ? "" : "; --max-peak-bytes " + fmtBytes(fit.max_peak_bytes) +
          (r.peak_bytes <= fit.max_peak_bytes ? ": within" : ": over")));
    }
    // Activations are their own category: from the graph, an allowance, or not known (and how to get them).
    const acts = mem.activations || {};
    if (acts.source === "graph") {
      const dims = Object.entries(acts.dims || {}).map(([k, v]) => k + "=" + v).join(" ");
      kv(settings, "activations", fmtBytes(acts.saved_bytes) + " saved in forward" +
         (acts.held_after_forward_bytes !== acts.saved_bytes ? ", " + fmtBytes(acts.held_after_forward_bytes) + " held under activation checkpointing" : "") +
         "; " + fmtBytes(r.activation_bytes) + " live at the peak (graph" + (dims ? ", " + dims : "") + ", " + acts.device + ", sdpa " + acts.sdpa + ")");
    } else if (acts.source === "allowance") {
      kv(settings, "activations", fmtBytes(acts.allowance_bytes) + " (allowance, --activation-bytes)");
    } else if (acts.source === "unknown") {
      kv(settings, "activations", "not known: " + acts.reason);
    }
    for (const n of mem.notes || []) kv(settings, "note", n);
  }
  // Communication (exact bytes) and the step-time ESTIMATE with its assumptions (docs/time-model.md).
  const timeBox = document.getElementById("time-summary");
  if (plan.comm && plan.comm.per_step) {
    const c = plan.comm.per_step;
    kv(timeBox, "communication", "per rank per step, exact bytes: all-gather " +
       fmtBytes(c.all_gather.forward + c.all_gather.backward) + " (forward " + fmtBytes(c.all_gather.forward) +
       ", backward " + fmtBytes(c.all_gather.backward) + "), reduce-scatter " + fmtBytes(c.reduce_scatter.backward) +
       (c.all_reduce.backward ? ", all-reduce " + fmtBytes(c.all_reduce.backward) : "") + "; " + c.calls + " collectives");
  }
  if (plan.time) {
    const t = plan.time;
    kv(timeBox, "step time (estimate)", t.flops_known
      ? fmtSeconds(t.step_s) + " = compute " + fmtSeconds(t.compute_s) + " + exposed communication " +
        fmtSeconds(t.exposed_comm_s) + " + optimizer " + (t.optimizer_s === null ? "not modelled (CPU offload)" : fmtSeconds(t.optimizer_s)) +
        (t.tensor_parallel && t.tensor_parallel.comm_s > 0
          ? " + tensor-parallel communication " + fmtSeconds(t.tensor_parallel.comm_s) + " (blocking)" : "")
      : "not known without FLOPs (--flops FILE); exposed communication " + fmtSeconds(t.exposed_comm_s) + " of " +
        fmtSeconds(t.comm_s) + " in collectives");
    for (const a of t.assumptions || []) kv(timeBox, "assumption", a);
  }
  if (!plan.comm && !plan.time) kv(timeBox, "communication", "not in this plan");
  // The policy as this FSDP version reads it: FSDP2 has no force_leaf_modules, use_orig_params,
  // buffer_dtype or BatchNorm classes; each group with the reshard_after_forward its call gets.
  const shownPolicy = JSON.parse(JSON.stringify(plan.policy || {}));
  if (fsdp2) {
    delete shownPolicy.force_leaf_modules;
    if (!shownPolicy.min_num_params || !(shownPolicy.exclude_wrap_modules || []).length) delete shownPolicy.exclude_wrap_modules;
    if (shownPolicy.fsdp) delete shownPolicy.fsdp.use_orig_params;
    if (shownPolicy.mixed_precision) {
      delete shownPolicy.mixed_precision.buffer_dtype;
      delete shownPolicy.mixed_precision.ignore_classes;
    }
    const callOf = new Map(units.map((u) => [(u.modules || [u.path]).join("\n"), u]));
    for (const g of shownPolicy.groups || []) {
      const u = callOf.get(g.modules.join("\n"));
      if (g.reshard_after_forward === null || g.reshard_after_forward === undefined)
        g.reshard_after_forward = u ? u.reshard_after_forward : (shownPolicy.fsdp || {}).reshard_after_forward;
    }
  }
  document.getElementById("policy").textContent = JSON.stringify(shownPolicy, null, 2);

  // --- warnings and checks --------------------------------------------------
  const wbox = document.getElementById("warnings");
  if (!warnings.length) wbox.append(el("p", {}, "No warnings."));
  else {
    const t = el("table", { id: "warning-table" });
    // One row per kind of per-module warning, with the count and the first paths, as the text plan
    // folds them (report/warning_groups.h); the per-unit details keep each instance.
    const groups = [], at = new Map();
    for (const w of warnings) {
      const path = (w.modules && w.modules.length) ? (w.modules[0] || "(root)") : ((w.params || [])[0] || "");
      const key = w.kind + "/" + w.severity;
      if (path && at.has(key)) {
        const g = groups[at.get(key)];
        g.count += 1;
        g.paths.push(path);
        continue;
      }
      if (path) at.set(key, groups.length);
      groups.push({ w, count: 1, paths: path ? [path] : [] });
    }
    for (const g of groups) {
      const w = g.w;
      const tr = el("tr");
      const sev = el("td");
      sev.append(el("span", { class: "sev sev-" + w.severity }, w.severity));
      const kind = g.count > 1
        ? w.kind + " (x" + g.count + ": " + g.paths.slice(0, 3).join(", ") + (g.count > 3 ? ", ..." : "") + ")"
        : w.kind;
      tr.append(sev, el("td", {}, kind), el("td", {}, w.message));
      t.append(tr);
    }
    wbox.append(t);
  }
  const cbox = document.getElementById("checks");
  if (plan.checks) {
    cbox.append(el("h3", {}, "Checks: " + (plan.checks.passed ? "passed" : "failed")));
    const t = el("table", { id: "check-table" });
    for (const c of plan.checks.results) {
      const tr = el("tr");
      tr.append(el("td", { class: c.passed ? "pass" : "fail" }, c.passed ? "ok" : "FAIL"),
                el("td", {}, c.rule), el("td", {}, "limit " + c.limit + ", actual " + c.actual),
                el("td", {}, (c.units || []).map((p) => (p === "" ? "(root)" : p)).join(", ")));
      t.append(tr);
    }
    cbox.append(t);
  }
  if (plan.expect) {
    cbox.append(el("p", { class: plan.expect.equal ? "pass" : "fail" },
      "Expected plan " + plan.expect.file + ": " + (plan.expect.equal ? "equal" : "differs")));
  }

  // --- tooltip and details --------------------------------------------------
  const tooltip = document.getElementById("tooltip");
  function unitLines(i) {
    const u = units[i], m = u.memory || {};
    const lines = [
      ["class", u.qualified_class || u["class"]],
      ["parameters", fmtCount(u.param_numel) + " (" + fmtBytes(u.param_bytes) + "), " + (u.params || []).length + " tensors"],
      ["buffers", fmtCount(u.buffer_numel) + " (" + fmtBytes(u.buffer_bytes) + ")"],
      ["per rank", "sharded " + fmtBytes(m.sharded_bytes || 0) + ", gathered " + fmtBytes(m.unsharded_bytes || 0)],
      ["mixed precision", u.mixed_precision === null || u.mixed_precision === undefined ? "not set" : u.mixed_precision ? "on" : "off"],
    ];
    if (u.modules && u.modules.length > 1) lines.splice(0, 1, ["modules", u.modules.length + " in one fully_shard call"],
                                                        ["first's class", u.qualified_class || u["class"]]);
    if (fsdp2 && u.call !== undefined) lines.push(["fully_shard", "call " + u.call + ", reshard_after_forward " + u.reshard_after_forward]);
    if (u.comm) lines.push(["comm per step", fmtBytes(unitCommBytes(u)) + " (exact), " + u.comm.calls + " collectives"]);
    if (u.time) lines.push(["exposed comm", fmtSeconds(unitExposed(u)) + " (estimate)"]);
    const fz = frozenState(u);
    if (fz) lines.push(["gradients", fz]);
    for (const w of unitWarnings[i]) lines.push([w.severity, w.kind + ": " + w.message]);
    return lines;
  }
  function fillUnit(box, i) {
    box.replaceChildren(el("div", { class: "path" }, "#" + i + " " + unitName(units[i])));
    const t = el("table");
    for (const [k, v] of unitLines(i)) kv(t, k, v);
    box.append(t);
  }
  function place(e) {
    const pad = 14, w = tooltip.offsetWidth, h = tooltip.offsetHeight;
    const x = e.clientX + pad + w > innerWidth ? e.clientX - pad - w : e.clientX + pad;
    const y = e.clientY + pad + h > innerHeight ? e.clientY - pad - h : e.clientY + pad;
    tooltip.style.left = Math.max(0, x) + "px";
    tooltip.style.top = Math.max(0, y) + "px";
  }

  // --- treemap (d3-hierarchy) ----------------------------------------------
  (function treemap() {
    const box = document.getElementById("treemap");
    const legend = document.getElementById("treemap-legend");
    for (const [k, label] of STATUS) legend.append(el("span", { style: "--swatch: var(--" + k + ")" }, label));
    const W = treemapWidth, H = Math.round(Math.min(640, Math.max(360, W * 0.5)));
    // One row per unit, nested by enclosing unit; a unit with units inside also
    // gets an "own" leaf for the parameters it owns itself, so every area is
    // its own bytes. stratify and the layout are iterative: deep nests are fine.
    const hasKids = new Uint8Array(units.length);
    units.forEach((u) => { if (u.parent !== null && u.parent !== undefined) hasKids[u.parent] = 1; });
    const rows = [{ id: "top", parentId: null, kind: "top", value: 0 }];
    units.forEach((u, i) => {
      const parent = u.parent === null || u.parent === undefined ? "top" : "u" + u.parent;
      rows.push({ id: "u" + i, parentId: parent, kind: "unit", unit: i, value: hasKids[i] ? 0 : u.param_bytes });
      if (hasKids[i]) rows.push({ id: "o" + i, parentId: "u" + i, kind: "own", unit: i, value: u.param_bytes });
    });
    // Sibling units of one size in natural order of their names, each name split once.
    const split = new Map();
    const nameChunks = (i) => {
      if (i === undefined) return [];
      if (!split.has(i)) split.set(i, chunks(unitName(units[i])));
      return split.get(i);
    };
    performance.mark("fsdp-plan:treemap-start");
    const root = d3.stratify().id((d) => d.id).parentId((d) => d.parentId)(rows)
      .sum((d) => d.value)
      .sort((a, b) => b.value - a.value || (a.data.kind === "own") - (b.data.kind === "own") ||
                      compareChunks(nameChunks(a.data.unit), nameChunks(b.data.unit)) || (a.data.unit || 0) - (b.data.unit || 0));
    const labelled = (n) => n.data.kind === "unit" && n.children && n.x1 - n.x0 > 60 && n.y1 - n.y0 > 40;
    performance.mark("fsdp-plan:stratified");
    d3.treemap().tile(d3.treemapSquarify).size([W, H]).round(false)
      .paddingInner(1).paddingOuter((n) => (n.data.kind === "top" ? 0 : 2))
      .paddingTop((n) => (n.data.kind === "top" ? 0 : labelled(n) ? 15 : 2))(root);

    performance.mark("fsdp-plan:laid-out");
    const svg = svgEl("svg", { viewBox: "0 0 " + W + " " + H, height: H, id: "treemap-svg" });
    const rects = document.createDocumentFragment(), labels = document.createDocumentFragment();
    const status_ = units.map((_, i) => status(i));
    root.eachBefore((n) => {
      if (n.data.kind === "top") return;
      const i = n.data.unit, w = n.x1 - n.x0, h = n.y1 - n.y0;
      const frame = n.data.kind === "unit" && !!n.children;
      const cls = (n.data.kind === "own" ? "own" : "unit") + (frame ? " frame" : "") + " st-" + status_[i] +
                  (status_[i] === "ok" && units[i].depth % 2 ? " deep" : "");
      rects.append(svgEl("rect", { class: cls, x: n.x0, y: n.y0, width: w, height: h, "data-index": i }));
      const label = frame ? labelled(n) : w > 50 && h > 15;
      if (label) {
        const own = n.data.kind === "own", framed = own && labelled(n.parent);
        const name = framed ? "own parameters" : unitName(units[i]) + (own ? " (own)" : "");
        const fit = Math.floor((w - 6) / 6.2);
        labels.append(svgEl("text", { class: "label", x: n.x0 + 3, y: n.y0 + 11 },
                            name.length > fit ? "…" + name.slice(name.length - fit + 1) : name));
      }
    });
    svg.append(rects, labels);
    box.append(svg);
    performance.mark("fsdp-plan:treemap");

    const details = document.getElementById("unit-details");
    let selected = null;
    svg.addEventListener("mouseover", (e) => {
      const i = e.target.dataset && e.target.dataset.index;
      if (i === undefined) return;
      fillUnit(tooltip, +i);
      tooltip.hidden = false;
      place(e);
    });
    svg.addEventListener("mousemove", (e) => { if (!tooltip.hidden) place(e); });
    svg.addEventListener("mouseleave", () => { tooltip.hidden = true; });
    svg.addEventListener("click", (e) => {
      const i = e.target.dataset && e.target.dataset.index;
      if (i !== undefined) select(+i);
    });
    function select(i) {
      if (selected) selected.classList.remove("selected");
      selected = svg.querySelector('rect.unit[data-index="' + i + '"]');
      if (selected) selected.classList.add("selected");
      fillUnit(details, i);
      const ps = units[i].params || [];
      const t = el("table", { class: "params" });
      const head = el("tr");
      for (const h of ["parameter", "shape", "dtype", "numel"]) head.append(el("th", {}, h));
      t.append(head);
      for (const p of ps.slice(0, 500)) {
        const tr = el("tr");
        tr.append(el("td", {}, p.name), el("td", {}, "[" + (p.shape || []).join(", ") + "]"), el("td", {}, p.dtype),
                  el("td", { class: "num" }, fmtCount(p.numel)));
        t.append(tr);
      }
      details.append(t);
      if (ps.length > 500) details.append(el("p", {}, "… and " + (ps.length - 500) + " more parameters"));
      details.hidden = false;
    }

    // --- the units table: what the treemap shows, readable without a pointer
    const table = document.getElementById("unit-table");
    const heads = ["#", "unit", "class", "params", "size", "sharded/rank", "gathered/rank", "buffers", "mp"];
    if (fsdp2) heads.push("call", "reshard_after_forward");
    const commCols = units.length > 0 && !!units[0].comm, timeCols = units.length > 0 && !!units[0].time;
    if (commCols) heads.push("comm/step");
    if (timeCols) heads.push("exposed (estimate)");
    heads.push("warnings");
    const thead = el("thead"), htr = el("tr");
    for (const h of heads) htr.append(el("th", {}, h));
    thead.append(htr);
    const body = el("tbody");
    // Rows past the first thousand wait for a click: a table of 10,000 rows
    // takes the browser seconds to lay out (bench/html_render.py).
    const FIRST_ROWS = 1000;
    function addRows(from, to) {
      const frag = document.createDocumentFragment();
      const numeric = new Set(["#", "params", "size", "sharded/rank", "gathered/rank", "buffers", "comm/step",
                               "exposed (estimate)"]);
      for (let i = from; i < to; ++i) {
        const u = units[i];
        const m = u.memory || {};
        const tr = el("tr", { "data-index": i });
        const name = el("td", { class: "unit", style: "padding-left: " + (6 + 14 * Math.min(u.depth || 0, 12)) + "px" });
        name.append(el("span", { class: "st", style: "background: var(--" + status_[i] + ")" }), unitName(u));
        const mp = u.mixed_precision === null || u.mixed_precision === undefined ? "-" : u.mixed_precision ? "on" : "off";
        const cells = [String(i), name, u.modules && u.modules.length > 1 ? "group of " + u.modules.length : u["class"],
                       fmtCount(u.param_numel), fmtBytes(u.param_bytes), fmtBytes(m.sharded_bytes || 0),
                       fmtBytes(m.unsharded_bytes || 0), u.buffer_numel ? fmtBytes(u.buffer_bytes) : "-", mp];
        if (fsdp2) cells.push(u.call === undefined ? "-" : String(u.call), String(u.reshard_after_forward));
        if (commCols) cells.push(u.comm && unitCommBytes(u) ? fmtBytes(unitCommBytes(u)) : "-");
        if (timeCols) cells.push(u.time ? fmtSeconds(unitExposed(u)) : "-");
        cells.push(unitWarnings[i].map((w) => w.severity + ": " + w.kind).join(", "));
        cells.forEach((c, k) => {
          if (typeof c !== "string") { tr.append(c); return; }
          tr.append(el("td", numeric.has(heads[k]) ? { class: "num" } : heads[k] === "warnings" ? { class: "warn" } : {}, c));
        });
        frag.append(tr);
      }
      body.append(frag);
    }
    addRows(0, Math.min(units.length, FIRST_ROWS));
    table.append(thead, body);
    if (units.length > FIRST_ROWS) {
      const more = el("button", { id: "unit-table-more", type: "button" },
                      "show the other " + (units.length - FIRST_ROWS) + " units");
      more.addEventListener("click", () => { addRows(FIRST_ROWS, units.length); more.remove(); });
      table.parentElement.after(more);
    }
    body.addEventListener("click", (e) => {
      const tr = e.target.closest("tr[data-index]");
      if (tr) select(+tr.dataset.index);
    });
    performance.mark("fsdp-plan:unit-table");
  })();

  // --- memory over one step (d3-shape stack, d3-scale) ---------------------
  (function memoryChart() {
    const box = document.getElementById("memory-chart");
    const actsNote = document.getElementById("memory-activations");
    if (actsNote) {
      const src = (mem.activations || {}).source;
      actsNote.textContent = src === "graph" ? "activations from the graph" :
        src === "allowance" ? "activations: an allowance (--activation-bytes)" : "activations not included";
    }
    const steps = mem.timeline || [];
    if (!steps.length) {
      box.append(el("p", {}, "This plan has no memory timeline (written by an older fsdp-plan)."));
      return;
    }
    const CATS = [
      ["params_bytes", "sharded parameters", "#4e79a7"],
      ["optimizer_bytes", "optimizer state", "#76b7b2"],
      ["buffers_bytes", "buffers", "#bab0ac"],
      ["grads_bytes", "sharded gradients", "#59a14f"],
      // Not the treemap's orange (warning) or red (error): nothing here is a fault.
      ["gathered_bytes", "gathered parameters", "#9c755f"],
      ["unsharded_grads_bytes", "unsharded gradients", "#ff9da7"],
    ];
    // Activations (saved tensors, their gradients, recompute) when the plan knows them.
    if (steps[0].activation_bytes !== undefined) CATS.push(["activation_bytes", "activations", "#edc948"]);
    const legend = document.getElementById("memory-legend");
    for (const [, label, color] of CATS) legend.append(el("span", { style: "--swatch: " + color }, label));
    const W = chartWidth, H = 340;
    const M = { left: 76, right: 16, top: 34, bottom: 26 };
    const n = steps.length;
    const x = d3.scaleLinear().domain([0, n]).range([M.left, W - M.right]);
    const top = d3.max(steps, (s) => s.total_bytes) || 1;
    // Ticks at round numbers of the binary unit the top is in (KiB, MiB, ...).
    const scale = Math.pow(1024, Math.max(0, Math.floor(Math.log(top) / Math.log(1024))));
    const y = d3.scaleLinear().domain([0, (top * 1.08) / scale]).nice().range([H - M.bottom, M.top]);
    const yb = (bytes) => y(bytes / scale);
    // Step i covers [i, i+1]. More steps than pixels: each of at most two
    // buckets per pixel shows its largest step, so no high point (the peak
    // least of all) is lost. The last step repeats so the step curve closes.
    const buckets = Math.min(n, Math.ceil(2 * (W - M.left - M.right)));
    const points = [], xs = [];
    for (let b = 0; b < buckets; ++b) {
      const from = Math.floor((b * n) / buckets), to = Math.floor(((b + 1) * n) / buckets);
      let best = from;
      for (let i = from + 1; i < to; ++i) if (steps[i].total_bytes > steps[best].total_bytes) best = i;
      points.push(steps[best]);
      xs.push(from);
    }
    points.push(steps[n - 1]);
    xs.push(n);
    const series = d3.stack().keys(CATS.map((c) => c[0]))(points);
    const area = d3.area().curve(d3.curveStepAfter).x((d, i) => x(xs[i])).y0((d) => yb(d[0])).y1((d) => yb(d[1]));

    const svg = svgEl("svg", { viewBox: "0 0 " + W + " " + H, height: H, id: "memory-svg" });
    // Phase bands: forward, backward, optimizer step.
    const phases = [];
    steps.forEach((s, i) => {
      if (!phases.length || phases[phases.length - 1].phase !== s.phase) phases.push({ phase: s.phase, from: i, to: i + 1 });
      else phases[phases.length - 1].to = i + 1;
    });
    phases.forEach((p, k) => {
      if (k % 2 === 0) svg.append(svgEl("rect", { class: "phase-band", x: x(p.from), y: M.top, width: x(p.to) - x(p.from), height: H - M.top - M.bottom }));
      svg.append(svgEl("text", { class: "phase-label", x: x(p.from) + 3, y: H - 8 }, p.phase === "optimizer step" ? "opt." : p.phase + " →"));
    });
    const axis = svgEl("g", { class: "axis" });
    for (const t of y.ticks(5)) {
      axis.append(svgEl("line", { x1: M.left, x2: W - M.right, y1: y(t), y2: y(t) }));
      axis.append(svgEl("text", { x: M.left - 6, y: y(t) + 4, "text-anchor": "end" }, fmtBytes(Math.round(t * scale))));
    }
    svg.append(axis);
    series.forEach((s, k) => svg.append(svgEl("path", { class: "area", d: area(s), fill: CATS[k][2], "data-category": CATS[k][0] })));

    // The peak: the step the memory model names (phase and unit).
    const peak = mem.peak || {};
    const isPeak = (s) => s.phase === peak.phase && (s.unit === null ? null : s.unit) === (peak.unit === undefined ? null : peak.unit);
    // FSDP2 visits a unit more than once in backward: prefer the visit at the peak's bytes.
    let at = steps.findIndex((s) => isPeak(s) && s.total_bytes === (mem.per_rank || {}).peak_bytes);
    if (at < 0) at = steps.findIndex(isPeak);
    if (at < 0) at = d3.maxIndex(steps, (s) => s.total_bytes);
    const px = x(at + 0.5), peakStep = steps[at];
    svg.append(svgEl("line", { class: "peak-line", x1: px, x2: px, y1: M.top - 6, y2: H - M.bottom }));
    svg.append(svgEl("circle", { cx: px, cy: yb(peakStep.total_bytes), r: 4, fill: "#b42318" }));
    const where = peakStep.unit === null ? "" : " at unit " + peakStep.unit + " " + unitName(units[peakStep.unit]);
    const label = svgEl("text", {
      id: "peak-label", y: M.top - 12, "data-bytes": peakStep.total_bytes, "data-phase": peakStep.phase,
      "data-unit-path": peakStep.unit === null ? "" : units[peakStep.unit].path,
    }, "peak " + fmtBytes(peakStep.total_bytes) + " in " + peakStep.phase + where);
    const right = px > W * 0.6;
    label.setAttribute("x", right ? px - 6 : px + 6);
    label.setAttribute("text-anchor", right ? "end" : "start");
    svg.append(label);

    const cursor = svgEl("line", { class: "cursor-line", y1: M.top, y2: H - M.bottom, visibility: "hidden" });
    svg.append(cursor);
    box.append(svg);
    svg.addEventListener("mousemove", (e) => {
      const r = svg.getBoundingClientRect();
      const i = Math.floor(x.invert(((e.clientX - r.left) * W) / r.width));
      if (i < 0 || i >= n) { tooltip.hidden = true; cursor.setAttribute("visibility", "hidden"); return; }
      const s = steps[i];
      cursor.setAttribute("x1", x(i + 0.5));
      cursor.setAttribute("x2", x(i + 0.5));
      cursor.setAttribute("visibility", "visible");
      tooltip.replaceChildren(el("div", { class: "path" }, s.phase + (s.unit === null ? "" : " at unit " + s.unit + " " + unitName(units[s.unit]))));
      const t = el("table");
      for (const [k, name] of CATS.slice().reverse()) kv(t, name, fmtBytes(s[k]));
      kv(t, "total", fmtBytes(s.total_bytes));
      tooltip.append(t);
      tooltip.hidden = false;
      place(e);
    });
    svg.addEventListener("mouseleave", () => { tooltip.hidden = true; cursor.setAttribute("visibility", "hidden"); });
    performance.mark("fsdp-plan:memory");
  })();

  document.body.dataset.renderMs = (performance.now() - started).toFixed(1);
  document.body.dataset.ready = "1";
})();
