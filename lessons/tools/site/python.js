// The course site's Python: Pyodide (CPython compiled to WebAssembly) with the simulator's archive (core/, sim/,
// course/playground.py and SimPy), started once per page and shared by whatever on it needs it.
// `servingLabPython(root)`: a promise of {pyodide, loadMs}; root is the site's playground/ folder (absolute URL).
window.servingLabPython = (() => {
  "use strict";
  let started = null;
  return root => {
    if (started === null) {
      started = (async () => {
        const begun = performance.now();
        const pyodide = await loadPyodide({indexURL: root + "pyodide/"});
        const archive = await fetch(root + "serving_lab_sim.zip");
        if (!archive.ok) throw new Error(`the simulator's archive did not load (HTTP ${archive.status})`);
        pyodide.unpackArchive(await archive.arrayBuffer(), "zip", {extractDir: "/home/pyodide/serving_lab"});
        pyodide.runPython("import sys; sys.path.insert(0, '/home/pyodide/serving_lab'); import course.playground");
        return {pyodide, loadMs: performance.now() - begun};
      })();
    }
    return started;
  };
})();

// What a page opened from disk (file://) says instead of starting Python: it cannot load WebAssembly there.
window.servingLabFileNote = "The simulator runs in the browser with WebAssembly, which a page opened from disk " +
  "cannot load: serve the site (python -m http.server -d site) and open it at http://localhost:8000/.";

// Run `course.playground.<name>(**kwargs)` and return its result, passed through JSON both ways.
window.servingLabCall = (pyodide, name, kwargs) => {
  pyodide.globals.set("serving_lab_call", JSON.stringify({name, kwargs}));
  return JSON.parse(pyodide.runPython(
    "import json\ncall = json.loads(serving_lab_call)\n" +
    "json.dumps(getattr(course.playground, call['name'])(**call['kwargs']), allow_nan=False)"));
};
