// The only script: the overview's figures refresh in place every few seconds.
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-live]").forEach((box) => {
    const every = Number(box.dataset.every || 3000);
    const tick = async () => {
      try {
        const reply = await fetch(box.dataset.live, { credentials: "same-origin" });
        if (reply.ok && !reply.redirected) box.innerHTML = await reply.text();
      } catch (_) { /* keep the last figures; try again next tick */ }
      setTimeout(tick, every);
    };
    setTimeout(tick, every);
  });
});
