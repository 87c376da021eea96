// plan_svg: a well-formed standalone SVG; devices in host boxes named by the topology; every
// hop drawn once, its link class (network, intra-host, inside a device) adding up to the plan's
// statistics; lines only in the band between the rows of boxes; an aggregated picture past the
// device view's thresholds, bounded in size.
#include "lib/plan/svg.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "meshcast/limits.h"
#include "meshcast/multicast_tree.h"
#include "meshcast/plan.h"
#include "meshcast/topology.h"
#include "support/testing.h"

namespace meshcast {
namespace {

bool name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == ':' || c == '_';
}

bool entity_at(const std::string& s, std::size_t i) {
  for (const char* e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"})
    if (s.compare(i, std::strlen(e), e) == 0) return true;
  return false;
}

// Why `s` is not one well-formed XML document with an <svg> root ("" when it is); counts its
// elements. Enough XML for what plan_svg writes: a declaration, tags, attributes in double
// quotes, text, the five predefined entities.
std::string xml_problem(const std::string& s, std::size_t* elements = nullptr) {
  if (!s.starts_with("<?xml ")) return "no XML declaration";
  for (const char c : s)
    if (static_cast<unsigned char>(c) < 32 && c != '\n' && c != '\t') return "control character";
  std::size_t i = s.find("?>");
  if (i == std::string::npos) return "unterminated declaration";
  i += 2;
  std::vector<std::string> open;
  std::size_t n = 0;
  bool done = false;  // the root is closed
  while (i < s.size()) {
    if (s[i] != '<') {
      if (s[i] == '&' && !entity_at(s, i)) return "bad entity in text at " + std::to_string(i);
      if ((open.empty()) && !std::isspace(static_cast<unsigned char>(s[i])))
        return "text outside the root";
      ++i;
      continue;
    }
    if (done) return "content after the root";
    if (s.compare(i, 2, "</") == 0) {
      const std::size_t end = s.find('>', i);
      if (end == std::string::npos) return "unterminated end tag";
      const std::string name = s.substr(i + 2, end - i - 2);
      if (open.empty() || open.back() != name) return "mismatched </" + name + ">";
      open.pop_back();
      done = open.empty();
      i = end + 1;
      continue;
    }
    std::size_t j = i + 1;
    while (j < s.size() && name_char(s[j])) ++j;
    const std::string name = s.substr(i + 1, j - i - 1);
    if (name.empty()) return "empty tag name at " + std::to_string(i);
    if (n == 0 && name != "svg") return "the root is <" + name + ">";
    ++n;
    std::set<std::string> attributes;
    for (;;) {
      while (j < s.size() && std::isspace(static_cast<unsigned char>(s[j]))) ++j;
      if (j >= s.size()) return "unterminated <" + name + ">";
      if (s.compare(j, 2, "/>") == 0) {
        j += 2;
        done = open.empty();
        break;
      }
      if (s[j] == '>') {
        open.push_back(name);
        ++j;
        break;
      }
      std::size_t k = j;
      while (k < s.size() && name_char(s[k])) ++k;
      const std::string attr = s.substr(j, k - j);
      if (attr.empty()) return "bad attribute in <" + name + ">";
      if (!attributes.insert(attr).second) return "repeated " + attr + " in <" + name + ">";
      if (s.compare(k, 2, "=\"") != 0) return "unquoted " + attr + " in <" + name + ">";
      const std::size_t close = s.find('"', k + 2);
      if (close == std::string::npos) return "unterminated " + attr;
      for (std::size_t q = k + 2; q < close; ++q)
        if (s[q] == '<' || (s[q] == '&' && !entity_at(s, q))) return "bad character in " + attr;
      j = close + 1;
    }
    i = j;
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  if (!done) return "no root";
  if (elements) *elements = n;
  return "";
}

std::size_t count(const std::string& s, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t i = s.find(needle); i != std::string::npos; i = s.find(needle, i + 1)) ++n;
  return n;
}

// The start tags beginning with `prefix` ("<path class=\"net\""), each as its text.
std::vector<std::string> tags(const std::string& s, const std::string& prefix) {
  std::vector<std::string> out;
  for (std::size_t i = s.find(prefix); i != std::string::npos; i = s.find(prefix, i + 1))
    out.push_back(s.substr(i, s.find('>', i) - i));
  return out;
}

std::string attr(const std::string& tag, const std::string& name) {
  const std::size_t i = tag.find(" " + name + "=\"");
  if (i == std::string::npos) return "";
  const std::size_t from = i + name.size() + 3;
  return tag.substr(from, tag.find('"', from) - from);
}

// The lines of one link class: bytes summed, and their count.
std::pair<std::int64_t, std::size_t> lines_of(const std::string& svg, const std::string& cls) {
  std::int64_t bytes = 0;
  const auto found = tags(svg, "<path class=\"" + cls + "\"");
  for (const auto& t : found) bytes += std::stoll(attr(t, "data-bytes"));
  return {bytes, found.size()};
}

// The hops of a plan as the tests count them (independently of lib/plan/svg): per link class,
// the distinct (sender, reads its destination buffer, receiver) of the device view.
std::map<std::string, std::set<std::tuple<int, bool, int>>> hops(const Plan& p, const Topology& t) {
  std::map<std::string, std::set<std::tuple<int, bool, int>>> out;
  const auto add = [&](int from, bool from_dst, int to) {
    out[from == to                         ? "local"
        : t.host_of(from) == t.host_of(to) ? "intra"
                                           : "net"]
        .insert({from, from_dst, to});
  };
  for (const Op& op : p.ops()) {
    if (op.kind == OpKind::Copy) add(op.root, false, op.root);
    if (op.kind == OpKind::Reduce)
      for (const int c : op.peers) add(c, false, op.root);
    if (op.kind != OpKind::Multicast) continue;
    const auto n = static_cast<std::int64_t>(op.peers.size());
    for (std::int64_t k = 0; k < n; ++k) {
      const std::int64_t parent = multicast_parent(k, n, op.group, op.fork);
      const int to = op.peers[static_cast<std::size_t>(k)];
      if (parent < 0)
        add(op.root, op.from_dst, to);
      else
        add(op.peers[static_cast<std::size_t>(parent)], true, to);
    }
  }
  return out;
}

// Every number pair "x,y" of a path's d attribute, as y values.
std::vector<double> ys_of(const std::string& d) {
  std::vector<double> ys;
  for (std::size_t i = d.find(','); i != std::string::npos; i = d.find(',', i + 1))
    ys.push_back(std::stod(d.substr(i + 1)));
  return ys;
}

struct Rect {
  double x, y, w, h;
  bool contains(const Rect& r) const {
    return r.x >= x && r.y >= y && r.x + r.w <= x + w && r.y + r.h <= y + h;
  }
};

// The first <rect> after position `at` (a box's outline comes first in its group).
Rect rect_after(const std::string& svg, std::size_t at) {
  const std::size_t i = svg.find("<rect", at);
  const std::string r = svg.substr(i, svg.find("/>", i) - i);
  return {std::stod(attr(r, "x")), std::stod(attr(r, "y")), std::stod(attr(r, "width")),
          std::stod(attr(r, "height"))};
}

// Where each start tag beginning with `prefix` is.
std::vector<std::size_t> positions(const std::string& s, const std::string& prefix) {
  std::vector<std::size_t> out;
  for (std::size_t i = s.find(prefix); i != std::string::npos; i = s.find(prefix, i + 1))
    out.push_back(i);
  return out;
}

// The boxes that stand for devices or hosts (not the host boxes around devices).
std::vector<Rect> boxes(const std::string& svg) {
  std::vector<Rect> out;
  for (const char* kind : {"device", "host", "hosts", "host-part"})
    for (const std::size_t at : positions(svg, std::string("<g class=\"") + kind + "\"")) {
      const std::size_t rect = svg.find("<rect", at);
      if (svg.substr(rect, svg.find("/>", rect) - rect).find("rx=") == std::string::npos)
        out.push_back(rect_after(svg, at));
    }
  return out;
}

// Lines stay between the bottom of the first row of boxes and the top of the second: they cross
// no box and no text (the boxes' text is inside them, the host and mesh names outside the band).
void expect_lines_in_band(const std::string& svg, const std::string& what) {
  std::set<double> tops, bottoms;
  for (const Rect& r : boxes(svg)) {
    tops.insert(r.y);
    bottoms.insert(r.y + r.h);
  }
  ASSERT_EQ(tops.size(), 2u) << what;
  const double band_top = *bottoms.begin(), band_bottom = *tops.rbegin();
  for (const char* cls : {"net", "intra", "local", "transfer"})
    for (const auto& t : tags(svg, std::string("<path class=\"") + cls + "\""))
      for (const double y : ys_of(attr(t, "d"))) {
        EXPECT_GE(y, band_top - 0.05) << what << ": " << t;
        EXPECT_LE(y, band_bottom + 0.05) << what << ": " << t;
      }
}

Layout parse(const Shape& shape, const std::string& text) {
  return Layout::parse(shape, DType::f32, text);
}

const Topology& aws() {
  static const Topology t = Topology::load(MESHCAST_SOURCE_DIR "/meshes/aws-p3.8xlarge.json");
  return t;
}
const Topology& cluster() {
  static const Topology t = Topology::load(MESHCAST_SOURCE_DIR "/meshes/cluster-1024x8.json");
  return t;
}

TEST(PlanSvg, HostBoxesNamedByTheTopology) {
  const Topology t =
      Topology::from_hosts("two", {{"alpha", {0, 1}}, {"beta", {2, 3}}},
                           LinkClass("intra", 50e9, 5e-6), LinkClass("network", 1.25e9, 30e-6));
  const Plan p = plan(parse({8, 6}, "2x2@0-3:S0S1"), parse({8, 6}, "4@0-3:RS0"), t);
  const std::string svg = plan_svg(p, t);
  EXPECT_EQ(xml_problem(svg), "");
  // One host box per host in each mesh; every device in its host's box.
  EXPECT_EQ(count(svg, "<g class=\"host\" data-host=\"alpha\">"), 2u);
  EXPECT_EQ(count(svg, "<g class=\"host\" data-host=\"beta\">"), 2u);
  // Each device's box lies inside the box of its host (in its own mesh's row).
  std::vector<std::pair<std::string, Rect>> frames;
  for (const std::size_t at : positions(svg, "<g class=\"host\""))
    frames.emplace_back(attr(svg.substr(at, 100), "data-host"), rect_after(svg, at));
  const auto devices = positions(svg, "<g class=\"device\"");
  ASSERT_EQ(devices.size(), 8u);
  for (const std::size_t at : devices) {
    const int d = std::stoi(attr(svg.substr(at, 100), "data-device"));
    const Rect box = rect_after(svg, at);
    std::vector<std::string> in;
    for (const auto& [name, frame] : frames)
      if (frame.contains(box)) in.push_back(name);
    EXPECT_EQ(in, std::vector<std::string>{t.host_name(t.host_of(d))}) << d;
  }
  EXPECT_EQ(svg.find("Aggregated"), std::string::npos);
  expect_lines_in_band(svg, "2x2 -> 4 on two hosts");
}

TEST(PlanSvg, LinesByLinkAddUpToThePlansStatistics) {
  struct Case {
    Shape shape;
    const char *src, *dst;
    Strategy strategy;
  };
  const std::vector<Case> cases = {
      {{8, 6}, "2x2@0-3:S0S1", "4@4-7:RS0", Strategy::Auto},
      {{8, 6}, "2x2@0-3:S0S1", "4@2-5:RS0", Strategy::SendRecv},
      {{8, 6}, "2x2@0-3:S0R+P1", "4@2-5:RS0", Strategy::Auto},
      {{64, 64}, "2@0-1:RR", "8@4-11:RR", Strategy::Broadcast},  // one multicast, a tree of chains
      {{64, 64}, "2x4@0-7:S0R", "2x4@4-11:RS1", Strategy::AllGather},
      {{8, 8}, "2x2@0-3:S0R", "4@0-3:S0R", Strategy::Auto},  // local copies only
  };
  for (const Case& c : cases) {
    PlanOptions o;
    o.strategy = c.strategy;
    const Plan p = plan(parse(c.shape, c.src), parse(c.shape, c.dst), aws(), o);
    const std::string what = std::string(c.src) + " -> " + c.dst;
    const std::string svg = plan_svg(p);  // the topology found again by its name
    ASSERT_EQ(xml_problem(svg), "") << what;
    EXPECT_EQ(svg.find("Hosts unknown"), std::string::npos) << what;
    EXPECT_NE(svg.find("data-host=\"p3-0\""), std::string::npos) << what;
    const auto expected = hops(p, aws());
    const auto [net, n_net] = lines_of(svg, "net");
    const auto [intra, n_intra] = lines_of(svg, "intra");
    const auto [local, n_local] = lines_of(svg, "local");
    EXPECT_EQ(net, p.stats().bytes_network) << what;
    EXPECT_EQ(intra, p.stats().bytes_intra_host) << what;
    EXPECT_EQ(local, p.stats().bytes_local) << what;
    EXPECT_EQ(n_net, expected.contains("net") ? expected.at("net").size() : 0) << what;
    EXPECT_EQ(n_intra, expected.contains("intra") ? expected.at("intra").size() : 0) << what;
    EXPECT_EQ(n_local, expected.contains("local") ? expected.at("local").size() : 0) << what;
    EXPECT_EQ(lines_of(svg, "transfer").second, 0u) << what;
    expect_lines_in_band(svg, what);
  }
}

TEST(PlanSvg, RandomPlansStayWellFormedAndAccountEveryByte) {
  testing::Rng rng(20240611);
  const Topology t = Topology::uniform("sweep", 4, 4, LinkClass("intra", 50e9, 5e-6),
                                       LinkClass("network", 1.25e9, 30e-6));
  const Strategy strategies[] = {Strategy::Auto, Strategy::Broadcast, Strategy::SendRecv,
                                 Strategy::AllGather};
  for (int i = 0; i < testing::scaled(150); ++i) {
    const testing::Case c = testing::random_case(rng, testing::Limits{});
    PlanOptions o;
    o.strategy = strategies[i % 4];
    const Plan p = plan(c.src, c.dst, t, o);
    const std::string svg = plan_svg(p, t);
    std::size_t elements = 0;
    ASSERT_EQ(xml_problem(svg, &elements), "") << c.str();
    EXPECT_LE(static_cast<std::int64_t>(elements), limits().svg_elements) << c.str();
    if (svg.find("Aggregated") != std::string::npos) continue;  // rare at 8 devices a mesh
    EXPECT_EQ(lines_of(svg, "net").first, p.stats().bytes_network) << c.str();
    EXPECT_EQ(lines_of(svg, "intra").first, p.stats().bytes_intra_host) << c.str();
    EXPECT_EQ(lines_of(svg, "local").first, p.stats().bytes_local) << c.str();
    expect_lines_in_band(svg, c.str());
  }
}

TEST(PlanSvg, WithoutTheTopologyHostsAreUnknown) {
  // A topology of the user's own (no preset of its name): lines of one class, and a note.
  const Topology mine =
      Topology::from_hosts("not-a-preset-of-meshcast", {{"h", {0, 1, 2, 3}}},
                           LinkClass("intra", 50e9, 5e-6), LinkClass("network", 1.25e9, 30e-6));
  const Plan p = plan(parse({8, 6}, "2x2@0-3:S0S1"), parse({8, 6}, "4@0-3:RS0"), mine);
  const std::string svg = plan_svg(p);
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_NE(svg.find("Hosts unknown (topology not-a-preset-of-meshcast is not a preset)"),
            std::string::npos);
  EXPECT_EQ(lines_of(svg, "net").second + lines_of(svg, "intra").second, 0u);
  EXPECT_EQ(lines_of(svg, "transfer").first, p.stats().bytes_moved);
  EXPECT_EQ(plan_svg(p, mine).find("Hosts unknown"), std::string::npos);

  // Drawn with another topology than the plan's, whose network bytes differ: not believed.
  const Plan on_aws = plan(parse({8, 6}, "2x2@0-3:S0S1"), parse({8, 6}, "4@4-7:RS0"), aws());
  EXPECT_NE(plan_svg(on_aws, Topology::single_host())
                .find("network bytes do not match topology single-host"),
            std::string::npos);
  // One that does not place a device of the plan.
  EXPECT_NE(plan_svg(on_aws, mine).find("does not place device 4"), std::string::npos);
}

TEST(PlanSvg, AggregatedPastTheDeviceViewsThresholds) {
  // 64 devices a mesh: one box per host, host-to-host bytes written on every line.
  const Plan p =
      plan(parse({64, 64}, "8x8@0-63:S0S1"), parse({64, 64}, "64@64-127:RS0"), cluster());
  const std::string svg = plan_svg(p);
  ASSERT_EQ(xml_problem(svg), "");
  EXPECT_NE(svg.find("Aggregated view (64 source and 64 destination devices, more than 16"),
            std::string::npos);
  EXPECT_EQ(count(svg, "<g class=\"device\""), 0u);
  for (int h = 0; h < 16; ++h)
    EXPECT_EQ(count(svg, "<g class=\"host\" data-host=\"host" + std::to_string(h) + "\">"), 1u)
        << h;
  const auto [net, lines] = lines_of(svg, "net");
  EXPECT_EQ(net, p.stats().bytes_network);  // hosts 0-7 to hosts 8-15: every hop crosses
  EXPECT_EQ(lines, 64u);
  ASSERT_EQ(tags(svg, "<g class=\"labels\"").size(), 1u);
  const std::size_t labels = svg.find("<g class=\"labels\"");
  EXPECT_EQ(count(svg.substr(labels, svg.find("</g>", labels) - labels), "<text "), lines);
  EXPECT_NE(svg.find("in: 2 KiB net"), std::string::npos);  // each destination host's bytes
  expect_lines_in_band(svg, "8x8 -> 64");

  // 16 devices a mesh, drawn one by one while the transfers are few...
  const Plan transpose =
      plan(parse({64, 64}, "4x4@0-15:S0S1"), parse({64, 64}, "4x4@16-31:S1S0"), cluster());
  EXPECT_EQ(count(plan_svg(transpose), "<g class=\"device\""),
            static_cast<std::size_t>(2 * kSvgDeviceView));
  // ... aggregated when they are more than kSvgDeviceLines.
  const Plan dense =
      plan(parse({64, 64}, "4x4@0-15:S0S1"), parse({64, 64}, "16@16-31:RS0"), cluster());
  const std::string d = plan_svg(dense);
  EXPECT_NE(d.find("Aggregated view (64 device-to-device transfers, more than 40"),
            std::string::npos);
  EXPECT_EQ(lines_of(d, "net").first, dense.stats().bytes_network);
}

TEST(PlanSvg, BoundedAtAThousandDevices) {
  PlanOptions o;
  o.strategy = Strategy::Broadcast;
  o.balance = Balance::Greedy;
  // One host of 1,024 devices: runs of its devices.
  const Plan one_host = plan(parse({1024, 64}, "512@0-511:S0R"),
                             parse({1024, 64}, "512@512-1023:RS0"), Topology::single_host(), o);
  // 128 hosts: runs of hosts.
  const Plan many_hosts =
      plan(parse({1024, 64}, "512@0-511:S0R"), parse({1024, 64}, "512@512-1023:RS0"), cluster(), o);
  for (const auto& [p, note] : {std::pair(&one_host, "consecutive devices of one host"),
                                std::pair(&many_hosts, "up to 8 consecutive hosts")}) {
    const std::string svg = plan_svg(*p);
    std::size_t elements = 0;
    ASSERT_EQ(xml_problem(svg, &elements), "") << note;
    EXPECT_LE(static_cast<std::int64_t>(elements), limits().svg_elements) << note;
    EXPECT_LT(svg.size(), std::size_t{200} << 10) << note;
    EXPECT_NE(svg.find(note), std::string::npos) << note;
    std::size_t boxes = 0;
    for (const char* kind : {"host", "hosts", "host-part"})
      boxes += count(svg, std::string("<g class=\"") + kind + "\"");
    EXPECT_EQ(boxes, static_cast<std::size_t>(2 * kSvgMaxBoxes)) << note;
    expect_lines_in_band(svg, note);
  }
}

TEST(PlanSvg, NamesAreEscaped) {
  const Topology t =
      Topology::from_hosts("a<b>&\"c\"", {{"h<0>&", {0, 1}}, {"h'1'", {2, 3}}},
                           LinkClass("intra", 50e9, 5e-6), LinkClass("network", 1.25e9, 30e-6));
  const Plan p = plan(parse({8, 8}, "2x2@0-3:S0R"), parse({8, 8}, "4@0-3:RS0"), t);
  for (const std::string& svg : {plan_svg(p, t), plan_svg(p)}) {
    EXPECT_EQ(xml_problem(svg), "");
    EXPECT_NE(svg.find("a&lt;b&gt;&amp;&quot;c&quot;"), std::string::npos);
  }
  EXPECT_NE(plan_svg(p, t).find("data-host=\"h&lt;0&gt;&amp;\""), std::string::npos);
  EXPECT_NE(plan_svg(p, t).find("data-host=\"h&apos;1&apos;\""), std::string::npos);
}

// U+FFFE and U+FFFF are valid UTF-8 but not characters XML allows: a name with them made a
// file no XML reader takes. They become '?', as does UTF-8 that is not well-formed (a surrogate,
// an overlong form: a '?' per byte); other characters beyond ASCII stay.
TEST(PlanSvg, CharactersXmlDoesNotAllowAreReplaced) {
  const Topology t =
      Topology::from_hosts("x\xEF\xBF\xBEy\xC3\xA9\xED\xA0\x80\xC0\xAF",
                           {{"h\xEF\xBF\xBF", {0, 1}}, {"\xF0\x9F\x99\x82", {2, 3}}},
                           LinkClass("intra", 50e9, 5e-6), LinkClass("network", 1.25e9, 30e-6));
  const Plan p = plan(parse({8, 8}, "2x2@0-3:S0R"), parse({8, 8}, "4@0-3:RS0"), t);
  const std::string svg = plan_svg(p, t);
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(svg.find("\xEF\xBF\xBE"), std::string::npos);
  EXPECT_EQ(svg.find("\xEF\xBF\xBF"), std::string::npos);
  EXPECT_NE(svg.find("x?y\xC3\xA9?????"), std::string::npos);
  EXPECT_NE(svg.find("data-host=\"h?\""), std::string::npos);
  EXPECT_NE(svg.find("\xF0\x9F\x99\x82"), std::string::npos);
}

}  // namespace
}  // namespace meshcast
