// Applies the saved theme before the first paint (no inline script: the page's CSP forbids it).
(() => {
  try {
    const t = localStorage.getItem("theme");
    if (t === "dark" || t === "light") document.documentElement.dataset.theme = t;
  } catch (_) { /* storage disabled: follow the system */ }
})();
