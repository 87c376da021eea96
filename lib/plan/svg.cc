// plan_svg: a plan drawn as a standalone SVG picture. The source mesh on top, the destination
// mesh below, devices grouped in one box per host of the plan's topology. Every transfer is
// drawn hop by hop, as the executor moves it and PlanStats counts it (a multicast along its
// chain or tree of chains), coloured by the link it takes: network, intra-host, or inside one
// device. Lines leave the bottom edge of a source box and enter the top edge of a destination
// box (a receiver forwarding from its destination buffer: an arc above the destination row), so
// they stay in the band between the rows and never cross a label. Past the device view's
// thresholds (lib/plan/svg.h) one box stands for a host and the lines carry host-to-host bytes.
#include "lib/plan/svg.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lib/plan/svg_model.h"
#include "lib/support/text.h"
#include "meshcast/units.h"

namespace meshcast {
namespace svg {
namespace {

// Whether the n-byte character at s[i] (well-formed: detail::utf8_length's) is one XML allows:
// not U+FFFE or U+FFFF.
bool xml_char(const std::string& s, std::size_t i, std::size_t n) {
  return !(n == 3 && static_cast<unsigned char>(s[i]) == 0xEF &&
           static_cast<unsigned char>(s[i + 1]) == 0xBF &&
           static_cast<unsigned char>(s[i + 2]) >= 0xBE);
}

// Text safe inside an XML element or attribute: markup escaped, control characters, invalid
// UTF-8 and characters XML does not allow replaced by '?'.
std::string esc(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const char c = s[i];
    const std::size_t n = detail::utf8_length(s, i);
    if (n > 1) {  // one '?' for a whole sequence XML does not allow
      if (xml_char(s, i, n))
        out.append(s, i, n);
      else
        out += '?';
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

// A coordinate with one decimal: "12.5".
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// A distinct colour per index (golden-angle hues), as "#rrggbb" at the given lightness (0..1).
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

// Bytes in a few characters, for labels on lines: "512 B", "1.5 KiB", "32 KiB", "1.02 GiB".
std::string short_bytes(std::int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  auto v = static_cast<double>(bytes);
  std::size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(kUnits)) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  // %.3g would write 1000 as "1e+03".
  std::snprintf(buf, sizeof buf, u == 0 || v >= 999.5 ? "%.0f %s" : "%.3g %s", v, kUnits[u]);
  return buf;
}

// Width in pixels of `s` in DejaVu Sans (bold, the wider) or its monospace at `font_size`: an
// estimate by characters (code points), slightly generous.
double text_width(const std::string& s, double font_size = 12) {
  std::size_t chars = 0;
  for (const char c : s) chars += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return static_cast<double>(chars) * font_size * 0.66;
}

// Geometry, in pixels.
constexpr double kMargin = 20;
constexpr double kGap = 10;        // between the devices of a host box
constexpr double kFrameGap = 20;   // between host boxes
constexpr double kPad = 8;         // inside a host box, around its devices
constexpr double kFrameHead = 22;  // a host box's name, on its outer side
constexpr double kBand = 190;      // between the rows of boxes: the lines' only room
constexpr double kStub = 48;       // lines end straight down this long, their labels on it
constexpr double kSlot = 26;       // edge room of a line that gets a label
constexpr double kFooterLine = 20;

// How each link class (svg::Link) is drawn, and named in a box's text.
struct LinkStyle {
  const char* cls;
  const char* colour;
  const char* dash;
  const char* legend;
};
constexpr LinkStyle kStyle[] = {
    {"net", "#e8590c", "", "network (between hosts)"},
    {"intra", "#1971c2", "7 4", "intra-host"},
    {"local", "#868e96", "2 4", "inside one device"},
    {"transfer", "#495057", "", "transfer (hosts unknown)"},
};
const char* const kLinkWord[] = {"net", "intra", "copy", "moved"};

// "in: 1.5 MiB net, 3 MiB intra"
std::string bytes_text(const char* what, const std::array<std::int64_t, 4>& by_link) {
  std::string s = what;
  bool any = false;
  for (int link : {kNetwork, kIntra, kUnknown, kLocal})
    if (by_link[static_cast<std::size_t>(link)] > 0) {
      s += (any ? ", " : ": ") + short_bytes(by_link[static_cast<std::size_t>(link)]) + " " +
           kLinkWord[link];
      any = true;
    }
  return any ? s : s + ": nothing";
}

struct Rect {
  double x = 0, y = 0, w = 0, h = 0;
  double cx() const { return x + w / 2; }
};

// A line from a sender's box to a receiver's.
struct Line {
  bool from_dst;
  std::size_t from, to;  // boxes
  Link link;
  std::int64_t bytes;
  double ax = 0, bx = 0;  // where it leaves its sender's box and enters its receiver's
  int label_row = -1;     // of its label above the receiver (staggered), -1 for none
};

// One mesh's row: its boxes and, in the device view, its host boxes.
struct Row {
  std::vector<Rect> boxes, frames;
  double width = 0;
};

// The picture of one plan: what is drawn (the view), where (place()), then the SVG text.
class Drawing {
 public:
  Drawing(const Plan& plan, const Hosts& hosts)
      : plan_(plan), hosts_(hosts), v_(view_of(plan, hosts)), c_(captions_of(plan, hosts, v_)) {
    for (const int d : plan.devices()) colour_index_.emplace(d, colour_index_.size());
    for (const auto& [key, bytes] : v_.flows.between) {
      const auto [from_dst, from, to, link] = key;
      if (from_dst && from == to) continue;  // aggregated: forwarded inside one box
      lines_.push_back({from_dst, from, to, link, bytes});
      max_bytes_ = std::max(max_bytes_, bytes);
    }
    place();
  }

  std::string svg() const {
    std::ostringstream os;
    head(os);
    frames(os);
    lines(os);
    for (std::size_t b = 0; b < v_.src.boxes.size(); ++b) box(os, true, b);
    for (std::size_t b = 0; b < v_.dst.boxes.size(); ++b) box(os, false, b);
    tail(os);
    return os.str();
  }

 private:
  bool framed() const { return v_.devices; }  // host boxes around device boxes
  std::string fill(int d) const { return colour(colour_index_.at(d), 0.8); }
  std::string ink(int d) const { return colour(colour_index_.at(d), 0.38); }
  std::string bytes_of(bool is_src, std::size_t b) const {
    return bytes_text(is_src ? "out" : "in", is_src ? v_.flows.out[b] : v_.flows.in[b]);
  }
  std::vector<Link> legend() const {
    return hosts_.topology ? std::vector<Link>{kNetwork, kIntra, kLocal}
                           : std::vector<Link>{kUnknown, kLocal};
  }

  // Sizes and positions: boxes as wide as their longest text and, where lines get labels, as
  // the room those need; rows centred; lines' ends spread along the boxes' edges.
  void place() {
    // Each box edge's lines: (line, this is its receiving end).
    bottom_.resize(v_.src.boxes.size());
    top_.resize(v_.dst.boxes.size());
    for (std::size_t i = 0; i < lines_.size(); ++i) {
      (lines_[i].from_dst ? top_ : bottom_)[lines_[i].from].emplace_back(i, false);
      top_[lines_[i].to].emplace_back(i, true);
    }
    std::size_t slots = 1;
    for (const auto& edge : top_) slots = std::max(slots, edge.size());
    double text_w = 0;
    for (const bool is_src : {true, false}) {
      const Panel& p = is_src ? v_.src : v_.dst;
      for (std::size_t b = 0; b < p.boxes.size(); ++b) {
        text_w = std::max({text_w, text_width(p.boxes[b].title) + (framed() ? 14 : 0),
                           text_width(p.boxes[b].detail, 11)});
        if (!framed()) text_w = std::max(text_w, text_width(bytes_of(is_src, b), 11));
      }
    }
    box_w_ = std::max(
        {96.0, text_w + 14,
         static_cast<double>(std::min<std::size_t>(slots, framed() ? 4 : 10) + 1) * kSlot});
    box_h_ = framed() ? 42 : 60;

    double y = kMargin + 16;
    title_y_ = y;
    y += c_.subtitle.empty() ? 0 : 20;
    subtitle_y_ = y;
    legend_y_ = y + 24;
    src_label_y_ = legend_y_ + 30;
    src_top_ = src_label_y_ + 12 + (framed() ? kFrameHead : 0);
    dst_top_ = src_top_ + box_h_ + kBand;
    dst_label_y_ = dst_top_ + box_h_ + (framed() ? kFrameHead : 0) + 22;
    footer_y_ = dst_label_y_ + 30;

    rs_ = row(v_.src, src_top_);
    rd_ = row(v_.dst, dst_top_);
    double content_w =
        std::max({rs_.width, rd_.width, text_width(c_.title, 15), text_width(c_.subtitle),
                  text_width(c_.src), text_width(c_.dst), 560.0});
    for (const auto& f : c_.footer) content_w = std::max(content_w, text_width(f) * 0.92);
    width_ = content_w + 2 * kMargin;
    height_ = footer_y_ + kFooterLine * static_cast<double>(c_.footer.size()) + kMargin;
    for (Row* r : {&rs_, &rd_}) {
      const double shift = kMargin + (content_w - r->width) / 2;
      for (Rect& b : r->boxes) b.x += shift;
      for (Rect& f : r->frames) f.x += shift;
    }
    for (Rect& f : rs_.frames) f.y = src_top_ - kFrameHead, f.h = kFrameHead + box_h_ + kPad;
    for (Rect& f : rd_.frames) f.y = dst_top_ - kPad, f.h = kPad + box_h_ + kFrameHead;

    for (std::size_t b = 0; b < bottom_.size(); ++b) attach(bottom_[b], rs_.boxes[b]);
    for (std::size_t b = 0; b < top_.size(); ++b) attach(top_[b], rd_.boxes[b]);
  }

  // A mesh's boxes (and host boxes) left to right from x = 0, at height y.
  Row row(const Panel& p, double y) const {
    Row r;
    double x = 0;
    if (!framed()) {
      for (std::size_t b = 0; b < p.boxes.size(); ++b, x += box_w_ + kFrameGap)
        r.boxes.push_back({x, y, box_w_, box_h_});
    } else {
      for (const Frame& f : p.frames) {
        const double inner = static_cast<double>(f.count) * (box_w_ + kGap) - kGap;
        const double fw = std::max(inner, text_width(f.name)) + 2 * kPad;
        for (std::size_t b = 0; b < f.count; ++b)
          r.boxes.push_back(
              {x + (fw - inner) / 2 + static_cast<double>(b) * (box_w_ + kGap), y, box_w_, box_h_});
        r.frames.push_back({x, 0, fw, 0});
        x += fw + kFrameGap;
      }
    }
    r.width = x - kFrameGap;
    return r;
  }

  // Spreads an edge's line ends evenly, in the order of their other ends (fewest crossings);
  // the lines entering a box get labels when each has kSlot of room.
  void attach(std::vector<std::pair<std::size_t, bool>>& edge, const Rect& r) {
    const auto other = [&](const std::pair<std::size_t, bool>& e) {
      const Line& l = lines_[e.first];
      return e.second ? (l.from_dst ? rd_ : rs_).boxes[l.from].cx() : rd_.boxes[l.to].cx();
    };
    std::stable_sort(edge.begin(), edge.end(),
                     [&](const auto& p, const auto& q) { return other(p) < other(q); });
    const double step = r.w / static_cast<double>(edge.size() + 1);
    for (std::size_t k = 0; k < edge.size(); ++k) {
      Line& l = lines_[edge[k].first];
      (edge[k].second ? l.bx : l.ax) = r.x + step * static_cast<double>(k + 1);
      if (edge[k].second && step >= kSlot) l.label_row = static_cast<int>(k % 3);
    }
  }

  // The document's start, the title, legend and the meshes' names.
  void head(std::ostream& os) const {
    os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
       << "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" << num(width_)
       << "\" height=\"" << num(height_) << "\" viewBox=\"0 0 " << num(width_) << ' '
       << num(height_)
       << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
       << "<title>" << esc("meshcast plan " + plan_.src().str() + " -> " + plan_.dst().str())
       << "</title>\n"
       << "<rect x=\"0\" y=\"0\" width=\"" << num(width_) << "\" height=\"" << num(height_)
       << "\" fill=\"white\"/>\n";
    os << "<defs>";
    for (const Link link : legend())
      os << "<marker id=\"arrow-" << kStyle[link].cls << "\" viewBox=\"0 0 10 10\" refX=\"10\" "
         << "refY=\"5\" markerUnits=\"userSpaceOnUse\" markerWidth=\"9\" markerHeight=\"9\" "
         << "orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"" << kStyle[link].colour
         << "\"/></marker>";
    os << "</defs>\n";
    os << "<text x=\"" << num(kMargin) << "\" y=\"" << num(title_y_)
       << "\" font-size=\"15\" font-weight=\"bold\">" << esc(c_.title) << "</text>\n";
    if (!c_.subtitle.empty())
      os << "<text class=\"aggregated\" x=\"" << num(kMargin) << "\" y=\"" << num(subtitle_y_)
         << "\" fill=\"#a61e4d\">" << esc(c_.subtitle) << "</text>\n";
    double x = kMargin;
    os << "<g class=\"legend\">";
    for (const Link link : legend()) {
      const LinkStyle& s = kStyle[link];
      os << "<path d=\"M" << num(x) << ',' << num(legend_y_ - 4) << " h28\" stroke=\"" << s.colour
         << "\" stroke-width=\"3\" fill=\"none\""
         << (*s.dash ? std::string(" stroke-dasharray=\"") + s.dash + "\"" : std::string())
         << " marker-end=\"url(#arrow-" << s.cls << ")\"/><text x=\"" << num(x + 36) << "\" y=\""
         << num(legend_y_) << "\">" << esc(s.legend) << "</text>";
      x += 36 + text_width(s.legend) + 18;
    }
    os << "<text x=\"" << num(x) << "\" y=\"" << num(legend_y_) << "\" fill=\"#555\">"
       << esc("line width \u221d bytes; the number over a line's end: its bytes")
       << "</text></g>\n";
    os << "<g font-weight=\"bold\"><text x=\"" << num(kMargin) << "\" y=\"" << num(src_label_y_)
       << "\">" << esc(c_.src) << "</text><text x=\"" << num(kMargin) << "\" y=\""
       << num(dst_label_y_) << "\">" << esc(c_.dst) << "</text></g>\n";
  }

  // Host boxes (device view), named on their outer side, away from the lines.
  void frames(std::ostream& os) const {
    for (const bool is_src : {true, false}) {
      const Panel& p = is_src ? v_.src : v_.dst;
      const Row& r = is_src ? rs_ : rd_;
      for (std::size_t f = 0; f < p.frames.size(); ++f) {
        const Rect& fr = r.frames[f];
        os << "<g class=\"host\" data-host=\"" << esc(p.frames[f].name) << "\"><rect x=\""
           << num(fr.x) << "\" y=\"" << num(fr.y) << "\" width=\"" << num(fr.w) << "\" height=\""
           << num(fr.h) << "\" rx=\"6\" fill=\"#f1f3f5\" stroke=\"#868e96\"/>"
           << "<text x=\"" << num(fr.x + kPad) << "\" y=\""
           << num(is_src ? fr.y + 15 : fr.y + fr.h - 7) << "\" font-weight=\"bold\" "
           << "fill=\"#495057\">" << esc(p.frames[f].name) << "</text></g>\n";
      }
    }
  }

  // Lines under the boxes, the largest first so that thin ones stay visible. Each ends going
  // straight down into its receiver, for its label; a forwarding receiver's line is an arc.
  void lines(std::ostream& os) const {
    std::vector<std::size_t> order(lines_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return lines_[a].bytes > lines_[b].bytes;
    });
    // Thinner lines when there are many, so that a dense picture stays a picture of lines.
    const double widest =
        std::max(1.0, 6.0 * std::min(1.0, 16.0 / static_cast<double>(lines_.size())));
    const double src_bottom = src_top_ + box_h_, stub = dst_top_ - kStub;
    static const char* const kPhrase[] = {"over the network", "inside a host",
                                          "copied inside the device", "moved"};
    os << "<g fill=\"none\" opacity=\"0.85\">\n";
    for (const std::size_t i : order) {
      const Line& l = lines_[i];
      const LinkStyle& s = kStyle[l.link];
      const double w = 1 + widest * static_cast<double>(l.bytes) / static_cast<double>(max_bytes_);
      os << "<path class=\"" << s.cls << "\" data-bytes=\"" << l.bytes << "\" stroke=\"" << s.colour
         << "\" stroke-width=\"" << num(w) << "\"";
      if (*s.dash) os << " stroke-dasharray=\"" << s.dash << "\"";
      if (l.from_dst) {
        // Low arcs (their peak is 3/4 of h above the stub): over the destination row, under
        // most of the lines from the source.
        const double h = std::min((kBand - kStub) * 0.8, 20 + 0.15 * std::fabs(l.ax - l.bx));
        os << " d=\"M" << num(l.ax) << ',' << num(dst_top_) << " L" << num(l.ax) << ',' << num(stub)
           << " C" << num(l.ax) << ',' << num(stub - h) << ' ' << num(l.bx) << ',' << num(stub - h)
           << ' ' << num(l.bx) << ',' << num(stub);
      } else {
        const double mid = (src_bottom + stub) / 2;
        os << " d=\"M" << num(l.ax) << ',' << num(src_bottom) << " C" << num(l.ax) << ','
           << num(mid) << ' ' << num(l.bx) << ',' << num(mid) << ' ' << num(l.bx) << ','
           << num(stub);
      }
      const Panel& from = l.from_dst ? v_.dst : v_.src;
      os << " L" << num(l.bx) << ',' << num(dst_top_) << "\" marker-end=\"url(#arrow-" << s.cls
         << ")\"><title>"
         << esc(from.boxes[l.from].title + " -> " + v_.dst.boxes[l.to].title + ": " +
                human_bytes(l.bytes) + " " + kPhrase[l.link] +
                (l.from_dst ? ", forwarded from its destination buffer" : ""))
         << "</title></path>\n";
    }
    os << "</g>\n";
  }

  // A box, opaque over the lines' ends, its text inside. A device: its colour (a destination
  // device striped by the devices it receives from), id, coordinate and tile. A host (or a run
  // of hosts or devices): its name, devices and bytes by link.
  void box(std::ostream& os, bool is_src, std::size_t b) const {
    const Box& box = (is_src ? v_.src : v_.dst).boxes[b];
    const Rect& r = (is_src ? rs_ : rd_).boxes[b];
    const auto rect = [&](double x, double w, const std::string& fill) {
      os << "<rect x=\"" << num(x) << "\" y=\"" << num(r.y) << "\" width=\"" << num(w)
         << "\" height=\"" << num(r.h) << "\" fill=\"" << fill << "\"/>";
    };
    std::string tip;
    if (framed()) {
      const int d = box.devices[0];
      tip = box.title + (hosts_.topology ? " on " + hosts_.name(box.host) : std::string());
      os << "<g class=\"device\" data-device=\"" << d << "\">";
      if (is_src) {
        rect(r.x, r.w, fill(d));
      } else if (v_.flows.received_from[b].empty()) {
        rect(r.x, r.w, "white");
        tip += " receives nothing";
      } else {
        // The largest senders in sender order; the others merged as sender -1.
        const auto& from = v_.flows.received_from[b];
        std::vector<std::pair<int, std::int64_t>> list(from.begin(), from.end());
        if (list.size() > kMaxStripes) {
          std::stable_sort(list.begin(), list.end(),
                           [](const auto& x, const auto& y) { return x.second > y.second; });
          std::int64_t rest = 0;
          for (std::size_t i = kMaxStripes - 1; i < list.size(); ++i) rest += list[i].second;
          list.resize(kMaxStripes - 1);
          std::sort(list.begin(), list.end());
          list.emplace_back(-1, rest);
        }
        std::int64_t total = 0;
        for (const auto& [s, bytes] : list) total += bytes;
        double x = r.x;
        tip += " receives";
        for (const auto& [s, bytes] : list) {
          const double w = r.w * static_cast<double>(bytes) /
                           static_cast<double>(std::max<std::int64_t>(total, 1));
          rect(x, w, s < 0 ? "#ced4da" : fill(s));
          x += w;
          tip.append(" ")
              .append(human_bytes(bytes))
              .append(" from ")
              .append(s < 0 ? std::string("the others") : std::to_string(s))
              .append(";");
        }
      }
      os << "<rect x=\"" << num(r.x + 5) << "\" y=\"" << num(r.y + 6) << "\" width=\"9\" "
         << "height=\"9\" fill=\"" << ink(d) << "\"/>";
    } else {
      os << "<g class=\"" << box.kind << "\"";
      if (box.kind == std::string("host")) os << " data-host=\"" << esc(box.title) << "\"";
      os << ">";
      rect(r.x, r.w, is_src ? "#e7f5ff" : "#fff4e6");
      tip = box.title + ": " + box.detail + "; " + bytes_of(is_src, b);
    }
    os << "<rect x=\"" << num(r.x) << "\" y=\"" << num(r.y) << "\" width=\"" << num(r.w)
       << "\" height=\"" << num(r.h) << "\" fill=\"none\" stroke=\"#343a40\"/>"
       << "<text x=\"" << num(r.x + (framed() ? 19 : 7)) << "\" y=\"" << num(r.y + 16)
       << "\" font-weight=\"bold\">" << esc(box.title) << "</text>"
       << "<text x=\"" << num(r.x + 7) << "\" y=\"" << num(r.y + 33) << "\" font-size=\"11\""
       << (framed() ? " font-family=\"DejaVu Sans Mono, Menlo, monospace\"" : "") << ">"
       << esc(box.detail) << "</text>";
    if (!framed())
      os << "<text x=\"" << num(r.x + 7) << "\" y=\"" << num(r.y + 50) << "\" font-size=\"11\">"
         << esc(bytes_of(is_src, b)) << "</text>";
    os << "<title>" << esc(tip) << "</title></g>\n";
  }

  // The lines' labels, over their ends, staggered in three rows with a white halo; the footer.
  void tail(std::ostream& os) const {
    os << "<g class=\"labels\" font-size=\"10\" text-anchor=\"middle\" stroke=\"white\" "
       << "stroke-width=\"3\" paint-order=\"stroke\">\n";
    for (const Line& l : lines_)
      if (l.label_row >= 0)
        os << "<text x=\"" << num(l.bx) << "\" y=\"" << num(dst_top_ - 13 - 12.0 * l.label_row)
           << "\" fill=\"" << kStyle[l.link].colour << "\">" << esc(short_bytes(l.bytes))
           << "</text>\n";
    os << "</g>\n";
    for (std::size_t i = 0; i < c_.footer.size(); ++i)
      os << "<text x=\"" << num(kMargin) << "\" y=\""
         << num(footer_y_ + kFooterLine * static_cast<double>(i)) << "\""
         << (i >= 2 ? " fill=\"#555\"" : "") << ">" << esc(c_.footer[i]) << "</text>\n";
    os << "</svg>\n";
  }

  const Plan& plan_;
  const Hosts& hosts_;
  const View v_;
  const Captions c_;
  std::map<int, std::size_t> colour_index_;  // device -> its colour
  std::vector<Line> lines_;
  std::int64_t max_bytes_ = 1;
  std::vector<std::vector<std::pair<std::size_t, bool>>> bottom_, top_;  // of each box
  Row rs_, rd_;
  double box_w_ = 0, box_h_ = 0, width_ = 0, height_ = 0;
  double title_y_ = 0, subtitle_y_ = 0, legend_y_ = 0, src_label_y_ = 0, src_top_ = 0, dst_top_ = 0,
         dst_label_y_ = 0, footer_y_ = 0;
};

}  // namespace
}  // namespace svg

std::string plan_svg(const Plan& plan, const Topology& topology) {
  return svg::Drawing(plan, svg::hosts_of(plan, topology)).svg();
}

std::string plan_svg(const Plan& plan) {
  // The plan keeps its topology's name: a preset's file gives the hosts back. Anything else
  // (a file of the user's, a discovered topology) draws without hosts rather than fail.
  std::optional<Topology> t;
  if (plan.topology() == Topology::single_host().name()) {
    t = Topology::single_host();
  } else {
    try {
      t = Topology::resolve(plan.topology());
    } catch (const std::exception&) {
    }
  }
  if (t) return plan_svg(plan, *t);
  svg::Hosts unknown;
  unknown.unknown_why = "topology " + plan.topology() + " is not a preset";
  return svg::Drawing(plan, unknown).svg();
}

}  // namespace meshcast
