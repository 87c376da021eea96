// plan_svg: a plan drawn as a standalone SVG picture. The source mesh on top, the destination
// mesh below, each as a grid of device boxes labelled with the device id and its tile. Every
// device has its own colour; a destination box is striped by the devices that send to it
// (stripe width proportional to bytes), and one line per (sender, receiver) pair runs from the
// sender's box to the receiver's destination box, its width proportional to the bytes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "meshcast/limits.h"
#include "meshcast/plan.h"
#include "meshcast/units.h"

namespace meshcast {
namespace {

constexpr double kMargin = 20;
constexpr double kGap = 12;  // between boxes
constexpr double kBoxH = 48;
constexpr double kBand = 110;       // vertical space between the two grids, for the lines
constexpr double kCharW = 6.7;      // width of one 11px monospace character
constexpr std::int64_t kWrap = 16;  // boxes per row at most
constexpr std::size_t kMaxLines = 4000;
constexpr std::size_t kMaxStripes = 8;  // senders drawn in a destination box; the rest as one

// Length of the valid UTF-8 sequence starting at s[i], or 0.
std::size_t utf8_length(const std::string& s, std::size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const std::size_t n = b < 0x80           ? 1
                        : (b >> 5) == 0x6  ? 2
                        : (b >> 4) == 0xe  ? 3
                        : (b >> 3) == 0x1e ? 4
                                           : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return 0;
  return n;
}

// Text safe inside an XML element or attribute: markup escaped, control characters and invalid
// UTF-8 replaced by '?'.
std::string esc(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const char c = s[i];
    const std::size_t n = utf8_length(s, i);
    if (n > 1) {
      out.append(s, i, n);
      i += n;
      continue;
    }
    ++i;
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += (n == 0 || (static_cast<unsigned char>(c) < 32 && c != '\t')) ? '?' : c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string colour(std::size_t index, double lightness) {
  const double h = std::fmod(static_cast<double>(index) * 137.508, 360.0) / 60.0;
  const double s = 0.62, l = lightness;
  const double c = (1 - std::fabs(2 * l - 1)) * s;
  const double x = c * (1 - std::fabs(std::fmod(h, 2.0) - 1));
  double r = 0, g = 0, b = 0;
  if (h < 1)
    r = c, g = x;
  else if (h < 2)
    r = x, g = c;
  else if (h < 3)
    g = c, b = x;
  else if (h < 4)
    g = x, b = c;
  else if (h < 5)
    r = x, b = c;
  else
    r = c, b = x;
  const double m = l - c / 2;
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", static_cast<int>(std::lround((r + m) * 255)),
                static_cast<int>(std::lround((g + m) * 255)),
                static_cast<int>(std::lround((b + m) * 255)));
  return buf;
}

struct Rect {
  double x = 0, y = 0, w = 0, h = 0;
  double cx() const { return x + w / 2; }
};

// Boxes per row and rows of a mesh drawn as a grid: 1-D as a row, 2-D as a grid, higher-D as
// rows of the last axis; rows longer than kWrap wrap.
struct Grid {
  std::int64_t cols = 1, rows = 1;
  std::int64_t per_row = 1;  // drawn rows per mesh row
  std::int64_t mesh_cols = 1;
};
Grid grid_of(std::int64_t boxes, std::int64_t row_length) {
  Grid g;
  g.mesh_cols = row_length;
  g.cols = std::min(g.mesh_cols, kWrap);
  g.per_row = (g.mesh_cols + kWrap - 1) / kWrap;
  g.rows = (boxes / g.mesh_cols) * g.per_row;
  return g;
}

std::string tile_label(const Layout& l, std::int64_t index) {
  std::string s = l.tile_at(index).str();
  if (l.spec().is_partial()) s += " addend " + std::to_string(l.partial_group(index));
  return s;
}

// A mesh drawn as boxes: one per device, or, when it has more devices than a picture should
// draw, one per run of `per_box` consecutive devices (mesh order), named by its first device.
struct Panel {
  const Layout& layout;
  std::int64_t per_box = 1;
  std::int64_t boxes() const { return (layout.mesh().size() + per_box - 1) / per_box; }
  int first(std::int64_t box) const { return layout.mesh().device(box * per_box); }
  std::int64_t size(std::int64_t box) const {
    return std::min(per_box, layout.mesh().size() - box * per_box);
  }
  // The box of a device of this mesh, by its first device.
  int box_of(int device) const {
    return per_box == 1 ? device : first(*layout.mesh().index_of(device) / per_box);
  }
  std::string title(std::int64_t box) const {
    if (per_box == 1) return "device " + std::to_string(first(box));
    return "devices " + std::to_string(first(box)) + ".." +
           std::to_string(layout.mesh().device(box * per_box + size(box) - 1));
  }
  std::string label(std::int64_t box) const {
    if (per_box == 1) return tile_label(layout, box);
    return std::to_string(size(box)) + " tiles from " + layout.tile_at(box * per_box).str();
  }
  Grid grid() const {  // aggregated boxes in one (wrapped) row
    return grid_of(boxes(), per_box == 1 ? layout.mesh().shape().back() : boxes());
  }
};

Panel panel_of(const Layout& l) {
  // Elements of a box: about 6 plus up to kMaxStripes stripes; lines come on top (max_lines).
  const std::int64_t max_boxes = std::max<std::int64_t>(16, limits().svg_elements / 80);
  return Panel{l, (l.mesh().size() + max_boxes - 1) / max_boxes};
}

}  // namespace

std::string plan_svg(const Plan& plan) {
  const Layout& src = plan.src();
  const Layout& dst = plan.dst();
  const std::vector<int> devices = plan.devices();
  std::map<int, std::size_t> colour_index;
  for (std::size_t i = 0; i < devices.size(); ++i) colour_index[devices[i]] = i;
  const auto fill = [&](int d) { return colour(colour_index[d], 0.78); };
  const auto ink = [&](int d) { return colour(colour_index[d], 0.38); };
  const Panel ps = panel_of(src), pd = panel_of(dst);

  // Bytes per (sender, receiver, sender reads its destination buffer).
  const auto elem = static_cast<std::int64_t>(dtype_size(dst.dtype()));
  std::map<std::tuple<int, int, bool>, std::int64_t> flows;
  for (const Op& op : plan.ops()) {
    const std::int64_t bytes = op.box.volume() * elem;
    switch (op.kind) {
      case OpKind::Copy:
      case OpKind::Multicast: {
        const int from = op.from_dst ? pd.box_of(op.root) : ps.box_of(op.root);
        if (op.kind == OpKind::Copy) flows[{from, pd.box_of(op.root), op.from_dst}] += bytes;
        for (int p : op.peers) flows[{from, pd.box_of(p), op.from_dst}] += bytes;
        break;
      }
      case OpKind::Reduce:
        for (int p : op.peers) flows[{ps.box_of(p), pd.box_of(op.root), false}] += bytes;
        break;
      case OpKind::Zero:
        break;
    }
  }
  std::map<int, std::map<int, std::int64_t>> by_sender;  // receiver -> sender -> bytes
  std::int64_t max_flow = 1;
  for (const auto& [key, bytes] : flows) {
    by_sender[std::get<1>(key)][std::get<0>(key)] += bytes;
    max_flow = std::max(max_flow, bytes);
  }
  // Per receiver, its largest senders in sender order; the others merged as sender -1.
  std::map<int, std::vector<std::pair<int, std::int64_t>>> received;
  for (const auto& [to, senders] : by_sender) {
    auto& list = received[to];
    list.assign(senders.begin(), senders.end());
    if (list.size() <= kMaxStripes) continue;
    std::stable_sort(list.begin(), list.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    std::int64_t rest = 0;
    for (std::size_t i = kMaxStripes - 1; i < list.size(); ++i) rest += list[i].second;
    list.resize(kMaxStripes - 1);
    std::sort(list.begin(), list.end());
    list.emplace_back(-1, rest);
  }

  // Box size from the longest label.
  std::size_t longest = 12;
  for (const Panel* panel : {&ps, &pd})
    for (std::int64_t i = 0; i < panel->boxes(); ++i)
      longest = std::max({longest, panel->label(i).size(), panel->title(i).size()});
  const double box_w = std::max(96.0, static_cast<double>(longest) * kCharW + 16);

  const Grid gs = ps.grid(), gd = pd.grid();
  const auto grid_w = [&](const Grid& g) {
    return static_cast<double>(g.cols) * (box_w + kGap) - kGap;
  };
  const auto grid_h = [&](const Grid& g) {
    return static_cast<double>(g.rows) * (kBoxH + kGap) - kGap;
  };

  std::vector<std::string> footer;
  {
    const PlanStats& st = plan.stats();
    footer.push_back("strategy " + to_string(plan.strategy()) + " \u00b7 balance " +
                     to_string(plan.balance()) + " \u00b7 topology " + plan.topology() +
                     " \u00b7 " + std::to_string(plan.ops().size()) + " ops in " +
                     std::to_string(plan.phases()) + " phases");
    char pred[64];
    std::snprintf(pred, sizeof pred, "%.3g s", st.predicted_seconds);
    footer.push_back(
        "tensor " + shape_str(src.shape()) + " " + to_string(src.dtype()) + " (" +
        human_bytes(src.bytes()) + ") \u00b7 bytes moved " + human_bytes(st.bytes_moved) +
        " (intra-host " + human_bytes(st.bytes_intra_host) + ", network " +
        human_bytes(st.bytes_network) + ") \u00b7 local copies " + human_bytes(st.bytes_local) +
        " \u00b7 predicted " + pred + (st.search_truncated ? " (search truncated)" : ""));
    footer.push_back(
        "Each device has its own colour. A destination tile is striped by the devices that send "
        "to it (width \u221d bytes; beyond " +
        std::to_string(kMaxStripes - 1) + " senders the smaller ones in grey).");
    footer.push_back(
        "Lines run from sender to receiver, width \u221d bytes; dashed: a copy inside one "
        "device; curved: sent from a destination buffer.");
  }
  // A line is a path and its tooltip; its sender's arrow head is two more.
  const std::size_t max_lines =
      std::min<std::size_t>(kMaxLines, static_cast<std::size_t>(limits().svg_elements / 8));
  const std::size_t hidden = flows.size() > max_lines ? flows.size() - max_lines : 0;
  if (hidden > 0) footer.push_back(std::to_string(hidden) + " smaller transfers not drawn.");
  if (ps.per_box > 1 || pd.per_box > 1)
    footer.push_back("Too many devices to draw one by one: a box stands for up to " +
                     std::to_string(std::max(ps.per_box, pd.per_box)) +
                     " consecutive devices of its mesh, and lines for their bytes together.");
  std::size_t footer_chars = 0;
  for (const auto& f : footer) footer_chars = std::max(footer_chars, f.size());

  const double content_w =
      std::max({grid_w(gs), grid_w(gd), static_cast<double>(footer_chars) * 6.2, 480.0});
  const double width = content_w + 2 * kMargin;
  const double src_top = kMargin + 56;
  const double dst_top = src_top + grid_h(gs) + kBand;
  const double footer_top = dst_top + grid_h(gd) + 36;
  const double height = footer_top + 20.0 * static_cast<double>(footer.size()) + kMargin;

  std::map<int, Rect> src_box, dst_box;
  std::map<int, std::string> src_title, dst_title;  // of a box, by its first device
  const auto place = [&](const Grid& g, const Panel& panel, double top, std::map<int, Rect>& out,
                         std::map<int, std::string>& titles) {
    const double left = kMargin + (content_w - grid_w(g)) / 2;
    for (std::int64_t i = 0; i < panel.boxes(); ++i) {
      const std::int64_t row = (i / g.mesh_cols) * g.per_row + (i % g.mesh_cols) / kWrap;
      const std::int64_t col = (i % g.mesh_cols) % kWrap;
      titles[panel.first(i)] = panel.title(i);
      out[panel.first(i)] = Rect{left + static_cast<double>(col) * (box_w + kGap),
                                 top + static_cast<double>(row) * (kBoxH + kGap), box_w, kBoxH};
    }
  };
  place(gs, ps, src_top, src_box, src_title);
  place(gd, pd, dst_top, dst_box, dst_title);

  std::ostringstream os;
  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
     << "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" << num(width)
     << "\" height=\"" << num(height) << "\" viewBox=\"0 0 " << num(width) << ' ' << num(height)
     << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
     << "<title>" << esc("meshcast plan " + src.str() + " -> " + dst.str()) << "</title>\n"
     << "<rect x=\"0\" y=\"0\" width=\"" << num(width) << "\" height=\"" << num(height)
     << "\" fill=\"white\"/>\n";
  os << "<text x=\"" << num(kMargin) << "\" y=\"" << num(kMargin + 8)
     << "\" font-size=\"15\" font-weight=\"bold\">"
     << esc("meshcast plan: " + shape_str(src.shape()) + " " + to_string(src.dtype()))
     << "</text>\n";

  // Lines, drawn over the boxes (translucent), largest last. Lines leaving one box, and lines
  // entering one box, are spread along its edge so that they do not overlap.
  std::vector<std::pair<std::tuple<int, int, bool>, std::int64_t>> all(flows.begin(), flows.end());
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  all.resize(all.size() - hidden);
  struct Line {
    int from, to;
    bool from_dst;
    std::int64_t bytes;
    Rect a, b;
    double ax = 0, bx = 0;
  };
  std::vector<Line> lines;
  for (const auto& [key, bytes] : all) {
    const auto [from, to, from_dst] = key;
    const auto& origins = from_dst ? dst_box : src_box;
    const auto target = dst_box.find(to);
    const auto origin = origins.find(from);
    if (target == dst_box.end() || origin == origins.end() || (from_dst && from == to)) continue;
    lines.push_back({from, to, from_dst, bytes, origin->second, target->second});
  }
  {
    std::map<std::pair<int, bool>, std::vector<std::size_t>> out;
    std::map<int, std::vector<std::size_t>> in;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      out[{lines[i].from, lines[i].from_dst}].push_back(i);
      in[lines[i].to].push_back(i);
    }
    const auto spread = [&](std::vector<std::size_t>& group, bool at_start) {
      std::stable_sort(group.begin(), group.end(), [&](std::size_t x, std::size_t y) {
        return at_start ? lines[x].b.cx() < lines[y].b.cx() : lines[x].a.cx() < lines[y].a.cx();
      });
      for (std::size_t k = 0; k < group.size(); ++k) {
        Line& l = lines[group[k]];
        const Rect& r = at_start ? l.a : l.b;
        const double x =
            r.x + r.w * static_cast<double>(k + 1) / static_cast<double>(group.size() + 1);
        (at_start ? l.ax : l.bx) = x;
      }
    };
    for (auto& [key, group] : out) spread(group, true);
    for (auto& [key, group] : in) spread(group, false);
  }
  // Thinner lines when there are many.
  const double widest =
      lines.size() <= 16 ? 5.0
                         : std::max(1.0, 5.0 * std::sqrt(16.0 / static_cast<double>(lines.size())));
  std::ostringstream ls;
  std::map<int, bool> marker;
  ls << "<g fill=\"none\" stroke-linecap=\"round\" opacity=\"0.75\">\n";
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    const Line& l = *it;
    marker[l.from] = true;
    const double w = 1 + widest * static_cast<double>(l.bytes) / static_cast<double>(max_flow);
    ls << "<path stroke=\"" << ink(l.from) << "\" stroke-width=\"" << num(w) << "\"";
    if (l.from == l.to && !l.from_dst) ls << " stroke-dasharray=\"5,4\"";
    if (l.from_dst) {
      // Within the destination grid: a curve above the boxes.
      const double lift = 30 + std::fabs(l.ax - l.bx) / 8;
      ls << " d=\"M" << num(l.ax) << ',' << num(l.a.y) << " Q" << num((l.ax + l.bx) / 2) << ','
         << num(std::min(l.a.y, l.b.y) - lift) << ' ' << num(l.bx) << ',' << num(l.b.y) << "\"";
    } else {
      ls << " d=\"M" << num(l.ax) << ',' << num(l.a.y + l.a.h) << " L" << num(l.bx) << ','
         << num(l.b.y) << "\"";
    }
    ls << " marker-end=\"url(#arrow" << l.from << ")\"><title>"
       << esc((l.from_dst ? dst_title : src_title)[l.from] + " -> " + dst_title[l.to] + ": " +
              human_bytes(l.bytes) + (l.from_dst ? " (from its destination buffer)" : ""))
       << "</title></path>\n";
  }
  ls << "</g>\n";
  os << "<defs>";
  for (const auto& [d, used] : marker)
    os << "<marker id=\"arrow" << d << "\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" "
       << "markerUnits=\"userSpaceOnUse\" markerWidth=\"9\" markerHeight=\"9\" "
       << "orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"" << ink(d) << "\"/></marker>";
  os << "</defs>\n";

  const auto draw_box = [&](const Rect& r, int device, const std::string& title,
                            const std::string& label, bool is_src) {
    os << "<g>";
    if (is_src) {
      os << "<rect x=\"" << num(r.x) << "\" y=\"" << num(r.y) << "\" width=\"" << num(r.w)
         << "\" height=\"" << num(r.h) << "\" fill=\"" << fill(device) << "\"/>";
    } else if (const auto rec = received.find(device); rec != received.end()) {
      std::int64_t total = 0;
      for (const auto& [s, b] : rec->second) total += b;
      double x = r.x;
      for (const auto& [s, b] : rec->second) {
        const double w =
            r.w * static_cast<double>(b) / static_cast<double>(std::max<std::int64_t>(total, 1));
        os << "<rect x=\"" << num(x) << "\" y=\"" << num(r.y) << "\" width=\"" << num(w)
           << "\" height=\"" << num(r.h) << "\" fill=\"" << (s < 0 ? "#bbbbbb" : fill(s)) << "\"/>";
        x += w;
      }
    }
    os << "<rect x=\"" << num(r.x) << "\" y=\"" << num(r.y) << "\" width=\"" << num(r.w)
       << "\" height=\"" << num(r.h) << "\" fill=\"none\" stroke=\"#333\"/>"
       << "<rect x=\"" << num(r.x + 4) << "\" y=\"" << num(r.y + 5) << "\" width=\"10\" "
       << "height=\"10\" fill=\"" << ink(device) << "\"/>"
       << "<text x=\"" << num(r.x + 19) << "\" y=\"" << num(r.y + 15) << "\" font-weight=\"bold\">"
       << esc(title) << "</text>"
       << "<text x=\"" << num(r.x + 6) << "\" y=\"" << num(r.y + 36)
       << "\" font-family=\"DejaVu Sans Mono, Menlo, monospace\" font-size=\"11\">" << esc(label)
       << "</text>";
    if (!is_src) {
      std::string tip = title + " receive" + (title.starts_with("devices") ? "" : "s");
      if (const auto rec = received.find(device); rec != received.end())
        for (const auto& [s, b] : rec->second)
          tip.append(" ")
              .append(human_bytes(b))
              .append(" from ")
              .append(s < 0 ? std::string("the others") : std::to_string(s))
              .append(";");
      os << "<title>" << esc(tip) << "</title>";
    }
    os << "</g>\n";
  };
  for (std::int64_t i = 0; i < ps.boxes(); ++i)
    draw_box(src_box[ps.first(i)], ps.first(i), ps.title(i), ps.label(i), true);
  for (std::int64_t i = 0; i < pd.boxes(); ++i)
    draw_box(dst_box[pd.first(i)], pd.first(i), pd.title(i), pd.label(i), false);

  os << ls.str();
  // Panel labels over the lines, with a white halo.
  os << "<g stroke=\"white\" stroke-width=\"4\" paint-order=\"stroke\" font-weight=\"bold\">"
     << "<text x=\"" << num(kMargin) << "\" y=\"" << num(src_top - 10) << "\">"
     << esc("source " + src.str()) << "</text>"
     << "<text x=\"" << num(kMargin) << "\" y=\"" << num(dst_top - 10) << "\">"
     << esc("destination " + dst.str()) << "</text></g>\n";
  for (std::size_t i = 0; i < footer.size(); ++i)
    os << "<text x=\"" << num(kMargin) << "\" y=\""
       << num(footer_top + 20.0 * static_cast<double>(i)) << "\""
       << (i >= 2 ? " fill=\"#555\"" : "") << ">" << esc(footer[i]) << "</text>\n";
  os << "</svg>\n";
  return os.str();
}

}  // namespace meshcast
