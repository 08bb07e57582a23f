// A lesson's playground: the course's own simulator (course/playground.py with core/, sim/ and SimPy) run
// in the reader's browser by Pyodide, drawn with uPlot. "Predict, then run": Run waits for a prediction.
//
// Everything it loads lies in the site's playground/ folder (Pyodide's runtime, the simulator's archive,
// uPlot), so it works offline; Pyodide starts the first time the reader touches the playground, not when
// the page opens. A page opened from disk (file://) cannot load WebAssembly, so there it says how to serve
// the site instead.
(() => {
  "use strict";
  const COLORS = ["#2563eb", "#ea580c", "#16a34a", "#7c3aed", "#db2777", "#6b7280"];
  function el(tag, attrs = {}, text = "") {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text) node.textContent = text;
    return node;
  }

  function chartOf(chart, container) {
    const rightAxis = chart.series.some(s => s.right_axis);
    const series = [{label: chart.x_label}].concat(chart.series.map((s, i) => ({
      label: s.label, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true,
      scale: s.right_axis ? "y2" : "y", points: {show: chart.x.length <= 64},
    })));
    const axes = [{label: chart.x_label}, {label: chart.y_label}];
    if (rightAxis) axes.push({label: chart.y2_label, scale: "y2", side: 1, grid: {show: false}});
    const scales = {x: {time: false, distr: chart.log_x ? 3 : 1}};
    if (rightAxis) scales.y2 = {auto: true};
    const width = Math.max(320, Math.floor(container.getBoundingClientRect().width) - 40);
    return new uPlot({title: chart.title, width, height: 300, scales, series, axes},
                     [chart.x].concat(chart.series.map(s => s.values)), container);
  }

  function format(x) {
    return Math.abs(x) >= 100 ? x.toFixed(0) : x.toPrecision(3);
  }

  function setUp(section) {
    const spec = JSON.parse(section.querySelector("script[type='application/json']").textContent);
    const root = new URL(section.dataset.root, location.href).href;  // Pyodide wants an absolute indexURL
    const form = section.querySelector(".pg-form");
    const status = section.querySelector(".pg-status");
    const knobs = {};  // name -> () => the chosen value
    for (const knob of spec.knobs) {
      const label = el("label", {}, knob.label + " ");
      if (knob.choices.every(c => typeof c === "number")) {
        // a slider over the offered values (the simulator runs only those), with the value beside it
        const slider = el("input", {type: "range", name: knob.name, min: "0", max: String(knob.choices.length - 1),
                                    step: "1", value: String(knob.choices.indexOf(knob.default))});
        const shown = el("output", {}, String(knob.default));
        slider.addEventListener("input", () => { shown.textContent = String(knob.choices[+slider.value]); });
        knobs[knob.name] = () => knob.choices[+slider.value];
        label.append(slider, shown);
      } else {
        const select = el("select", {name: knob.name});
        for (const choice of knob.choices) {
          const option = el("option", {value: String(knob.choices.indexOf(choice))}, String(choice));
          if (choice === knob.default) option.selected = true;
          select.append(option);
        }
        knobs[knob.name] = () => knob.choices[+select.value];
        label.append(select);
      }
      form.append(label);
    }
    const guess = el("input", {type: "number", step: "any", class: "pg-guess", required: ""});
    const guessLabel = el("label", {class: "pg-question"}, spec.question + " ");
    guessLabel.append(guess, document.createTextNode(" " + spec.unit));
    const run = el("button", {type: "submit", class: "pg-run", disabled: ""}, "Run the simulator");
    form.append(guessLabel, run);

    if (location.protocol === "file:") {
      status.textContent = servingLabFileNote;
      return;
    }
    const warm = () => servingLabPython(root).catch(() => {});  // its failure is reported when Run awaits it
    form.addEventListener("focusin", warm, {once: true});
    form.addEventListener("pointerover", warm, {once: true});
    guess.addEventListener("input", () => { run.disabled = guess.value === ""; });
    form.addEventListener("submit", async event => {
      event.preventDefault();
      if (guess.value === "") return;
      run.disabled = true;
      section.dataset.state = "running";
      status.textContent = "Starting Python in your browser...";
      try {
        const {pyodide, loadMs} = await servingLabPython(root);
        status.textContent = "Simulating...";
        await new Promise(resolve => setTimeout(resolve, 20));  // let the status paint first
        const chosen = Object.fromEntries(Object.entries(knobs).map(([name, value]) => [name, value()]));
        const started = performance.now();
        const result = servingLabCall(pyodide, "run", {lesson: spec.lesson, ...chosen});
        const runMs = performance.now() - started;
        const out = section.querySelector(".pg-result");
        out.replaceChildren();
        const predicted = Number(guess.value);
        const miss = result.answer === 0 ? 0 : 100 * (predicted - result.answer) / result.answer;
        const off = miss === 0 ? "" : ` (your guess is ${format(Math.abs(miss))}% ${miss < 0 ? "below" : "above"})`;
        out.append(el("p", {class: "pg-verdict"},
          `You predicted ${format(predicted)}${spec.unit}; the simulator says ${format(result.answer)}${spec.unit}${off}.`));
        const chart = el("div", {class: "pg-chart"});
        out.append(chart);
        chartOf(result.chart, chart);
        const lines = el("ul");
        for (const line of result.lines) lines.append(el("li", {}, line));
        out.append(lines);
        status.textContent = `Simulated in ${(runMs / 1000).toFixed(1)} s (Python started in ${(loadMs / 1000).toFixed(1)} s).`;
        Object.assign(section.dataset, {state: "done", digest: result.digest, answer: String(result.answer),
                                        loadMs: String(Math.round(loadMs)), runMs: String(Math.round(runMs))});
      } catch (error) {
        section.dataset.state = "failed";
        status.textContent = `The simulator failed: ${error.message || error}`;
        console.error(error);
      } finally {
        run.disabled = guess.value === "";
      }
    });
  }

  document.querySelectorAll("section.playground").forEach(setUp);
})();
