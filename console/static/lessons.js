// The Lessons page's script: the lesson shown completes itself. While it has open steps, this
// asks the console to check them (POST /lessons/poll: `runwatch lesson check N --open`), one
// request at a time, the next one poll-ms after the last answer; a step whose check passes turns
// OK and stays so (the console keeps it in the lab's progress). Served from this package; the
// page allows no other script (Content-Security-Policy).
"use strict";

const lesson = document.getElementById("lesson");

function show(result) {
  for (const s of result.steps) {
    const li = lesson.querySelector(`li[data-step="${s.step}"]`);
    if (!li || li.classList.contains("ok")) continue; // done stays done
    li.className = `step ${s.ok ? "ok" : "no"}`;
    li.querySelector(".verdict").textContent = s.ok ? "OK" : "NO";
    const found = li.querySelector(".found");
    found.querySelector("span").textContent = s.found;
    found.hidden = s.ok;
    li.querySelector(".hint").hidden = s.ok;
  }
  const next = document.getElementById("next");
  if (next) {
    const of = document.querySelectorAll("#lessons tbody tr").length;
    next.textContent = result.next ? `lesson ${result.next.lesson} of ${of}, step ${result.next.step}` : "every lesson done";
  }
  const row = document.querySelector(`#lessons tr[data-lesson="${result.lesson}"] .done`);
  if (row) row.textContent = `${result.done_ever.length} of ${result.steps.length}`;
  lesson.dataset.polled = String(Number(lesson.dataset.polled) + 1); // what the browser tests wait on
}

function openSteps() {
  return lesson.querySelectorAll("li.step:not(.ok)").length;
}

async function poll() {
  try {
    const body = new URLSearchParams({ token: lesson.dataset.token, lesson: lesson.dataset.lesson });
    const resp = await fetch("/lessons/poll", { method: "POST", body });
    const result = await resp.json();
    if (result.steps) show(result);
  } catch (err) {
    // the next poll tries again; the steps keep what they showed
  }
  if (openSteps()) setTimeout(poll, Number(lesson.dataset.pollMs));
  else document.getElementById("lesson-done").hidden = false;
}

if (lesson && openSteps()) poll();
