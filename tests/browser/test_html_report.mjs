// The HTML report in a real browser: Debian's chromium driven by playwright-core.
// For each model: the page has one rectangle per unit, hovering a unit shows its
// path, the peak label agrees with the JSON plan, nothing is logged as an error
// and nothing is requested but the page itself. Screenshots go to OUT_DIR.
// Also (issue 24): a units table, visible without hovering, one row per unit in
// the plan's order (FSDP2: each call's reshard_after_forward); sibling units of
// one size in the treemap in natural path order (layers 2 before 10); memory
// colours apart from the warning and error colours; FSDP2 pages without
// FSDP1-only settings; tooltip text inside its box. Issue 26: a 2-D plan shows its mesh.
//
// Usage: node test_html_report.mjs FSDP_PLAN_BINARY NODE_PREFIX OUT_DIR   (run by ctest;
//        NODE_PREFIX holds node_modules/playwright-core, installed from this
//        directory's package-lock.json by npm ci)
//    or: node test_html_report.mjs --time PAGE.html NODE_PREFIX   (prints the render time)
//    or: node test_html_report.mjs --screenshot PAGE.html OUT.png NODE_PREFIX   (units and memory, for docs/)
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const CHROMIUM = "/usr/bin/chromium";
const FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"];

function fail(message) {
  console.error("FAIL: " + message);
  process.exitCode = 1;
}
function check(ok, message) {
  if (!ok) fail(message);
  return ok;
}

function playwright(prefix) {
  const require = createRequire(path.join(path.resolve(prefix), "package.json"));
  return require("playwright-core");
}

// A fresh profile per run; the page is opened from a file.
async function openBrowser(pw) {
  if (!fs.existsSync(CHROMIUM)) throw new Error(CHROMIUM + " is missing: apt-get install chromium (scripts/dev does)");
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "fsdp-plan-chromium-"));
  const context = await pw.chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM, headless: true, args: FLAGS, viewport: { width: 1280, height: 900 },
  });
  return { context, close: async () => { await context.close(); fs.rmSync(profile, { recursive: true, force: true }); } };
}

// Opens the page and waits for report.js to finish; returns what went wrong on the way.
async function load(context, file) {
  const page = await context.newPage();
  const url = pathToFileURL(file).href;
  const errors = [], requests = [];
  page.on("console", (m) => { if (m.type() === "error") errors.push("console: " + m.text()); });
  page.on("pageerror", (e) => errors.push("page error: " + e.message));
  page.on("request", (r) => { if (r.url() !== url) requests.push(r.url()); });
  const t0 = Date.now();
  await page.goto(url);
  await page.waitForSelector("body[data-ready='1']", { timeout: 60000 });
  const wallMs = Date.now() - t0;
  return { page, errors, requests, wallMs };
}

// Natural order of unit paths: digit runs compare as numbers ("layers.2" < "layers.10").
function naturalCompare(a, b) {
  const split = (s) => s.split(/(\d+)/).map((p, i) => (i % 2 ? Number(p) : p));
  const x = split(a), y = split(b);
  for (let i = 0; i < Math.min(x.length, y.length); ++i)
    if (x[i] !== y[i]) return x[i] < y[i] ? -1 : 1;
  return x.length - y.length;
}

// Bytes as the text plan prints them (lib/util/strings.cpp format_bytes: %.1f, ties to even).
function fmtBytes(n) {
  const names = [" B", " KiB", " MiB", " GiB", " TiB", " PiB"];
  let v = n, u = 0;
  while (v >= 1024 && u + 1 < names.length) { v /= 1024; ++u; }
  if (u === 0) return String(n) + names[0];
  const m = v * 10;
  if (m % 1 === 0.5 && Math.floor(m) % 2 === 0) return (Math.floor(m) / 10).toFixed(1) + names[u];
  return v.toFixed(1) + names[u];
}

// Seconds as the text plan prints them (lib/report/time_text.cpp format_seconds).
function fmtSeconds(s) {
  if (!(s > 0)) return "0 s";
  const [v, u] = s < 1e-3 ? [s * 1e6, " us"] : s < 1 ? [s * 1e3, " ms"] : [s, " s"];
  return v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0) + u;
}

function rgb(color) {  // "#rrggbb" or "rgb(r, g, b)"
  const c = color.trim();
  const hex = c.match(/^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i);
  if (hex) return hex.slice(1, 4).map((v) => parseInt(v, 16));
  const dec = c.match(/^rgb\((\d+), (\d+), (\d+)\)$/);
  return dec ? dec.slice(1, 4).map(Number) : null;
}

async function checkPage(page, name, plan) {
  const n = plan.units.length;
  const label = (u) => (u.modules && u.modules.length > 1 ? "[" + u.modules.join(", ") + "]" : u.path === "" ? "(root)" : u.path);
  // The units table: there without any hover, one row per unit, in the plan's order.
  const table = page.locator("#unit-table");
  check(await table.isVisible(), `${name}: no units table visible without hovering`);
  const rows = await page.$$eval("#unit-table tbody tr[data-index]", (trs) =>
    trs.map((tr) => ({ index: Number(tr.dataset.index), cells: [...tr.cells].map((c) => c.textContent) })));
  check(rows.length === n && rows.every((r, i) => r.index === i),
        `${name}: the units table has rows ${rows.map((r) => r.index).join(",")}, want 0..${n - 1}`);
  const heads = await page.$$eval("#unit-table thead th", (ths) => ths.map((th) => th.textContent));
  rows.forEach((r, i) => {
    const u = plan.units[i];
    check(r.cells[1].trim() === label(u), `${name}: units table row ${i} names "${r.cells[1].trim()}", want "${label(u)}"`);
    if (plan.fsdp_version === 2) {
      const col = heads.indexOf("reshard_after_forward");
      check(col >= 0 && r.cells[col] === String(u.reshard_after_forward),
            `${name}: row ${i}: reshard_after_forward "${col >= 0 ? r.cells[col] : "(no column)"}", plan ${u.reshard_after_forward}`);
    }
  });
  // Issue 27: per unit its communication per step (exact bytes, as the text plan formats them) and
  // the exposed communication, marked as an estimate; the step-time table says "estimate" too.
  if (plan.comm) {
    const commCol = heads.indexOf("comm/step"), expCol = heads.indexOf("exposed (estimate)");
    check(commCol >= 0 && expCol >= 0, `${name}: the units table has no comm/step or exposed (estimate) column`);
    rows.forEach((r, i) => {
      const c = plan.units[i].comm;
      const bytes = c.all_gather_forward_bytes + c.all_gather_backward_bytes + c.reduce_scatter_bytes + c.all_reduce_bytes;
      const want = bytes ? fmtBytes(bytes) : "-";
      check(commCol < 0 || r.cells[commCol] === want, `${name}: row ${i}: comm/step "${r.cells[commCol]}", plan ${bytes} bytes (${want})`);
      // Schema 2: the unit's exposed communication is its forward, backward and tail parts.
      const t = plan.units[i].time;
      const exposed = fmtSeconds(t.exposed_forward_s + t.exposed_backward_s + t.exposed_tail_s);
      check(expCol < 0 || r.cells[expCol] === exposed, `${name}: row ${i}: exposed "${r.cells[expCol]}", plan ${exposed}`);
    });
    const timeText = await page.locator("#time-summary").textContent();
    check(/step time \(estimate\)/.test(timeText) && timeText.includes("ESTIMATE"),
          `${name}: the step-time table does not say it is an estimate: ${timeText.slice(0, 200)}`);
  }
  // The treemap: siblings of one size in natural order of their paths.
  const order = await page.$$eval("#treemap rect.unit", (rs) => rs.map((r) => Number(r.dataset.index)));
  const seen = new Map();  // parent -> [index] in drawing order
  for (const i of order) {
    const key = plan.units[i].parent ?? -1;
    if (!seen.has(key)) seen.set(key, []);
    seen.get(key).push(i);
  }
  for (const kids of seen.values())
    for (let k = 1; k < kids.length; ++k) {
      const a = plan.units[kids[k - 1]], b = plan.units[kids[k]];
      if (a.param_bytes === b.param_bytes)
        check(naturalCompare(label(a), label(b)) < 0, `${name}: the treemap draws ${label(a)} before ${label(b)}`);
    }
  // Memory colours are not the treemap's warning and error colours.
  const vars = await page.evaluate(() => {
    const cs = getComputedStyle(document.documentElement);
    return { warning: cs.getPropertyValue("--warning"), error: cs.getPropertyValue("--error") };
  });
  const fills = await page.$$eval("#memory-svg path.area", (ps) => ps.map((p) => [p.dataset.category, p.getAttribute("fill")]));
  for (const [cat, fill] of fills)
    for (const [status, color] of Object.entries(vars)) {
      const a = rgb(fill), b = rgb(color);
      const d = a && b ? Math.hypot(a[0] - b[0], a[1] - b[1], a[2] - b[2]) : 0;
      check(d >= 60, `${name}: memory category ${cat} (${fill}) looks like the ${status} colour (${color.trim()})`);
    }
  // FSDP2 has no use_orig_params or force_leaf_modules; every group says its reshard_after_forward.
  const settings = await page.locator("#memory-settings").textContent();
  // Issue 41: the fits verdict against --hardware, with the headroom it assumes.
  if (plan.memory.fit)
    check(settings.includes(plan.memory.fit.verdict + "peak ") && settings.includes("ASSUMED for the CUDA context"),
          `${name}: the page does not show the verdict ${plan.memory.fit.verdict}: ${settings.slice(0, 300)}`);
  // Issue 26: a 2-D plan's page shows its device mesh, and TP's communication as the JSON has it.
  if (plan.tensor_parallel) {
    const text = await page.locator("#memory-settings").textContent();
    const m = plan.tensor_parallel.mesh;
    const mesh = "(" + m.dim_names.map((d, i) => d + " " + m.shape[i]).join(", ") + ")";
    check(await page.locator("#memory-settings").isVisible() && text.includes("device mesh" + mesh),
          `${name}: the page does not show the device mesh ${mesh}: ${text.slice(0, 300)}`);
    const tc = plan.comm.tensor_parallel;
    check(text.includes("tp communication" + (tc.sizes_known ? fmtBytes(tc.bytes) : "sizes unknown")),
          `${name}: the page's tp communication is not the plan's (${tc.sizes_known ? tc.bytes + " bytes" : "unknown"})`);
  }
  const policy = JSON.parse(await page.locator("#policy").textContent());
  if (plan.fsdp_version === 2) {
    check(!settings.includes("use_orig_params"), `${name}: an FSDP2 page shows use_orig_params`);
    check(!("force_leaf_modules" in policy) && !("use_orig_params" in (policy.fsdp || {})),
          `${name}: an FSDP2 page's policy shows FSDP1-only settings`);
    for (const g of policy.groups || [])
      check(g.reshard_after_forward !== null && g.reshard_after_forward !== undefined,
            `${name}: group [${g.modules}] has no reshard_after_forward on the page`);
  } else {
    check(settings.includes("use_orig_params"), `${name}: an FSDP1 page lacks use_orig_params`);
  }
}

// Every cell of the tooltip inside its box, a long unbroken class name too.
async function checkTooltipFits(page, name) {
  const overflow = () => page.evaluate(() => {
    const t = document.getElementById("tooltip");
    const box = t.getBoundingClientRect();
    return [...t.querySelectorAll("td, div")].filter((c) => {
      const r = c.getBoundingClientRect();
      return c.scrollWidth > c.clientWidth + 1 || r.right > box.right + 0.5;
    }).map((c) => c.textContent.slice(0, 40));
  });
  let out = await overflow();
  check(out.length === 0, `${name}: tooltip text runs past its box: ${out.join(" | ")}`);
  await page.evaluate(() => {
    const cell = document.querySelector("#tooltip td");
    if (cell) cell.textContent = "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlockWithAVeryLongName";
  });
  out = await overflow();
  check(out.length === 0, `${name}: a long class name runs past the tooltip: ${out.join(" | ")}`);
}

async function checkModel(context, binary, outDir, name, args) {
  console.log(`-- ${name}: fsdp-plan ${args.join(" ")}`);
  const run = (extra) => spawnSync(binary, [...args, ...extra], { encoding: "utf8", maxBuffer: 1 << 30 });
  const j = run(["--format", "json"]);
  if (!check(j.status === 0 || j.status === 1, `${name}: json exit ${j.status}: ${j.stderr}`)) return;
  const plan = JSON.parse(j.stdout);
  const file = path.join(outDir, name + ".html");
  const h = run(["--format", "html", "-o", file]);
  if (!check(h.status === j.status && h.stdout === "", `${name}: html exit ${h.status}: ${h.stderr}`)) return;

  const { page, errors, requests } = await load(context, file);
  const n = plan.units.length;
  const rects = await page.locator("#treemap rect.unit").count();
  check(rects === n, `${name}: ${rects} unit rectangles for ${n} units`);

  // Hover the largest unit with no unit inside it (its whole rectangle is its own).
  const parents = new Set(plan.units.map((u) => u.parent));
  let pick = -1;
  plan.units.forEach((u, i) => { if (!parents.has(i) && (pick < 0 || u.param_bytes > plan.units[pick].param_bytes)) pick = i; });
  await page.hover(`#treemap rect.unit[data-index="${pick}"]`);
  const shown = await page.locator("#tooltip .path").textContent();
  const pu = plan.units[pick];
  const want = `#${pick} ${pu.modules && pu.modules.length > 1 ? "[" + pu.modules.join(", ") + "]" : pu.path === "" ? "(root)" : pu.path}`;
  check(shown === want, `${name}: hovering unit ${pick} shows "${shown}", want "${want}"`);
  check(await page.locator("#tooltip").isVisible(), `${name}: the tooltip is not visible`);
  await checkTooltipFits(page, name);
  await checkPage(page, name, plan);

  // The peak label names the plan's peak.
  const peak = plan.memory.peak, perRank = plan.memory.per_rank;
  const label = page.locator("#peak-label");
  const text = await label.textContent();
  check(Number(await label.getAttribute("data-bytes")) === perRank.peak_bytes,
        `${name}: peak label has ${await label.getAttribute("data-bytes")} bytes, plan says ${perRank.peak_bytes}`);
  check(await label.getAttribute("data-unit-path") === (peak.unit_path ?? ""), `${name}: peak label's unit differs from the plan's`);
  // The text plan's peak line, as C++ formats it: "peak 1.1 MiB in backward at unit 2 blocks.1, 3 units gathered"
  // (FSDP2: "...blocks.1: sharded_params 90.3 KiB, ..." by category).
  const t = run(["--format", "text"]);
  const line = t.stdout.split("\n").map((l) => l.trim()).find((l) => l.startsWith("peak "));
  check(line !== undefined && (line === text || line.startsWith(text + ",") || line.startsWith(text + ":")),
        `${name}: peak label "${text}" is not the text plan's "${line}"`);
  check(await page.locator("#memory-svg path.area").count() === 6, `${name}: the memory chart lacks its six categories`);
  check(await page.locator("#warning-table tr").count() === plan.warnings.length ||
        (plan.warnings.length === 0 && await page.locator("#warnings").textContent() === "No warnings."),
        `${name}: the warnings table does not list the plan's ${plan.warnings.length} warnings`);

  await page.screenshot({ path: path.join(outDir, name + ".png"), fullPage: true });
  check(errors.length === 0, `${name}: ${errors.join("; ")}`);
  check(requests.length === 0, `${name}: the page requested ${requests.join(", ")}`);
  await page.close();
  console.log(`   ${n} units, hovered ${want}, label "${text}"`);
}

async function main() {
  const argv = process.argv.slice(2);
  if (argv[0] === "--time") {
    const [, file, prefix] = argv;
    const browser = await openBrowser(playwright(prefix));
    try {
      for (let k = 0; k < 3; ++k) {
        const { page, errors, requests, wallMs } = await load(browser.context, path.resolve(file));
        const scriptMs = await page.evaluate(() => document.body.dataset.renderMs);
        // After the next frame: layout and paint of what report.js built.
        const paintedMs = await page.evaluate(() => new Promise((done) =>
          requestAnimationFrame(() => setTimeout(() => done(performance.now().toFixed(0))))));
        const marks = await page.evaluate(() => performance.getEntriesByType("mark")
          .map((m) => m.name.replace("fsdp-plan:", "") + " " + m.startTime.toFixed(0)).join(", "));
        const rects = await page.locator("#treemap rect.unit").count();
        console.log(`run ${k + 1}: ${rects} unit rectangles; from navigation to rendered ${wallMs} ms ` +
                    `(report.js ${scriptMs} ms; painted at ${paintedMs} ms of the page's clock; marks: ${marks}); ` +
                    `errors ${errors.length}, requests ${requests.length}`);
        await page.close();
      }
    } finally {
      await browser.close();
    }
    return;
  }
  if (argv[0] === "--screenshot") {
    const [, file, out, prefix] = argv;
    const browser = await openBrowser(playwright(prefix));
    try {
      const { page } = await load(browser.context, path.resolve(file));
      await page.setViewportSize({ width: 1100, height: 900 });
      await page.reload();
      await page.waitForSelector("body[data-ready='1']");
      const box = await page.locator("#memory-section").boundingBox();
      await page.screenshot({ path: out, fullPage: true, clip: { x: 0, y: 0, width: 1100, height: Math.ceil(box.y + box.height) + 8 } });
    } finally {
      await browser.close();
    }
    return;
  }
  const [binary, prefix, outDir] = argv;
  fs.mkdirSync(outDir, { recursive: true });
  const models = path.join(ROOT, "sample_models"), policies = path.join(ROOT, "policies");
  const browser = await openBrowser(playwright(prefix));
  try {
    await checkModel(browser.context, binary, outDir, "tiny_gpt",
      [path.join(models, "tiny_gpt.pt"), "--policy", path.join(policies, "transformer.json"), "--world-size", "8"]);
    // Size-based: tied weights split across units (a warning) and an empty unit.
    await checkModel(browser.context, binary, outDir, "tiny_gpt_size_based",
      [path.join(models, "tiny_gpt.pt"), "--policy", path.join(policies, "size_based.json"), "--world-size", "4",
       "--max-unit-numel", "40000"]);
    // Mixed precision with BatchNorm units that run without it.
    await checkModel(browser.context, binary, outDir, "small_cnn_mixed_precision",
      [path.join(models, "small_cnn.pt"), "--policy", path.join(policies, "mixed_precision.json"), "--world-size", "2"]);
    // FSDP2: several timeline steps per unit in backward; the label must still find the peak's.
    await checkModel(browser.context, binary, outDir, "tiny_gpt_fsdp2",
      [path.join(models, "tiny_gpt.pt"), "--policy", path.join(policies, "fsdp2.json"), "--world-size", "8"]);
    // A 2-D plan (FSDP2 with tensor parallelism): the mesh, and TP's sizes unknown from TorchScript.
    const tp = path.join(outDir, "tiny_gpt_tp.json");
    fs.writeFileSync(tp, JSON.stringify({
      module_classes: ["Block"], fsdp: { version: 2, world_size: 8 },
      tensor_parallel: { degree: 2, mesh: { dp_shard: 4 }, plan: {
        "blocks.*.attn.qkv": "colwise", "blocks.*.attn.proj": "rowwise",
        "blocks.*.mlp.fc": "colwise", "blocks.*.mlp.out": "rowwise" } } }));
    await checkModel(browser.context, binary, outDir, "tiny_gpt_tp",
      [path.join(models, "tiny_gpt.pt"), "--policy", tp]);
    // Twenty units of the root, seven LayerNorms of one size among them: natural order in the treemap.
    const many = path.join(outDir, "layer_norms_and_linears.json");
    fs.writeFileSync(many, JSON.stringify({ module_classes: ["LayerNorm", "Linear"] }));
    await checkModel(browser.context, binary, outDir, "tiny_gpt_many_units",
      [path.join(models, "tiny_gpt.pt"), "--policy", many, "--world-size", "8"]);
  } finally {
    await browser.close();
  }
  if (process.exitCode) console.error("html report: FAILED");
  else console.log("html report: all checks passed");
}

main().catch((e) => { console.error(e); process.exit(1); });
