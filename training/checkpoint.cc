#include "training/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "lib/support/json_text.h"
#include "lib/support/spread.h"
#include "lib/support/text.h"
#include "meshcast/collectives.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"
#include "meshcast/plan.h"
#include "meshcast/region.h"
#include "meshcast/reshard.h"
#include "meshcast/sync.h"
#include "meshcast/units.h"

namespace meshcast::training {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kFormat = "meshcast-checkpoint-2";
constexpr std::int64_t kF32 = 4;
// The files a load keeps open.
constexpr std::size_t kOpenFiles = 64;
// A load's syncs: every source tile has one holder, its sender (Broadcast: one multicast to every
// device that needs a part of it). Small boxes (biases, norms) are coalesced into messages; a box
// over 256 KiB travels unpacked, straight from the source tile into the target, so that large
// weights are not copied through staging. Two syncs are in flight at once (see move_all()), each
// staging at most 16 MiB.
const SyncOptions kLoadSync{.plan = {.strategy = Strategy::Broadcast, .balance = Balance::None},
                            .max_staging_bytes = std::int64_t{16} << 20,
                            .bucket_bytes = std::int64_t{256} << 10};

// ---- Agreeing on failures ----------------------------------------------------------------------

// Runs `body`; what it throws becomes this device's failure. Bad input stays a ValidationError;
// anything else is an IoError when `io` (saving) and a ValidationError otherwise (loading: the
// contract names every unreadable part of a checkpoint a validation failure).
template <class F>
std::unique_ptr<Error> attempt(bool io, F&& body) {
  const auto failure = [io](const std::string& field, const std::string& cause,
                            bool input) -> std::unique_ptr<Error> {
    if (io && !input) return std::make_unique<IoError>(field, cause);
    return std::make_unique<ValidationError>(field, cause);
  };
  try {
    body();
    return nullptr;
  } catch (const Error& e) {
    return failure(e.field(), e.cause(), e.kind() == ErrorKind::BadInput);
  } catch (const std::exception& e) {
    return failure("checkpoint", e.what(), false);
  }
}

// Ends a phase on every device of `group` (it is also a barrier): when any failed, every one
// throws the failure of the first in group order, so none waits for a partner that gave up.
template <class F>
void phase(const Group& group, bool io, F&& body) {
  const auto failure = attempt(io, std::forward<F>(body));
  group.comm().agree(group, failure.get());
}

// The group of `world`: the communicator's own world when it is that, so that saving and loading
// make no group of their own.
Group group_of(Communicator& comm, const std::vector<int>& world) {
  return world == comm.world().devices() ? comm.world() : comm.group(world);
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
    if (path_.find('\0') != std::string::npos)  // the OS would open another file
      throw ValidationError("path", "the path holds a NUL byte");
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

// Refuses a small file (`what`: a manifest, DIR/latest) larger than an input file may be.
void require_readable_size(const std::string& what, std::int64_t size) {
  const std::int64_t bound = limits().input_file_bytes;
  if (size > bound)
    throw ValidationError("checkpoint", what + ": " + std::to_string(size) +
                                            " bytes exceed the limit of " + std::to_string(bound) +
                                            " (raise it with MESHCAST_MAX_INPUT_FILE_BYTES)");
}

// The text of a small regular file, within require_readable_size().
std::string read_text(const fs::path& path) {
  File f(path.string(), kRead);
  f.require_regular();
  const std::int64_t size = f.size();
  require_readable_size(path.string(), size);
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
    if (const auto s = step_of(it->path().filename().string())) {
      // Found before any work: the save of that step would refuse to overwrite it at the end.
      if (!it->is_directory(ec) && !ec)
        throw ValidationError("checkpoint", it->path().string() +
                                                " is not a checkpoint directory: remove it, or "
                                                "give another --checkpoint-dir");
      steps.push_back(*s);
    }
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
  std::vector<std::int64_t> steps;  // every checkpoint's step, newest first (a corrupt newest
                                    // gives way to the next)
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
  Newest n{steps.back(), root / step_name(steps.back()), "", {steps.rbegin(), steps.rend()}};
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

// This device's entry for the manifest, its file's checksum left out: its counted tiles (value, m
// and v of each, one after the other) and their offsets; null when it holds none.
json device_entry(Parameters& params, int device) {
  json entry{{"device", device}, {"parameters", json::array()}};
  std::int64_t bytes = 0;
  for (const Param& p : params.all()) {
    if (!p.counted) continue;
    entry["parameters"].push_back(
        {{"name", p.name}, {"shape", p.shape}, {"layout", p.layout.str()}, {"offset", bytes}});
    for (const auto* data : {&p.value, &p.m, &p.v})
      bytes += static_cast<std::int64_t>(data->size()) * kF32;
  }
  if (entry["parameters"].empty()) return nullptr;
  entry["bytes"] = bytes;
  return entry;
}

// Why a tile's value, m or v (`part` 0, 1, 2) cannot be a trained state, or "": NaN, an infinite
// value or m, or a negative v (a load would spread them into NaN weights). v may be +inf: the
// square of a finite gradient above 1.8e19 in float, whose update is then 0.
// `first`: the index in its part of data[0].
std::string unsound(const float* data, std::size_t count, int part, std::int64_t first = 0) {
  for (std::size_t i = 0; i < count; ++i)
    if (part == 2 ? std::isnan(data[i]) || data[i] < 0 : !std::isfinite(data[i]))
      return std::string(part == 0   ? "value"
                         : part == 1 ? "m"
                                     : "v") +
             " element " + std::to_string(first + static_cast<std::int64_t>(i)) + " is " +
             std::to_string(data[i]);
  return "";
}

// Writes this device's file into `tmp` (see device_entry()) and returns its entry for the
// manifest as JSON text, or "" when it reports nothing. A state that is not a trained one is
// refused before anything is written.
std::string write_device_file(Parameters& params, int device, const fs::path& tmp) {
  json entry = device_entry(params, device);
  if (entry.is_null()) return "";
  for (const Param& p : params.all()) {
    if (!p.counted) continue;
    int part = 0;
    for (const auto* data : {&p.value, &p.m, &p.v})
      if (const std::string why = unsound(data->data(), data->size(), part++); !why.empty())
        throw ValidationError("checkpoint", "parameter " + p.name + " on device " +
                                                std::to_string(device) + ": " + why +
                                                ": nothing is saved");
  }
  File file((tmp / device_file(device)).string(), O_WRONLY | O_CREAT | O_TRUNC);
  Fnv fnv;
  for (const Param& p : params.all()) {
    if (!p.counted) continue;
    for (const auto* data : {&p.value, &p.m, &p.v}) {
      const std::size_t n = data->size() * kF32;
      file.write(data->data(), n);
      fnv.add(data->data(), n);
    }
  }
  file.sync();
  file.close();
  entry["fnv1a64"] = fnv.hex();
  return entry.dump();
}

// Every device's entry text (empty for devices that wrote none), gathered over `group`.
std::vector<std::string> gather_entries(const Group& group, const std::string& mine) {
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(group.size()));
  const auto me = static_cast<std::size_t>(group.index_of(group.comm().rank()));
  sizes[me] = static_cast<std::int64_t>(mine.size());
  all_gather(group, &sizes[me], sizes.data(), static_cast<std::int64_t>(sizes.size()), DType::i64);
  std::int64_t total = 0;
  for (auto s : sizes) total += s;
  std::string all(static_cast<std::size_t>(total), '\0');
  all_gatherv(group, mine.data(), all.data(), sizes, DType::i8);
  std::vector<std::string> out;
  std::size_t at = 0;
  for (auto s : sizes) {
    out.push_back(all.substr(at, static_cast<std::size_t>(s)));
    at += static_cast<std::size_t>(s);
  }
  return out;
}

// The JSON values a manifest may hold: an offset per device and parameter it holds, up to 8x the
// default, within the file's own bound (MESHCAST_MAX_INPUT_FILE_BYTES).
constexpr std::size_t kManifestValues = 8 * detail::kMaxJsonValues;
// A parameter's layout (its mesh's devices counted apart), name and map entries, as a manifest
// is read: 300,000 parameters of one device each took 1.6 GB with the manifest's JSON.
constexpr std::int64_t kParameterBytes = 4096;

// A save's description (JSON text; "" for none) as its manifest holds it.
json parse_description(const std::string& description) {
  return description.empty() ? json() : detail::parse_json(description, "checkpoint.description");
}

// The manifest from the devices' entries, as a save writes it: parameters in order of first
// appearance; sealed with its checksum.
std::string manifest_text(std::int64_t step, const json& description,
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
  return manifest.dump(2) + "\n";
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
  std::uint64_t checksum = 0;      // the manifest's own
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
    j = detail::parse_json(read_text(m.path), "manifest", kManifestValues);
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
      Layout layout = Layout::parse(p.at("shape").get<Shape>(), DType::f32,
                                    p.at("layout").get<std::string>(), "layout");
      if (layout.spec().is_partial())
        throw ValidationError("layout", layout.str() + " holds a pending sum, not values");
      return layout;
    } catch (const Error& e) {
      throw bad("parameter " + name + ": " + e.what());
    }
  };
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  try {
    if (!j.is_object() || j.value("format", "") != kFormat)
      throw bad(std::string("not a ") + kFormat + " manifest");
    const std::string checksum = manifest_checksum(j);
    if (j.value("checksum", "") != checksum)
      throw bad("checksum mismatch: the manifest changed after it was written");
    m.checksum = std::stoull(checksum, nullptr, 16);
    // A training step is an int (TrainConfig::steps).
    if (integer(j.at("step"), "step", std::numeric_limits<int>::max()) != step)
      throw bad("its step is not " + std::to_string(step) + ", the step of its directory");
    m.step = step;
    m.description = j.at("description").dump();
    // What the layouts hold, counted as each is built, within the training memory bound: a
    // parameter's entries and 16 bytes a device of its mesh (a forged manifest of 23 KB held
    // 300 meshes of 2^20 devices, 4.8 GB, before its first parameter was found missing).
    std::int64_t held = 0;
    for (const auto& p : j.at("parameters")) {
      const std::string name = p.at("name");
      Layout layout = layout_of(p, name);
      held += kParameterBytes + 16 * layout.mesh().size();
      if (held > limits().train_memory_bytes)
        throw ValidationError("train memory",
                              m.path + ": its parameters' layouts take over " +
                                  human_bytes(limits().train_memory_bytes) +
                                  " to hold (raise it with MESHCAST_MAX_TRAIN_MEMORY_BYTES)");
      if (!m.params.emplace(name, std::move(layout)).second)
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
  for (std::size_t i = 0; i < old.ndim(); ++i) shard.push_back(old.shard_index(i, *index));
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
  struct Span {
    std::int64_t offset, bytes;
    std::string name;
    bool operator<(const Span& o) const { return offset < o.offset; }
  };
  std::vector<Span> spans;
  for (const auto& [name, offset] : f.offsets) {
    const Layout& old = m.params.at(name);
    if (file_device(old, device) != device)
      throw ValidationError("checkpoint", f.path + ": has a tile of " + name + " that device " +
                                              std::to_string(device) + " does not write");
    spans.push_back({offset, 3 * old.tile_of(device).volume() * kF32, name});
  }
  std::sort(spans.begin(), spans.end());
  std::int64_t end = 0;
  for (const Span& s : spans) {
    if (s.offset != end)
      throw ValidationError("checkpoint", f.path + ": its tiles leave a gap or overlap at byte " +
                                              std::to_string(std::min(s.offset, end)));
    end += s.bytes;
  }
  if (end != size)
    throw ValidationError("checkpoint", f.path + ": its tiles take " + std::to_string(end) +
                                            " of its " + std::to_string(size) + " bytes");
  // Tile by tile, in pieces of at most 1 MiB that each lie in one of its value, m or v: the
  // checksum over the whole file, then whether each part is a trained state (a forged or
  // miscomputed one would spread NaN into the weights that a load sets).
  Fnv fnv;
  std::string unsound_part;
  std::vector<float> buf(std::size_t{1} << 18);
  for (const Span& s : spans) {
    const std::int64_t third = s.bytes / 3 / kF32;
    for (int part = 0; part < 3; ++part)
      for (std::int64_t done = 0; done < third;) {
        const auto count = static_cast<std::size_t>(
            std::min<std::int64_t>(third - done, static_cast<std::int64_t>(buf.size())));
        const std::int64_t at = s.offset + (part * third + done) * kF32;
        if (file.read(buf.data(), count * kF32, at) != count * kF32)
          throw ValidationError("checkpoint", f.path + ": shorter than its size");
        fnv.add(buf.data(), count * kF32);
        if (unsound_part.empty())
          if (const std::string why = unsound(buf.data(), count, part, done); !why.empty())
            unsound_part = "parameter " + s.name + ": " + why;
        done += static_cast<std::int64_t>(count);
      }
  }
  if (fnv.hex() != f.fnv) throw ValidationError("checkpoint", f.path + ": checksum mismatch");
  if (!unsound_part.empty()) throw ValidationError("checkpoint", f.path + ": " + unsound_part);
}

// Member k of the n of `group` verifies every n-th file of `m`; returns the devices whose files
// it verified.
std::set<int> verify_files(const Group& group, const Manifest& m) {
  const auto n = static_cast<std::size_t>(group.size());
  const auto me = static_cast<std::size_t>(group.index_of(group.comm().rank()));
  std::set<int> verified;
  std::size_t i = 0;
  for (const auto& [device, f] : m.files)
    if (i++ % n == me) {
      verify_file(m, device, f);
      verified.insert(device);
    }
  return verified;
}

// The files of a manifest that a device reads, opened on demand (at most kOpenFiles at once),
// each verified whole before this device first reads it unless this device verified it already:
// what a device loads is what it checked itself, not what another device saw at that path (a
// node-local copy of the checkpoint may differ).
class SavedFiles {
 public:
  SavedFiles(const Manifest& m, std::set<int> verified) : m_(m), verified_(std::move(verified)) {}
  File& open(int device) {
    const SavedFile& f = m_.files.at(device);
    if (!verified_.count(device)) {
      verify_file(m_, device, f);
      verified_.insert(device);
    }
    if (open_.size() >= kOpenFiles) open_.clear();
    return open_.try_emplace(device, f.path, kRead).first->second;
  }

 private:
  const Manifest& m_;
  std::set<int> verified_;
  std::map<int, File> open_;
};

// ---- Moving saved tensors ----------------------------------------------------------------------

// `layout` with a first dimension of 3, unsplit: the value, m and v of a tile one after the other,
// as a device's file holds a tile and as a load moves it.
Layout with_moments(const Layout& layout) {
  Shape shape{3};
  shape.insert(shape.end(), layout.shape().begin(), layout.shape().end());
  std::vector<std::vector<int>> dims{{}};
  dims.insert(dims.end(), layout.spec().dims().begin(), layout.spec().dims().end());
  return Layout(std::move(shape), DType::f32, layout.mesh(), ShardingSpec(std::move(dims)));
}

// The layout a load reads a saved tensor in, on this run's devices: the saved one without its
// replicas (one device per saved tile, so that every byte is read once), each tile on the device
// that wrote it when that device is in this run, else on one that holds no tile. When the saved
// tiles outnumber this run's devices, the most split mesh axis is halved until they do not: a
// device then reads its tile from the parts of several saved tiles.
Layout source_layout(const Layout& saved, const std::vector<int>& world) {
  const Mesh& mesh = saved.mesh();
  std::vector<std::int64_t> extents(mesh.ndim(), 1);
  for (const auto& axes : saved.spec().dims())
    for (int a : axes)
      extents[static_cast<std::size_t>(a)] = mesh.extent(static_cast<std::size_t>(a));
  const auto tiles = [&] {
    std::int64_t n = 1;
    for (auto e : extents) n *= e;
    return n;
  };
  const auto devices = static_cast<std::int64_t>(world.size());
  const bool merged = tiles() > devices;
  while (tiles() > devices) {
    auto& e = *std::max_element(extents.begin(), extents.end());
    e = (e + 1) / 2;
  }
  std::vector<int> placed(static_cast<std::size_t>(tiles()), -1);
  std::set<int> taken;
  if (!merged) {
    const std::set<int> here(world.begin(), world.end());
    // The mesh without replicas keeps the coordinates of the tiles' first holders.
    std::vector<std::int64_t> coord(extents.size(), 0);
    for (auto& device : placed) {
      const int writer = mesh.device(mesh.index(coord));
      if (here.count(writer) && taken.insert(writer).second) device = writer;
      for (std::size_t a = coord.size(); a-- > 0;) {
        if (++coord[a] < extents[a]) break;
        coord[a] = 0;
      }
    }
  }
  auto next = world.begin();
  for (auto& device : placed) {
    if (device >= 0) continue;
    while (taken.count(*next)) ++next;
    device = *next++;
  }
  return with_moments(
      Layout(saved.shape(), DType::f32, Mesh(std::move(extents), std::move(placed)), saved.spec()));
}

// The most bytes a device holds of `layout` (its uneven splits rounded up): a bound that every
// device computes alike, whatever it holds itself.
std::int64_t largest_tile_bytes(const Layout& layout) {
  std::int64_t elements = 1;
  for (std::size_t i = 0; i < layout.ndim(); ++i) {
    const std::int64_t parts = layout.splits(i);
    elements *= (layout.shape()[i] + parts - 1) / parts;
  }
  return elements * static_cast<std::int64_t>(dtype_size(layout.dtype()));
}

// A load's moves: the saved tensors in the manifest's order (the same on every device), in
// batches of consecutive tensors that each move as one sync.
struct Moves {
  // This device's part of each batch, from source_layout() to this run's layout (both
  // with_moments()).
  std::vector<SyncPlan> batches;
  std::vector<Param*> params;  // per tensor: this device's, or null when it holds none
};

// This device's entry of what the run holds: the shape and layout of each parameter whose mesh it
// is the first device of (one device names each), as JSON text; "" for none.
std::string running_entry(Parameters& params, int me) {
  json entry = json::array();
  for (const Param& p : params.all())
    if (p.layout.mesh().device(0) == me)
      entry.push_back({{"name", p.name}, {"shape", p.shape}, {"layout", p.layout.str()}});
  return entry.empty() ? "" : entry.dump();
}

// The moves of every saved tensor, from what every device's running_entry() says, in batches
// whose source tiles take at most `batch_bytes` on any device; refuses a checkpoint of another
// model.
Moves plan_moves(const Manifest& m, const std::vector<std::string>& entries, Parameters& params,
                 const std::vector<int>& world, int me, std::int64_t batch_bytes) {
  std::map<std::string, json> running;
  std::vector<std::string> order;
  for (const auto& text : entries) {
    if (text.empty()) continue;
    for (const json& p : json::parse(text)) {
      const std::string name = p.at("name");
      const auto [it, fresh] = running.emplace(name, p);
      if (fresh)
        order.push_back(name);
      else if (it->second != p)
        throw ValidationError("checkpoint", "parameter " + name + " differs between devices: " +
                                                it->second.dump() + " and " + p.dump());
    }
  }
  for (const auto& name : m.order)
    if (!running.count(name))
      throw ValidationError("checkpoint", m.path + ": parameter " + name + " is not in the model");
  for (const auto& name : order) {
    const Shape shape = running.at(name).at("shape");
    const auto saved = m.params.find(name);
    if (saved == m.params.end() || saved->second.shape() != shape)
      throw ValidationError("checkpoint",
                            m.path + ": no parameter " + name + " of shape " + shape_str(shape));
  }
  std::map<std::string, Param*> mine;
  for (Param& p : params.all()) {
    const auto it = running.find(p.name);
    if (it == running.end() || it->second.at("layout") != p.layout.str())
      throw ValidationError("checkpoint", "parameter " + p.name + " is laid out as " +
                                              p.layout.str() + " on device " + std::to_string(me) +
                                              ", otherwise on the first device of its mesh");
    mine[p.name] = &p;
  }
  Moves moves;
  std::vector<TensorMove> batch;
  std::int64_t bytes = 0;  // the batch's largest source tiles: at least what any device holds
  const auto flush = [&] {
    if (batch.empty()) return;
    moves.batches.push_back(
        plan_sync(std::exchange(batch, {}), me, Topology::single_host(), kLoadSync));
    bytes = 0;
  };
  for (const auto& name : m.order) {
    const Layout& saved = m.params.at(name);
    Layout target = with_moments(Layout::parse(
        saved.shape(), DType::f32, running.at(name).at("layout").get<std::string>(), "layout"));
    const auto held = mine.find(name);
    Param* param = held == mine.end() ? nullptr : held->second;
    if (!param && target.mesh().contains(me))
      throw ValidationError("checkpoint", "parameter " + name + " is laid out on device " +
                                              std::to_string(me) + ", which does not hold it");
    Layout source = source_layout(saved, world);
    const std::int64_t size = largest_tile_bytes(source);
    if (bytes + size > batch_bytes) flush();
    bytes += size;
    batch.push_back({name, std::move(source), std::move(target)});
    moves.params.push_back(param);
  }
  flush();
  return moves;
}

// This device's source tile `tile` of saved tensor `name` (its value, m and v: see
// with_moments()) read into `out` from the saved tiles it overlaps: of each, the rows that the
// tile spans, contiguous in its file.
void read_source(const Manifest& m, const std::string& name, const Box& tile, int me,
                 std::vector<float>& out, SavedFiles& files) {
  const Layout& saved = m.params.at(name);
  const Box box(std::vector<Range>(tile.ranges().begin() + 1, tile.ranges().end()));
  const std::int64_t volume = box.volume();
  const auto read = [&](File& file, float* to, std::int64_t count, std::int64_t at) {
    const auto bytes = static_cast<std::size_t>(count * kF32);
    if (file.read(to, bytes, at) != bytes)
      throw ValidationError("checkpoint", file.path() + ": shorter than the manifest says");
  };
  if (volume == 0) return;
  // Usually the tile this device wrote: its three arrays in one read.
  if (const auto own = m.files.find(me); own != m.files.end() && saved.mesh().contains(me) &&
                                         own->second.offsets.count(name) &&
                                         saved.tile_of(me) == box) {
    read(files.open(me), out.data(), 3 * volume, own->second.offsets.at(name));
    return;
  }
  std::int64_t covered = 0;
  std::vector<float> band;
  for (const auto& [device, f] : m.files) {
    const auto offset = f.offsets.find(name);
    if (offset == f.offsets.end()) continue;
    const Box from = saved.tile_of(device);
    const Box part = intersect(from, box);
    if (part.empty()) continue;
    auto ranges = from.ranges();
    ranges[0] = part[0];
    const Box rows(ranges);
    const std::int64_t skip = (part[0].lo - from[0].lo) * (from.volume() / from[0].size());
    band.resize(static_cast<std::size_t>(rows.volume()));
    File& file = files.open(device);
    for (std::int64_t k = 0; k < 3; ++k) {
      read(file, band.data(), rows.volume(), offset->second + (k * from.volume() + skip) * kF32);
      copy_region(Region::of(band.data(), kF32, rows, part),
                  Region::of(out.data() + k * volume, kF32, box, part));
    }
    covered += part.volume();
  }
  if (covered != volume)
    throw ValidationError("checkpoint", m.path + ": its files do not cover " + name + " " +
                                            box.str() + " (a file is missing from it)");
}

// Moves every saved tensor into `loaded` (per tensor: this device's target tile, see
// with_moments()), batch after batch, each device reading its source tiles of a batch from the
// files while the previous batch moves. A device that cannot read takes part all the same, so
// that none waits for a partner that gave up; it returns its failure, for every device to agree
// on.
std::unique_ptr<Error> move_all(const Manifest& m, const Moves& moves, const Group& group,
                                SavedFiles& files, std::vector<std::vector<float>>& loaded) {
  const int me = group.comm().rank();
  struct Moving {
    std::vector<std::vector<float>> sources;  // per tensor of the batch
    Transfer transfer;                        // destroyed first: it may still read `sources`
  };
  Moving previous;
  std::unique_ptr<Error> failure;
  std::size_t first = 0;  // the batch's first tensor
  for (const SyncPlan& batch : moves.batches) {
    const auto& tensors = batch.tensors();
    Moving now;
    now.sources.resize(tensors.size());
    std::vector<const void*> src(tensors.size());
    std::vector<void*> dst(tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const TensorMove& t = tensors[i];
      std::vector<float>& source = now.sources[i];
      if (t.src.mesh().contains(me)) {
        const Box tile = t.src.tile_of(me);
        source.resize(static_cast<std::size_t>(tile.volume()));
        if (!failure)
          failure = attempt(false, [&] { read_source(m, t.name, tile, me, source, files); });
      }
      std::vector<float>& target = loaded[first + i];
      if (const Param* p = moves.params[first + i])
        target.resize(static_cast<std::size_t>(3 * p->shard.volume()));
      src[i] = source.data();
      dst[i] = target.data();
    }
    now.transfer = isync(batch, group, src, dst);
    previous.transfer.wait();
    previous = std::move(now);
    first += tensors.size();
  }
  previous.transfer.wait();
  return failure;
}

}  // namespace

void save_checkpoint(Communicator& comm, const std::vector<int>& world, Parameters& params,
                     std::int64_t step, const std::string& dir, const std::string& description) {
  if (step < 0) throw ValidationError("checkpoint.step", "negative: " + std::to_string(step));
  const Group group = group_of(comm, world);
  const bool leader = comm.rank() == world.front();
  const fs::path root(dir), tmp = root / (step_name(step) + ".tmp"), dest = root / step_name(step);

  json desc;
  // No save is in flight (saving is collective), so every temporary is a killed save's remains.
  phase(group, true, [&] {
    if (!leader) return;
    desc = parse_description(description);
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
  phase(group, true, [&] { entry = write_device_file(params, comm.rank(), tmp); });
  const auto entries = gather_entries(group, entry);
  phase(group, true, [&] {
    if (!leader) return;
    write_text(tmp / "manifest.json", manifest_text(step, desc, entries));
    sync_dir(tmp);
  });

  // Read everything back before the checkpoint becomes the newest and older ones are pruned: one
  // that does not verify must replace nothing.
  phase(group, true, [&] {
    try {
      verify_files(group, read_manifest(tmp, step));
    } catch (const ValidationError& e) {
      throw IoError("checkpoint", "does not read back as written: " + std::string(e.what()));
    }
  });

  phase(group, true, [&] {
    if (!leader) return;
    rename_path(tmp, dest);
    sync_dir(root);
    write_text(root / "latest.tmp", step_name(step) + "\n");
    rename_path(root / "latest.tmp", root / "latest");
    sync_dir(root);
    prune(root, step);
  });
}

void check_checkpoint_size(Communicator& comm, const std::vector<int>& world, Parameters& params,
                           const std::string& description) {
  const Group group = group_of(comm, world);
  json desc;
  std::string mine;
  phase(group, false, [&] {
    desc = parse_description(description);
    json entry = device_entry(params, comm.rank());
    if (entry.is_null()) return;
    entry["fnv1a64"] = Fnv{}.hex();  // every checksum is as long
    mine = entry.dump();
  });
  const auto entries = gather_entries(group, mine);
  phase(group, false, [&] {
    if (comm.rank() != world.front()) return;
    // As save_checkpoint() writes it at the widest step, and as a load reads it.
    const std::string what = "the manifest of each checkpoint of this run";
    const std::string text = manifest_text(std::numeric_limits<int>::max(), desc, entries);
    require_readable_size(what, static_cast<std::int64_t>(text.size()));
    try {
      detail::parse_json(text, "manifest", kManifestValues);
    } catch (const ParseError& e) {
      throw ValidationError("checkpoint", what + ": " + e.what());
    }
  });
}

namespace {

// Where a corrupt checkpoint is moved out of the way of the steps a resumed run saves:
// DIR/step-N.corrupt (or .corrupt-2, ...), kept for inspection; loads and prunes ignore it.
fs::path aside(const fs::path& checkpoint) {
  fs::path to = checkpoint.string() + ".corrupt";
  for (int k = 2; fs::exists(fs::symlink_status(to)); ++k)
    to = checkpoint.string() + ".corrupt-" + std::to_string(k);
  return to;
}

// Whether a load may pass over this failure to an older checkpoint: a corrupt or partial one
// (BadInput), not an I/O error, a peer's failure or one over the memory bound (whole: the bound
// is to be raised, not the checkpoint renamed and passed over).
bool corrupt(const Error& e) {
  return e.kind() == ErrorKind::BadInput && e.field() != "train memory";
}

}  // namespace

SavedCheckpoint find_checkpoint(const std::string& dir) {
  SavedCheckpoint found;
  // Refused as load_checkpoint refuses: every failure is a ValidationError. A manifest that
  // cannot be read (corrupt, or missing) gives way to the next older checkpoint, as in
  // load_checkpoint.
  std::unique_ptr<Error> newest_failure;
  if (const auto failure = attempt(false, [&] {
        const Newest n = find_newest(dir);
        for (std::int64_t step : n.steps) {
          const fs::path path = fs::path(dir) / step_name(step);
          auto unread =
              attempt(false, [&] { found.description = read_manifest(path, step).description; });
          if (!unread) {
            found.step = step;
            found.path = path.string();
            found.fallback = n.fallback;
            break;
          }
          if (!corrupt(*unread)) throw *unread;
          found.skipped.push_back(unread->cause());
          if (!newest_failure) newest_failure = std::move(unread);
        }
        if (found.step < 0 && newest_failure) throw *newest_failure;
      }))
    throw ValidationError(failure->field(), failure->cause());
  return found;
}

std::int64_t load_checkpoint(Communicator& comm, const std::vector<int>& world, Parameters& params,
                             const std::string& dir, const LoadOptions& options, LoadStats* stats) {
  if (options.batch_bytes < 1)
    throw ValidationError("checkpoint.batch_bytes",
                          "must be at least 1, got " + std::to_string(options.batch_bytes));
  if (stats) *stats = {};
  const Group group = group_of(comm, world);
  // Every device must see the same checkpoints (a directory not shared by all would differ).
  const auto same_everywhere = [&](std::array<std::int64_t, 3> values) {
    for (const detail::Spread& s : detail::spread(group, values))
      if (!s.same())
        throw ValidationError("checkpoint", dir + ": the devices see different checkpoints");
  };
  std::vector<std::int64_t> steps;
  phase(group, false, [&] { steps = find_newest(dir).steps; });
  same_everywhere({static_cast<std::int64_t>(steps.size()), steps.empty() ? -1 : steps.front(), 0});

  // The newest that reads back whole; a corrupt one gives way to the next older (each phase
  // fails on every device alike, so all of them walk the same steps).
  Manifest m;
  std::set<int> verified;  // the devices whose files this device verified
  std::int64_t step = -1;
  std::exception_ptr newest_failure;
  std::vector<std::pair<fs::path, std::string>> passed;  // the corrupt ones and why
  // Runs a phase that finds a checkpoint corrupt or not; only the former is passed over.
  const auto reads_back = [&](const fs::path& path, auto&& body) {
    try {
      phase(group, false, body);
      return true;
    } catch (const Error& e) {
      if (!corrupt(e)) throw;
      if (!newest_failure) newest_failure = std::current_exception();
      passed.emplace_back(path, e.cause());
      return false;
    }
  };
  for (std::int64_t s : steps) {
    const fs::path path = fs::path(dir) / step_name(s);
    if (!reads_back(path, [&] { m = read_manifest(path, s); })) continue;
    same_everywhere({s, static_cast<std::int64_t>(m.checksum >> 32),
                     static_cast<std::int64_t>(m.checksum & 0xffffffffu)});
    if (!reads_back(path, [&] { verified = verify_files(group, m); })) continue;
    step = s;
    break;
  }
  if (step < 0) {
    if (newest_failure) std::rethrow_exception(newest_failure);
    return -1;
  }
  if (options.accept)
    phase(group, false,
          [&] { options.accept((fs::path(dir) / step_name(step)).string(), m.description); });
  const auto entries = gather_entries(group, running_entry(params, comm.rank()));
  Moves moves;
  phase(group, false,
        [&] { moves = plan_moves(m, entries, params, world, comm.rank(), options.batch_bytes); });

  std::vector<std::vector<float>> loaded(moves.params.size());
  SavedFiles files(m, std::move(verified));
  comm.agree(group, move_all(m, moves, group, files, loaded).get());

  // The corrupt ones out of the way of the steps the run saves next (a checkpoint is never
  // overwritten), once the load succeeded and before anything else changes.
  if (!passed.empty()) {
    std::vector<fs::path> to;
    for (const auto& [path, why] : passed) to.push_back(aside(path));
    phase(group, true, [&] {
      if (group.index_of(comm.rank()) == 0)
        for (std::size_t i = 0; i < passed.size(); ++i) rename_path(passed[i].first, to[i]);
    });
    if (stats)
      for (std::size_t i = 0; i < passed.size(); ++i)
        stats->passed_over.push_back(passed[i].first.string() + " is corrupt (" + passed[i].second +
                                     "); moved to " + to[i].string());
  }

  // Only now that every device read everything: a failed load leaves the parameters as they were.
  for (std::size_t i = 0; i < moves.params.size(); ++i) {
    Param* p = moves.params[i];
    if (!p) continue;
    const auto n = static_cast<std::ptrdiff_t>(p->shard.volume());
    const auto at = loaded[i].begin();
    p->value.assign(at, at + n);
    p->m.assign(at + n, at + 2 * n);
    p->v.assign(at + 2 * n, at + 3 * n);
  }
  if (stats) {
    stats->tensors = static_cast<std::int64_t>(moves.params.size());
    stats->batches = static_cast<std::int64_t>(moves.batches.size());
    for (const SyncPlan& batch : moves.batches) stats->messages += batch.stats().messages;
  }
  return step;
}

}  // namespace meshcast::training
