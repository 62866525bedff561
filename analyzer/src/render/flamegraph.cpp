// flamegraph: the bytes live at one moment, by stack, as collapsed-stack
// text (flamegraph.pl, speedscope) or a self-contained interactive SVG.
#include <algorithm>
#include <cstdio>
#include <map>
#include <ostream>
#include <string_view>

#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/snapshot/text.hpp"
#include "reports/report_helpers.hpp"

namespace cachealloc::analyzer {

using snapshot::BlockState;
using snapshot::Snapshot;

namespace {

const char* metric_name(FlameMetric metric) {
  switch (metric) {
    case FlameMetric::allocated: return "allocated";
    case FlameMetric::requested: return "requested";
    case FlameMetric::reserved: return "reserved";
  }
  return "allocated";
}

// Text for XML: escaped, control characters (text.hpp) shown as a space and
// invalid UTF-8 as '?', which XML 1.0 cannot carry.
std::string xml_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = snapshot::utf8_sequence_length(s, i);
    if (n == 0) {
      out += '?';
      ++i;
      continue;
    }
    const char c = s[i];
    if (snapshot::is_control_character(s, i, n)) {
      out += ' ';
    } else if (n == 1) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&quot;"; break;
        case '\'': out += "&apos;"; break;
        default: out += c;
      }
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  return out;
}

// A frame of a collapsed stack: control characters and invalid bytes
// spelled out as in tables (text.hpp); ';' separates frames, so it becomes ','.
std::string collapsed_frame(const std::string& frame) {
  std::string text = snapshot::printable(frame);
  std::replace(text.begin(), text.end(), ';', ',');
  return text;
}

std::string human_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) value /= 1024.0, ++unit;
  char text[64];
  if (unit == 0)
    std::snprintf(text, sizeof text, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(text, sizeof text, "%.2f %s", value, kUnits[unit]);
  return text;
}

struct Node {
  std::string name;
  std::uint64_t bytes = 0;
  std::map<std::string, std::size_t> children;  // name -> index into the node list
};

// The colour of a frame: warm hues from a hash of its name; Python frames green.
std::string fill_of(std::string_view name) {
  std::uint32_t h = 2166136261u;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  const bool python = name.find(".py:") != std::string_view::npos;
  const unsigned r = python ? 80 + h % 60 : 205 + h % 50;
  const unsigned g = python ? 170 + (h >> 8) % 60 : 80 + (h >> 8) % 130;
  const unsigned b = python ? 80 + (h >> 16) % 40 : 40 + (h >> 16) % 40;
  char text[32];
  std::snprintf(text, sizeof text, "rgb(%u,%u,%u)", r, g, b);
  return text;
}

// Click to zoom, search, reset. Written for this file; no library.
constexpr const char* kScript = R"JS(
(function () {
  var svg = document.documentElement, W = +svg.getAttribute('width'), M = 10, CH = 7.0;
  var frames = [].slice.call(document.querySelectorAll('g.f'));
  var details = document.getElementById('details'), matched = document.getElementById('matched');
  var total = frames.length ? +frames[0].getAttribute('data-w') : 0;
  function human(b) {
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0, v = b;
    while (v >= 1024 && i < 4) { v /= 1024; i++; }
    return i === 0 ? b + ' B' : v.toFixed(2) + ' ' + u[i];
  }
  frames.forEach(function (g) {
    g._x = +g.getAttribute('data-x'); g._w = +g.getAttribute('data-w'); g._d = +g.getAttribute('data-d');
    g._n = g.getAttribute('data-n'); g._r = g.querySelector('rect'); g._t = g.querySelector('text');
    g._fill = g._r.getAttribute('fill');
    g.addEventListener('click', function (e) { zoom(g); e.stopPropagation(); });
    g.addEventListener('mouseover', function () {
      details.textContent = g._n + ': ' + human(g._w) + ' (' + g._w + ' bytes, ' +
        (total ? (100 * g._w / total).toFixed(2) : '0.00') + '%)';
    });
    g.addEventListener('mouseout', function () { details.textContent = ' '; });
  });
  function label(g, width) {
    var fit = Math.floor((width - 6) / CH);
    if (fit < 3) return '';
    return g._n.length <= fit ? g._n : g._n.substring(0, fit - 2) + '..';
  }
  function draw(x0, w, depth) {
    var s = (W - 2 * M) / (w > 0 ? w : 1);
    frames.forEach(function (g) {
      var inside = w > 0 ? (g._x < x0 + w && g._x + g._w > x0) : true;
      if (!inside || (g._w === 0 && g._d > 0)) { g.style.display = 'none'; return; }
      g.style.display = '';
      var nx = Math.max(g._x, x0), nw = w > 0 ? Math.min(g._x + g._w, x0 + w) - nx : w;
      var width = w > 0 ? nw * s : W - 2 * M;
      g._r.setAttribute('x', (M + (nx - x0) * s).toFixed(2));
      g._r.setAttribute('width', Math.max(width - 0.5, 0).toFixed(2));
      g._t.setAttribute('x', (M + (nx - x0) * s + 3).toFixed(2));
      g._t.textContent = label(g, width);
      g.style.opacity = g._d < depth ? 0.6 : 1;
    });
  }
  function zoom(g) { draw(g._x, g._w, g._d); }
  function search() {
    var term = window.prompt('Search frames (regular expression)', '');
    if (term === null) return;
    var re;
    try { re = new RegExp(term); } catch (e) { matched.textContent = 'not a regular expression'; return; }
    var spans = [];
    frames.forEach(function (g) {
      var hit = term !== '' && re.test(g._n);
      g._r.setAttribute('fill', hit ? 'rgb(230,0,230)' : g._fill);
      if (hit) spans.push([g._x, g._x + g._w]);
    });
    spans.sort(function (a, b) { return a[0] - b[0]; });
    var sum = 0, end = -1;
    spans.forEach(function (p) {
      if (p[1] <= end) return;
      sum += p[1] - Math.max(p[0], end);
      end = p[1];
    });
    matched.textContent = term === '' ? ' ' : 'matched ' + human(sum) + ' (' +
      (total ? (100 * sum / total).toFixed(2) : '0.00') + '%)';
  }
  document.getElementById('search').addEventListener('click', search);
  document.getElementById('reset').addEventListener('click', function () { draw(0, total, 0); });
  window.addEventListener('keydown', function (e) {
    if ((e.ctrlKey || e.metaKey) && e.key === 'f') { e.preventDefault(); search(); }
    if (e.key === 'Escape') draw(0, total, 0);
  });
  draw(0, total, 0);
})();
)JS";

}  // namespace

FlameGraph flame_graph(EventSource& source, const ReportOptions& options, const FlameOptions& flame) {
  const Snapshot& snapshot = source.head();
  SiteNamer names(snapshot, options.sites);
  AnalysisOptions analysis = detail::analysis_options(options);
  // The state after one event: a window that ends there, refused where it
  // ends before a mid-run trace's first memory event (no memory was recorded).
  if (flame.at == FlameOptions::At::event && flame.event < analysis.window.end) analysis.window.end = flame.event + 1;
  const Analysis a = analyze(source, analysis);
  FlameGraph graph;
  graph.metric = metric_name(flame.metric);
  const std::size_t before_window = a.window.begin == 0 ? kNoEvent : a.window.begin - 1;
  std::string when;
  switch (flame.at) {
    case FlameOptions::At::peak: {
      const Peak& peak = flame.metric == FlameMetric::allocated   ? a.peak_allocated
                         : flame.metric == FlameMetric::requested ? a.peak_requested
                                                                  : a.peak_reserved;
      graph.event = peak.event == kNoEvent ? before_window : peak.event;
      when = "at its peak";
      break;
    }
    case FlameOptions::At::end:
      graph.event = a.window.end == 0 || a.window.end <= a.window.begin ? before_window : a.window.end - 1;
      when = "at the end";
      break;
    case FlameOptions::At::event:
      graph.event = flame.event;
      when = "at event #" + std::to_string(flame.event);
      break;
  }
  std::map<std::vector<std::string>, std::uint64_t> by_stack;
  auto add = [&](snapshot::StackId stack, std::uint64_t bytes) {
    if (bytes == 0) return;
    std::vector<std::string> frames = names.lines(stack);
    std::reverse(frames.begin(), frames.end());
    by_stack[std::move(frames)] += bytes;
    graph.total += bytes;
  };
  replay_to(
      source, a.device, graph.event,
      [&](const Replay& replay) {
        const std::vector<snapshot::Segment> layout = replay.layout();
        if (flame.metric == FlameMetric::reserved) {
          const std::vector<SegmentFigures> figures = replay.segment_figures();
          for (std::size_t i = 0; i < layout.size() && i < figures.size(); ++i) add(layout[i].stack, figures[i].reserved);
          return;
        }
        for (const snapshot::Segment& segment : layout) {
          for (const snapshot::Block& block : segment.blocks) {
            if (flame.metric == FlameMetric::allocated) {
              if (block.state == BlockState::active_allocated) add(block.stack, block.size);
            } else if (block.state == BlockState::active_allocated || block.state == BlockState::active_pending_free) {
              add(block.stack, block.requested);
            }
          }
        }
      },
      options.progress);
  for (auto& [frames, bytes] : by_stack) graph.stacks.push_back(FlameStack{frames, bytes});
  std::stable_sort(graph.stacks.begin(), graph.stacks.end(),
                   [](const FlameStack& x, const FlameStack& y) { return x.bytes > y.bytes; });
  graph.title = detail::title(snapshot, a.device, graph.metric + " " + when) + ", " +
                (graph.event == kNoEvent ? std::string("before the first event")
                                         : "after event #" + std::to_string(graph.event)) +
                ": " + human_bytes(graph.total);
  return graph;
}

void write_collapsed(const FlameGraph& graph, std::ostream& out) {
  for (const FlameStack& stack : graph.stacks) {
    std::string line;
    for (const std::string& frame : stack.frames) {
      if (!line.empty()) line += ';';
      line += collapsed_frame(frame);
    }
    out << line << ' ' << stack.bytes << '\n';
  }
}

void write_flame_svg(const FlameGraph& graph, std::ostream& out) {
  // The tree of frames, root ("all") first.
  std::vector<Node> nodes(1);
  nodes[0].name = "all";
  nodes[0].bytes = graph.total;
  for (const FlameStack& stack : graph.stacks) {
    std::size_t at = 0;
    for (const std::string& frame : stack.frames) {
      const auto found = nodes[at].children.find(frame);
      std::size_t next;
      if (found == nodes[at].children.end()) {
        next = nodes.size();
        nodes[at].children.emplace(frame, next);
        nodes.push_back(Node{frame, 0, {}});
      } else {
        next = found->second;
      }
      nodes[next].bytes += stack.bytes;
      at = next;
    }
  }
  constexpr int kWidth = 1200, kMargin = 10, kRow = 17, kTop = 52;
  // Depth-first, children largest first: x offsets in bytes.
  struct Placed {
    std::size_t node;
    std::uint64_t x;
    int depth;
  };
  std::vector<Placed> placed;
  std::vector<Placed> todo{{0, 0, 0}};
  int depth_max = 0;
  while (!todo.empty()) {
    const Placed p = todo.back();
    todo.pop_back();
    placed.push_back(p);
    depth_max = std::max(depth_max, p.depth);
    std::vector<std::size_t> children;
    for (const auto& [name, index] : nodes[p.node].children) children.push_back(index);
    std::stable_sort(children.begin(), children.end(),
                     [&](std::size_t x, std::size_t y) { return nodes[x].bytes > nodes[y].bytes; });
    std::uint64_t x = p.x;
    std::vector<Placed> next;
    for (const std::size_t child : children) {
      next.push_back({child, x, p.depth + 1});
      x += nodes[child].bytes;
    }
    for (auto it = next.rbegin(); it != next.rend(); ++it) todo.push_back(*it);
  }
  const int height = kTop + (depth_max + 1) * kRow + 30;
  const double scale = graph.total == 0 ? 0.0 : static_cast<double>(kWidth - 2 * kMargin) / static_cast<double>(graph.total);
  char number[64];
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" << kWidth << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << kWidth << ' ' << height << "\" font-family=\"monospace\" font-size=\"12\">\n"
      << "<style>g.f:hover rect{stroke:#000;stroke-width:0.5} g.f text{pointer-events:none}"
         " .button{cursor:pointer;fill:#336} #details,#matched{fill:#000}</style>\n"
      << "<rect x=\"0\" y=\"0\" width=\"" << kWidth << "\" height=\"" << height << "\" fill=\"#f8f8f0\"/>\n"
      << "<text x=\"" << kWidth / 2 << "\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">"
      << xml_text(graph.title) << "</text>\n"
      << "<text id=\"reset\" class=\"button\" x=\"" << kMargin << "\" y=\"38\">Reset zoom</text>\n"
      << "<text id=\"search\" class=\"button\" x=\"" << kWidth - kMargin
      << "\" y=\"38\" text-anchor=\"end\">Search</text>\n"
      << "<text id=\"matched\" x=\"" << kWidth - kMargin - 60 << "\" y=\"38\" text-anchor=\"end\"> </text>\n"
      << "<text id=\"details\" x=\"" << kMargin << "\" y=\"" << height - 10 << "\"> </text>\n";
  for (const Placed& p : placed) {
    const Node& node = nodes[p.node];
    const std::string name = xml_text(node.name);
    const double x = kMargin + static_cast<double>(p.x) * scale;
    const double w = p.node == 0 ? kWidth - 2 * kMargin : static_cast<double>(node.bytes) * scale;
    const int y = kTop + p.depth * kRow;
    out << "<g class=\"f\" data-x=\"" << p.x << "\" data-w=\"" << node.bytes << "\" data-d=\"" << p.depth
        << "\" data-n=\"" << name << "\"><title>" << name << " (" << xml_text(human_bytes(node.bytes)) << ", "
        << node.bytes << " bytes)</title>";
    std::snprintf(number, sizeof number, "%.2f", x);
    out << "<rect x=\"" << number << "\" y=\"" << y << "\" width=\"";
    std::snprintf(number, sizeof number, "%.2f", std::max(w - 0.5, 0.0));
    out << number << "\" height=\"" << kRow - 1 << "\" rx=\"2\" fill=\""
        << (p.node == 0 ? std::string("rgb(200,200,200)") : fill_of(node.name)) << "\"/>";
    std::snprintf(number, sizeof number, "%.2f", x + 3);
    out << "<text x=\"" << number << "\" y=\"" << y + kRow - 5 << "\"></text></g>\n";
  }
  out << "<script type=\"text/ecmascript\"><![CDATA[" << kScript << "]]></script>\n</svg>\n";
}

}  // namespace cachealloc::analyzer
