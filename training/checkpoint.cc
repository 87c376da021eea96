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
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>
#include <utility>

#include "meshcast/collectives.h"
#include "meshcast/error.h"
#include "meshcast/plan.h"
#include "meshcast/region.h"

namespace meshcast::training {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kFormat = "meshcast-checkpoint-1";
constexpr std::int64_t kF32 = 4;
constexpr std::size_t kMessageBytes = 2048;  // an error as broadcast to the other devices

// ---- Agreeing on failures ----------------------------------------------------------------------

// What stopped this device in a phase; rethrown on every device.
struct Failure {
  bool io = false;  // IoError, else ValidationError
  std::string field, cause;
};

// Runs `body`; what it throws becomes this device's failure. ValidationErrors stay so, anything
// else is reported as IoError when `io` (saving) and as ValidationError otherwise (loading: the
// contract names every unreadable part of a checkpoint a validation failure).
template <class F>
std::optional<Failure> attempt(bool io, F&& body) {
  try {
    body();
    return std::nullopt;
  } catch (const ValidationError& e) {
    return Failure{false, e.field(), std::string(e.what()).substr(e.field().size() + 2)};
  } catch (const Error& e) {
    return Failure{io, e.field(), std::string(e.what()).substr(e.field().size() + 2)};
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
  const std::string field = s.substr(1, nl - 1), cause = s.substr(nl + 1);
  if (s[0] == 'i') throw IoError(field, cause);
  throw ValidationError(field, cause);
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
  std::int64_t size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail(path_);
    return st.st_size;
  }
  void sync() {
    if (::fsync(fd_) != 0) fail(path_);
  }
  void close() {
    const int r = ::close(std::exchange(fd_, -1));
    if (r != 0) fail(path_);
  }

 private:
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

std::string read_text(const fs::path& path) {
  File f(path.string(), O_RDONLY);
  std::string text(static_cast<std::size_t>(f.size()), '\0');
  text.resize(f.read(text.data(), text.size(), 0));
  return text;
}

void rename_path(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) fail(to.string());
}

// Moves directory `from` to `to`, atomically replacing an existing `to`: a re-saved step must
// not leave DIR/latest naming a missing directory at any moment.
void replace_dir(const fs::path& from, const fs::path& to) {
  if (!fs::exists(to)) return rename_path(from, to);
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(from);
    return;
  }
  if (errno != EINVAL && errno != ENOSYS) fail(to.string());
  // The file system cannot exchange (NFS): a crash between these two leaves no step `to`.
  fs::remove_all(to);
  rename_path(from, to);
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

std::string step_name(std::int64_t step) {
  char s[32];
  std::snprintf(s, sizeof s, "step-%08lld", static_cast<long long>(step));
  return s;
}

// The step of a directory named step-<digits> (nothing after), if it is one.
std::optional<std::int64_t> step_of(const std::string& name) {
  constexpr std::string_view prefix = "step-";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return {};
  std::int64_t step = 0;
  const char* end = name.data() + name.size();
  const auto [p, ec] = std::from_chars(name.data() + prefix.size(), end, step);
  if (ec != std::errc{} || p != end) return {};
  return step;
}

std::string device_file(int device) { return "device-" + std::to_string(device) + ".bin"; }

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

// The manifest from the devices' entries: parameters in order of first appearance.
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
  return {{"format", kFormat},
          {"step", step},
          {"description", description},
          {"parameters", params},
          {"files", files}};
}

// Deletes every complete checkpoint but `kept` and the newest other one.
void prune(const fs::path& dir, std::int64_t kept) {
  std::vector<std::int64_t> steps;
  for (const auto& e : fs::directory_iterator(dir))
    if (const auto s = step_of(e.path().filename().string()); s && *s != kept) steps.push_back(*s);
  std::sort(steps.begin(), steps.end());
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

struct SavedParam {
  Shape shape;
  std::string layout;
};

struct Manifest {
  std::string path;  // of manifest.json
  std::int64_t step = 0;
  std::vector<std::string> order;  // parameter names as listed
  std::map<std::string, SavedParam> params;
  std::map<int, SavedFile> files;  // by device
};

Manifest read_manifest(const fs::path& checkpoint, std::int64_t step) {
  Manifest m;
  m.path = (checkpoint / "manifest.json").string();
  try {
    const json j = json::parse(read_text(m.path));
    if (j.at("format") != kFormat || j.at("step") != step)
      throw ValidationError("checkpoint", m.path + ": not the manifest of a " + kFormat + " " +
                                              checkpoint.filename().string());
    m.step = step;
    for (const auto& p : j.at("parameters")) {
      const std::string name = p.at("name");
      m.order.push_back(name);
      m.params[name] = {p.at("shape").get<Shape>(), p.at("layout")};
    }
    for (const auto& f : j.at("files")) {
      SavedFile& s = m.files[f.at("device").get<int>()];
      s.path = (checkpoint / f.at("name").get<std::string>()).string();
      s.bytes = f.at("bytes");
      s.fnv = f.at("fnv1a64");
      s.offsets = f.at("offsets").get<std::map<std::string, std::int64_t>>();
    }
  } catch (const json::exception& e) {
    throw ValidationError("checkpoint", m.path + ": " + e.what());
  }
  return m;
}

Layout saved_layout(const Manifest& m, const std::string& name) {
  const SavedParam& p = m.params.at(name);
  return Layout::parse(p.shape, DType::f32, p.layout, "checkpoint");
}

// The device whose file has the tile that `device` holds in `old`: the tile's first holder.
int file_device(const Layout& old, int device) {
  const auto index = *old.mesh().index_of(device);
  std::vector<std::int64_t> shard;
  for (std::size_t i = 0; i < old.rank(); ++i) shard.push_back(old.shard_index(i, index));
  return old.mesh().device(old.holders(shard).front());
}

// Checks a file's size, checksum and that every tile it lists lies inside it.
void verify_file(const Manifest& m, int device, const SavedFile& f) {
  File file(f.path, O_RDONLY);
  const std::int64_t size = file.size();
  if (size != f.bytes)
    throw ValidationError("checkpoint", f.path + ": size " + std::to_string(size) +
                                            ", the manifest says " + std::to_string(f.bytes));
  Fnv fnv;
  std::vector<char> buf(std::size_t{1} << 20);
  for (std::int64_t at = 0; at < size;) {
    const std::size_t n = file.read(buf.data(), buf.size(), at);
    if (n == 0) throw ValidationError("checkpoint", f.path + ": shorter than its size");
    fnv.add(buf.data(), n);
    at += static_cast<std::int64_t>(n);
  }
  if (fnv.hex() != f.fnv) throw ValidationError("checkpoint", f.path + ": checksum mismatch");
  for (const auto& [name, offset] : f.offsets) {
    if (!m.params.count(name))
      throw ValidationError("checkpoint", f.path + ": parameter " + name + " not in the manifest");
    const std::int64_t tile = saved_layout(m, name).tile_of(device).volume() * kF32;
    if (offset < 0 || offset + 3 * tile > size)
      throw ValidationError("checkpoint", f.path + ": parameter " + name + " runs past its end");
  }
}

// The new value, m and v of `p` (its shard) read from the files, by the part of the plan from
// the saved layout to p.layout that this device receives.
std::array<std::vector<float>, 3> read_param(const Manifest& m, const Param& p, int me,
                                             std::map<int, File>& files) {
  const Layout old = saved_layout(m, p.name);
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
    File& file = files.try_emplace(source, saved->second.path, O_RDONLY).first->second;
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
    try {
      desc = description.empty() ? json() : json::parse(description);
    } catch (const json::exception& e) {
      throw ValidationError("checkpoint.description", e.what());
    }
    fs::create_directories(root);
    for (const auto& e : fs::directory_iterator(root)) {
      const std::string name = e.path().filename().string();
      if (name == "latest.tmp" || (name.ends_with(".tmp") && name.starts_with("step-")))
        fs::remove_all(e.path());
    }
    fs::create_directory(tmp);
  });

  std::string entry;
  phase(comm, world, true, [&] { entry = write_device_file(params, comm.rank(), tmp); });
  const auto entries = gather_entries(comm, world, entry);

  phase(comm, world, true, [&] {
    if (!leader) return;
    write_text(tmp / "manifest.json", make_manifest(step, desc, entries).dump(2) + "\n");
    sync_dir(tmp);
    replace_dir(tmp, dest);
    sync_dir(root);
    write_text(root / "latest.tmp", step_name(step) + "\n");
    rename_path(root / "latest.tmp", root / "latest");
    sync_dir(root);
    prune(root, step);
  });
}

std::int64_t load_checkpoint(Communicator& comm, const std::vector<int>& world, Parameters& params,
                             const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;
  std::int32_t present = fs::exists(root / "latest", ec) ? 1 : 0;
  all_reduce(comm, world, &present, &present, 1, DType::i32, ReduceOp::Max);
  if (present == 0) return -1;

  Manifest m;
  phase(comm, world, false, [&] {
    const fs::path latest = root / "latest";
    std::string name = read_text(latest);
    if (name.ends_with('\n')) name.pop_back();
    const auto step = step_of(name);
    if (!step)
      throw ValidationError("checkpoint", latest.string() + ": names no checkpoint: " + name);
    m = read_manifest(root / name, *step);
  });

  // Device k of n verifies every n-th file.
  const auto n = world.size();
  const auto me =
      static_cast<std::size_t>(std::find(world.begin(), world.end(), comm.rank()) - world.begin());
  phase(comm, world, false, [&] {
    std::size_t i = 0;
    for (const auto& [device, f] : m.files)
      if (i++ % n == me) verify_file(m, device, f);
  });

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
      if (it == m.params.end() || it->second.shape != p.shape)
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
  return m.step;
}

}  // namespace meshcast::training
