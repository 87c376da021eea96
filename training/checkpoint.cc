#include "training/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>
#include <utility>

#include "lib/json_text.h"
#include "lib/text.h"
#include "meshcast/collectives.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"
#include "meshcast/plan.h"
#include "meshcast/region.h"

namespace meshcast::training {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kFormat = "meshcast-checkpoint-2";
constexpr std::int64_t kF32 = 4;
constexpr std::size_t kMessageBytes = 2048;  // an error as broadcast to the other devices

// ---- Agreeing on failures ----------------------------------------------------------------------

// What stopped this device in a phase; rethrown on every device.
struct Failure {
  bool io = false;  // IoError, else ValidationError
  std::string field, cause;
};

[[noreturn]] void rethrow(const Failure& f) {
  if (f.io) throw IoError(f.field, f.cause);
  throw ValidationError(f.field, f.cause);
}

// Runs `body`; what it throws becomes this device's failure. Bad input (ValidationError,
// ParseError) stays so; anything else is reported as IoError when `io` (saving) and as
// ValidationError otherwise (loading: the contract names every unreadable part of a checkpoint a
// validation failure).
template <class F>
std::optional<Failure> attempt(bool io, F&& body) {
  try {
    body();
    return std::nullopt;
  } catch (const Error& e) {
    const bool input = dynamic_cast<const ValidationError*>(&e) != nullptr ||
                       dynamic_cast<const ParseError*>(&e) != nullptr;
    return Failure{io && !input, e.field(), std::string(e.what()).substr(e.field().size() + 2)};
  } catch (const std::exception& e) {
    return Failure{io, "checkpoint", e.what()};
  }
}

// Ends a phase on every device of `world` (it is also a barrier): when any failed, every one
// throws the failure of the first in world order, so none waits for a partner that gave up.
void settle(Communicator& comm, const std::vector<int>& world, const std::optional<Failure>& mine) {
  const auto n = static_cast<std::int64_t>(world.size());
  const auto me = std::find(world.begin(), world.end(), comm.rank()) - world.begin();
  std::int64_t first = mine ? n - me : 0;  // max picks the first failing device
  all_reduce(comm, world, &first, &first, 1, DType::i64, ReduceOp::Max);
  if (first == 0) return;
  const int root = world[static_cast<std::size_t>(n - first)];
  std::array<char, kMessageBytes> text{};
  if (comm.rank() == root) {
    const std::string s = (mine->io ? "i" : "v") + mine->field + '\n' + mine->cause;
    s.copy(text.data(), text.size() - 1);
  }
  broadcast(comm, world, root, text.data(), static_cast<std::int64_t>(text.size()), DType::i8);
  const std::string s(text.data());
  const auto nl = s.find('\n');
  rethrow({s[0] == 'i', s.substr(1, nl - 1), s.substr(nl + 1)});
}

template <class F>
void phase(Communicator& comm, const std::vector<int>& world, bool io, F&& body) {
  settle(comm, world, attempt(io, std::forward<F>(body)));
}

// ---- Files -------------------------------------------------------------------------------------

[[noreturn]] void fail(const std::string& path) {
  throw IoError("checkpoint",
                path + ": " + std::error_code(errno, std::generic_category()).message());
}

// Flags to open a checkpoint's file for reading: a FIFO planted under its name must not block
// the open (require_regular() then refuses it).
constexpr int kRead = O_RDONLY | O_NONBLOCK;

// An open file descriptor (POSIX, for fsync), closed when it dies.
class File {
 public:
  File(std::string path, int flags) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), flags | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(path_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }

  const std::string& path() const { return path_; }
  void write(const void* data, std::size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, p, bytes);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(path_);
      p += n;
      bytes -= static_cast<std::size_t>(n);
    }
  }
  // Reads up to `bytes` at `at`; returns how many (fewer only at the end of the file).
  std::size_t read(void* data, std::size_t bytes, std::int64_t at) {
    std::size_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pread(fd_, static_cast<char*>(data) + done, bytes - done,
                                static_cast<off_t>(at) + static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(path_);
      if (n == 0) break;
      done += static_cast<std::size_t>(n);
    }
    return done;
  }
  std::int64_t size() const { return status().st_size; }
  // A directory, FIFO or device in a checkpoint is damage, not data.
  void require_regular() const {
    if (!S_ISREG(status().st_mode))
      throw ValidationError("checkpoint", path_ + ": not a regular file");
  }
  void sync() {
    if (::fsync(fd_) != 0) fail(path_);
  }
  void close() {
    const int r = ::close(std::exchange(fd_, -1));
    if (r != 0) fail(path_);
  }

 private:
  struct stat status() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail(path_);
    return st;
  }

  std::string path_;
  int fd_ = -1;
};

// Makes a directory's entries (files created or renamed in it) durable.
void sync_dir(const fs::path& dir) { File(dir.string(), O_RDONLY | O_DIRECTORY).sync(); }

// Writes `text` to `path` durably.
void write_text(const fs::path& path, const std::string& text) {
  File f(path.string(), O_WRONLY | O_CREAT | O_TRUNC);
  f.write(text.data(), text.size());
  f.sync();
  f.close();
}

// The text of a small regular file (a manifest, DIR/latest), no larger than an input file may be.
std::string read_text(const fs::path& path) {
  File f(path.string(), kRead);
  f.require_regular();
  const std::int64_t size = f.size(), bound = limits().input_file_bytes;
  if (size > bound)
    throw ValidationError("checkpoint", path.string() + ": " + std::to_string(size) +
                                            " bytes exceed the limit of " + std::to_string(bound) +
                                            " (raise it with MESHCAST_MAX_INPUT_FILE_BYTES)");
  std::string text(static_cast<std::size_t>(size), '\0');
  text.resize(f.read(text.data(), text.size(), 0));
  return text;
}

void rename_path(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) fail(to.string());
}

// FNV-1a 64, fed in pieces.
struct Fnv {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  void add(const void* data, std::size_t bytes) {
    for (const auto* p = static_cast<const unsigned char*>(data); bytes-- > 0; ++p)
      h = (h ^ *p) * 0x100000001b3ULL;
  }
  std::string hex() const {
    char s[17];
    std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(h));
    return s;
  }
};

// The manifest's own checksum: FNV-1a 64 of its canonical text (compact, keys sorted) without
// the "checksum" key, so that any edit of a key, a value or the structure shows, however the
// file is laid out.
std::string manifest_checksum(json manifest) {
  manifest.erase("checksum");
  const std::string text = manifest.dump();
  Fnv fnv;
  fnv.add(text.data(), text.size());
  return fnv.hex();
}

std::string step_name(std::int64_t step) {
  char s[32];
  std::snprintf(s, sizeof s, "step-%08lld", static_cast<long long>(step));
  return s;
}

// The step of a directory named as step_name() names it (step-5 or step--1 are not), if it is
// one: two names for one step would make "the newest" ambiguous.
std::optional<std::int64_t> step_of(const std::string& name) {
  constexpr std::string_view prefix = "step-";
  if (!name.starts_with(prefix)) return {};
  std::int64_t step = 0;
  const char* end = name.data() + name.size();
  const auto [p, ec] = std::from_chars(name.data() + prefix.size(), end, step);
  if (ec != std::errc{} || p != end || step < 0 || step_name(step) != name) return {};
  return step;
}

// The steps of DIR's checkpoint directories, ascending; none when DIR does not exist.
std::vector<std::int64_t> saved_steps(const fs::path& dir) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return steps;
  for (; !ec && it != fs::directory_iterator(); it.increment(ec))
    if (const auto s = step_of(it->path().filename().string()); s && it->is_directory(ec))
      steps.push_back(*s);
  if (ec) throw IoError("checkpoint", dir.string() + ": " + ec.message());
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string device_file(int device) { return "device-" + std::to_string(device) + ".bin"; }

// The checkpoint a resume continues from: always the newest, so that the resumed run saves no
// step that exists already. DIR/latest names it after every complete save; when it does not
// (missing: the first save was killed before writing it; older: a save was killed between its
// two renames; or edited), `fallback` says so.
struct Newest {
  std::int64_t step = -1;  // -1: DIR holds no checkpoint
  fs::path path;
  std::string fallback;
};

Newest find_newest(const fs::path& root) {
  const auto steps = saved_steps(root);
  const fs::path latest = root / "latest";
  std::error_code ec;
  const bool pointer = fs::symlink_status(latest, ec).type() != fs::file_type::not_found;
  if (steps.empty()) {
    // Its checkpoints were removed: starting afresh would silently lose the run.
    if (pointer)
      throw ValidationError("checkpoint", latest.string() + " exists but " + root.string() +
                                              " holds no checkpoint directory");
    return {};
  }
  Newest n{steps.back(), root / step_name(steps.back()), ""};
  if (!pointer) {
    n.fallback = latest.string() + " is missing";
    return n;
  }
  try {
    std::string named = read_text(latest);
    if (named.ends_with('\n')) named.pop_back();
    if (named != step_name(n.step))
      n.fallback = latest.string() + " names " + detail::quote(named) + ", not the newest";
  } catch (const Error& e) {
    n.fallback = e.what();
  }
  return n;
}

// ---- Saving ------------------------------------------------------------------------------------

// Writes this device's file into `tmp` (its counted tiles: values, m, v) and returns its entry
// for the manifest as JSON text, or "" when it reports nothing.
std::string write_device_file(Parameters& params, int device, const fs::path& tmp) {
  json entry{{"device", device}, {"parameters", json::array()}};
  std::optional<File> file;
  Fnv fnv;
  std::int64_t bytes = 0;
  for (const Param& p : params.all()) {
    if (!p.counted) continue;
    if (!file) file.emplace((tmp / device_file(device)).string(), O_WRONLY | O_CREAT | O_TRUNC);
    entry["parameters"].push_back(
        {{"name", p.name}, {"shape", p.shape}, {"layout", p.layout.str()}, {"offset", bytes}});
    for (const auto* data : {&p.value, &p.m, &p.v}) {
      const std::size_t n = data->size() * kF32;
      file->write(data->data(), n);
      fnv.add(data->data(), n);
      bytes += static_cast<std::int64_t>(n);
    }
  }
  if (!file) return "";
  file->sync();
  file->close();
  entry["bytes"] = bytes;
  entry["fnv1a64"] = fnv.hex();
  return entry.dump();
}

// Every device's entry text (empty for devices that wrote no file), gathered over `world`.
std::vector<std::string> gather_entries(Communicator& comm, const std::vector<int>& world,
                                        const std::string& mine) {
  std::vector<std::int64_t> sizes(world.size());
  const auto me = std::find(world.begin(), world.end(), comm.rank()) - world.begin();
  sizes[static_cast<std::size_t>(me)] = static_cast<std::int64_t>(mine.size());
  all_gather(comm, world, &sizes[static_cast<std::size_t>(me)], sizes.data(),
             static_cast<std::int64_t>(sizes.size()), DType::i64);
  std::int64_t total = 0;
  for (auto s : sizes) total += s;
  std::string all(static_cast<std::size_t>(total), '\0');
  all_gatherv(comm, world, mine.data(), all.data(), sizes, DType::i8);
  std::vector<std::string> out;
  std::size_t at = 0;
  for (auto s : sizes) {
    out.push_back(all.substr(at, static_cast<std::size_t>(s)));
    at += static_cast<std::size_t>(s);
  }
  return out;
}

// The manifest from the devices' entries: parameters in order of first appearance; sealed with
// its checksum.
json make_manifest(std::int64_t step, const json& description,
                   const std::vector<std::string>& entries) {
  json params = json::array(), files = json::array();
  std::map<std::string, json> seen;  // name -> {name, shape, layout}
  for (const auto& text : entries) {
    if (text.empty()) continue;
    const json e = json::parse(text);
    json offsets = json::object();
    for (const auto& p : e["parameters"]) {
      const std::string name = p["name"];
      const json saved{{"name", name}, {"shape", p["shape"]}, {"layout", p["layout"]}};
      const auto [it, fresh] = seen.emplace(name, saved);
      if (fresh)
        params.push_back(saved);
      else if (it->second != saved)
        throw ValidationError("checkpoint", "parameter " + name + " differs between devices: " +
                                                it->second.dump() + " and " + saved.dump());
      offsets[name] = p["offset"];
    }
    files.push_back({{"name", device_file(e["device"].get<int>())},
                     {"device", e["device"]},
                     {"bytes", e["bytes"]},
                     {"fnv1a64", e["fnv1a64"]},
                     {"offsets", offsets}});
  }
  json manifest{{"format", kFormat},
                {"step", step},
                {"description", description},
                {"parameters", params},
                {"files", files}};
  manifest["checksum"] = manifest_checksum(manifest);
  return manifest;
}

// Deletes every checkpoint but `kept` and the newest other one.
void prune(const fs::path& dir, std::int64_t kept) {
  auto steps = saved_steps(dir);
  std::erase(steps, kept);
  if (!steps.empty()) steps.pop_back();
  for (auto s : steps) fs::remove_all(dir / step_name(s));
}

// ---- Loading -----------------------------------------------------------------------------------

struct SavedFile {
  std::string path;
  std::int64_t bytes = 0;
  std::string fnv;
  std::map<std::string, std::int64_t> offsets;
};

struct Manifest {
  std::string path;  // of manifest.json
  std::int64_t step = 0;
  std::string description;         // JSON text
  std::vector<std::string> order;  // parameter names as listed
  std::map<std::string, Layout> params;
  std::map<int, SavedFile> files;  // by device
};

// Reads and checks a manifest: its checksum first (so that nothing an edit changed is used),
// then the type and range of every value.
Manifest read_manifest(const fs::path& checkpoint, std::int64_t step) {
  Manifest m;
  m.path = (checkpoint / "manifest.json").string();
  const auto bad = [&](const std::string& why) {
    return ValidationError("checkpoint", m.path + ": " + why);
  };
  json j;
  try {
    j = detail::parse_json(read_text(m.path), "manifest");
  } catch (const ParseError& e) {
    throw bad(e.what());
  }
  const auto integer = [&](const json& v, const std::string& what, std::int64_t hi) {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > hi)
      throw bad(what + " " + v.dump().substr(0, 64) + " is not an integer in 0.." +
                std::to_string(hi));
    return v.get<std::int64_t>();
  };
  const auto layout_of = [&](const json& p, const std::string& name) {
    try {
      return Layout::parse(p.at("shape").get<Shape>(), DType::f32,
                           p.at("layout").get<std::string>(), "layout");
    } catch (const Error& e) {
      throw bad("parameter " + name + ": " + e.what());
    }
  };
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  try {
    if (!j.is_object() || j.value("format", "") != kFormat)
      throw bad(std::string("not a ") + kFormat + " manifest");
    if (j.value("checksum", "") != manifest_checksum(j))
      throw bad("checksum mismatch: the manifest changed after it was written");
    if (integer(j.at("step"), "step", kMax) != step)
      throw bad("its step is not " + std::to_string(step) + ", the step of its directory");
    m.step = step;
    m.description = j.at("description").dump();
    for (const auto& p : j.at("parameters")) {
      const std::string name = p.at("name");
      if (!m.params.emplace(name, layout_of(p, name)).second)
        throw bad("parameter " + name + " is listed twice");
      m.order.push_back(name);
    }
    for (const auto& f : j.at("files")) {
      const int device =
          static_cast<int>(integer(f.at("device"), "device", std::numeric_limits<int>::max()));
      const std::string name = device_file(device);
      // Only the name the device's file has: a manifest must not point outside its directory.
      if (f.at("name") != name)
        throw bad("the file of device " + std::to_string(device) + " is not named " + name);
      SavedFile& s = m.files[device];
      if (!s.path.empty()) throw bad(name + " is listed twice");
      s.path = (checkpoint / name).string();
      s.bytes = integer(f.at("bytes"), name + " bytes", kMax);
      s.fnv = f.at("fnv1a64");
      for (const auto& [param, offset] : f.at("offsets").items()) {
        if (!m.params.count(param))
          throw bad(name + ": parameter " + param + " is not in the manifest");
        s.offsets[param] = integer(offset, name + " offset of " + param, kMax);
      }
    }
  } catch (const json::exception& e) {
    throw bad(e.what());
  }
  return m;
}

// The device whose file has the tile that `device` holds in `old`: the tile's first holder.
int file_device(const Layout& old, int device) {
  const auto index = old.mesh().index_of(device);
  if (!index)
    throw ValidationError("checkpoint",
                          "device " + std::to_string(device) + " is not in " + old.mesh().str());
  std::vector<std::int64_t> shard;
  for (std::size_t i = 0; i < old.rank(); ++i) shard.push_back(old.shard_index(i, *index));
  return old.mesh().device(old.holders(shard).front());
}

// Checks that a file is regular, of its size, that its tiles (each the device's own, as first
// holder) fill it exactly one after the other, and its checksum.
void verify_file(const Manifest& m, int device, const SavedFile& f) {
  File file(f.path, kRead);
  file.require_regular();
  const std::int64_t size = file.size();
  if (size != f.bytes)
    throw ValidationError("checkpoint", f.path + ": size " + std::to_string(size) +
                                            ", the manifest says " + std::to_string(f.bytes));
  std::vector<std::pair<std::int64_t, std::int64_t>> spans;  // offset, bytes
  for (const auto& [name, offset] : f.offsets) {
    const Layout& old = m.params.at(name);
    if (file_device(old, device) != device)
      throw ValidationError("checkpoint", f.path + ": has a tile of " + name + " that device " +
                                              std::to_string(device) + " does not write");
    spans.emplace_back(offset, 3 * old.tile_of(device).volume() * kF32);
  }
  std::sort(spans.begin(), spans.end());
  std::int64_t end = 0;
  for (const auto& [offset, bytes] : spans) {
    if (offset != end)
      throw ValidationError("checkpoint", f.path + ": its tiles leave a gap or overlap at byte " +
                                              std::to_string(std::min(offset, end)));
    end += bytes;
  }
  if (end != size)
    throw ValidationError("checkpoint", f.path + ": its tiles take " + std::to_string(end) +
                                            " of its " + std::to_string(size) + " bytes");
  Fnv fnv;
  std::vector<char> buf(std::size_t{1} << 20);
  for (std::int64_t at = 0; at < size;) {
    const std::size_t n = file.read(buf.data(), buf.size(), at);
    if (n == 0) throw ValidationError("checkpoint", f.path + ": shorter than its size");
    fnv.add(buf.data(), n);
    at += static_cast<std::int64_t>(n);
  }
  if (fnv.hex() != f.fnv) throw ValidationError("checkpoint", f.path + ": checksum mismatch");
}

// Device k of the n in `world` verifies every n-th file of `m`.
void verify_files(Communicator& comm, const std::vector<int>& world, const Manifest& m) {
  const auto n = world.size();
  const auto me =
      static_cast<std::size_t>(std::find(world.begin(), world.end(), comm.rank()) - world.begin());
  std::size_t i = 0;
  for (const auto& [device, f] : m.files)
    if (i++ % n == me) verify_file(m, device, f);
}

// The new value, m and v of `p` (its shard) read from the files, by the part of the plan from
// the saved layout to p.layout that this device receives.
std::array<std::vector<float>, 3> read_param(const Manifest& m, const Param& p, int me,
                                             std::map<int, File>& files) {
  const Layout& old = m.params.at(p.name);
  const Plan pl = plan(old, p.layout, Topology::single_host(), {Strategy::SendRecv, Balance::None});
  const auto n = static_cast<std::size_t>(p.shard.volume());
  std::array<std::vector<float>, 3> out{std::vector<float>(n), std::vector<float>(n),
                                        std::vector<float>(n)};
  std::int64_t covered = 0;
  std::vector<float> band;
  for (const Op& op : pl.ops()) {
    const bool mine = (op.kind == OpKind::Copy && op.root == me) ||
                      (op.kind == OpKind::Multicast &&
                       std::find(op.peers.begin(), op.peers.end(), me) != op.peers.end());
    if (!mine || op.box.empty()) continue;
    // A Copy's root holds the tile but need not be the device that wrote it.
    const int source = file_device(old, op.root);
    const auto saved = m.files.find(source);
    if (saved == m.files.end() || !saved->second.offsets.count(p.name))
      throw ValidationError("checkpoint",
                            m.path + ": no tile of " + p.name + " in " + device_file(source));
    const std::int64_t offset = saved->second.offsets.at(p.name);
    File& file = files.try_emplace(source, saved->second.path, kRead).first->second;
    // Read the rows of the tile that the box spans (contiguous in the file), not the whole tile.
    const Box tile = old.tile_of(source);
    auto ranges = tile.ranges();
    ranges[0] = op.box[0];
    const Box rows(ranges);
    const std::int64_t row = tile[0].size() > 0 ? tile.volume() / tile[0].size() : 0;
    const std::int64_t skip = (op.box[0].lo - tile[0].lo) * row * kF32;
    band.resize(static_cast<std::size_t>(rows.volume()));
    const std::size_t bytes = band.size() * kF32;
    for (std::size_t k = 0; k < 3; ++k) {
      const std::int64_t at = offset + static_cast<std::int64_t>(k) * tile.volume() * kF32;
      if (file.read(band.data(), bytes, at + skip) != bytes)
        throw ValidationError("checkpoint", file.path() + ": shorter than the manifest says");
      copy_region(Region::of(band.data(), kF32, rows, op.box),
                  Region::of(out[k].data(), kF32, p.shard, op.box));
    }
    covered += op.box.volume();
  }
  if (covered != p.shard.volume())
    throw ValidationError("checkpoint", m.path + ": does not cover " + p.name + " " +
                                            p.shard.str() + " on device " + std::to_string(me));
  return out;
}

}  // namespace

void save_checkpoint(Communicator& comm, const std::vector<int>& world, Parameters& params,
                     std::int64_t step, const std::string& dir, const std::string& description) {
  if (step < 0) throw ValidationError("checkpoint.step", "negative: " + std::to_string(step));
  const bool leader = comm.rank() == world.front();
  const fs::path root(dir), tmp = root / (step_name(step) + ".tmp"), dest = root / step_name(step);

  json desc;
  // No save is in flight (saving is collective), so every temporary is a killed save's remains.
  phase(comm, world, true, [&] {
    if (!leader) return;
    desc = description.empty() ? json() : detail::parse_json(description, "checkpoint.description");
    fs::create_directories(root);
    for (const auto& e : fs::directory_iterator(root)) {
      const std::string name = e.path().filename().string();
      if (name == "latest.tmp" || (name.ends_with(".tmp") && name.starts_with("step-")))
        fs::remove_all(e.path());
    }
    if (fs::exists(fs::symlink_status(dest)))
      throw ValidationError("checkpoint.step",
                            dest.string() + " exists: a checkpoint is never overwritten");
    fs::create_directory(tmp);
  });

  std::string entry;
  phase(comm, world, true, [&] { entry = write_device_file(params, comm.rank(), tmp); });
  const auto entries = gather_entries(comm, world, entry);
  phase(comm, world, true, [&] {
    if (!leader) return;
    write_text(tmp / "manifest.json", make_manifest(step, desc, entries).dump(2) + "\n");
    sync_dir(tmp);
  });

  // Read everything back before the checkpoint becomes the newest and older ones are pruned: one
  // that does not verify must replace nothing.
  phase(comm, world, true, [&] {
    try {
      verify_files(comm, world, read_manifest(tmp, step));
    } catch (const ValidationError& e) {
      throw IoError("checkpoint", "does not read back as written: " + std::string(e.what()));
    }
  });

  phase(comm, world, true, [&] {
    if (!leader) return;
    rename_path(tmp, dest);
    sync_dir(root);
    write_text(root / "latest.tmp", step_name(step) + "\n");
    rename_path(root / "latest.tmp", root / "latest");
    sync_dir(root);
    prune(root, step);
  });
}

SavedCheckpoint find_checkpoint(const std::string& dir) {
  SavedCheckpoint found;
  // Refused as load_checkpoint refuses: every failure is a ValidationError.
  if (const auto failure = attempt(false, [&] {
        const Newest n = find_newest(dir);
        if (n.step < 0) return;
        found = {n.step, n.path.string(), read_manifest(n.path, n.step).description, n.fallback};
      }))
    rethrow(*failure);
  return found;
}

std::int64_t load_checkpoint(Communicator& comm, const std::vector<int>& world, Parameters& params,
                             const std::string& dir) {
  Manifest m;
  std::int64_t step = -1;
  phase(comm, world, false, [&] {
    const Newest n = find_newest(dir);
    step = n.step;
    if (step >= 0) m = read_manifest(n.path, step);
  });
  // Every device must have found the same one (a directory not shared by all would differ).
  std::array<std::int64_t, 2> seen{step, -step};
  all_reduce(comm, world, seen.data(), seen.data(), 2, DType::i64, ReduceOp::Max);
  if (seen[0] != -seen[1])
    throw ValidationError("checkpoint", dir + ": the devices see different newest checkpoints");
  if (step < 0) return -1;

  phase(comm, world, false, [&] { verify_files(comm, world, m); });

  // The checkpoint and the model must hold the same parameters.
  std::vector<std::int32_t> used(m.order.size(), 0);
  for (const Param& p : params.all()) {
    const auto it = std::find(m.order.begin(), m.order.end(), p.name);
    if (it != m.order.end()) used[static_cast<std::size_t>(it - m.order.begin())] = 1;
  }
  all_reduce(comm, world, used.data(), used.data(), static_cast<std::int64_t>(used.size()),
             DType::i32, ReduceOp::Max);
  std::vector<std::array<std::vector<float>, 3>> loaded;
  phase(comm, world, false, [&] {
    for (std::size_t i = 0; i < used.size(); ++i)
      if (used[i] == 0)
        throw ValidationError("checkpoint",
                              m.path + ": parameter " + m.order[i] + " is not in the model");
    for (const Param& p : params.all()) {
      const auto it = m.params.find(p.name);
      if (it == m.params.end() || it->second.shape() != p.shape)
        throw ValidationError(
            "checkpoint", m.path + ": no parameter " + p.name + " of shape " + shape_str(p.shape));
    }
    std::map<int, File> files;
    for (const Param& p : params.all()) loaded.push_back(read_param(m, p, comm.rank(), files));
  });

  // Only now that every device read everything: a failed load leaves the parameters as they were.
  std::size_t i = 0;
  for (Param& p : params.all()) {
    auto& [value, m1, v] = loaded[i++];
    p.value = std::move(value);
    p.m = std::move(m1);
    p.v = std::move(v);
  }
  return step;
}

}  // namespace meshcast::training
