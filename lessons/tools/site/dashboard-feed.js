// The course site's dashboard: the server's dashboard page (dashboard.js, unchanged) fed not by a server's
// event stream but by the simulator in the browser: course.playground.dashboard_frames (sim/dashboard_replay.py)
// makes the whole replay's frames, and they are played here a tenth of a second apart, as a server sends them.
// The GPU and the speed come from the page's query (?hardware=h100-sxm&speed=1), set by its form.
window.dashboardFeed = onFrame => {
  "use strict";
  const status = document.getElementById("status");
  const FRAME_MS = 100;  // core/dashboard_frames.py: FRAME_INTERVAL_S
  let timer = null;
  if (location.protocol === "file:") {
    status.textContent = servingLabFileNote;
    return {close() {}};
  }
  const query = new URLSearchParams(location.search);
  const kwargs = {hardware: query.get("hardware") || "h100-sxm", speed: Number(query.get("speed") || 1)};
  for (const [name, value] of Object.entries(kwargs)) {
    const field = document.querySelector(`#replay-form [name=${name}]`);
    if (field) field.value = String(value);
  }
  status.textContent = "starting Python in your browser";
  (async () => {
    const {pyodide} = await servingLabPython(new URL("../playground/", location.href).href);
    status.textContent = "simulating";
    await new Promise(resolve => setTimeout(resolve, 20));  // let the status paint first
    const frames = servingLabCall(pyodide, "dashboard_frames", kwargs);
    status.textContent = "replaying";
    let next = 0;
    const play = () => {
      onFrame(frames[next]);
      next += 1;
      if (next < frames.length) timer = setTimeout(play, FRAME_MS);
    };
    play();
  })().catch(error => {
    status.textContent = `the simulator failed: ${error.message || error}`;
    console.error(error);
  });
  return {close() { clearTimeout(timer); }};
};
