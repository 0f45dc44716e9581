// The outbox dashboard refreshes itself: every few seconds it fetches its figures
// (the same view with ?fragment=1) and swaps them in, without reloading the page.
(function () {
  "use strict";
  var box = document.getElementById("dde-dashboard");
  if (!box) {
    return;
  }
  var seconds = parseFloat(box.getAttribute("data-refresh-seconds")) || 10;
  var url = box.getAttribute("data-fragment-url");
  var status = document.getElementById("dde-refresh-status");

  function say(text) {
    if (status) {
      status.textContent = text;
    }
  }

  function refresh() {
    fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        box.innerHTML = html;
        box.setAttribute("data-refreshes", String(1 + (parseInt(box.getAttribute("data-refreshes"), 10) || 0)));
        say("");
      })
      .catch(function (error) {
        say("Could not refresh (" + error.message + "); the figures below may be stale.");
      })
      .then(function () {
        window.setTimeout(refresh, seconds * 1000);
      });
  }

  window.setTimeout(refresh, seconds * 1000);
})();
