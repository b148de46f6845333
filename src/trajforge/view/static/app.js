// trajforge view: the page over the viewer's JSON API. Three views chosen by the URL hash
// (#/ overview, #/samples?filters, #/sample?key=..&filters). Every piece of data from the run is
// put into the page with textContent or as an attribute value, never parsed as HTML: model and
// tool output are untrusted. A timer polls /api/status and redraws the overview or the list when
// the run grew.
'use strict';

const POLL_MS = 2000;
const FOLD_CHARS = 1500;
const FOLD_LINES = 24;
const FILTERS = ['status', 'tool', 'task_type', 'reason', 'q', 'sort'];
let generation = -1;
let current = null;  // {view, params}

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k === 'text') node.textContent = String(v);
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

const fmt = (n) => (n === null || n === undefined) ? '–' : Number(n).toLocaleString('en-US');
const pct = (r) => (r === null || r === undefined) ? '–' : (100 * r).toFixed(1) + '%';
const short = (n) => n >= 1e6 ? +(n / 1e6).toFixed(1) + 'M' : n >= 1e4 ? +(n / 1e3).toFixed(1) + 'k' : String(n);
const money = (c) => (c === null || c === undefined) ? '–' : '$' + Number(c).toFixed(c >= 1 ? 2 : 4);

class Stale extends Error {}
let latest = 0;  // the newest view request: answers to older ones (typing fast, clicking on) are dropped

async function api(path, view = true) {
  const ticket = view ? ++latest : latest;
  const res = await fetch(path, {headers: {Accept: 'application/json'}});
  const body = await res.json();
  if (ticket !== latest) throw new Stale();
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

function route() {
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path, qs] = hash.split('?');
  const params = new URLSearchParams(qs || '');
  if (path === '/samples') return {view: 'samples', params};
  if (path === '/sample') return {view: 'sample', params};
  return {view: 'overview', params};
}

function filterParams(params, extra) {
  const out = new URLSearchParams();
  for (const k of FILTERS) if (params.get(k)) out.set(k, params.get(k));
  for (const [k, v] of Object.entries(extra || {})) if (v !== null && v !== undefined && v !== '') out.set(k, v);
  return out;
}

function setStatus(s) {
  document.getElementById('source').textContent = s.source;
  const live = document.getElementById('live');
  live.textContent = s.live ? '● live' : (s.kind === 'run' ? 'finished' : 'file');
  live.className = 'badge ' + (s.live ? 'live' : 'idle');
  // a big run is read behind the first page: the list and figures grow until it is all in
  const left = s.indexing_bytes_left || 0;
  const reading = document.getElementById('indexing');
  reading.textContent = left ? 'reading the run: ' + fmt(Math.ceil(left / 1e6)) + ' MB left'
    : s.reading_dataset ? 'reading the dataset' : '';
  reading.hidden = !left && !s.reading_dataset;
  generation = s.generation;
}

async function render() {
  current = route();
  for (const id of ['nav-overview', 'nav-samples'])
    document.getElementById(id).classList.toggle('active', id === 'nav-' + (current.view === 'overview' ? 'overview' : 'samples'));
  const main = document.getElementById('main');
  try {
    if (current.view === 'overview') await renderOverview(main);
    else if (current.view === 'samples') await renderSamples(main, current.params, true);
    else await renderSample(main, current.params);
  } catch (e) {
    if (!(e instanceof Stale)) main.replaceChildren(el('p', {class: 'error', text: 'Error: ' + e.message}));
  }
}

// ---- overview -------------------------------------------------------------------------------
function figure(label, value, shown, key) {
  return el('div', {class: 'fig', 'data-fig': key, 'data-value': value === null ? '' : value},
    el('div', {class: 'v', text: shown}), el('div', {class: 'l', text: label}));
}

function bars(title, rows, opts) {
  // rows: [{label, value, ok?, fail?, note}] -> horizontal bars scaled to the largest value
  const max = Math.max(1, ...rows.map((r) => r.value));
  const box = el('section', {class: 'chart', 'data-chart': opts.id}, el('h3', {text: title}));
  if (!rows.length) box.append(el('p', {class: 'muted', text: 'none'}));
  for (const r of rows) {
    const bar = el('div', {class: 'bar'});
    if (r.ok !== undefined) {
      const ok = el('span', {class: 'seg ok'}), bad = el('span', {class: 'seg bad'});
      ok.style.width = (100 * r.ok / max) + '%';
      bad.style.width = (100 * r.fail / max) + '%';
      bar.append(ok, bad);
    } else {
      const seg = el('span', {class: 'seg ' + (opts.cls || 'neutral')});
      seg.style.width = (100 * r.value / max) + '%';
      bar.append(seg);
    }
    box.append(el('div', {class: 'barrow', 'data-label': r.label},
      el('span', {class: 'bl', text: r.label}), bar, el('span', {class: 'bv', text: r.note || fmt(r.value)})));
  }
  return box;
}

function histo(title, bins, id) {
  const box = el('section', {class: 'chart', 'data-chart': id}, el('h3', {text: title}));
  if (!bins.length) { box.append(el('p', {class: 'muted', text: 'no data'})); return box; }
  const max = Math.max(1, ...bins.map((b) => b.count));
  const cols = el('div', {class: 'histo'});
  for (const b of bins) {
    const label = b.hi - b.lo === 1 ? fmt(b.lo) : fmt(b.lo) + '–' + fmt(b.hi - 1);
    const col = el('div', {class: 'col', title: label + ': ' + fmt(b.count)});
    const fill = el('div', {class: 'fill'});
    fill.style.height = (100 * b.count / max) + '%';
    col.append(el('div', {class: 'cnt', text: b.count ? short(b.count) : ''}), fill);
    cols.append(el('div', {class: 'hcol', 'data-bin': label}, col, el('div', {class: 'hl', text: short(b.lo)})));
  }
  box.append(cols);
  return box;
}

// Rewards of a --tasks run: every task, then per metadata category and difficulty.
function taskTable(t) {
  const num = (x) => x == null ? '–' : x.toFixed(3);
  const head = el('tr', {}, ['', 'tasks', 'rollouts', 'mean reward', 'passed', 'errors', 'tampered', 'pass@1', 'pass@' + t.all.k].map((h) => el('th', {text: h})));
  const row = (label, g) => el('tr', {'data-task-row': label}, [label, fmt(g.tasks), fmt(g.rollouts), num(g.mean_reward),
    g.passed + ' / ' + g.verdicts, fmt(g.errors), fmt(g.tampered || 0), num(g.pass_at_1), num(g.pass_at_k)].map((v) => el('td', {text: v})));
  const rows = [row('all tasks', t.all)];
  for (const [name, g] of Object.entries(t.by_category)) rows.push(row('category ' + name, g));
  for (const [name, g] of Object.entries(t.by_difficulty)) rows.push(row('difficulty ' + name, g));
  for (const [name, g] of Object.entries(t.per_task)) rows.push(row('task ' + name, g));
  return el('section', {class: 'chart', id: 'tasks'}, el('h3', {text: 'Rewards by task'}), el('table', {class: 'samples'}, head, ...rows));
}

// A record's verification state, as statistics.json counts it (the server's verdict: passed, failed,
// error with its kind, or unverified): its words, and the class that colours it.
const VERDICTS = {passed: ['passed', 'pass'], failed: ['failed', 'fail'], error: ['error', 'err'], unverified: ['not verified', 'none']};

function verdictWords(s) {
  if (!s) return ['–', 'none'];
  const [words, cls] = VERDICTS[s.state] || [s.state, 'none'];
  return [s.state === 'error' && s.error ? words + ' (' + s.error + ')' : words, cls];
}

// The verification banner under the conversation: for a task, its reward, the metrics of
// reward.json, the verifier's mode, what the agent tampered with, the test script's output and the
// files it wrote under /logs/verifier/; for a dataset row, its state, score and method.
function verifyView(v, s, logs) {
  const [words, cls] = verdictWords(s);
  const state = s && s.state === 'failed' && v.failure ? words + ' (' + v.failure + ')' : words;  // sabotage: its kind
  const extra = v.method === 'tests' ? (v.reward != null ? ' · reward ' + v.reward : '')
    : (v.score != null ? ' · score ' + v.score : '') + (v.method && v.method !== 'none' ? ' · ' + v.method : '');
  const mode = v.isolation ? ' · ' + v.isolation + ' verifier' : '';
  const box = el('section', {class: 'turn verify ' + cls, id: 'verification', 'data-verdict': s ? s.state : ''},
    el('div', {class: 'th', text: 'Verification: ' + state + extra + mode}));
  if (v.rewards && Object.keys(v.rewards).length > 1)
    box.append(el('p', {class: 'rewards', text: Object.entries(v.rewards).map(([k, x]) => k + ' ' + x).join(' · ')}));
  const tests = v.detail && v.detail.tests;
  if (tests && tests.message) box.append(el('p', {class: 'warn-text', text: tests.message}));
  if (tests && tests.stopped) box.append(el('p', {class: 'warn-text', text: tests.stopped}));
  if (v.tampered && v.tampered.length) {
    const more = v.tampered_count ? ' (' + v.tampered_count + ' in all)' : '';
    box.append(el('div', {class: 'th', id: 'tampered', text: 'Tampered: the agent changed what its tests depend on' + more}),
      el('ul', {class: 'tampered'}, ...v.tampered.map((t) => el('li', {text: t.change + ' ' + t.path + ' — ' + t.what}))));
  }
  if (tests && tests.output) box.append(el('div', {class: 'th', text: 'Test output (exit ' + tests.exit_code + ', ' + tests.seconds + ' s)'}), folded(tests.output, 'text verifier-output'));
  for (const f of logs || [])
    box.append(el('div', {class: 'th', text: '/logs/verifier/' + f.name + (f.truncated ? ' (first 256 KB)' : '')}), folded(f.text, 'text verifier-log'));
  return box;
}

async function renderOverview(main) {
  const o = await api('/api/overview');
  setStatus(o);
  const f = o.figures, s = f.samples, t = f.tokens;
  const figs = el('div', {class: 'figs'},
    figure('samples total', s.total, fmt(s.total ?? (s.finished + s.failed + s.discarded)), 'samples.total'),
    figure('finished', s.finished, fmt(s.finished), 'samples.finished'),
    figure('completed', s.completed, fmt(s.completed), 'samples.completed'),
    figure('partial', s.partial, fmt(s.partial), 'samples.partial'),
    figure('failed', s.failed, fmt(s.failed), 'samples.failed'),
    figure('discarded', s.discarded, fmt(s.discarded), 'samples.discarded'),
    figure('prompt tokens', t.prompt, fmt(t.prompt), 'tokens.prompt'),
    figure('completion tokens', t.completion, fmt(t.completion), 'tokens.completion'),
    figure('reasoning tokens', t.reasoning, fmt(t.reasoning), 'tokens.reasoning'),
    figure('cost', f.cost, money(f.cost), 'cost'),
    figure('API calls', f.api_calls, fmt(f.api_calls), 'api_calls'),
    figure('samples / min', f.throughput_samples_per_minute ?? null, fmt(f.throughput_samples_per_minute), 'throughput_samples_per_minute'),
    figure('duration', f.duration_seconds ?? null, f.duration_seconds == null ? '–' : f.duration_seconds.toFixed(1) + ' s', 'duration_seconds'),
    figure('reasoning coverage', f.reasoning.coverage, pct(f.reasoning.coverage), 'reasoning.coverage'));
  if (o.verification) {  // counted as statistics.json counts them: errors and unverified records apart
    const v = o.verification;
    figs.append(figure('verification pass rate', v.pass_rate, pct(v.pass_rate) + ' of ' + fmt(v.verified), 'verification.pass_rate'));
    figs.append(figure('passed', v.passed, fmt(v.passed), 'verification.passed'));
    figs.append(figure('failed verification', v.failed, fmt(v.failed), 'verification.failed'));
    const kinds = Object.entries(v.errors_by_kind).map(([k, n]) => k + ' ' + fmt(n)).join(', ');
    figs.append(figure('verification errors' + (kinds ? ' (' + kinds + ')' : ''), v.errors, fmt(v.errors), 'verification.errors'));
    figs.append(figure('not verified', v.unverified, fmt(v.unverified), 'verification.unverified'));
    if (v.mean_score !== null) figs.append(figure('mean score', v.mean_score, v.mean_score.toFixed(3), 'verification.mean_score'));
  }
  if (f.token_capture) figs.append(figure('prefix integrity', f.token_capture.prefix_integrity, pct(f.token_capture.prefix_integrity), 'token_capture.prefix_integrity'));
  if (f.tasks) figs.append(figure('mean reward', f.tasks.all.mean_reward, f.tasks.all.mean_reward == null ? '–' : f.tasks.all.mean_reward.toFixed(3), 'tasks.mean_reward'));
  const failed = Object.entries(s.failed_by_class).map(([k, v]) => ({label: k, value: v}));
  const discarded = Object.entries(s.discarded_by_reason).map(([k, v]) => ({label: k, value: v}));
  const tools = Object.entries(f.tools).filter(([, x]) => x.count > 0).sort((a, b) => b[1].count - a[1].count)
    .map(([k, x]) => ({label: k, value: x.count, ok: x.success, fail: x.failure,
      note: fmt(x.count) + ' calls · ' + pct(x.success_rate) + ' ok'}));
  const charts = el('div', {class: 'charts'},
    bars('Tool calls (green ok, red failed)', tools, {id: 'tools'}),
    bars('Failed samples by class', failed, {id: 'failed', cls: 'bad'}),
    bars('Discarded samples by reason', discarded, {id: 'discarded', cls: 'warn'}),
    histo('Assistant turns per trajectory', o.turns, 'turns'),
    histo('Tokens per trajectory', o.tokens, 'tokens'));
  if (Object.keys(o.task_types).length)
    charts.append(bars('Task types', Object.entries(o.task_types).map(([k, v]) => ({label: k, value: v})), {id: 'task_types'}));
  const notes = el('div', {class: 'notes'});
  if (f.tasks) notes.append(taskTable(f.tasks));
  const stale = o.statistics && o.statistics.merge && o.statistics.merge.not_in_dataset;
  if (stale) notes.append(el('p', {class: 'muted', text: stale + ' finished sample(s) are no longer in the dataset: listed and counted here, left out of trajectories.jsonl and statistics.json'}));
  if (o.outcomes_not_in_dataset) notes.append(el('p', {class: 'muted', id: 'outcomes_not_in_dataset', text: o.outcomes_not_in_dataset +
    ' failed or discarded sample(s) of rows no longer in the dataset: left out here, as statistics.json leaves them out'}));
  if (o.duplicates) notes.append(el('p', {class: 'muted', text: o.duplicates + ' duplicate record(s) ignored (the first one of a sample counts)'}));
  for (const c of o.settings_changes || [])  // a resume with another model or settings: the run mixes them
    notes.append(el('p', {class: 'warn-text', id: 'settings_change', text: 'invocation ' + c.invocation + ' changed ' +
      Object.entries(c.changed).map(([k, [a, b]]) => k + ' ' + JSON.stringify(a) + ' -> ' + JSON.stringify(b)).join('; ')}));
  for (const p of o.problems) notes.append(el('p', {class: 'warn-text', text: p}));
  const models = (o.models || []).length > 1 ? 'models ' + o.models.join(', ') : o.model ? 'model ' + o.model : null;
  main.replaceChildren(el('h2', {text: 'Run ' + (o.run_name || o.source)}),
    models ? el('p', {class: 'muted', text: models}) : null, figs, charts, notes);
}

// ---- sample list ----------------------------------------------------------------------------
function select(name, label, values, params) {
  const sel = el('select', {name, 'data-filter': name, 'aria-label': label},
    el('option', {value: '', text: label + ': all'}));
  for (const [v, n] of Object.entries(values)) sel.append(el('option', {value: v, text: v + ' (' + fmt(n) + ')'}));
  sel.value = params.get(name) || '';
  sel.addEventListener('change', () => go(name, sel.value));
  return sel;
}

function go(name, value) {
  const p = filterParams(current.params, {size: current.params.get('size')});
  if (value) p.set(name, value); else p.delete(name);
  location.hash = '#/samples?' + p.toString();
}

function statusBadge(e) {
  return el('span', {class: 'badge st-' + e.status, text: e.status + (e.reason ? ': ' + e.reason : '')});
}

function verdict(e) {
  const s = e.verification;
  if (!s) return '–';
  const [words, cls] = verdictWords(s);
  const mark = {passed: '✓ ', failed: '✗ ', error: '⚠ '}[s.state] || '';
  const score = (s.state === 'passed' || s.state === 'failed') && e.score !== null ? ' ' + Number(e.score).toFixed(2) : '';
  return el('span', {class: 'verdict ' + cls, 'data-verdict': s.state, text: mark + words + score});
}

let searchTimer = null;

async function renderSamples(main, params, full) {
  const page = Number(params.get('page') || 0), size = Number(params.get('size') || 50);
  const data = await api('/api/samples?' + filterParams(params, {page, size}).toString());
  setStatus(data);
  const fc = data.facets;
  let bar = document.getElementById('filters');
  if (full || !bar) {
    // While the user types, the search box is kept as it is (focus, caret, pending keystrokes).
    let search = document.activeElement && document.activeElement.id === 'search' ? document.activeElement : null;
    if (!search) {
      search = el('input', {type: 'search', id: 'search', placeholder: 'search prompts…', 'aria-label': 'search prompts',
        value: params.get('q') || ''});
      search.addEventListener('input', () => {
        clearTimeout(searchTimer);
        searchTimer = setTimeout(() => go('q', search.value.trim()), 300);
      });
    }
    const focused = search === document.activeElement;
    bar = el('div', {id: 'filters', class: 'filters'},
      select('status', 'status', fc.status, params), select('tool', 'tool', fc.tool, params),
      select('task_type', 'task type', fc.task_type, params),
      select('reason', 'failure class / discard reason', fc.reason, params), search);
    main.replaceChildren(bar, el('div', {id: 'list'}));
    if (focused) search.focus();
  } else {
    for (const sel of bar.querySelectorAll('select')) {  // counts grew while the run went on
      if (sel === document.activeElement) continue;
      sel.replaceWith(select(sel.name, sel.options[0].textContent.replace(/: all$/, ''), fc[sel.name], params));
    }
  }
  const rows = data.items.map((e) => {
    const link = '#/sample?' + filterParams(params, {key: e.key}).toString();
    const prompt = e.prompt || (e.has_record ? '(no prompt)' : '(prompt unknown: the dataset was not found)');
    return el('tr', {'data-key': e.key, 'data-status': e.status, 'data-reason': e.reason || ''},
      el('td', {class: 'num', text: e.prompt_index ?? '–'}),
      el('td', {}, statusBadge(e)),
      el('td', {class: 'prompt'}, el('a', {href: link, text: prompt.length > 160 ? prompt.slice(0, 160) + '…' : prompt}),
        e.message ? el('div', {class: 'msg', text: e.message}) : null),
      el('td', {class: 'num', text: e.turns}),
      el('td', {class: 'tools'}, e.tools.map((t) => el('span', {class: 'chip', text: t}))),
      el('td', {class: 'num', text: e.tool_calls ? e.tool_calls + (e.tool_failures ? ' (' + e.tool_failures + ' failed)' : '') : '0'}),
      el('td', {class: 'num', text: fmt(e.tokens)}),
      el('td', {class: 'num', text: money(e.cost)}),
      el('td', {}, verdict(e)),
      el('td', {class: 'num', text: e.batch ?? '–'}));
  });
  const pages = Math.max(1, Math.ceil(data.total / size));
  const pageLink = (p, label) => p < 0 || p >= pages ? el('span', {class: 'muted', text: label})
    : el('a', {href: '#/samples?' + filterParams(params, {page: p, size}).toString(), text: label});
  const pager = el('div', {class: 'pager', id: 'pager'}, pageLink(page > 0 ? 0 : -1, '« first'), pageLink(page - 1, '← prev'),
    el('span', {id: 'page-info', text: `page ${fmt(page + 1)} of ${fmt(pages)} · ${fmt(data.total)} samples`}),
    pageLink(page + 1, 'next →'), pageLink(page < pages - 1 ? pages - 1 : -1, 'last »'));
  const sortable = {turns: 'turns', calls: 'tool_calls', tokens: 'tokens', cost: 'cost'};
  const head = el('tr', {}, ['#', 'status', 'prompt', 'turns', 'tools', 'calls', 'tokens', 'cost', 'verification', 'batch']
    .map((h) => {
      const key = sortable[h];
      if (!key) return el('th', {text: h});
      const on = params.get('sort') === key;  // click: largest first; again: back to dataset order
      const p = filterParams(params, {size: params.get('size')});
      if (on) p.delete('sort'); else p.set('sort', key);
      return el('th', {class: 'sortable' + (on ? ' sorted' : '')},
        el('a', {href: '#/samples?' + p.toString(), 'data-sort': key, text: h + (on ? ' ▼' : '')}));
    }));
  const bottom = pager.cloneNode(true);
  bottom.removeAttribute('id');
  bottom.querySelector('#page-info').removeAttribute('id');
  document.getElementById('list').replaceChildren(pager,
    el('table', {class: 'samples', id: 'samples'}, el('thead', {}, head), el('tbody', {}, rows)), bottom);
}

// ---- conversation ---------------------------------------------------------------------------
function folded(text, cls) {
  const lines = text.split('\n');
  if (text.length <= FOLD_CHARS && lines.length <= FOLD_LINES) return el('pre', {class: cls, text});
  const head = lines.length > FOLD_LINES ? lines.slice(0, FOLD_LINES).join('\n') : text.slice(0, FOLD_CHARS);
  const rest = lines.length > FOLD_LINES ? (lines.length - FOLD_LINES) + ' more lines' : (text.length - FOLD_CHARS) + ' more characters';
  const det = el('details', {class: 'fold'}, el('summary', {text: 'show all (' + rest + ')'}), el('pre', {class: cls, text}));
  const preview = el('pre', {class: cls + ' preview', text: head + '\n…'});
  det.addEventListener('toggle', () => { preview.hidden = det.open; });
  return el('div', {}, preview, det);
}

function resultBlock(r) {
  const box = el('div', {class: 'result' + (r.error ? ' error' : ''), 'data-result-id': r.id || ''},
    el('div', {class: 'rh', text: (r.error ? '✗ error · ' : 'result · ') + (r.name || '') + (r.id ? ' · ' + r.id : '')}));
  if (r.fields) {
    for (const [k, v] of r.fields) box.append(el('div', {class: 'field'}, el('span', {class: 'fk', text: k}), folded(v, 'fv')));
  } else box.append(folded(r.text || '', 'fv'));
  return box;
}

function tokensNote(t) {
  const u = t.tokens ?? t.token_count ?? t.usage;
  if (u === undefined) return null;
  return el('span', {class: 'tok', text: typeof u === 'object' ? Object.entries(u).map(([k, v]) => k + ' ' + v).join(' · ') : u + ' tokens'});
}

function turnView(t, n) {
  if (t.kind === 'system') {
    const names = t.tools.map((x) => x.name).join(', ');
    return el('details', {class: 'turn system'},
      el('summary', {text: `System · ${t.tools.length} tool(s) offered${names ? ': ' + names : ''}`}),
      t.tools.map((x) => el('div', {class: 'tooldef'}, el('b', {text: x.name}), el('p', {text: x.description}),
        folded(x.parameters, 'args'))),
      el('details', {}, el('summary', {text: 'full system text'}), el('pre', {text: t.text})));
  }
  if (t.kind === 'gpt') {
    const box = el('section', {class: 'turn gpt', 'data-turn': n}, el('div', {class: 'th'}, 'Assistant · turn ' + n, tokensNote(t)));
    for (const r of t.reasoning) box.append(el('details', {class: 'reasoning'}, el('summary', {text: 'reasoning · ' + r.split('\n')[0].slice(0, 100)}), el('pre', {text: r})));
    if (t.text) box.append(el('pre', {class: 'text', text: t.text}));
    for (const c of t.calls) {
      box.append(el('div', {class: 'call' + (c.bad ? ' error' : ''), 'data-call': c.name},
        el('div', {class: 'ch', text: '→ ' + c.name + (c.id ? ' · ' + c.id : '')}), folded(c.arguments, 'args'),
        c.result ? resultBlock(c.result) : el('div', {class: 'result missing', text: 'no result recorded'})));
    }
    return box;
  }
  if (t.kind === 'tool') return el('section', {class: 'turn tool'}, el('div', {class: 'th', text: 'Tool results without a matching call'}), t.results.map(resultBlock));
  return el('section', {class: 'turn ' + t.kind}, el('div', {class: 'th'}, t.kind === 'human' ? 'Human' : t.role, tokensNote(t)), folded(t.text, 'text'));
}

function metaTable(d) {
  const e = d.entry, r = d.record || {};
  const rows = [['sample', e.key], ['status', e.status + (e.reason ? ' (' + e.reason + ')' : '')],
    ['prompt index', e.prompt_index], ['batch', e.batch], ['task type', e.task_type], ['turns', e.turns],
    ['tokens', fmt(e.tokens)], ['cost', money(e.cost)], ['attempts', e.attempts], ['message', e.message]];
  if (r.metadata) rows.push(['model', r.metadata.model], ['timestamp', r.metadata.timestamp]);
  if (r.api_calls !== undefined) rows.push(['API calls', r.api_calls]);
  if (r.tokens) rows.push(['token ids', r.tokens.segments + ' segment(s), ' + r.tokens.prefix_breaks + ' prefix break(s)']);
  else if (r.tokens_missing && r.tokens_missing !== 'not_requested') rows.push(['token ids', 'none (' + r.tokens_missing + ')']);
  if (r.toolsets_used) rows.push(['toolsets', r.toolsets_used.join(', ')]);
  if (r.usage) rows.push(['usage', Object.entries(r.usage).map(([k, v]) => k.replace(/_tokens$/, '') + ' ' + v).join(' · ')]);
  if (r.tool_stats) rows.push(['tool stats', Object.entries(r.tool_stats).map(([k, s]) => `${k} ${s.success}/${s.count} ok`).join(', ')]);
  if (r.task) rows.push(['task', r.task.name + ' (' + r.task.path + ')'], ['task metadata', JSON.stringify(r.task.metadata)]);
  if (r.verification && r.verification.method === 'tests') {
    const v = r.verification;
    rows.push(['reward', v.reward == null ? 'none (' + v.error + ')' : String(v.reward) + ' · ' + verdictWords(e.verification)[0] + (v.failure ? ' (' + v.failure + ')' : '')]);
    if (v.tampered && v.tampered.length) rows.push(['tampered', (v.tampered_count || v.tampered.length) + ' change(s) to what the tests depend on']);
  } else if (r.verification) {
    const v = r.verification;
    rows.push(['verification', verdictWords(e.verification)[0] + (v.score != null ? ' · score ' + v.score : '') +
      (v.method && v.method !== 'none' ? ' · ' + v.method : '')]);
    if (v.detail && Object.keys(v.detail).length) rows.push(['verification detail', typeof v.detail === 'string' ? v.detail : JSON.stringify(v.detail)]);
  }
  return el('table', {class: 'meta'}, rows.filter(([, v]) => v !== null && v !== undefined && v !== '')
    .map(([k, v]) => el('tr', {}, el('th', {text: k}), el('td', {text: v}))));
}

async function renderSample(main, params) {
  const d = await api('/api/sample?' + filterParams(params, {key: params.get('key')}).toString());
  const link = (key, label, id) => key ? el('a', {id, href: '#/sample?' + filterParams(params, {key}).toString(), text: label}) : el('span', {class: 'muted', text: label});
  const nav = el('div', {class: 'pager'}, link(d.prev, '← previous', 'prev'),
    el('a', {href: '#/samples?' + filterParams(params).toString(), text: 'back to list'}),
    el('span', {text: d.position === null ? '' : `${d.position + 1} of ${fmt(d.count)}`}), link(d.next, 'next →', 'next'));
  const turns = el('div', {class: 'turns', id: 'turns'});
  let n = 0;
  for (const t of d.turns || []) turns.append(turnView(t, t.kind === 'gpt' ? ++n : n));
  if (!d.turns) turns.append(el('p', {class: 'muted', text: 'No trajectory was saved for this sample.'}));
  if (d.record && d.record.verification) turns.append(verifyView(d.record.verification, d.entry.verification, d.verifier_logs));
  main.replaceChildren(nav, metaTable(d), turns);
  window.scrollTo(0, 0);
}

// ---- live refresh ---------------------------------------------------------------------------
async function poll() {
  if (!current || current.view === 'sample' || document.hidden) return;
  try {
    const s = await api('/api/status', false);
    if (s.generation !== generation) {
      if (current.view === 'overview') await renderOverview(document.getElementById('main'));
      else await renderSamples(document.getElementById('main'), current.params, false);
    }
    setStatus(s);
  } catch (e) { /* the server went away: keep what is shown */ }
}

// j / k (or → / ←) step through samples in the conversation view
document.addEventListener('keydown', (ev) => {
  if (!current || current.view !== 'sample' || ev.ctrlKey || ev.metaKey || ev.altKey) return;
  if (ev.target instanceof HTMLInputElement) return;
  const id = {j: 'next', ArrowRight: 'next', k: 'prev', ArrowLeft: 'prev'}[ev.key];
  const link = id && document.getElementById(id);
  if (link) link.click();
});

window.addEventListener('hashchange', render);
render();
setInterval(poll, POLL_MS);
