// Counts each lease down once a second: an element with data-lease-until
// (milliseconds since the epoch) shows the time left, or that it ended.
(function () {
  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-lease-until]").forEach(function (el) {
      var left = Math.ceil((Number(el.dataset.leaseUntil) - now) / 1000);
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
