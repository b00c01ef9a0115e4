// What the page keeps for its tab: JSON values in sessionStorage under the
// "sa." prefix (the token, each agent's connection), gone with the tab.

const PREFIX = "sa.";
const store = window.sessionStorage;

export function saved(key, fallback) {
  try {
    const raw = store.getItem(PREFIX + key);
    return raw === null ? fallback : JSON.parse(raw);
  } catch {
    return fallback;
  }
}

export function save(key, value) {
  store.setItem(PREFIX + key, JSON.stringify(value));
}
