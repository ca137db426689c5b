// orderd console: a front end to the admin JSON API. No data is in the
// page itself; everything is fetched with the admin token, which lives in
// sessionStorage and travels only in the Authorization header.
'use strict';
(function () {
  const TOKEN_KEY = 'orderd.adminToken';
  const STATUS_MS = 2000;            // projections page: the state every 2 s
  const HISTORY_MS = 5000;           // and the server's samples every 5 s (it takes one every 5 s)
  const WINDOW_MS = 60 * 60 * 1000;  // chart window: the hour the server keeps
  const JOB_POLL_MS = 1000;
  const DEAD_POLL_MS = 3000;

  let stops = [];
  let generation = 0;

  // ---- DOM helpers: text only, never HTML from data ----
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else if (v === true) el.setAttribute(k, '');
      else el.setAttribute(k, String(v));
    }
    append(el, kids);
    return el;
  }
  function append(el, kids) {
    for (const k of kids.flat(Infinity)) {
      if (k === undefined || k === null || k === false) continue;
      el.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return el;
  }
  function svg(tag, attrs, ...kids) {
    const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    return append(el, kids);
  }
  // scroller wraps a table that may be wider than a narrow window: the
  // table scrolls inside its box and the page keeps the window's width.
  function scroller(table) { return h('div', { class: 'scroll' }, table); }
  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;
  // seg escapes one path segment of an API URL as Go's url.PathEscape does:
  // the API reads ids such as "order_summaries:<event id>" unescaped.
  const seg = (v) => encodeURIComponent(v).replace(/%(3A|40|24|26|2B|2C|3B|3D)/gi, (m) => decodeURIComponent(m));

  // ---- formatting ----
  function fmtTime(s) {
    if (!s) return '–';
    const d = new Date(s);
    return isNaN(d) ? String(s) : d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z').replace(/Z$/, ' UTC');
  }
  function fmtNum(n) { return (n === undefined || n === null) ? '–' : Number(n).toLocaleString('en-US'); }
  function fmtRate(r) { return (r === undefined || r === null) ? '–' : (r >= 100 ? r.toFixed(0) : r.toFixed(1)); }
  function fmtDuration(secs) {
    if (!secs || secs <= 0) return '–';
    secs = Math.round(secs);
    const m = Math.floor(secs / 60), s = secs % 60;
    return m > 0 ? `${m}m${String(s).padStart(2, '0')}s` : `${s}s`;
  }
  const STATE_SYMBOL = { queued: '…', pending: '…', running: '⟳', succeeded: '✓', done: '✓', failed: '✗', canceled: '⊘' };
  function stateText(st) { return `${STATE_SYMBOL[st] || '?'} ${st || 'unknown'}`; }
  function stateCell(st) {
    const cls = (st === 'failed') ? 'bad' : (st === 'succeeded' || st === 'done') ? 'ok' : (st === 'canceled' ? 'warn' : '');
    return h('span', { class: cls, 'data-state': st }, stateText(st));
  }
  function canonical(v) {
    if (Array.isArray(v)) return '[' + v.map(canonical).join(',') + ']';
    if (v && typeof v === 'object') return '{' + Object.keys(v).sort().map((k) => JSON.stringify(k) + ':' + canonical(v[k])).join(',') + '}';
    return JSON.stringify(v === undefined ? null : v);
  }
  function show(v) {
    if (v === undefined) return h('span', { class: 'muted' }, '(absent)');
    if (v === null) return h('span', { class: 'muted' }, 'null');
    if (typeof v === 'object') return h('code', {}, JSON.stringify(v));
    return h('code', {}, String(v));
  }

  // ---- API ----
  class Problem extends Error {
    constructor(doc, status) {
      super((doc && (doc.detail || doc.title)) || 'request failed');
      this.doc = doc;
      this.status = status;
    }
  }

  function token() { return sessionStorage.getItem(TOKEN_KEY) || ''; }

  async function api(method, path, body) {
    const headers = { Accept: 'application/json, application/problem+json' };
    const t = token();
    if (t) headers.Authorization = 'Bearer ' + t;
    const init = { method, headers, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (e) {
      throw new Problem({ type: 'about:blank', title: 'The server could not be reached', status: 0, detail: String(e && e.message || e) }, 0);
    }
    const text = await res.text();
    let doc = null;
    try { doc = text ? JSON.parse(text) : null; } catch (_) { doc = null; }
    if (res.status === 401) {
      signOut('The server refused the token (401): sign in again.', doc);
      throw new Problem(doc || { title: 'Unauthorized', status: 401 }, 401);
    }
    if (!res.ok) {
      throw new Problem(doc && typeof doc === 'object' ? doc : { title: res.statusText || 'Error', status: res.status, detail: text.slice(0, 500) }, res.status);
    }
    return doc;
  }

  // problemBox shows an error as the problem document the API returned.
  function problemBox(err) {
    const doc = (err && err.doc) || { title: 'Error', detail: String(err && err.message || err) };
    const rows = [];
    for (const key of ['type', 'title', 'status', 'detail', 'instance']) {
      if (doc[key] !== undefined && doc[key] !== '') rows.push(h('dt', {}, key), h('dd', {}, show(doc[key])));
    }
    for (const [k, v] of Object.entries(doc)) {
      if (['type', 'title', 'status', 'detail', 'instance', 'errors'].includes(k)) continue;
      rows.push(h('dt', {}, k), h('dd', {}, show(v)));
    }
    const errors = Array.isArray(doc.errors) && doc.errors.length
      ? h('ul', { class: 'problem-errors' }, doc.errors.map((e) => h('li', {}, h('code', {}, e.field || ''), ': ', e.detail || '')))
      : null;
    return h('div', { class: 'problem', role: 'alert', 'data-problem-type': doc.type || '', 'data-status': doc.status || '' },
      h('p', { class: 'problem-title' }, `✗ ${doc.title || 'Error'}${doc.status ? ` (HTTP ${doc.status})` : ''}`),
      h('dl', {}, rows), errors,
      h('details', {}, h('summary', {}, 'Problem document'), h('pre', {}, JSON.stringify(doc, null, 2))));
  }

  // ---- timers: each page's polling stops when the page changes ----
  function every(ms, fn) {
    let stopped = false;
    let id = null;
    const tick = async () => {
      if (stopped) return;
      try { await fn(); } catch (e) { if (e instanceof Problem && e.status === 401) return; }
      if (!stopped) id = setTimeout(tick, ms);
    };
    stops.push(() => { stopped = true; clearTimeout(id); });
    tick();
    return () => { stopped = true; clearTimeout(id); };
  }
  function stopAll() {
    for (const s of stops) s();
    stops = [];
    generation++;
  }

  // ---- login ----
  function showLogin(message, doc) {
    stopAll();
    $('nav').hidden = true;
    $('sign-out').hidden = true;
    $('page').hidden = true;
    $('page').replaceChildren();
    $('login').hidden = false;
    const m = $('login-message');
    m.replaceChildren();
    if (message) m.append(h('p', { class: 'bad' }, '✗ ' + message));
    if (doc) m.append(problemBox({ doc }));
    $('token').focus();
  }
  function signOut(message, doc) {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin(message, doc);
  }
  async function signIn(ev) {
    ev.preventDefault();
    const input = $('token');
    const t = input.value.trim();
    input.value = '';
    if (!t) return;
    sessionStorage.setItem(TOKEN_KEY, t);
    try {
      await api('GET', '/v1/admin/projections');
    } catch (e) {
      if (e.status !== 401) showLogin('The token could not be checked.', e.doc);
      return;
    }
    route();
  }

  // ---- router ----
  const pages = {
    projections: projectionsPage,
    rebuild: (el, args) => jobPage(el, args, 'rebuild'),
    verify: (el, args) => jobPage(el, args, 'verify'),
    'dead-letters': deadLettersPage,
    order: orderPage,
    log: logPage,
  };
  // The link `orderd serve` prints in its development mode carries the
  // token (#token=, or ?token=): kept as a typed one is, then taken out of
  // the address so that it stays in no history entry or bookmark.
  function takeLinkToken() {
    const m = /^#token=([^&]*)/.exec(location.hash) || /[?&]token=([^&]*)/.exec(location.search);
    if (!m) return;
    const t = decodeURIComponent(m[1]).trim();
    if (t) sessionStorage.setItem(TOKEN_KEY, t);
    history.replaceState(null, '', location.pathname + '#/projections');
  }
  function route() {
    stopAll();
    takeLinkToken();
    if (!token()) { showLogin(); return; }
    const parts = location.hash.replace(/^#\/?/, '').split('/').filter((p) => p !== '');
    const name = parts[0];
    if (!pages[name]) { location.replace('#/projections'); if (name === undefined || name === '') route(); return; }
    $('login').hidden = true;
    $('nav').hidden = false;
    $('sign-out').hidden = false;
    for (const a of document.querySelectorAll('#nav a')) {
      if (a.dataset.page === name) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
    }
    const el = $('page');
    el.hidden = false;
    el.replaceChildren();
    el.dataset.page = name;
    let args;
    try { args = parts.slice(1).map(decodeURIComponent); } catch (_) { args = []; }
    pages[name](el, args, generation);
  }

  // ---- page 1: projections ----
  // The first screen answers "is it healthy?": in one line first, then
  // one line per projection and one for the relay, then charts of the
  // last hour from the samples the server keeps (GET /v1/admin/history),
  // so a reload shows them at once; versions, jobs and the partitions
  // (folded) below.
  function projectionsPage(el) {
    const summary = h('p', { class: 'health-summary', id: 'health-summary', role: 'status', 'data-state': 'loading' }, 'Checking…');
    const status = h('p', { class: 'status-line', id: 'projections-updated' }, 'Loading…');
    const err = h('div', { id: 'projections-error' });
    const health = h('div', { id: 'health' });
    const relay = h('div', { id: 'relay' });
    const charts = h('div', { id: 'projections-charts', class: 'charts' });
    const chartsNote = h('p', { class: 'muted', id: 'charts-note' });
    const table = h('div', { id: 'projections-table' });
    const parts = h('div', { id: 'partitions' });
    el.append(h('h2', {}, 'Projections'), summary, status, err, health, relay,
      h('h3', {}, 'Last hour'), chartsNote, charts,
      h('h3', {}, 'Versions, jobs and dead letters'), table, parts);
    let body = null;
    let hist = null;
    let ready = null;
    let partitionsOpen = false;
    const render = () => {
      if (!body) return;
      const now = Date.now();
      const latest = hist && hist.samples.length ? hist.samples[hist.samples.length - 1] : null;
      const sum = healthSummary(body.projections, body.relay, ready, now);
      summary.dataset.state = sum.state;
      summary.replaceChildren(h('span', { class: sum.state === 'bad' ? 'bad' : sum.state === 'warn' ? 'warn' : 'ok' }, sum.text));
      health.replaceChildren(healthTable(body.projections, latest));
      relay.replaceChildren(relayTable(body.relay, latest, now));
      table.replaceChildren(projectionsTable(body.projections));
      const fold = partitionsFold(body.projections, partitionsOpen);
      fold.addEventListener('toggle', () => { partitionsOpen = fold.open; });
      parts.replaceChildren(fold);
      if (hist) {
        chartsNote.textContent = `Sampled by the server every ${hist.interval_seconds} s and kept for ${hist.window_seconds / 60} minutes: ${hist.samples.length} sample${hist.samples.length === 1 ? '' : 's'}${hist.samples.length ? ` since ${fmtTime(hist.samples[0].at)}` : ''}. Apply rate: events acknowledged per second between samples.`;
        charts.replaceChildren(...historyCharts(hist, body.projections, now));
      }
    };
    every(STATUS_MS, async () => {
      try {
        [body, ready] = await Promise.all([api('GET', '/v1/admin/projections'), readiness()]);
      } catch (e) {
        err.replaceChildren(problemBox(e));
        throw e;
      }
      err.replaceChildren();
      status.textContent = `Updated ${fmtTime(new Date().toISOString())}`;
      render();
    });
    every(HISTORY_MS, async () => {
      try {
        hist = await api('GET', '/v1/admin/history');
      } catch (e) {
        err.replaceChildren(problemBox(e));
        throw e;
      }
      render();
    });
  }

  // readiness is this instance's GET /readyz: each check ("store", "bus",
  // and the relay, projector and jobs roles it runs) mapped to "ok" or
  // "unavailable"; null when it does not answer.
  async function readiness() {
    try {
      const res = await fetch('/readyz', { cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer' });
      const doc = await res.json();
      return doc && typeof doc === 'object' ? doc : null;
    } catch (_) {
      return null;
    }
  }

  // healthSummary is the one-line answer to "is everything healthy?",
  // from what the page loads: each projection's state as its line shows
  // it, the relay's lease, and this instance's readiness (its store, NATS
  // and failing roles). A projection catching up is healthy; dead letters
  // and unknowns need a look; a failing projection or role, or no relay
  // holding the lease, is unhealthy. state is ok, warn or bad.
  function healthSummary(ps, r, ready, now) {
    const bad = [];
    const warn = [];
    const busy = [];
    for (const p of ps) {
      const lag = 'active_lag' in p ? p.active_lag : p.consumer_lag;
      if (p.last_error) bad.push(`${p.name} failing`);
      else if (lag === null || lag === undefined) warn.push(`${p.name}'s lag unknown`);
      else if (lag > 0) busy.push(`${p.name} ${fmtNum(lag)} event${lag === 1 ? '' : 's'} behind`);
      if (p.dead_letters > 0) warn.push(`${p.name} has ${fmtNum(p.dead_letters)} dead letter${p.dead_letters === 1 ? '' : 's'}`);
    }
    if (!r || !r.owner) warn.push('no relay has run on this log yet');
    else if (!(r.lease_until && Date.parse(r.lease_until) > now)) bad.push('no relay holds the lease');
    const what = { store: 'the store unreachable from this instance', bus: 'NATS unreachable from this instance' };
    if (!ready) warn.push('this instance\'s readiness unknown');
    else {
      for (const [check, v] of Object.entries(ready)) {
        if (v !== 'ok') bad.push(what[check] || `the ${check} role failing on this instance`);
      }
    }
    if (bad.length) return { state: 'bad', text: `✗ Unhealthy: ${[...bad, ...warn, ...busy].join('; ')}.` };
    if (warn.length) return { state: 'warn', text: `⚠ Needs a look: ${[...warn, ...busy].join('; ')}.` };
    if (busy.length) return { state: 'ok', text: `✓ Healthy, catching up: ${busy.join('; ')}; the relay running, no dead letters, this instance ready.` };
    return { state: 'ok', text: '✓ Healthy: every projection up to date, the relay running, no dead letters, this instance ready.' };
  }

  // lagSeconds is the projection's largest partition lag in seconds, or null.
  function lagSeconds(p) {
    let out = null;
    for (const part of p.partitions || []) {
      if (part && typeof part.lag_seconds === 'number' && (out === null || part.lag_seconds > out)) out = part.lag_seconds;
    }
    return out;
  }

  // healthTable is one line per projection: its state in a word, lag in
  // events and seconds, apply rate (the server's latest sample), dead
  // letters and last error.
  function healthTable(ps, latest) {
    const head = h('tr', {}, ['Projection', 'State', 'Lag (events)', 'Lag (seconds)', 'Apply rate (events/s)', 'Dead letters', 'Last error']
      .map((c, i) => h('th', { scope: 'col', class: i >= 2 && i <= 5 ? 'num' : null }, c)));
    const rows = ps.map((p) => {
      const sample = latest && (latest.projections || []).find((x) => x.name === p.name);
      const rate = sample && typeof sample.apply_rate === 'number' ? sample.apply_rate : null;
      // What readers read lags by active_lag; consumer_lag is this
      // instance's version's, which is a build's while a deploy builds a
      // new version (a server without active_lag sends only that).
      const lag = 'active_lag' in p ? p.active_lag : p.consumer_lag;
      const buildLag = p.shadow_version && p.shadow_lag !== undefined
        ? [h('br'), h('span', { class: 'muted build-lag', 'data-build-lag': p.shadow_lag }, `build v${p.shadow_version}: ${fmtNum(p.shadow_lag)}`)] : null;
      const secs = lagSeconds(p);
      const state = p.last_error ? h('span', { class: 'bad' }, '✗ failing')
        : (lag === null || lag === undefined) ? h('span', { class: 'warn' }, '? unknown')
          : p.dead_letters > 0 ? h('span', { class: 'warn' }, '⚠ dead letters')
            : lag === 0 ? h('span', { class: 'ok' }, '✓ up to date') : h('span', { class: 'warn' }, '… catching up');
      return h('tr', { 'data-health': p.name },
        h('th', { scope: 'row' }, p.name),
        h('td', { class: 'state' }, state),
        (lag === null || lag === undefined)
          ? h('td', { class: 'num lag', 'data-lag': 'unknown' }, h('span', { class: 'warn' }, '? unknown'), buildLag)
          : h('td', { class: 'num lag', 'data-lag': lag }, lag === 0 ? h('span', { class: 'ok' }, '✓ 0') : h('span', { class: 'warn' }, `… ${fmtNum(lag)}`), buildLag),
        h('td', { class: 'num lag-seconds', 'data-lag-seconds': secs === null ? '' : secs }, secs === null ? h('span', { class: 'warn' }, '? unknown') : secs.toFixed(1)),
        h('td', { class: 'num rate', 'data-rate': rate === null ? '' : rate.toFixed(2) }, rate === null ? h('span', { class: 'muted' }, '– (first sample)') : fmtRate(rate)),
        h('td', { class: 'num dead', 'data-dead-letters': p.dead_letters }, p.dead_letters > 0
          ? h('a', { href: '#/dead-letters', class: 'bad' }, `⚠ ${fmtNum(p.dead_letters)}`) : h('span', { class: 'ok' }, '✓ 0')),
        h('td', { class: 'last-error' }, p.last_error ? h('span', { class: 'bad' }, '⚠ ' + p.last_error) : h('span', { class: 'muted' }, '– none')));
    });
    return scroller(h('table', { class: 'health', id: 'health-table' }, h('thead', {}, head), h('tbody', {}, rows)));
  }

  // relayTable is the relay's line: who holds its lease, how old the
  // last commit its checkpoint covers is, and the catch-ups this instance
  // counted (GET /v1/admin/projections "relay", the server's latest sample).
  function relayTable(r, latest, now) {
    const rs = (latest && latest.relay) || {};
    const head = h('tr', {}, ['Relay', 'Holder', 'Checkpoint age (seconds)', 'Catch-ups', 'Checkpoint saved']
      .map((c, i) => h('th', { scope: 'col', class: i === 2 || i === 3 ? 'num' : null }, c)));
    let holder;
    if (!r || !r.owner) holder = h('span', { class: 'warn', 'data-relay': 'none' }, '… no relay has run on this log yet: start an instance with the relay role');
    else if (r.lease_until && Date.parse(r.lease_until) > now) holder = h('span', { class: 'ok', 'data-relay-owner': r.owner }, `✓ ${r.owner} (epoch ${r.epoch})`);
    else holder = h('span', { class: 'bad', 'data-relay-owner': '' }, `⚠ nobody (last ${r.owner}): is an instance with the relay role running?`);
    const age = r && r.checkpoint_recorded_at ? Math.max(0, (now - Date.parse(r.checkpoint_recorded_at)) / 1000) : null;
    const row = h('tr', { 'data-health': 'relay' },
      h('th', { scope: 'row' }, 'outbox relay'),
      h('td', { class: 'holder' }, holder),
      h('td', { class: 'num checkpoint-age', 'data-age': age === null ? '' : age.toFixed(1) }, age === null ? h('span', { class: 'muted' }, '– no checkpoint yet')
        : h('span', { class: age > 60 ? 'warn' : '' }, age.toFixed(1))),
      h('td', { class: 'num catchups', 'data-catchups': typeof rs.catchups === 'number' ? rs.catchups : '' },
        typeof rs.catchups === 'number' ? (rs.catchups === 0 ? h('span', { class: 'ok' }, '✓ 0') : h('span', { class: 'warn' }, `⚠ ${fmtNum(rs.catchups)}`))
          : h('span', { class: 'muted', title: 'this instance runs no relay' }, '– not here')),
      h('td', {}, r && r.checkpoint_saved_at ? fmtTime(r.checkpoint_saved_at) : '–'));
    return scroller(h('table', { class: 'health', id: 'relay-table' }, h('thead', {}, head), h('tbody', {}, row)));
  }

  // historyCharts draws, from the server's samples, each projection's lag
  // and apply rate and the relay's checkpoint age over the last hour.
  function historyCharts(hist, ps, now) {
    // The axis spans what the server has kept, at least 5 minutes: a
    // server up for a minute does not squeeze its samples into the
    // last sliver of an hour.
    const span = Math.min(WINDOW_MS, Math.max(5 * 60 * 1000, hist.samples.length ? now - Date.parse(hist.samples[0].at) : 0));
    const series = (name, key) => hist.samples.map((s) => {
      const x = (s.projections || []).find((p) => p.name === name);
      return { t: Date.parse(s.at), v: x ? x[key] : null };
    }).filter((x) => typeof x.v === 'number');
    const out = [];
    for (const p of ps) {
      out.push(h('div', { class: 'chart-pair', 'data-chart-of': p.name },
        chart(`${p.name}: lag (events)`, series(p.name, 'lag'), now, 'lag', span),
        chart(`${p.name}: apply rate (events/s)`, series(p.name, 'apply_rate'), now, 'rate', span)));
    }
    const age = hist.samples.filter((s) => s.relay && typeof s.relay.checkpoint_age_seconds === 'number')
      .map((s) => ({ t: Date.parse(s.at), v: s.relay.checkpoint_age_seconds }));
    out.push(h('div', { class: 'chart-pair', 'data-chart-of': 'relay' }, chart('relay: checkpoint age (seconds)', age, now, 'age', span)));
    return out;
  }

  // projectionsTable is each projection's versions and collections, dead
  // letters, last verify and last rebuild.
  function projectionsTable(ps) {
    const head = h('tr', {}, ['Projection', 'Version and collections', 'Dead letters', 'Last verify', 'Last rebuild']
      .map((c) => h('th', { scope: 'col' }, c)));
    const rows = [];
    for (const p of ps) {
      const dead = p.dead_letters > 0
        ? h('a', { href: '#/dead-letters', class: 'bad' }, `⚠ ${fmtNum(p.dead_letters)}`)
        : h('span', { class: 'ok' }, '✓ 0');
      rows.push(h('tr', { 'data-projection': p.name },
        h('th', { scope: 'row' }, p.name),
        h('td', { class: 'collections', 'data-active-version': p.active_version },
          p.active_collection ? h('code', {}, p.active_collection) : h('span', { class: 'warn' }, '… first build under way'),
          h('br'), h('span', { class: 'version' }, p.active_version ? `version ${p.active_version}` : 'no version built yet'),
          p.version && p.version !== p.active_version ? h('span', { class: 'muted' }, ` (this instance folds v${p.version})`) : null,
          p.shadow_collection ? [h('br'), `building v${p.shadow_version}: `, h('code', {}, p.shadow_collection)] : null,
          p.previous_collection ? [h('br'), `previous v${p.previous_version}: `, h('code', {}, p.previous_collection), ' ', switchBackButton(p)] : null,
          h('br'), h('span', {
            class: 'muted generation',
            title: 'The pointer document names the collection readers read and the one a rebuild builds. Each write of it (a build\'s start, '
              + 'its switch to readers, a switch back, a cancel, the end of a grace) adds one to its generation, and each is a compare-and-set '
              + 'on it, so a stalled job cannot undo a newer change.',
          }, `generation ${p.generation} (writes of the pointer)`)),
        h('td', { class: 'num dead', 'data-dead-letters': p.dead_letters }, dead),
        h('td', { class: 'last-verify' }, verifySummary(p)),
        h('td', { class: 'last-rebuild' }, rebuildSummary(p))));
    }
    return scroller(h('table', { class: 'projections' }, h('thead', {}, head), h('tbody', {}, rows)));
  }

  // partitionsFold folds every projection's partitions into one
  // details element whose summary says whether every partition with
  // messages waiting has an owner (JetStream pins a partition to a
  // projector when a message reaches it: an idle one has none).
  function partitionsFold(ps, open) {
    const all = ps.flatMap((p) => p.partitions || []);
    const unowned = all.filter((x) => x && !x.owner && x.lag).length;
    const fold = h('details', { id: 'partitions-fold', open: open || null },
      h('summary', {}, `Partitions: ${fmtNum(all.length)} (${ps.map((p) => `${p.name} ${(p.partitions || []).length}`).join(', ')}) — `,
        unowned ? h('span', { class: 'warn' }, `⚠ ${unowned} with messages waiting and no owner`) : h('span', { class: 'ok' }, '✓ every busy partition owned')));
    for (const p of ps) if (Array.isArray(p.partitions) && p.partitions.length) fold.append(partitionsTable(p));
    return fold;
  }

  // switchBackButton points the projection's readers back at its previous
  // collection (POST .../switch-back), after a confirmation.
  function switchBackButton(p) {
    const b = h('button', { type: 'button', class: 'switch-back', 'data-projection': p.name }, 'Switch back');
    b.addEventListener('click', async () => {
      if (!confirm(`Point the readers of ${p.name} back at ${p.previous_collection} (version ${p.previous_version})?`)) return;
      b.disabled = true;
      const err = $('projections-error');
      try {
        await api('POST', `/v1/admin/projections/${seg(p.name)}/switch-back`, {});
        if (err) err.replaceChildren(h('p', { class: 'ok', role: 'status' }, `✓ ${p.name} reads ${p.previous_collection} again`));
      } catch (e) {
        if (err) err.replaceChildren(problemBox(e));
        b.disabled = false;
      }
    });
    return b;
  }

  function verifySummary(p) {
    const v = p.last_verify;
    if (!v) return h('span', { class: 'muted' }, '– never');
    const link = h('a', { href: `#/verify/${enc(p.name)}/${enc(v.job)}` }, 'report');
    if (v.state !== 'succeeded') return [stateCell(v.state), ' ', link];
    const when = v.finished_at ? ` ${fmtTime(v.finished_at)}` : '';
    if (v.drift === 0) return [h('span', { class: 'ok' }, `✓ clean${when}`), ' ', link];
    return [h('span', { class: 'bad' }, `✗ drift ${v.drift}${v.repaired ? `, repaired ${v.repaired}` : ''}${when}`), ' ', link];
  }
  function rebuildSummary(p) {
    const r = p.last_rebuild;
    if (!r) return h('span', { class: 'muted' }, '– never');
    // Phase and progress as the job's own route works them out (the
    // server fills them in), e.g. "1/3 scanning 49 %, ETA 12s".
    let where = null;
    if (r.phase && r.phase !== r.state) {
      where = `${r.phase_steps ? `${r.phase_step}/${r.phase_steps} ` : ''}${r.phase}`
        + `${r.phase_percent !== undefined ? ` ${r.phase_percent} %` : ''}${r.phase_eta_seconds ? `, ETA ${fmtDuration(r.phase_eta_seconds)}` : ''}`;
    }
    return [stateCell(r.state), where ? [' ', h('span', { class: 'rebuild-phase', 'data-phase': r.phase }, where)] : null,
      ' ', h('a', { href: `#/rebuild/${enc(p.name)}/${enc(r.job)}` }, 'progress'),
      r.error ? [h('br'), h('span', { class: 'bad' }, r.error)] : null];
  }
  // PARTITION_COLUMNS labels and formats the fields of a partition's
  // status (domain.PartitionStatus); a field the API adds later is shown
  // under its key made readable, not dropped.
  const PARTITION_COLUMNS = [
    ['partition', 'Partition', 'num', (v) => fmtNum(v)],
    ['consumer', 'Consumer', 'mono', (v) => v || '–'],
    ['owner', 'Owner', 'mono', (v) => v || h('span', { class: 'muted' }, '– none (idle)')],
    ['pinned_at', 'Pinned since', '', fmtTime],
    ['lag', 'Lag (messages)', 'num', (v) => (v === null || v === undefined) ? h('span', { class: 'warn' }, '? unknown') : fmtNum(v)],
    ['lag_seconds', 'Lag (seconds)', 'num', (v) => (v === null || v === undefined) ? h('span', { class: 'warn' }, '? unknown') : v.toFixed(1)],
    ['applied', 'Applied by its owner', 'num', (v) => fmtNum(v)],
    ['apply_rate', 'Apply rate (events/s)', 'num', fmtRate],
  ];
  function label(key) {
    const s = String(key).replace(/_/g, ' ');
    return s.charAt(0).toUpperCase() + s.slice(1);
  }
  function partitionsTable(p) {
    const cols = PARTITION_COLUMNS.slice();
    for (const part of p.partitions) {
      for (const k of Object.keys(part || {})) {
        if (!cols.some((c) => c[0] === k)) cols.push([k, label(k), '', show]);
      }
    }
    const t = h('table', { class: 'partitions', 'data-partitions-of': p.name },
      h('thead', {}, h('tr', {}, cols.map(([k, name, cls]) => h('th', { scope: 'col', class: cls === 'num' ? 'num' : null, 'data-key': k }, name)))),
      h('tbody', {}, p.partitions.map((part) => h('tr', { 'data-partition': (part || {}).partition },
        cols.map(([k, , cls, fmt]) => h('td', { class: cls || null }, fmt((part || {})[k])))))));
    return h('section', { class: 'partitions-of' }, h('h4', {}, `${p.name}: ${p.partitions.length} partitions`), scroller(t));
  }

  // chart draws points on an axis from 0 to their maximum over the last
  // span milliseconds (at most the hour the server keeps). With no
  // samples, or only zeros, there is no scale to draw: the chart says so
  // instead of inventing a maximum.
  function chart(title, points, now, cls, span) {
    const W = 360, H = 96, L = 44, B = 16, T = 8;
    points = points.filter((p) => p.t >= now - span);
    const max = points.length ? Math.max(...points.map((p) => p.v)) : null;
    const idle = !max;
    const x = (t) => L + (W - L - 4) * (1 - (now - t) / span);
    const y = (v) => T + (H - T - B - 3) * (1 - (idle ? 0 : v / max));
    const last = points.length ? points[points.length - 1].v : null;
    const n = `${points.length} sample${points.length === 1 ? '' : 's'}`;
    const summary = !points.length ? 'no samples yet (the server takes one every 5 s)'
      : idle ? `0 in all ${n}`
        : `latest ${fmtRate(last)}, max ${fmtRate(max)} (${n})`;
    const g = svg('svg', { class: 'spark', width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': `${title}: ${summary}` },
      svg('title', {}, title),
      svg('line', { x1: L, y1: H - B, x2: W - 4, y2: H - B, stroke: '#888' }),
      svg('line', { x1: L, y1: T, x2: L, y2: H - B, stroke: '#888' }),
      idle ? svg('text', { x: (L + W) / 2, y: (T + H - B) / 2, 'text-anchor': 'middle', class: 'idle' }, points.length ? '0 throughout' : 'no samples yet')
        : svg('text', { x: L - 4, y: T + 8, 'text-anchor': 'end' }, fmtRate(max)),
      svg('text', { x: L - 4, y: H - B, 'text-anchor': 'end' }, '0'),
      svg('text', { x: L, y: H - 3 }, `−${Math.round(span / 60000)} min`),
      svg('text', { x: W - 4, y: H - 3, 'text-anchor': 'end' }, 'now'));
    if (points.length) {
      g.append(svg('polyline', { class: cls, points: points.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(' ') }));
    }
    return h('figure', { class: idle ? 'chart idle' : 'chart', 'data-series': cls, 'data-max': max === null ? '' : max, 'data-samples': points.length }, g,
      h('figcaption', {}, `${title}: ${summary}`));
  }

  // ---- pages 2 and 3: rebuild and verify jobs ----
  async function projectionNames() {
    const body = await api('GET', '/v1/admin/projections');
    return body.projections;
  }

  function jobPage(el, args, kind) {
    const verify = kind === 'verify';
    const [name, jobID] = args;
    const formErr = h('div', { id: `${kind}-form-error` });
    const select = h('select', { id: `${kind}-projection`, required: true });
    const fields = verify
      ? h('label', { class: 'check' }, h('input', { type: 'checkbox', id: 'verify-repair' }), 'repair: rewrite the documents that differ')
      : h('label', {}, 'Partitions (1–64)', h('input', { type: 'number', id: 'rebuild-partitions', min: 1, max: 64, value: 1, required: true }));
    const submit = h('button', { type: 'submit', id: `${kind}-start` }, verify ? 'Start verify' : 'Start rebuild');
    const form = h('form', { class: 'inline', id: `${kind}-form` },
      h('label', {}, 'Projection', select), fields, submit);
    const latest = h('div', { id: `${kind}-latest` });
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      formErr.replaceChildren();
      submit.disabled = true;
      try {
        const body = verify ? { repair: $('verify-repair').checked } : { partitions: Number($('rebuild-partitions').value) };
        const job = await api('POST', `/v1/admin/projections/${seg(select.value)}/${verify ? 'verifications' : 'rebuilds'}`, body);
        location.hash = `#/${kind}/${enc(job.projection)}/${enc(job.id)}`;
      } catch (e) {
        formErr.replaceChildren(problemBox(e));
      } finally {
        submit.disabled = false;
      }
    });
    el.append(h('h2', {}, verify ? 'Verify a read model' : 'Rebuild a read model'),
      h('p', { class: 'muted' }, verify
        ? 'Folds every stream of the log and compares it with the read model: missing, stale, extra and different documents, and two digests that are equal exactly when nothing drifted.'
        : 'Builds a shadow collection from the log while the active one keeps serving, verifies it, then switches the projection to it.'),
      form, formErr, latest);
    const refreshLatest = () => projectionNames().then((ps) => {
      if (!select.options.length) select.replaceChildren(...ps.map((p) => h('option', { value: p.name, selected: p.name === name }, p.name)));
      latest.replaceChildren(h('h3', {}, verify ? 'Latest verify of each projection' : 'Latest rebuild of each projection'),
        h('ul', {}, ps.map((p) => {
          const j = verify ? p.last_verify : p.last_rebuild;
          return h('li', {}, h('strong', {}, p.name), ': ', j
            ? [stateCell(j.state), ' ', h('a', { href: `#/${kind}/${enc(p.name)}/${enc(j.job)}` }, `job ${j.job}`)]
            : h('span', { class: 'muted' }, 'none yet'));
        })));
    }).catch((e) => { formErr.replaceChildren(problemBox(e)); });
    refreshLatest();
    if (name && jobID) watchJob(el, kind, name, jobID, refreshLatest);
  }

  function watchJob(el, kind, name, jobID, onFinal) {
    const verify = kind === 'verify';
    const path = `/v1/admin/projections/${seg(name)}/${verify ? 'verifications' : 'rebuilds'}/${seg(jobID)}`;
    const panel = h('section', { id: `${kind}-job`, 'data-job': jobID });
    const err = h('div', { id: `${kind}-job-error` });
    const actions = h('div', { id: `${kind}-actions` });
    el.append(h('h3', {}, `${verify ? 'Verify' : 'Rebuild'} job `, h('code', {}, jobID), ` of ${name}`), actions, err, panel);
    let stop = null;
    const cancel = h('button', { type: 'button', id: `${kind}-cancel` }, `Cancel this ${kind}`);
    cancel.addEventListener('click', async () => {
      cancel.disabled = true;
      err.replaceChildren();
      try {
        await api('POST', `${path}/cancel`);
      } catch (e) {
        err.replaceChildren(problemBox(e));
      }
    });
    actions.append(cancel);
    stop = every(JOB_POLL_MS, async () => {
      let job;
      try {
        job = await api('GET', path);
      } catch (e) {
        err.replaceChildren(problemBox(e));
        if (e.status === 404) stop();
        throw e;
      }
      const final = ['succeeded', 'failed', 'canceled'].includes(job.state);
      cancel.disabled = final || job.cancel_requested;
      panel.dataset.state = job.state;
      panel.replaceChildren(...(verify ? verifyView(job) : rebuildView(job)));
      // The job's state is written before its last task is marked done:
      // poll on until the tasks are final too, or the table would keep
      // showing that task running.
      const tasksFinal = (job.tasks || []).every((t) => ['done', 'failed', 'canceled'].includes(t.state));
      if (final && tasksFinal) {
        stop();
        onFinal();
      }
    });
  }

  // percent is the share of the log's commits scanned (the ETA is the
  // commits left at the rate so far, so done/(done+rate*eta) is exactly
  // that share); 100 only once the job has succeeded.
  function percent(job) {
    if (job.state === 'succeeded') return 100;
    const parts = (job.tasks || []).filter((t) => t.name.startsWith('part-'));
    if (parts.length && parts.every((t) => t.state === 'done')) return 99;
    if (job.eta_seconds > 0 && job.events_per_second > 0) {
      return Math.min(99, Math.floor(100 * job.events_done / (job.events_done + job.eta_seconds * job.events_per_second)));
    }
    return 0;
  }
  function phase(job) {
    const tasks = job.tasks || [];
    const by = (n) => tasks.find((t) => t.name === n);
    if (job.state === 'succeeded') return `✓ rebuild succeeded: 100 %${job.replaced_collection ? `; ${job.shadow_collection} replaced ${job.replaced_collection}` : ''}`;
    if (job.state === 'failed') return `✗ rebuild failed: ${job.error || ''}`;
    if (job.state === 'canceled') return '⊘ rebuild canceled: the active collection is unchanged';
    if (job.cancel_requested) return '⊘ cancel requested: stopping at the next checkpoint';
    const plan = by('plan');
    if (plan && plan.state !== 'done') return '… planning the partitions';
    const fin = by('finish');
    if (fin && fin.state === 'running') return '⟳ verifying the shadow and switching';
    return '⟳ scanning the log into the shadow collection';
  }

  function rebuildView(job) {
    const pct = percent(job);
    const out = [];
    out.push(h('p', { class: 'job-state' }, 'State: ', stateCell(job.state)));
    out.push(h('div', { class: 'progress' },
      h('progress', { id: 'rebuild-progress', max: 100, value: pct }, `${pct} %`),
      h('span', { class: 'percent', id: 'rebuild-percent' }, `${pct} %`),
      h('span', { id: 'rebuild-phase' }, phase(job))));
    out.push(h('dl', { class: 'facts' },
      h('dt', {}, 'Events done'), h('dd', { id: 'rebuild-events' }, fmtNum(job.events_done)),
      h('dt', {}, 'Streams done'), h('dd', {}, fmtNum(job.streams_done)),
      h('dt', {}, 'Events/s'), h('dd', { id: 'rebuild-rate' }, fmtRate(job.events_per_second)),
      h('dt', {}, 'ETA'), h('dd', { id: 'rebuild-eta' }, fmtDuration(job.eta_seconds)),
      h('dt', {}, 'Partitions'), h('dd', {}, fmtNum(job.partitions)),
      h('dt', {}, 'Shadow collection'), h('dd', {}, job.shadow_collection ? h('code', {}, job.shadow_collection) : '–'),
      h('dt', {}, 'Replaced collection'), h('dd', {}, job.replaced_collection ? h('code', {}, job.replaced_collection) : '–'),
      h('dt', {}, 'Poison streams'), h('dd', {}, fmtNum(job.poison_streams || 0)),
      h('dt', {}, 'Created'), h('dd', {}, fmtTime(job.created_at)),
      h('dt', {}, 'Started'), h('dd', {}, fmtTime(job.started_at)),
      h('dt', {}, 'Finished'), h('dd', {}, fmtTime(job.finished_at)),
      job.error ? [h('dt', {}, 'Error'), h('dd', { class: 'bad' }, '✗ ' + job.error)] : null));
    out.push(h('h3', {}, 'Tasks'), tasksTable(job.tasks || []));
    return out;
  }

  function tasksTable(tasks) {
    const head = h('tr', {}, ['Task', 'State', 'Range', 'Cursor', 'Events', 'Streams', 'Attempts', 'Owner', 'Lease until', 'Resumes', 'Error']
      .map((c) => h('th', { scope: 'col' }, c)));
    return scroller(h('table', { class: 'tasks', id: 'tasks' }, h('thead', {}, head), h('tbody', {}, tasks.map((t) => h('tr', { 'data-task': t.name, 'data-state': t.state },
      h('th', { scope: 'row' }, t.name),
      h('td', {}, stateCell(t.state)),
      h('td', { class: 'mono' }, t.from || t.to ? `${t.from || '(start)'} – ${t.to || '(end)'}` : '–'),
      h('td', { class: 'mono' }, t.cursor || '–'),
      h('td', { class: 'num' }, fmtNum(t.events)),
      h('td', { class: 'num' }, fmtNum(t.streams)),
      h('td', { class: 'num' }, fmtNum(t.attempts)),
      h('td', { class: 'mono' }, t.owner || '–'),
      h('td', {}, fmtTime(t.lease_until)),
      h('td', { class: 'resumes' }, (t.resumes && t.resumes.length)
        ? h('details', {}, h('summary', {}, `↻ ${t.resumes.length}`), h('ul', {}, t.resumes.map((r) =>
          h('li', {}, `${fmtTime(r.at)} by ${r.owner} from ${r.cursor || '(start)'} (${fmtNum(r.events)} events, ${fmtNum(r.streams)} streams)`))))
        : '0'),
      h('td', {}, t.error ? h('span', { class: 'bad' }, '✗ ' + t.error) : '–'))))));
  }

  const KIND_SYMBOL = { missing: '∅', stale: '↓', extra: '+', different: '≠' };
  function verifyView(job) {
    const out = [h('p', { class: 'job-state' }, 'State: ', stateCell(job.state), job.repair ? ' (with repair)' : ' (report only)')];
    if (!job.report) {
      out.push(h('p', { id: 'verify-progress' }, `⟳ ${fmtNum(job.streams_done)} streams, ${fmtNum(job.events_done)} events so far`));
      if (job.error) out.push(h('p', { class: 'bad' }, '✗ ' + job.error));
      return out;
    }
    const r = job.report;
    const drift = r.missing + r.stale + r.extra + r.different;
    out.push(h('p', { id: 'verify-verdict', 'data-drift': drift, class: drift ? 'bad' : 'ok' }, drift
      ? `✗ drift: ${drift} document${drift === 1 ? ' differs' : 's differ'} from the log${r.repaired ? `; ${r.repaired} repaired` : ''}`
      : '✓ no drift: the read model equals the fold of the log'));
    if (job.error) out.push(h('p', { class: 'bad' }, '✗ ' + job.error));
    const counts = [['Collection', h('code', {}, r.collection)], ['Documents', r.documents], ['Streams', r.streams], ['Events', r.events],
      ['∅ Missing', r.missing], ['↓ Stale', r.stale], ['+ Extra', r.extra], ['≠ Different', r.different], ['Repaired', r.repaired], ['Poison streams', r.poison_streams]];
    out.push(scroller(h('table', { class: 'report-counts', id: 'verify-counts' }, h('tbody', {}, counts.map(([k, v]) =>
      h('tr', { 'data-count': String(k).replace(/^\W+\s/, '').toLowerCase() }, h('th', { scope: 'row' }, k), h('td', { class: 'num' }, typeof v === 'number' ? fmtNum(v) : v)))))));
    const same = r.digest === r.expected_digest;
    out.push(h('h3', {}, 'Digests'), h('table', { class: 'digests', id: 'verify-digests' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Read model (as read)'), h('th', {}, 'Fold of the log'))),
      h('tbody', {}, h('tr', {}, h('td', {}, h('code', {}, r.digest)), h('td', {}, h('code', {}, r.expected_digest))),
        h('tr', {}, h('td', { colspan: 2, class: same ? 'ok' : 'bad', id: 'verify-digests-verdict' }, same ? '= equal' : '≠ differ')))));
    out.push(h('h3', {}, 'Documents that differ (up to five of each kind)'));
    if (!r.examples || !r.examples.length) {
      out.push(h('p', { class: 'muted', id: 'verify-no-examples' }, 'None.'));
    } else {
      out.push(scroller(h('table', { class: 'examples', id: 'verify-examples' },
        h('thead', {}, h('tr', {}, ['Document', 'Kind', 'Stored version', 'Log version', 'Fields that differ'].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', {}, r.examples.map((x) => h('tr', { 'data-id': x.id, 'data-kind': x.kind },
          h('td', {}, h('a', { href: `#/order/${enc(x.id)}` }, x.id)),
          h('td', {}, `${KIND_SYMBOL[x.kind] || '?'} ${x.kind}`),
          h('td', { class: 'num' }, x.stored_version),
          h('td', { class: 'num' }, x.log_version),
          h('td', {}, (x.fields && x.fields.length) ? x.fields.map((f, i) => [i ? ', ' : '', h('code', {}, f)]) : '–')))))));
    }
    return out;
  }

  // ---- page 4: dead letters ----
  function deadLettersPage(el) {
    const filter = h('select', { id: 'dead-projection' }, h('option', { value: '' }, 'all projections'));
    const reload = h('button', { type: 'button', id: 'dead-reload' }, 'Reload');
    const status = h('p', { class: 'status-line', id: 'dead-updated' }, 'Loading…');
    const err = h('div', { id: 'dead-error' });
    const list = h('div', { id: 'dead-list' });
    const log = h('ol', { class: 'log', id: 'retry-log' });
    el.append(h('h2', {}, 'Dead letters'),
      h('p', { class: 'muted' }, 'Events a projection could not apply after repeated deliveries, parked so that only their own stream waits. Fix the cause, then retry: a retry folds the stream from the log up to the event; on success the dead letter is removed.'),
      h('form', { class: 'inline', onsubmit: (e) => e.preventDefault() }, h('label', {}, 'Projection', filter), reload),
      status, err, list, h('h3', {}, 'Retries in this session'), log);
    projectionNames().then((ps) => {
      filter.append(...ps.map((p) => h('option', { value: p.name }, p.name)));
    }).catch((e) => err.replaceChildren(problemBox(e)));
    let shown = null;
    const load = async (force) => {
      let body;
      try {
        const q = filter.value ? `&projection=${enc(filter.value)}` : '';
        body = await api('GET', `/v1/admin/dead-letters?limit=1000${q}`);
      } catch (e) {
        err.replaceChildren(problemBox(e));
        throw e;
      }
      err.replaceChildren();
      status.textContent = `${body.dead_letters.length} dead letter${body.dead_letters.length === 1 ? '' : 's'}; updated ${fmtTime(new Date().toISOString())}`;
      const sig = canonical(body.dead_letters.map((d) => [d.id, d.retried_at || '', d.retry_result || '', d.deliveries]));
      if (!force && sig === shown) return;
      shown = sig;
      list.replaceChildren(deadTable(body.dead_letters, retry, load));
    };
    const retry = async (letters) => {
      for (const d of letters) {
        const li = h('li', { 'data-retry-of': d.id }, `⟳ ${d.id}: retrying…`);
        log.prepend(li);
        try {
          await api('POST', `/v1/admin/dead-letters/${seg(d.id)}/retry`);
          li.dataset.result = 'applied';
          li.replaceChildren(h('span', { class: 'ok' }, `✓ ${d.id}: applied`), ` (stream ${d.stream_id}${d.version ? `, v${d.version}` : ''})`);
        } catch (e) {
          li.dataset.result = 'failed';
          li.replaceChildren(h('span', { class: 'bad' }, `✗ ${d.id}: still fails`), problemBox(e));
        }
      }
      await load(true).catch(() => {});
    };
    filter.addEventListener('change', () => load(true).catch(() => {}));
    reload.addEventListener('click', () => load(true).catch(() => {}));
    every(DEAD_POLL_MS, () => load(false));
  }

  function eventOf(d) {
    try { return JSON.parse(d.payload); } catch (_) { return null; }
  }

  function deadTable(letters, retry) {
    if (!letters.length) return h('p', { class: 'ok', id: 'dead-none' }, '✓ No dead letters.');
    const byStream = new Map();
    for (const d of letters) {
      if (!byStream.has(d.stream_id)) byStream.set(d.stream_id, []);
      byStream.get(d.stream_id).push(d);
    }
    const head = h('tr', {}, ['Dead letter', 'Projection', 'Version', 'Event', 'Error', 'Deliveries', 'Parked at', 'Last retry', '']
      .map((c) => h('th', { scope: 'col' }, c)));
    const body = [];
    for (const [stream, ds] of byStream) {
      ds.sort((a, b) => (a.version || 0) - (b.version || 0) || (a.stream_seq || 0) - (b.stream_seq || 0));
      const all = h('button', { type: 'button', class: 'retry-stream', 'data-stream': stream }, `Retry all ${ds.length} of this stream`);
      all.addEventListener('click', () => { all.disabled = true; retry(ds); });
      body.push(h('tr', { class: 'stream-head', 'data-stream': stream },
        h('td', { colspan: 8 }, 'Stream ', h('a', { href: `#/order/${enc(stream)}` }, h('code', {}, stream)), ` — ${ds.length} dead letter${ds.length === 1 ? '' : 's'}`),
        h('td', {}, all)));
      for (const d of ds) {
        const ev = eventOf(d);
        const one = h('button', { type: 'button', class: 'retry-one', 'data-id': d.id }, 'Retry');
        one.addEventListener('click', () => { one.disabled = true; retry([d]); });
        body.push(h('tr', { class: 'dead-letter', 'data-id': d.id, 'data-stream': d.stream_id },
          h('td', { class: 'mono' }, d.id),
          h('td', {}, d.projection),
          h('td', { class: 'num' }, d.version ? `v${d.version}` : '–'),
          h('td', {}, ev && ev.type ? h('code', {}, ev.type) : h('span', { class: 'bad' }, '✗ not decodable'),
            h('details', {}, h('summary', {}, 'event'), h('pre', {}, ev ? JSON.stringify(ev, null, 2) : d.payload),
              h('p', { class: 'muted' }, `subject ${d.subject}, stream sequence ${d.stream_seq}${d.event_id ? `, event id ${d.event_id}` : ''}`))),
          h('td', { class: 'bad' }, '✗ ' + d.error),
          h('td', { class: 'num' }, fmtNum(d.deliveries)),
          h('td', {}, fmtTime(d.parked_at)),
          h('td', {}, d.retried_at ? [fmtTime(d.retried_at), h('br'), h('span', { class: 'bad' }, '✗ ' + (d.retry_result || ''))] : '–'),
          h('td', {}, one)));
      }
    }
    return scroller(h('table', { class: 'dead-letters', id: 'dead-table' }, h('thead', {}, head), h('tbody', {}, body)));
  }

  // ---- page 5: order ----
  function orderPage(el, args) {
    const id = args[0] || '';
    const input = h('input', { id: 'order-id', type: 'text', value: id, required: true, size: 40, spellcheck: 'false', placeholder: 'order id' });
    const form = h('form', { class: 'inline', id: 'order-form' }, h('label', {}, 'Order id', input), h('button', { type: 'submit' }, 'Look up'));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const v = input.value.trim();
      if (!v) return;
      const target = `#/order/${enc(v)}`;
      if (location.hash === target) route(); else location.hash = target;
    });
    el.append(h('h2', {}, 'Order'), form);
    if (!id) return;
    const gen = generation;
    const out = h('div', { id: 'order-view' }, h('p', { class: 'status-line' }, 'Loading…'));
    el.append(out);
    const get = (p) => api('GET', p).then((v) => ({ v }), (e) => ({ e }));
    Promise.all([get(`/v1/orders/${seg(id)}/events`), get(`/v1/orders/${seg(id)}`), get(`/v1/admin/orders/${seg(id)}/read-models`)])
      .then(([evs, order, rms]) => {
        if (gen !== generation) return;
        out.replaceChildren(
          h('p', { class: 'status-line' }, `Loaded ${fmtTime(new Date().toISOString())}. `, h('a', { href: '#', id: 'order-reload', onclick: (e) => { e.preventDefault(); route(); } }, 'Reload')),
          h('div', { class: 'columns' },
            h('section', { id: 'order-events' }, h('h3', {}, 'Events'), evs.e ? problemBox(evs.e) : timeline(evs.v)),
            h('section', { id: 'order-state' },
              h('h3', {}, 'State folded from the log'), order.e ? problemBox(order.e) : foldedTable(order.v),
              h('h3', {}, 'Read models beside the fold of the log'), rms.e ? problemBox(rms.e) : rms.v.read_models.map(readModelView))));
      });
  }

  function timeline(body) {
    const meta = (e) => e.metadata || {};
    return [h('p', { class: 'muted' }, `${body.events.length} event${body.events.length === 1 ? '' : 's'}, stream at version ${body.version}, in the order the log returned them.`),
      h('ol', { class: 'timeline', id: 'timeline' }, body.events.map((e) => h('li', { 'data-version': e.version, 'data-type': e.type },
        h('div', { class: 'ev-head' }, `v${e.version} · ${e.type}`),
        h('dl', { class: 'facts' },
          h('dt', {}, 'occurred at'), h('dd', {}, fmtTime(e.occurred_at)),
          h('dt', {}, 'recorded at'), h('dd', {}, fmtTime(e.recorded_at)),
          h('dt', {}, 'event id'), h('dd', { class: 'mono' }, e.event_id),
          h('dt', {}, 'correlation id'), h('dd', { class: 'mono' }, meta(e).correlation_id || '–'),
          h('dt', {}, 'causation id'), h('dd', { class: 'mono' }, meta(e).causation_id || '–'),
          h('dt', {}, 'schema version'), h('dd', {}, meta(e).schema_version)),
        h('details', {}, h('summary', {}, 'data'), h('pre', {}, JSON.stringify(e.data, null, 2))))))];
  }

  function foldedTable(order) {
    return scroller(h('table', { class: 'folded', id: 'order-folded' }, h('tbody', {}, Object.entries(order).map(([k, v]) =>
      h('tr', {}, h('th', { scope: 'row' }, k), h('td', {}, show(v)))))));
  }

  const CHECK_TEXT = {
    equal: '✓ equal to the fold of the log',
    missing: '∅ missing: the read model has no document',
    stale: '↓ stale: the document is behind the log',
    different: '≠ different: same version, other content',
    extra: '+ extra: the log has no such stream',
  };
  function readModelView(c) {
    const doc = c.document || {};
    const exp = c.expected || {};
    const keys = [];
    for (const k of [...Object.keys(exp), ...Object.keys(doc)]) if (!keys.includes(k)) keys.push(k);
    const rows = keys.map((k) => {
      const differs = canonical(exp[k]) !== canonical(doc[k]) || (c.fields || []).includes(k);
      return h('tr', { class: differs ? 'diff' : '', 'data-field': k, 'data-differs': differs ? 'yes' : 'no' },
        h('th', { scope: 'row' }, k),
        h('td', {}, c.expected ? show(exp[k]) : h('span', { class: 'muted' }, '–')),
        h('td', {}, c.document ? show(doc[k]) : h('span', { class: 'muted' }, '–')),
        h('td', { class: 'mark', title: differs ? 'differs' : 'equal' }, differs ? '≠' : '='));
    });
    return h('section', { class: 'read-model', 'data-projection': c.projection, 'data-state': c.state },
      h('h4', {}, `${c.projection} `, h('span', { class: 'muted' }, '(collection ', h('code', {}, c.collection), ')')),
      h('p', { class: c.state === 'equal' ? 'ok' : 'bad' }, CHECK_TEXT[c.state] || c.state,
        ` — read model v${c.stored_version}, log v${c.log_version}`,
        (c.fields && c.fields.length) ? `; fields that differ: ${c.fields.join(', ')}` : ''),
      c.fold_error ? h('p', { class: 'bad' }, '✗ the fold stopped: ' + c.fold_error) : null,
      scroller(h('table', { class: 'compare' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Field'), h('th', {}, 'Fold of the log'), h('th', {}, 'Read model'), h('th', { class: 'mark' }, '= / ≠'))),
        h('tbody', {}, rows))));
  }

  // ---- page 6: the event log ----
  const EVENT_TYPES = ['OrderPlaced', 'OrderApproved', 'OrderInvoiced', 'OrderProcessingStarted', 'OrderShipped', 'OrderDelivered', 'OrderCanceled', 'OrderMarkedUnavailable'];
  const LOG_PAGE = 50;

  // logPage lists the log's newest commits (GET /v1/admin/log), filtered
  // by the form (kept in the URL fragment: #/log/<query>), pages back with
  // "Older", and with the live tail on prepends each commit as the log
  // records it (GET /v1/admin/log/tail). #/log/commit/<id> shows one.
  function logPage(el, args) {
    if (args[0] === 'commit') { commitPage(el, args[1] || ''); return; }
    const f = new URLSearchParams(args[0] || '');
    const filters = { type: f.get('type') || '', stream_id: f.get('stream_id') || '', correlation_id: f.get('correlation_id') || '' };
    const type = h('select', { id: 'log-type' }, h('option', { value: '' }, 'any type'),
      EVENT_TYPES.map((t) => h('option', { value: t, selected: t === filters.type }, t)));
    const stream = h('input', { id: 'log-stream', type: 'text', value: filters.stream_id, size: 24, spellcheck: 'false', placeholder: 'order id' });
    const corr = h('input', { id: 'log-correlation', type: 'text', value: filters.correlation_id, size: 24, spellcheck: 'false', placeholder: 'correlation id' });
    const live = h('input', { id: 'log-tail', type: 'checkbox' });
    const form = h('form', { class: 'inline', id: 'log-form' },
      h('label', {}, 'Event type', type), h('label', {}, 'Stream', stream), h('label', {}, 'Correlation id', corr),
      h('button', { type: 'submit', id: 'log-apply' }, 'Filter'),
      h('label', { class: 'check' }, live, 'Live tail: add new commits as they are recorded'));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      if (type.value) q.set('type', type.value);
      if (stream.value.trim()) q.set('stream_id', stream.value.trim());
      if (corr.value.trim()) q.set('correlation_id', corr.value.trim());
      const target = q.toString() ? `#/log/${enc(q.toString())}` : '#/log';
      if (location.hash === target) route(); else location.hash = target;
    });
    const status = h('p', { class: 'status-line', id: 'log-status' }, 'Loading…');
    const tailStatus = h('p', { class: 'status-line', id: 'log-tail-status' }, 'Live tail: off.');
    const err = h('div', { id: 'log-error' });
    const body = h('tbody', {});
    const table = h('table', { class: 'log-commits', id: 'log-table' },
      h('thead', {}, h('tr', {}, ['Recorded at', 'Stream', 'Versions', 'Events', 'Commit'].map((c) => h('th', { scope: 'col' }, c)))), body);
    const older = h('button', { type: 'button', id: 'log-older', hidden: true }, 'Older commits');
    const note = h('p', { class: 'muted', id: 'log-note' });
    const any = filters.type || filters.stream_id || filters.correlation_id;
    el.append(h('h2', {}, 'Event log'),
      h('p', { class: 'muted' }, 'Every commit (the events one command appended to a stream), newest first. A filter by type or correlation id looks through up to 2,048 commits a page, so a page may hold fewer matches than asked while older ones remain.'),
      form, status, tailStatus, err, scroller(table), note, older);
    const gen = generation;
    const shown = new Set();
    let next = '';
    let count = 0;
    const query = (cursor) => {
      const q = new URLSearchParams({ limit: String(LOG_PAGE) });
      for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
      if (cursor) q.set('cursor', cursor);
      return `/v1/admin/log?${q}`;
    };
    const describe = () => {
      status.textContent = `${fmtNum(count)} commit${count === 1 ? '' : 's'} shown${any ? ' matching ' + Object.entries(filters).filter(([, v]) => v).map(([k, v]) => `${k.replace('_', ' ')} ${v}`).join(', ') : ' of the whole log'}, newest first.`;
      older.hidden = !next;
      note.textContent = next ? '' : (count ? '— the oldest commit —' : 'No commit matches.');
    };
    const load = async (cursor) => {
      older.disabled = true;
      try {
        const page = await api('GET', query(cursor));
        if (gen !== generation) return;
        err.replaceChildren();
        for (const c of page.commits) {
          if (shown.has(c.id)) continue;
          shown.add(c.id);
          body.append(commitRow(c));
          count++;
        }
        next = page.next_cursor || '';
        if (cursor && !page.commits.length && next) note.textContent = 'No match in the commits examined: Older looks further back.';
        describe();
      } catch (e) {
        err.replaceChildren(problemBox(e));
      } finally {
        older.disabled = false;
      }
    };
    older.addEventListener('click', () => load(next));
    // matches tells whether a commit from the tail passes the filters.
    const matches = (c) => (!filters.stream_id || c.stream_id === filters.stream_id) &&
      (!filters.type || c.events.some((e) => e.type === filters.type)) &&
      (!filters.correlation_id || c.events.some((e) => (e.metadata || {}).correlation_id === filters.correlation_id));
    const prepend = (c) => {
      if (shown.has(c.id) || !matches(c)) return;
      shown.add(c.id);
      const row = commitRow(c);
      row.classList.add('new');
      body.prepend(row);
      count++;
      describe();
    };
    let stopTail = null;
    live.addEventListener('change', () => {
      if (live.checked) {
        stopTail = tailLog(gen, tailStatus, async () => {
          // Open: whatever was recorded between the page's load and now.
          try {
            const page = await api('GET', query(''));
            for (const c of page.commits.slice().reverse()) prepend(c);
          } catch (e) {
            err.replaceChildren(problemBox(e));
          }
        }, prepend);
        stops.push(stopTail);
      } else if (stopTail) {
        stopTail();
        stopTail = null;
        tailStatus.textContent = 'Live tail: off.';
        tailStatus.dataset.state = 'off';
      }
    });
    load('');
  }

  // tailLog reads the log's event stream with fetch (EventSource cannot
  // send the token in a header) until stopped; it reconnects after a
  // failure while on. onOpen runs each time the stream opens, onCommit
  // with each commit.
  function tailLog(gen, status, onOpen, onCommit) {
    let stopped = false;
    let ctrl = null;
    let retry = null;
    const set = (state, text) => { status.dataset.state = state; status.textContent = text; };
    const connect = async () => {
      if (stopped || gen !== generation) return;
      ctrl = new AbortController();
      set('connecting', 'Live tail: connecting…');
      let failure = 'the stream ended';
      try {
        const res = await fetch('/v1/admin/log/tail', { headers: { Accept: 'text/event-stream', Authorization: 'Bearer ' + token() },
          cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer', signal: ctrl.signal });
        if (res.status === 401) { signOut('The server refused the token (401): sign in again.'); return; }
        if (!res.ok) throw new Error(`HTTP ${res.status}`);
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          let i;
          while ((i = buf.indexOf('\n\n')) >= 0) {
            const block = buf.slice(0, i);
            buf = buf.slice(i + 2);
            let event = 'message';
            let data = '';
            for (const line of block.split('\n')) {
              if (line.startsWith('event: ')) event = line.slice(7);
              else if (line.startsWith('data: ')) data += line.slice(6);
            }
            if (event === 'open') { set('on', `Live tail: on since ${fmtTime(new Date().toISOString())}; new commits appear at the top.`); onOpen(); }
            if (event === 'commit') onCommit(JSON.parse(data));
            if (event === 'error') { try { failure = JSON.parse(data).detail || failure; } catch (_) { /* keep */ } }
          }
        }
      } catch (e) {
        if (stopped) return;
        failure = String(e && e.message || e);
      }
      if (stopped || gen !== generation) return;
      set('retrying', `Live tail: ✗ ${failure}; connecting again in 2 s.`);
      retry = setTimeout(connect, 2000);
    };
    connect();
    return () => { stopped = true; clearTimeout(retry); if (ctrl) ctrl.abort(); };
  }

  function versions(c) { return c.first_version === c.last_version ? `v${c.first_version}` : `v${c.first_version}..v${c.last_version}`; }

  function commitRow(c) {
    return h('tr', { class: 'commit', 'data-id': c.id, 'data-stream': c.stream_id },
      h('td', { class: 'when' }, fmtTime(c.recorded_at)),
      h('td', {}, h('a', { href: `#/order/${enc(c.stream_id)}`, class: 'stream' }, h('code', {}, c.stream_id))),
      h('td', { class: 'versions' }, versions(c)),
      h('td', { class: 'types' }, c.error ? h('span', { class: 'bad' }, '✗ ' + c.error) : c.events.map((e, i) => [i ? ', ' : '', h('code', {}, e.type)])),
      h('td', {}, h('a', { href: `#/log/commit/${enc(c.id)}`, class: 'open-commit mono' }, c.id)));
  }

  // commitPage shows one commit: its stream, versions and each event
  // with its ids, times and data.
  function commitPage(el, id) {
    const gen = generation;
    const out = h('div', { id: 'commit-view' }, h('p', { class: 'status-line' }, 'Loading…'));
    el.append(h('h2', {}, 'Commit ', h('code', {}, id)), h('p', {}, h('a', { href: '#/log', id: 'back-to-log' }, '← the event log')), out);
    api('GET', `/v1/admin/log/commits/${seg(id)}`).then((c) => {
      if (gen !== generation) return;
      out.replaceChildren(
        h('dl', { class: 'facts', id: 'commit-facts' },
          h('dt', {}, 'stream'), h('dd', {}, h('a', { href: `#/order/${enc(c.stream_id)}`, id: 'commit-order' }, h('code', {}, c.stream_id)), ' (the order’s page)'),
          h('dt', {}, 'versions'), h('dd', {}, versions(c)),
          h('dt', {}, 'recorded at'), h('dd', {}, fmtTime(c.recorded_at)),
          h('dt', {}, 'stream type'), h('dd', {}, c.stream_type || '–')),
        c.error ? h('p', { class: 'bad' }, '✗ ' + c.error) : null,
        h('ol', { class: 'timeline', id: 'commit-events' }, c.events.map((e) => h('li', { 'data-version': e.version, 'data-type': e.type },
          h('div', { class: 'ev-head' }, `v${e.version} · ${e.type}`),
          h('dl', { class: 'facts' },
            h('dt', {}, 'event id'), h('dd', { class: 'mono' }, e.event_id),
            h('dt', {}, 'occurred at'), h('dd', {}, fmtTime(e.occurred_at)),
            h('dt', {}, 'recorded at'), h('dd', {}, fmtTime(e.recorded_at)),
            h('dt', {}, 'correlation id'), h('dd', { class: 'mono' }, (e.metadata || {}).correlation_id || '–'),
            h('dt', {}, 'causation id'), h('dd', { class: 'mono' }, (e.metadata || {}).causation_id || '–'),
            h('dt', {}, 'schema version'), h('dd', {}, (e.metadata || {}).schema_version)),
          h('details', { open: true }, h('summary', {}, 'data'), h('pre', { class: 'data' }, JSON.stringify(e.data, null, 2)))))));
    }, (e) => { if (gen === generation) out.replaceChildren(problemBox(e)); });
  }

  // ---- start ----
  document.addEventListener('DOMContentLoaded', () => {
    $('login-form').addEventListener('submit', signIn);
    $('sign-out').addEventListener('click', () => { signOut('Signed out.'); });
    window.addEventListener('hashchange', route);
    route();
  });
}());
