// The dashboard's only script: it keeps a page's content current and follows an instance's
// output, both over server-sent events. Ours rather than a library's: two EventSources and
// a text append are all the pages need, and the Content-Security-Policy allows this file and
// nothing inline.
'use strict';

(function () {
  // Streams open now: closed when the page is left, so that a page kept in the browser's
  // back-forward cache holds no connection (a browser has six per host, and a held stream
  // would stall every later request); a page brought back from that cache loads afresh.
  const streams = [];
  window.addEventListener('pagehide', () => streams.forEach((s) => s.close()));
  window.addEventListener('pageshow', (e) => {
    if (e.persisted) {
      window.location.reload();
    }
  });
  // The server ended this stream for a newer page of the same session: it stays closed.
  const closeWhenReplaced = (source) =>
    source.addEventListener('replaced', () => source.close());

  // What a reader has open or scrolled to survives the content being replaced: the n-th
  // <details> and the n-th scrolled box of the new content are as they were.
  const swap = (content, html) => {
    const open = [...content.querySelectorAll('details')].map((d) => d.open);
    const scrolled = [...content.querySelectorAll('.scroll')].map((s) => s.scrollLeft);
    content.innerHTML = html;
    content.querySelectorAll('details').forEach((d, i) => {
      if (open[i]) {
        d.open = true;
      }
    });
    content.querySelectorAll('.scroll').forEach((s, i) => {
      s.scrollLeft = scrolled[i] || 0;
    });
  };

  const content = document.getElementById('content');
  if (content && content.dataset.live) {
    const live = new EventSource('/ui/live?page=' + encodeURIComponent(content.dataset.live));
    streams.push(live);
    closeWhenReplaced(live);
    live.addEventListener('content', (e) => {
      // Server-rendered HTML, escaped where it was made.
      swap(content, e.data);
      document.body.dataset.updated = String(Date.now());
    });
    live.addEventListener('error', () => {
      // Refused (the session ended, the node restarted): the page itself, loaded again in a
      // moment, says where to go. A dropped connection is retried by the browser.
      if (live.readyState === EventSource.CLOSED) {
        window.setTimeout(() => window.location.reload(), 2000);
      }
    });
  }

  const logs = document.getElementById('logs');
  if (logs && logs.dataset.source) {
    const follow = document.getElementById('follow');
    const output = new EventSource(logs.dataset.source);
    streams.push(output);
    closeWhenReplaced(output);
    // Each connection starts with the output's last lines: a reconnection starts afresh
    // rather than append them a second time.
    output.addEventListener('open', () => logs.replaceChildren());
    const append = (text, className) => {
      const line = document.createElement('span');
      line.className = className;
      line.textContent = text + '\n';
      logs.appendChild(line);
      while (logs.childNodes.length > 5000) {
        logs.removeChild(logs.firstChild);
      }
      if (!follow || follow.checked) {
        logs.scrollTop = logs.scrollHeight;
      }
    };
    output.addEventListener('line', (e) => {
      const line = JSON.parse(e.data);
      append(line.text, line.stream);
    });
    output.addEventListener('problem', (e) => {
      append(e.data, 'problem');
      output.close();
    });
    output.addEventListener('end', () => {
      append('(the output ended)', 'problem');
      output.close();
    });
  }
})();
