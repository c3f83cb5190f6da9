// Counts each lease down once a second: an element with data-lease-left-ms
// (the lease's time left when the server rendered the page, by the store's
// clock) shows the time left, or that it ended. Counting from the page's
// load keeps a browser whose clock is off from showing the wrong time.
(function () {
  var loaded = Date.now();
  function tick() {
    var elapsed = Date.now() - loaded;
    document.querySelectorAll("[data-lease-left-ms]").forEach(function (el) {
      var left = Math.ceil((Number(el.dataset.leaseLeftMs) - elapsed) / 1000);
      if (left > 0) {
        el.textContent = left + " s left";
        el.classList.remove("lease-expired");
      } else {
        el.textContent = "ended " + (-left) + " s ago: a retry takes it over";
        el.classList.add("lease-expired");
      }
    });
  }
  tick();
  setInterval(tick, 1000);
})();
