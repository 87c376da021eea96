// Topology: hosts, device placement and link classes, loaded from the JSON schema of
// docs/topology.md. Every error names the offending JSON path ("topology.hosts[2].devices[1]").
#include "meshcast/topology.h"

#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "lib/support/json_text.h"
#include "lib/support/text.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"

// Set by lib/CMakeLists.txt; these defaults serve a build without it (no source tree).
#ifndef MESHCAST_INSTALL_DATADIR
#define MESHCAST_INSTALL_DATADIR "share"
#endif
#ifndef MESHCAST_BUILD_TREE
#define MESHCAST_BUILD_TREE ""
#endif
#ifndef MESHCAST_SOURCE_MESHES
#define MESHCAST_SOURCE_MESHES ""
#endif

namespace meshcast {
namespace {

using nlohmann::json;

// Device ids a topology may place: the placement is a dense table indexed by id.
constexpr std::int64_t kMaxDeviceId = (std::int64_t{1} << 20) - 1;
constexpr std::int64_t kMaxNics = 1024;
constexpr double kGiga = 1e9;
constexpr double kMicro = 1e6;  // microseconds per second
// (1e308 us made predictions infinite, and a bandwidth 1e9 times another's outran the
// simulator's floor.)
constexpr double kMaxBandwidth = LinkClass::kMaxBandwidth;
constexpr double kMaxLinkSeconds = LinkClass::kMaxSeconds;

// Unit conversions of from_json, shared with to_json so that both round the same way.
double gbyte_to_bytes(double v) { return v * kGiga; }
double gbit_to_bytes(double v) { return v * kGiga / 8; }
double us_to_seconds(double us) { return us / kMicro; }

std::string type_name(const json& j) {
  if (j.is_number_integer()) return "an integer";
  if (j.is_number()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_boolean()) return "a boolean";
  if (j.is_array()) return "an array";
  if (j.is_object()) return "an object";
  return "null";
}

[[noreturn]] void wrong_type(const std::string& path, const char* expected, const json& j) {
  throw ParseError(path, std::string("expected ") + expected + ", got " + type_name(j));
}

const json& require(const json& obj, const std::string& path, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end()) throw ValidationError(path + "." + key, "missing");
  return *it;
}

void only_keys(const json& obj, const std::string& path, std::initializer_list<const char*> keys) {
  for (const auto& [k, v] : obj.items()) {
    bool known = false;
    for (const char* key : keys) known = known || k == key;
    if (!known) {
      std::string list;
      for (const char* key : keys) list += std::string(list.empty() ? "" : ", ") + key;
      const std::string q = detail::quote(k);
      throw ValidationError(path + "." + q.substr(1, q.size() - 2),
                            "unknown key (expected one of: " + list + ")");
    }
  }
}

const json& object_at(const json& j, const std::string& path) {
  if (!j.is_object()) wrong_type(path, "an object", j);
  return j;
}

std::string string_at(const json& j, const std::string& path) {
  if (!j.is_string()) wrong_type(path, "a string", j);
  return j.get<std::string>();
}

// A topology's or a host's name: not empty, and printed on one line in reports, so without
// ASCII control characters. Checked wherever a topology is made, so that to_json() round-trips.
void check_name(const std::string& name, const std::string& field) {
  if (name.empty()) throw ValidationError(field, "must not be empty");
  for (const char c : name)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      throw ValidationError(field, "holds a control character (byte " +
                                       std::to_string(static_cast<unsigned char>(c)) +
                                       "): a name is printed on one line");
}

// An integer in [lo, hi].
std::int64_t int_at(const json& j, const std::string& path, std::int64_t lo, std::int64_t hi) {
  if (!j.is_number_integer()) wrong_type(path, "an integer", j);
  if (j.is_number_unsigned() && j.get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
    throw ValidationError(path, "must be <= " + std::to_string(hi));
  const auto v = j.get<std::int64_t>();
  if (v < lo) throw ValidationError(path, "must be >= " + std::to_string(lo));
  if (v > hi) throw ValidationError(path, "must be <= " + std::to_string(hi));
  return v;
}

double number_at(const json& j, const std::string& path) {
  if (!j.is_number()) wrong_type(path, "a number", j);
  return j.get<double>();
}

// The shortest text that reads back as v: a value just past a bound shows as past it.
std::string fmt(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// A file's link without overhead_us: the network's (`nics` given) or the intra-host default.
double default_overhead(const int* nics) {
  return nics ? kDefaultNetworkOverhead : kDefaultIntraOverhead;
}

void check_link(const LinkClass& l, const std::string& path) {
  if (!(l.bandwidth >= 1 && l.bandwidth <= kMaxBandwidth))
    throw ValidationError(path + ".bandwidth",
                          "must be in [1, 1e15] bytes/s (got " + fmt(l.bandwidth) + ")");
  const auto seconds = [&](const char* field, double t) {
    if (!(t >= 0 && t <= kMaxLinkSeconds))
      throw ValidationError(path + "." + field, "must be in [0, 10] seconds (got " + fmt(t) + ")");
  };
  seconds("latency", l.latency);
  if (l.chain_latency) seconds("chain_latency", *l.chain_latency);
  seconds("overhead", l.overhead);
}

// A link class: exactly one of bandwidth_gbyte_s / bandwidth_gbit_s, and latency_us; the
// per-message overhead defaults by class (kDefaultIntraOverhead, kDefaultNetworkOverhead).
// `nics` (network only) multiplies the bandwidth.
LinkClass link_at(const json& j, const std::string& path, const char* name, int* nics) {
  object_at(j, path);
  if (j.contains("bandwidth_gbps"))
    throw ValidationError(path + ".bandwidth_gbps",
                          "ambiguous unit: write bandwidth_gbyte_s (gigabytes/s) or "
                          "bandwidth_gbit_s (gigabits/s)");
  if (nics)
    only_keys(j, path,
              {"bandwidth_gbyte_s", "bandwidth_gbit_s", "latency_us", "chain_latency_us",
               "overhead_us", "nics_per_host"});
  else if (j.contains("nics_per_host"))
    throw ValidationError(path + ".nics_per_host", "only the network link has NICs");
  else
    only_keys(
        j, path,
        {"bandwidth_gbyte_s", "bandwidth_gbit_s", "latency_us", "chain_latency_us", "overhead_us"});
  const bool gbyte = j.contains("bandwidth_gbyte_s"), gbit = j.contains("bandwidth_gbit_s");
  if (gbyte == gbit)
    throw ValidationError(path, gbyte ? "give one of bandwidth_gbyte_s and bandwidth_gbit_s"
                                      : "missing bandwidth: give bandwidth_gbyte_s (gigabytes/s) "
                                        "or bandwidth_gbit_s (gigabits/s)");
  const std::string key = gbyte ? "bandwidth_gbyte_s" : "bandwidth_gbit_s";
  const double v = number_at(j[key], path + "." + key);
  if (!(v > 0)) throw ValidationError(path + "." + key, "must be > 0 (got " + fmt(v) + ")");
  LinkClass l{name, gbyte ? gbyte_to_bytes(v) : gbit_to_bytes(v), 0};
  if (!(l.bandwidth <= kMaxBandwidth))
    throw ValidationError(path + "." + key, "too large (above 1e15 bytes/s)");
  if (l.bandwidth < 1) throw ValidationError(path + "." + key, "too small (below 1 byte/s)");
  const auto microseconds = [&](const char* field) {
    const double us = number_at(j[field], path + "." + field);
    if (!(us >= 0 && us <= kMaxLinkSeconds * kMicro))
      throw ValidationError(path + "." + field, "must be in [0, 1e7] (got " + fmt(us) + ")");
    return us_to_seconds(us + 0.0);  // -0 as 0: the file written reads back the same
  };
  require(j, path, "latency_us");
  l.latency = microseconds("latency_us");
  if (j.contains("chain_latency_us")) l.chain_latency = microseconds("chain_latency_us");
  l.overhead = j.contains("overhead_us") ? microseconds("overhead_us") : default_overhead(nics);
  if (nics) {
    *nics = 1;
    if (j.contains("nics_per_host"))
      *nics = static_cast<int>(int_at(j["nics_per_host"], path + ".nics_per_host", 1, kMaxNics));
    l.bandwidth *= *nics;
    // The host's total is what is bounded: name the fields the file has.
    if (!(l.bandwidth <= kMaxBandwidth))
      throw ValidationError(path + "." + key, "times nics_per_host (" + std::to_string(*nics) +
                                                  ") is too large (above 1e15 bytes/s per host)");
  }
  check_link(l, path);
  return l;
}

// The shortest decimal x with back(x) == target, so that from_json(to_json()) restores the
// stored double exactly and values read from a file print as they were written ("2", not
// "1.9999999999999998"). `approx` is the converted value, back() the reading conversion.
template <class Back>
std::string decimal(double target, double approx, Back back) {
  const auto text = [](double v, int digits) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    const double x = std::strtod(buf, nullptr);
    if (x == std::round(x) && std::fabs(x) < 1e15) std::snprintf(buf, sizeof buf, "%.0f", x);
    return std::string(buf);
  };
  const auto exact = [&](const std::string& t) {
    return back(std::strtod(t.c_str(), nullptr)) == target;
  };
  for (int digits = 1; digits <= 17; ++digits)
    if (const std::string t = text(approx, digits); exact(t)) return t;
  // The conversion rounds: try the neighbours of approx.
  double lo = approx, hi = approx;
  for (int i = 0; i < 16; ++i) {
    lo = std::nextafter(lo, -HUGE_VAL);
    hi = std::nextafter(hi, HUGE_VAL);
    for (const double c : {lo, hi})
      if (const std::string t = text(c, 17); exact(t)) return t;
  }
  return text(approx, 17);
}

}  // namespace

// The same topology as meshes/single-host.json.
Topology Topology::single_host() {
  Topology t;
  t.description_ =
      "Every device id on one host; links behave like memcpy on this machine (about 12 GB/s per "
      "core). The default when no topology is given.";
  return t;
}

Topology Topology::uniform(std::string name, int hosts, int devices_per_host, LinkClass intra,
                           LinkClass network) {
  const std::string field = "topology";
  check_name(name, field + ".name");
  if (hosts < 1) throw ValidationError(field + ".uniform.hosts", "must be >= 1");
  if (devices_per_host < 1)
    throw ValidationError(field + ".uniform.devices_per_host", "must be >= 1");
  const std::int64_t n = std::int64_t{hosts} * devices_per_host;
  if (n - 1 > kMaxDeviceId)
    throw ValidationError(field + ".uniform",
                          "too many devices (max " + std::to_string(kMaxDeviceId + 1) + ")");
  intra.name = "intra";
  network.name = "network";
  check_link(intra, field + ".links.intra");
  check_link(network, field + ".links.network");
  Topology t;
  t.name_ = std::move(name);
  t.intra_ = intra;
  t.network_ = network;
  t.all_on_one_ = false;
  t.host_of_.resize(static_cast<std::size_t>(n));
  for (std::int64_t d = 0; d < n; ++d) t.host_of_[d] = static_cast<int>(d / devices_per_host);
  t.placed_ = n;
  for (int h = 0; h < hosts; ++h) t.host_names_.push_back("host" + std::to_string(h));
  t.rank_devices();
  return t;
}

Topology Topology::from_json(std::string_view text, const std::string& field) {
  // Strict: malformed text and a key repeated in one object are ParseErrors naming the field.
  // Values: each host an object, its name, its devices' array and its ids, each device once
  // (3 hosts + devices <= 4 * 2^20), and the links' few: the largest topology fits.
  constexpr std::size_t kMaxValues = 4 * static_cast<std::size_t>(kMaxDeviceId + 1) + 4096;
  const json doc = detail::parse_json(std::string(text), field, kMaxValues);
  object_at(doc, field);
  only_keys(doc, field, {"name", "description", "links", "single_host", "uniform", "hosts"});

  Topology t;
  t.name_ = string_at(require(doc, field, "name"), field + ".name");
  check_name(t.name_, field + ".name");
  if (doc.contains("description"))
    t.description_ = string_at(doc["description"], field + ".description");

  bool single = false;
  if (doc.contains("single_host")) {
    if (!doc["single_host"].is_boolean())
      wrong_type(field + ".single_host", "a boolean", doc["single_host"]);
    single = doc["single_host"].get<bool>();
  }
  const int forms = int{single} + int{doc.contains("uniform")} + int{doc.contains("hosts")};
  if (forms != 1)
    throw ValidationError(field, forms == 0 ? "missing placement: give \"hosts\", \"uniform\" or "
                                              "\"single_host\": true"
                                            : "give only one of \"hosts\", \"uniform\" and "
                                              "\"single_host\"");

  const std::string lpath = field + ".links";
  const json& links = object_at(require(doc, field, "links"), lpath);
  only_keys(links, lpath, {"intra", "network"});
  t.intra_ = link_at(require(links, lpath, "intra"), lpath + ".intra", "intra", nullptr);
  if (links.contains("network")) {
    t.network_ = link_at(links["network"], lpath + ".network", "network", &t.nics_per_host_);
  } else if (single) {
    t.network_ = LinkClass{"network", t.intra_.bandwidth, t.intra_.latency, {}, t.intra_.overhead};
  } else {
    throw ValidationError(lpath + ".network", "missing");
  }

  if (single) {
    t.all_on_one_ = true;
    return t;
  }
  t.all_on_one_ = false;
  if (doc.contains("uniform")) {
    const std::string upath = field + ".uniform";
    const json& u = object_at(doc["uniform"], upath);
    only_keys(u, upath, {"hosts", "devices_per_host"});
    const auto hosts = int_at(require(u, upath, "hosts"), upath + ".hosts", 1, kMaxDeviceId + 1);
    const auto k = int_at(require(u, upath, "devices_per_host"), upath + ".devices_per_host", 1,
                          kMaxDeviceId + 1);
    if (hosts * k - 1 > kMaxDeviceId)
      throw ValidationError(upath,
                            "too many devices (max " + std::to_string(kMaxDeviceId + 1) + ")");
    Topology u_t =
        uniform(t.name_, static_cast<int>(hosts), static_cast<int>(k), t.intra_, t.network_);
    u_t.description_ = t.description_;
    u_t.nics_per_host_ = t.nics_per_host_;
    return u_t;
  }

  const std::string hpath = field + ".hosts";
  const json& hosts = doc["hosts"];
  if (!hosts.is_array()) wrong_type(hpath, "an array", hosts);
  std::vector<Host> placed(hosts.size());
  for (std::size_t h = 0; h < hosts.size(); ++h) {
    const std::string p = hpath + "[" + std::to_string(h) + "]";
    const json& host = object_at(hosts[h], p);
    only_keys(host, p, {"name", "devices"});
    placed[h].name =
        host.contains("name") ? string_at(host["name"], p + ".name") : "host" + std::to_string(h);
    const json& devs = require(host, p, "devices");
    if (!devs.is_array()) wrong_type(p + ".devices", "an array", devs);
    for (std::size_t i = 0; i < devs.size(); ++i)
      placed[h].devices.push_back(static_cast<int>(
          int_at(devs[i], p + ".devices[" + std::to_string(i) + "]", 0, kMaxDeviceId)));
  }
  t.place(placed, hpath);
  return t;
}

Topology Topology::from_hosts(std::string name, const std::vector<Host>& hosts, LinkClass intra,
                              LinkClass network, int nics_per_host, std::string description) {
  const std::string field = "topology";
  check_name(name, field + ".name");
  if (nics_per_host < 1 || nics_per_host > kMaxNics)
    throw ValidationError(field + ".links.network.nics_per_host",
                          "must be in [1, " + std::to_string(kMaxNics) + "] (got " +
                              std::to_string(nics_per_host) + ")");
  intra.name = "intra";
  network.name = "network";
  check_link(intra, field + ".links.intra");
  check_link(network, field + ".links.network");
  Topology t;
  t.name_ = std::move(name);
  t.description_ = std::move(description);
  t.intra_ = intra;
  t.network_ = network;
  t.nics_per_host_ = nics_per_host;
  t.all_on_one_ = false;
  t.place(hosts, field + ".hosts");
  return t;
}

void Topology::place(const std::vector<Host>& hosts, const std::string& path) {
  if (hosts.empty()) throw ValidationError(path, "needs at least one host");
  std::map<std::string, std::size_t> names;
  std::map<int, std::string> where;  // device -> path that placed it
  for (std::size_t h = 0; h < hosts.size(); ++h) {
    const std::string p = path + "[" + std::to_string(h) + "]";
    const Host& host = hosts[h];
    check_name(host.name, p + ".name");
    if (const auto [it, fresh] = names.emplace(host.name, h); !fresh)
      throw ValidationError(p + ".name", "host name " + detail::quote(host.name) +
                                             " used twice (also " + path + "[" +
                                             std::to_string(it->second) + "])");
    if (host.devices.empty())
      throw ValidationError(p + ".devices", "a host needs at least one device");
    host_names_.push_back(host.name);
    for (std::size_t i = 0; i < host.devices.size(); ++i) {
      const std::string dp = p + ".devices[" + std::to_string(i) + "]";
      const int d = host.devices[i];
      if (d < 0 || d > kMaxDeviceId)
        throw ValidationError(dp, "must be in [0, " + std::to_string(kMaxDeviceId) + "] (got " +
                                      std::to_string(d) + ")");
      if (const auto [it, fresh] = where.emplace(d, dp); !fresh)
        throw ValidationError(
            dp, "device " + std::to_string(d) + " placed twice (also " + it->second + ")");
      if (static_cast<std::size_t>(d) >= host_of_.size())
        host_of_.resize(static_cast<std::size_t>(d) + 1, -1);
      host_of_[static_cast<std::size_t>(d)] = static_cast<int>(h);
      ++placed_;
    }
  }
  rank_devices();
}

void Topology::rank_devices() {
  std::vector<int> seen(host_names_.size(), 0);
  rank_on_host_.assign(host_of_.size(), -1);
  for (std::size_t d = 0; d < host_of_.size(); ++d)
    if (host_of_[d] >= 0) rank_on_host_[d] = seen[static_cast<std::size_t>(host_of_[d])]++;
}

Topology Topology::load(const std::string& path) {
  // Only a regular file, and only up to the bound: /dev/zero, a FIFO or a huge file is refused
  // before it is read rather than read until memory runs out (or forever).
  const std::string text = read_input_file(path, "topology", limits().input_file_bytes);
  const std::string suffix = " (in " + detail::quote(path) + ")";
  try {
    return from_json(text);
  } catch (const ParseError& e) {
    throw ParseError(e.field(), e.cause() + suffix);
  } catch (const ValidationError& e) {
    throw ValidationError(e.field(), e.cause() + suffix);
  }
}

namespace {

// Entries a preset directory may hold before the rest are ignored (a listing stays cheap).
constexpr int kMaxPresetEntries = 4096;
constexpr std::size_t kMaxListedPresets = 20;  // in the message of an unknown name

bool is_kind(const std::string& path, mode_t kind) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && (st.st_mode & S_IFMT) == kind;
}

std::string real_path(const std::string& path) {
  const std::unique_ptr<char, decltype(&std::free)> r(::realpath(path.c_str(), nullptr),
                                                      &std::free);
  return r ? std::string(r.get()) : std::string();
}

// The file this code runs from. The libraries are static by default, so the code lives in the
// program, and dladdr() then names it only as argv[0] (maybe relative, maybe a bare name found
// on PATH): /proc/self/exe is the program's real path. A shared build (BUILD_SHARED_LIBS) is
// found by dladdr() as the library's own file ("....so"), which lives in <prefix>/lib.
std::string running_binary() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&running_binary), &info) != 0 && info.dli_fname) {
    const std::string f = info.dli_fname;
    if (f.find(".so") != std::string::npos && f.find('/') != std::string::npos) return real_path(f);
  }
  return real_path("/proc/self/exe");
}

// <prefix>/<datadir>/meshcast/meshes, the prefix being the parent of the binary's directory
// (bin/, lib/) or its grandparent (lib/x86_64-linux-gnu/).
std::vector<std::string> installed_preset_dirs(const std::string& binary) {
  const std::string datadir = MESHCAST_INSTALL_DATADIR;
  if (!datadir.empty() && datadir.front() == '/') return {datadir + "/meshcast/meshes"};
  std::vector<std::string> out;
  std::string dir = binary.substr(0, binary.rfind('/'));
  for (int up = 0; up < 2 && dir.find('/') != std::string::npos; ++up) {
    dir = dir.substr(0, dir.rfind('/'));
    out.push_back((dir.empty() ? "" : dir) + "/" + datadir + "/meshcast/meshes");
  }
  return out;
}

}  // namespace

std::vector<std::string> Topology::preset_dirs() {
  std::vector<std::string> dirs;
  const auto add = [&](const std::string& d) {
    if (!d.empty() && is_kind(d, S_IFDIR) && std::find(dirs.begin(), dirs.end(), d) == dirs.end())
      dirs.push_back(d);
  };
  if (const char* path = std::getenv("MESHCAST_TOPOLOGY_PATH")) {
    std::istringstream in(path);
    for (std::string d; std::getline(in, d, ':');) add(d);
  }
  const std::string binary = running_binary();
  if (!binary.empty()) {
    // A shared library's own presets beside it, before the installed ones (after the user's):
    // the Python package ships its copy in <package>/meshes, next to its module.
    if (binary != real_path("/proc/self/exe")) add(binary.substr(0, binary.rfind('/')) + "/meshes");
    for (const std::string& d : installed_preset_dirs(binary)) add(d);
    // The source tree's files serve only programs of this build tree (tests, bin/meshcast): an
    // installed program uses what was installed.
    const std::string tree = real_path(MESHCAST_BUILD_TREE);
    if (!tree.empty() && binary.rfind(tree + "/", 0) == 0) add(MESHCAST_SOURCE_MESHES);
  }
  return dirs;
}

std::vector<std::string> Topology::presets() {
  std::set<std::string> names;
  for (const std::string& d : preset_dirs()) {
    struct Close {
      void operator()(DIR* p) const { ::closedir(p); }
    };
    const std::unique_ptr<DIR, Close> dir(::opendir(d.c_str()));
    if (!dir) continue;
    int seen = 0;
    for (const dirent* e; seen < kMaxPresetEntries && (e = ::readdir(dir.get())); ++seen) {
      const std::string f = e->d_name;
      if (f.size() > 5 && f.ends_with(".json") && f.front() != '.' && is_kind(d + "/" + f, S_IFREG))
        names.insert(f.substr(0, f.size() - 5));
    }
  }
  return {names.begin(), names.end()};
}

Topology Topology::resolve(const std::string& text) {
  if (text.empty()) throw ValidationError("topology", "empty: give a file or a preset name");
  if (text.find('\0') != std::string::npos)  // the OS would read another path
    throw ValidationError("topology", "the name holds a NUL byte");
  // A path that exists is a file (load() refuses a directory or a device with its message); a
  // path with a '/' names no preset, so load() says why it cannot be read.
  if (struct stat st{}; ::stat(text.c_str(), &st) == 0 || text.find('/') != std::string::npos)
    return load(text);
  const std::string name = text.ends_with(".json") ? text.substr(0, text.size() - 5) : text;
  if (!name.empty() && name.front() != '.')
    for (const std::string& d : preset_dirs())
      if (const std::string f = d + "/" + name + ".json"; is_kind(f, S_IFREG)) return load(f);
  const std::vector<std::string> known = presets();
  std::string list;
  for (std::size_t i = 0; i < known.size() && i < kMaxListedPresets; ++i)
    list += (i ? ", " : "") + known[i];
  if (known.size() > kMaxListedPresets)
    list += ", ... (" + std::to_string(known.size() - kMaxListedPresets) + " more)";
  throw ValidationError("topology",
                        "unknown topology " + detail::quote(text) +
                            ": not a file, and no preset of that name (" +
                            (!known.empty() ? "presets: " + list
                             : std::getenv("MESHCAST_TOPOLOGY_PATH")
                                 ? std::string("no presets found, in MESHCAST_TOPOLOGY_PATH or "
                                               "where meshcast is installed")
                                 : std::string("no presets found: install meshcast, or set "
                                               "MESHCAST_TOPOLOGY_PATH")) +
                            ")");
}

// Hand-formatted like the files in meshes/ (one host per line), so that to_json() of a loaded
// file reproduces it.
std::string Topology::to_json() const {
  // Invalid UTF-8 (possible only through uniform()) is replaced rather than thrown.
  const auto str = [](const std::string& v) {
    return json(v).dump(-1, ' ', false, json::error_handler_t::replace);
  };
  const auto us = [](double seconds) { return decimal(seconds, seconds * kMicro, us_to_seconds); };
  const auto latency = [&](const LinkClass& l) {
    std::string s = ", \"latency_us\": " + us(l.latency);
    if (l.chain_latency) s += ", \"chain_latency_us\": " + us(*l.chain_latency);
    // Written where it is not what a file without it gets, so shipped files round-trip.
    if (l.overhead != default_overhead(&l == &network_ ? &nics_per_host_ : nullptr))
      s += ", \"overhead_us\": " + us(l.overhead);
    return s;
  };
  std::ostringstream os;
  os << "{\n  \"name\": " << str(name_) << ",\n";
  if (!description_.empty()) os << "  \"description\": " << str(description_) << ",\n";
  os << "  \"links\": {\n    \"intra\": {\"bandwidth_gbyte_s\": "
     << decimal(intra_.bandwidth, intra_.bandwidth / kGiga, gbyte_to_bytes) << latency(intra_)
     << "}";
  if (!all_on_one_ || network_.bandwidth != intra_.bandwidth ||
      network_.latency != intra_.latency || network_.chain_latency != intra_.chain_latency ||
      network_.overhead != intra_.overhead || nics_per_host_ != 1) {
    const int nics = nics_per_host_;
    os << ",\n    \"network\": {\"bandwidth_gbit_s\": "
       << decimal(network_.bandwidth, network_.bandwidth * 8 / nics / kGiga,
                  [nics](double x) { return gbit_to_bytes(x) * nics; })
       << latency(network_) << ", \"nics_per_host\": " << nics << "}";
  }
  os << "\n  },\n";
  if (all_on_one_) {
    os << "  \"single_host\": true\n}\n";
    return os.str();
  }
  std::vector<std::vector<std::size_t>> devices(host_names_.size());
  for (std::size_t d = 0; d < host_of_.size(); ++d)
    if (host_of_[d] >= 0) devices[static_cast<std::size_t>(host_of_[d])].push_back(d);
  os << "  \"hosts\": [\n";
  for (std::size_t h = 0; h < host_names_.size(); ++h) {
    os << "    {\"name\": " << str(host_names_[h]) << ", \"devices\": [";
    for (std::size_t i = 0; i < devices[h].size(); ++i) os << (i ? ", " : "") << devices[h][i];
    os << "]}" << (h + 1 < host_names_.size() ? "," : "") << "\n";
  }
  os << "  ]\n}\n";
  return os.str();
}

std::string Topology::host_name(int host) const {
  if (host < 0 || host >= hosts()) throw ValidationError("host", "no host " + std::to_string(host));
  return all_on_one_ ? std::string() : host_names_[static_cast<std::size_t>(host)];
}

int Topology::hosts() const { return all_on_one_ ? 1 : static_cast<int>(host_names_.size()); }

bool Topology::covers(int device) const {
  if (device < 0) return false;
  if (all_on_one_) return true;
  const auto d = static_cast<std::size_t>(device);
  return d < host_of_.size() && host_of_[d] >= 0;
}

int Topology::host_of(int device) const {
  if (!covers(device))
    throw ValidationError("topology", "device " + std::to_string(device) +
                                          " is not placed on any host of topology " +
                                          detail::quote(name_));
  return all_on_one_ ? 0 : host_of_[static_cast<std::size_t>(device)];
}

int Topology::nic_of(int device) const {
  host_of(device);  // refuses an unplaced device
  return all_on_one_ ? 0 : rank_on_host_[static_cast<std::size_t>(device)] % nics_per_host_;
}

}  // namespace meshcast
